"""What the data and model wings agree on about training targets: the value that counts for nothing.

The data wing pads the targets of a split's last evaluation window with it; the model's loss skips it. It is
torch's own default (``F.cross_entropy(ignore_index=-100)``), defined here once so that neither wing imports the
other.
"""

IGNORE_INDEX = -100  # a target that counts for nothing: the padding of the last evaluation window
