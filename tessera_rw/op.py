"""`from tessera_rw import op`: the op functions, `op.kernel`, and `op.tensor` placeholders.

>>> import numpy as np
>>> from tessera_rw import op
>>> op.softmax(np.zeros((2, 4), np.float32), axis=-1)[0]
array([0.25, 0.25, 0.25, 0.25], dtype=float32)
"""

from tessera_rw.algebra.api import *  # noqa: F401,F403  (the op functions are this module's API)
from tessera_rw.algebra.api import __all__ as _op_names
from tessera_rw.algebra.tensor import TensorSpec as tensor
from tessera_rw.grad_kernel import grad, value_and_grad
from tessera_rw.kernel import Kernel, autotune, kernel

__all__ = [*_op_names, "tensor", "kernel", "Kernel", "autotune", "grad", "value_and_grad"]


def __getattr__(name: str):
    """`op.<name>` for an op there is not: how to write it with these, or the names it is close to."""
    from tessera_rw.algebra.missing_ops import unknown_op
    if name.startswith("__"):
        raise AttributeError(name)
    raise unknown_op(name, __all__)
