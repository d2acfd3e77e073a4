"""What user code holds: SymbolicTensor (a node being traced) and TensorSpec (a data-less placeholder).

Both support Python's operators and the numpy-style methods; the operators forward to the op
functions in `api`, so every operator goes through the same shape rules and errors.
"""

from __future__ import annotations

import numbers
from typing import Any

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.missing_ops import MISSING_OPS
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.torch_keywords import numpy_keywords


# torch's tensor methods, and what does their work here
TORCH_NAMES = {
    "permute": "use x.transpose(*axes) (numpy's name)", "view": "use x.reshape(...)",
    "contiguous": "tensors here have no layout: drop the call", "unsqueeze": "use x[:, None] (None adds an axis)",
    "squeeze": "use op.squeeze(x, axis)", "size": "use x.shape", "dim": "use x.ndim",
    "float": 'use x.astype("float32")', "half": 'use x.astype("float16")', "bfloat16": 'use x.astype("bf16")',
    "to": "use x.astype(dtype)", "type": "use x.astype(dtype)", "numpy": "a traced tensor has no data yet",
    "item": "a traced tensor has no data yet", "masked_fill": "use op.where(mask, value, x)",
    "expand": "use op.broadcast_to(x, shape)", "repeat": "use op.concatenate([x, x, ...], axis)",
    "type_as": "use x.astype(y.dtype)", "new_zeros": "use op.zeros(shape, x.dtype)",
}


class ElementCount(int):
    """x.size, numpy's element count; called as torch's x.size(dim), an error naming x.shape."""

    def __call__(self, *dims):
        raise ArgumentError(f"x.size is numpy's element count ({int(self)}), not torch's x.size(dim)",
                            hint="x.shape[dim] (x.shape for them all)")


class TensorMethods:
    """Operators and methods shared by symbolic tensors and placeholders."""
    __slots__ = ()
    shape: tuple[int, ...]
    dtype: DType

    def __array_ufunc__(self, ufunc, method: str, *inputs: Any, **kwargs: Any):
        """numpy meets a tensor. `array + tensor` reaches here as np.add(array, tensor) and runs
        the operator's op, operands in order; numpy's own math (np.exp(t)) is refused, naming ours."""
        op = _OPERATOR_UFUNCS.get(ufunc.__name__) if method == "__call__" and not kwargs else None
        if op is None:
            _refuse_numpy(ufunc.__name__)
        return getattr(api, op)(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_numpy(func.__name__)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return ElementCount(n)

    @property
    def T(self):
        return api.transpose(self)

    @property
    def mT(self):
        return api.swapaxes(self, -1, -2)

    def __add__(self, other): return api.add(self, other)
    def __radd__(self, other): return api.add(other, self)
    def __sub__(self, other): return api.subtract(self, other)
    def __rsub__(self, other): return api.subtract(other, self)
    def __mul__(self, other): return api.multiply(self, other)
    def __rmul__(self, other): return api.multiply(other, self)
    def __truediv__(self, other): return api.divide(self, other)
    def __rtruediv__(self, other): return api.divide(other, self)
    def __pow__(self, other): return api.power(self, other)
    def __rpow__(self, other): return api.power(other, self)
    def __matmul__(self, other): return api.matmul(self, other)
    def __rmatmul__(self, other): return api.matmul(other, self)
    def __neg__(self): return api.negative(self)
    def __pos__(self): return self
    def __abs__(self): return api.abs(self)
    def __invert__(self): return api.logical_not(self)
    def __and__(self, other): return api.logical_and(self, other)
    def __rand__(self, other): return api.logical_and(other, self)
    def __or__(self, other): return api.logical_or(self, other)
    def __ror__(self, other): return api.logical_or(other, self)
    def __lt__(self, other): return api.less(self, other)
    def __le__(self, other): return api.less_equal(self, other)
    def __gt__(self, other): return api.greater(self, other)
    def __ge__(self, other): return api.greater_equal(self, other)
    def __eq__(self, other): return api.equal(self, other)  # type: ignore[override]
    def __ne__(self, other): return api.not_equal(self, other)  # type: ignore[override]
    __hash__ = object.__hash__

    def __getitem__(self, index): return api.getitem(self, index)
    def reshape(self, *shape): return api.reshape(self, shape[0] if len(shape) == 1 else shape)
    def flatten(self, start_axis: int = 0, end_axis: int = -1): return api.flatten(self, start_axis, end_axis)
    def ravel(self): return api.reshape(self, (-1,))
    def transpose(self, *axes): return api.transpose(self, (axes[0] if len(axes) == 1 else axes) or None)
    def swapaxes(self, a: int, b: int): return api.swapaxes(self, a, b)
    def astype(self, dtype): return api.cast(self, dtype)
    @numpy_keywords
    def sum(self, axis=None, keepdims=False): return api.sum(self, axis, keepdims)
    @numpy_keywords
    def mean(self, axis=None, keepdims=False): return api.mean(self, axis, keepdims)
    @numpy_keywords
    def max(self, axis=None, keepdims=False): return api.max(self, axis, keepdims)
    @numpy_keywords
    def min(self, axis=None, keepdims=False): return api.min(self, axis, keepdims)
    @numpy_keywords
    def var(self, axis=None, keepdims=False, ddof=0): return api.var(self, axis, keepdims, ddof)
    @numpy_keywords
    def std(self, axis=None, keepdims=False, ddof=0): return api.std(self, axis, keepdims, ddof)
    def clip(self, a_min=None, a_max=None): return api.clip(self, a_min, a_max)

    def __getattr__(self, name: str):
        """Only for names the class lacks: a torch method's name gets ours in the error."""
        if name.startswith("__"):
            raise AttributeError(name)
        hint = TORCH_NAMES.get(name) or MISSING_OPS.get(name) or (f"use op.{name}(x)" if hasattr(api, name) else None)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}" + (f"; {hint}" if hint else ""))

    def __round__(self, ndigits=None):
        raise AttributeError(f"round() of a {type(self).__name__}: " + MISSING_OPS["round"])

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        raise ArgumentError(f"the truth value of a {type(self).__name__} {TensorType(self.shape, self.dtype)} "
                            "is not known while tracing",
                            hint="use op.where(cond, a, b) instead of Python if/and/or on tensors", site=_site())

    def __iter__(self):
        raise ArgumentError("iterating over a traced tensor is not supported",
                            hint="index it (x[i]) or use op.reshape / slicing", site=_site())

    def _no_value(self, what: str):
        raise ArgumentError(f"{what} of a {type(self).__name__} {TensorType(self.shape, self.dtype)}: it has no "
                            "value while tracing",
                            hint="keep it a tensor (op functions take tensors, and a Python number broadcasts); "
                                 "return it from the kernel to read its value", site=_site())

    def _no_op(self, what: str, hint: str):
        raise ArgumentError(f"{what} of a {type(self).__name__} {TensorType(self.shape, self.dtype)} is not an op "
                            "of tessera_rw", hint=hint, site=_site())

    _NO_FLOOR = ("there is no floor op: for non-negative a / b, op.cast(a / b, 'int32') truncates to a // b "
                 "(and a - that * b is a % b); otherwise compute it outside the kernel")

    def __floordiv__(self, other): self._no_op("floor division (//)", self._NO_FLOOR)
    def __rfloordiv__(self, other): self._no_op("floor division (//)", self._NO_FLOOR)
    def __mod__(self, other): self._no_op("the remainder (%)", self._NO_FLOOR)
    def __rmod__(self, other): self._no_op("the remainder (%)", self._NO_FLOOR)

    def __float__(self): self._no_value("float()")
    def __int__(self): self._no_value("int()")
    def __complex__(self): self._no_value("complex()")
    def __index__(self): self._no_value("using as an index")

    def __setitem__(self, index, value):
        raise ArgumentError(f"cannot assign into a {type(self).__name__} {TensorType(self.shape, self.dtype)}: "
                            "traced tensors are values, not buffers",
                            hint="build the new tensor instead: op.where(mask, value, x), op.pad or op.concatenate",
                            site=_site())


def _site() -> str | None:
    """The user's line (builder imports this module, so it is fetched when an error is raised)."""
    from tessera_rw.algebra.builder import user_site
    return user_site()


class SymbolicTensor(TensorMethods):
    """A tensor inside a trace: a handle on the graph node that computes it."""
    __slots__ = ("node",)

    def __init__(self, node: Node):
        self.node = node

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    def __array__(self, *args: Any, **kwargs: Any):
        raise ArgumentError(f"a traced tensor {self.node.type} has no value yet",
                            hint="use tessera_rw.op functions instead of numpy inside @op.kernel")

    def __repr__(self) -> str:
        return f"SymbolicTensor({self.node.op} -> {self.node.type})"


class TensorSpec(TensorMethods):
    """A placeholder: a shape and dtype, no data. `op.tensor((4, 16), "bf16")` makes one.

    Accepted wherever arrays are, to trace, explain and compile without data; ops applied to
    placeholders give placeholders of the result's shape and dtype.
    """
    __slots__ = ("shape", "dtype")

    def __array__(self, *args: Any, **kwargs: Any):
        raise ArgumentError(f"a placeholder op.tensor({self.shape}, {self.dtype.name!r}) has no data",
                            hint="pass numpy (or CuPy / torch) arrays to compute values; placeholders trace, "
                                 "explain and compile without data")

    def eval(self):
        """A placeholder has no values to compute with: says so (eager ops on arrays give values)."""
        raise ArgumentError(f"eval() of a placeholder op.tensor({self.shape}, {self.dtype.name!r}): it has no data, "
                            "only a shape and dtype", hint="call the ops on arrays, which runs them at once: "
                            "x = np.random.rand(1024, 1024).astype(np.float32); y = op.softmax(op.matmul(x, x), axis=-1)")

    def __init__(self, shape, dtype: Any = "float32"):
        try:
            dims = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        except TypeError:
            raise ArgumentError(f"a tensor shape must be a tuple of ints, got {shape!r}") from None
        if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ArgumentError(f"a tensor shape must be a tuple of ints >= 0, got {shape!r}")
        self.shape = tuple(int(d) for d in dims)
        self.dtype = DType.parse(dtype)

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"tensor({self.shape}, {self.dtype})"


# the ufuncs numpy calls for Python's operators between an array and a tensor, and our ops for them
_OPERATOR_UFUNCS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide", "true_divide": "divide",
    "power": "power", "matmul": "matmul", "bitwise_and": "logical_and", "bitwise_or": "logical_or",
    "less": "less", "less_equal": "less_equal", "greater": "greater", "greater_equal": "greater_equal",
    "equal": "equal", "not_equal": "not_equal",
}


def _refuse_numpy(name: str):
    from tessera_rw.algebra.builder import user_site
    ours = f"op.{name}" if hasattr(api, name) else "the tessera_rw.op function"
    raise ArgumentError(f"numpy's {name} was given a traced tensor: numpy runs on arrays with values, and a "
                        f"tensor being traced has none yet", site=user_site(), hint=f"use {ours} inside @op.kernel")


class _LazyApi:
    """The op functions, imported on first use: `api` builds on these classes, not the reverse."""

    def __getattr__(self, name: str):
        import importlib
        return getattr(importlib.import_module("tessera_rw.algebra.api"), name)


api = _LazyApi()
