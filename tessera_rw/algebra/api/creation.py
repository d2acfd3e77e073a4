"""Creation op functions as numpy has them: ones, zeros, full, arange, tril, triu."""

from __future__ import annotations

import numbers

import numpy as np

from tessera_rw.algebra.api.dispatch import apply, integer, is_tracing, op_context
from tessera_rw.algebra.api.layout import broadcast_to
from tessera_rw.algebra.builder import beyond_double, make_constant, python_scalar
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.tensor import SymbolicTensor, TensorSpec


def full(shape, fill_value, dtype="float32"):
    """A tensor of one value; inside a traced function it is a graph constant."""
    with op_context("full", ()):
        spec = TensorSpec(shape, dtype)
        if not isinstance(fill_value, (numbers.Number,)):
            raise AttributeValueError(f"fill_value must be a number, got {fill_value!r}")
        value = python_scalar(fill_value, spec.dtype)
    if beyond_double(value, spec.dtype):    # held exactly, as a literal
        return broadcast_to(np.array(value, dtype=spec.dtype.numpy), spec.shape)
    if spec.shape == () and is_tracing() and not spec.dtype.is_complex and value == value:
        # what a Python scalar there would be, holding the value as the dtype rounds it
        return SymbolicTensor(make_constant(np.asarray(value, spec.dtype.numpy).item(), spec.dtype))
    return apply("full", (), shape=spec.shape, value=value, dtype=spec.dtype)


def ones(shape, dtype="float32"):
    """numpy.ones: `op.ones((seq, seq), "bool")` for a mask to take tril of."""
    return full(shape, 1, dtype)


def zeros(shape, dtype="float32"):
    """numpy.zeros."""
    return full(shape, 0, dtype)


def arange(start, stop=None, step=1, dtype=None):
    """numpy.arange; the dtype defaults to int64 for int bounds, float32 otherwise."""
    if stop is None:
        start, stop = 0, start
    with op_context("arange", ()):
        if not all(isinstance(v, numbers.Real) for v in (start, stop, step)):
            raise AttributeValueError(f"arange bounds must be numbers, got {start!r}, {stop!r}, {step!r}")
        integral = all(isinstance(v, numbers.Integral) for v in (start, stop, step))
        dt = DType.parse(dtype) if dtype is not None else DType.int64 if integral else DType.float32
        bounds = {k: python_scalar(v, dt) for k, v in (("start", start), ("stop", stop), ("step", step))}
        if any(beyond_double(v, dt) for v in bounds.values()):
            raise AttributeValueError(f"arange bounds {start}, {stop}, {step} go beyond 2**53, which the e-graph "
                                      "cannot hold exactly", hint="add the large offset to an arange of small bounds")
    return apply("arange", (), dtype=dt, **bounds)


def tril(x, k: int = 0):
    """Zero the elements above the k-th diagonal of the last two axes (numpy.tril)."""
    with op_context("tril", (x,), ("x",)):
        k = integer("k", k)
    return apply("tril", (x,), k=k)


def triu(x, k: int = 0):
    """Zero the elements below the k-th diagonal of the last two axes (numpy.triu)."""
    with op_context("triu", (x,), ("x",)):
        k = integer("k", k)
    return apply("triu", (x,), k=k)
