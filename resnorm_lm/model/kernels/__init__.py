"""Triton kernels, kept apart from the nn.Module wrappers (resnorm_lm/model/norms_triton.py).

Importing ``resnorm_lm.model.kernels.add_norm`` needs the ``triton`` package, and
``TRITON_INTERPRET=1`` set beforehand to run on CPU tensors.
"""
