"""``python -m resnorm_lm``: the ``resnorm-lm`` command (resnorm_lm/cli.py) without the console script."""

import sys

from resnorm_lm.cli import main

sys.exit(main())
