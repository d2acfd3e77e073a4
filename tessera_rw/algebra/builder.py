"""Node construction with the op's shape rule applied and errors given their context.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (2, 3), DType.float32)
>>> make("exp", x).type.shape
(2, 3)
"""

from __future__ import annotations

import inspect
import linecache
import math
import os
import sys
import sysconfig
import warnings
from typing import Any, Sequence

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError, DTypeError, TesseraError
from tessera_rw.algebra.node import ArrayLiteral, Node, TensorType
from tessera_rw.algebra.ops import opdef

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames in tessera_rw itself and in the standard library (contextlib, functools) are not the user's;
# installed libraries (site-packages, often inside the stdlib folder) are.
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INSTALLED = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib")})


def _is_user_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep) or filename.startswith("<frozen"):
        return False
    return not path.startswith(_STDLIB) or path.startswith(_INSTALLED)


def _user_frame():
    """The innermost frame outside tessera_rw, if any."""
    frame = sys._getframe(2)
    while frame is not None and not _is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_site() -> str | None:
    """'file:line in function: source' of the innermost frame outside tessera_rw, if any."""
    frame = _user_frame()
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    source = linecache.getline(filename, frame.f_lineno).strip()
    where = f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    return f"{where}: {source}" if source else where


def user_module() -> str | None:
    """The name of the module whose code is running, the innermost frame outside tessera_rw."""
    frame = _user_frame()
    return None if frame is None else frame.f_globals.get("__name__")


def warn_at_user_line(warning: Warning) -> None:
    """Issue `warning` as raised from the user's line (the innermost frame outside tessera_rw), so
    it reads, and filters, by the user's module."""
    frame = _user_frame()
    if frame is None:
        warnings.warn(warning, stacklevel=2)
        return
    warnings.warn_explicit(warning, type(warning), frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


def describe_operands(names: Sequence[str], types: Sequence[TensorType]) -> str:
    if len(names) < len(types):  # variadic: name them by position
        names = [f"{names[0] if names else 'x'}{i}" for i in range(len(types))]
    return ", ".join(f"{n}: {t}" for n, t in zip(names, types))


def make(op_name: str, *args: Node, **attrs: Any) -> Node:
    """Apply an op: check its operands against its shape rule and return the (interned) node."""
    op = opdef(op_name)
    attrs = op.attr_defaults | attrs
    types = tuple(a.type for a in args)
    try:
        result = op.infer(*types, **attrs)
    except TesseraError as e:
        raise e.with_context(op=op_name, operands=describe_operands(op.operands, types),
                             site=user_site()) from None
    except TypeError:
        _check_binds(op_name, op.infer, types, attrs)
        raise
    return Node(op_name, args, attrs, result)


def _check_binds(op_name: str, infer: Any, types: tuple[TensorType, ...], attrs: dict[str, Any]) -> None:
    """Raise an ArgumentError naming what is missing or extra when `attrs` (or the operand count) do
    not fit the op's shape rule; return when they do (the TypeError came from inside it)."""
    signature = inspect.signature(infer)
    try:
        signature.bind(*types, **attrs)
    except TypeError as e:
        operands = opdef(op_name).operands
        params = signature.parameters.values()
        wanted = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in operands]
        raise ArgumentError(f"cannot be applied to {len(types)} operand(s) with attributes {sorted(attrs)}: {e}",
                            op=op_name, operands=describe_operands(operands, types),
                            hint=f"its attributes are {wanted}" if wanted else None, site=user_site()) from None


def make_input(name: str, shape: tuple[int, ...], dtype: DType) -> Node:
    return make("input", name=name, shape=tuple(shape), dtype=dtype)


def python_scalar(value: float | int | bool, dtype: DType) -> float | int | bool | complex:
    """`value` as the Python type that holds `dtype` exactly, so equal constants intern together."""
    if dtype is DType.bool:
        return bool(value)
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        if not (math.isfinite(value) and info.min <= int(value) <= info.max):
            raise DTypeError(f"the value {value} does not fit {dtype.value} ({info.min} to {info.max})",
                             hint=f"cast the tensor to a wider type first (op.cast(x, 'int64')), or use a value in "
                                  f"{dtype.value}'s range")
        return int(value)
    if dtype.is_complex:
        return complex(value)
    return float(value)


def beyond_double(scalar: float | int | bool | complex, dtype: DType) -> bool:
    """Whether `scalar` is an integer of `dtype` that a double (the e-graph's number) cannot hold."""
    return dtype.is_integer and int(float(scalar)) != scalar


def make_constant(value: float | int | bool, dtype: DType) -> Node:
    """A 0-d constant of `dtype`. An integer that a double cannot hold (|value| > 2⁵³, the
    e-graph's number type) is held as a 0-d literal array instead, which the rewrites pass through
    untouched, so it comes out exact."""
    scalar = python_scalar(value, dtype)
    if beyond_double(scalar, dtype):
        return make("literal", value=ArrayLiteral(np.array(scalar, dtype=dtype.numpy)), dtype=dtype)
    return make("constant", value=scalar, dtype=dtype)
