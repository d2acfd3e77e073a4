"""Element types: one enum, its host (numpy / ml_dtypes) twins, and the promotion lattice.

>>> DType.parse("bf16")
<DType.bfloat16: 'bfloat16'>
>>> promote(DType.bfloat16, DType.float32)
<DType.float32: 'float32'>
"""

from __future__ import annotations

import enum
from functools import cache

import ml_dtypes
import numpy as np

from tessera_rw.algebra.errors import DTypeError


class DType(enum.Enum):
    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float8_e4m3 = "float8_e4m3"
    float8_e5m2 = "float8_e5m2"
    int64 = "int64"
    int32 = "int32"
    bool = "bool"
    # complex types appear only as the values of the fft family and spectral rewrites
    complex64 = "complex64"
    complex128 = "complex128"

    @staticmethod
    def parse(value: object) -> DType:
        """Accept a DType, a name, a short alias, or a numpy / ml_dtypes dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            found = _BY_NAME.get(value.lower())
            if value.lower() in _AMBIGUOUS:
                raise DTypeError(f"dtype {value!r} is ambiguous: {_AMBIGUOUS[value.lower()]}; say 'float32' or 'float64'")
            if found is None:
                raise DTypeError(
                    f"unknown dtype {value!r}; known: {', '.join(_BY_NAME)}")
            return found
        try:
            np_dtype = np.dtype(value)
        except TypeError:
            raise DTypeError(f"unknown dtype {value!r}; pass a name such as 'float32' or 'bf16'") from None
        found = _BY_NUMPY.get(np_dtype)
        if found is None:
            raise DTypeError(f"dtype {np_dtype.str if np_dtype.byteorder == '>' else np_dtype} has no tessera_rw "
                             f"equivalent; known: {', '.join(d.value for d in DType)}", hint=_unknown_dtype_hint(np_dtype))
        return found

    def __eq__(self, other: object) -> bool:
        """A dtype equals itself and, as numpy's dtypes do, its names, aliases and numpy / ml_dtypes
        dtypes, so `x.dtype == np.float16` or `x.dtype == "bf16"` reads right in a traced function.

        >>> DType.float16 == np.float16, DType.bfloat16 == "bf16", DType.float32 == "float64"
        (True, True, False)
        """
        if isinstance(other, DType):
            return self is other
        if isinstance(other, (str, np.dtype, type)):
            try:
                return self is DType.parse(other)
            except DTypeError:
                return False
        return NotImplemented

    __hash__ = enum.Enum.__hash__

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self]

    @property
    def dtype(self) -> np.dtype:
        """The numpy / ml_dtypes dtype, so numpy takes a DType where it takes a dtype.

        >>> float(np.finfo(DType.float16).min)
        -65504.0
        """
        return self.numpy

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in _FLOAT_RANK

    @property
    def is_complex(self) -> bool:
        return self in (DType.complex64, DType.complex128)

    @property
    def is_integer(self) -> bool:
        return self in (DType.int32, DType.int64)

    @property
    def is_low_precision(self) -> bool:
        """Stored narrower than float32: computed in float32 and rounded on the way out."""
        return self in (DType.float16, DType.bfloat16, DType.float8_e4m3, DType.float8_e5m2)

    @property
    def compute(self) -> DType:
        """The type arithmetic on this type is carried out in on the host (fp32 accumulation)."""
        return DType.float32 if self.is_low_precision else self

    @property
    def short(self) -> str:
        return _SHORT.get(self, self.value)

    @property
    def lowest(self) -> float:
        """The most negative finite value (what masked_fill(..., finfo.min) writes)."""
        return float(_finfo(self).min)

    @property
    def eps(self) -> float:
        return float(_finfo(self).eps)

    def __repr__(self) -> str:
        return f"<DType.{self.name}: '{self.value}'>"

    def __str__(self) -> str:
        return self.value


_NUMPY = {
    DType.float64: np.dtype(np.float64),
    DType.float32: np.dtype(np.float32),
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float8_e4m3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.int64: np.dtype(np.int64),
    DType.int32: np.dtype(np.int32),
    DType.bool: np.dtype(np.bool_),
    DType.complex64: np.dtype(np.complex64),
    DType.complex128: np.dtype(np.complex128),
}
_SHORT = {
    DType.float64: "f64", DType.float32: "f32", DType.float16: "f16", DType.bfloat16: "bf16",
    DType.float8_e4m3: "f8e4m3", DType.float8_e5m2: "f8e5m2", DType.int64: "i64", DType.int32: "i32",
    DType.bool: "bool", DType.complex64: "c64", DType.complex128: "c128",
}
_ALIASES = {
    "fp64": DType.float64, "f64": DType.float64, "double": DType.float64,
    "fp32": DType.float32, "f32": DType.float32,
    "fp16": DType.float16, "f16": DType.float16, "half": DType.float16,
    "bf16": DType.bfloat16,
    "fp8_e4m3": DType.float8_e4m3, "float8_e4m3fn": DType.float8_e4m3, "f8e4m3": DType.float8_e4m3,
    "fp8_e5m2": DType.float8_e5m2, "f8e5m2": DType.float8_e5m2,
    "i64": DType.int64, "i32": DType.int32, "bool_": DType.bool,
    "c64": DType.complex64, "c128": DType.complex128,
}
_BY_NAME = {d.value: d for d in DType} | _ALIASES
# names numpy and torch read differently: refused rather than guessed
_AMBIGUOUS = {"float": "numpy reads it as float64 and torch as float32"}
_BY_NUMPY = {v: k for k, v in _NUMPY.items()}

# Floats ordered by how much they can represent; promotion takes the wider.
_FLOAT_RANK = {
    DType.float8_e5m2: 0, DType.float8_e4m3: 0, DType.float16: 1, DType.bfloat16: 1,
    DType.float32: 2, DType.float64: 3,
}


def _finfo(dtype: DType):
    if not (dtype.is_float or dtype.is_complex):
        raise DTypeError(f"{dtype} is not a floating-point type")
    return ml_dtypes.finfo(dtype.numpy) if dtype.is_low_precision else np.finfo(dtype.numpy)


@cache
def promote(a: DType, b: DType) -> DType:
    """The result type of a binary op, numpy-like but closed over our types.

    Same-width floats of different formats (fp16 with bf16, e4m3 with e5m2) meet at the next
    width up, as in torch.
    """
    if a is b:
        return a
    if a.is_complex or b.is_complex:
        wide = DType.float64 in (a, b) or DType.complex128 in (a, b)
        return DType.complex128 if wide else DType.complex64
    if a.is_float and b.is_float:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra != rb:
            return a if ra > rb else b
        return {0: DType.float16, 1: DType.float32}[ra] if ra < 2 else a
    if a.is_float or b.is_float:
        return a if a.is_float else b
    if DType.int64 in (a, b):
        return DType.int64
    return DType.int32 if DType.int32 in (a, b) else DType.bool


def complex_of(dtype: DType) -> DType:
    """The complex type a real signal's spectrum is held in."""
    if dtype.is_complex:
        return dtype
    return DType.complex128 if dtype is DType.float64 else DType.complex64


def real_of(dtype: DType) -> DType:
    return DType.float64 if dtype is DType.complex128 else DType.float32


def _unknown_dtype_hint(np_dtype: np.dtype) -> str | None:
    """What to do with a numpy dtype tessera_rw has no name for, where there is something to do."""
    if np_dtype.byteorder == ">":
        return f"it is big-endian: convert with x.astype(x.dtype.newbyteorder('=')), {np_dtype.newbyteorder('=')} in this machine's order"
    if np_dtype.name in ("float8_e4m3", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e4m3b11fnuz"):
        return (f"{np_dtype.name} is another fp8 encoding than the GPUs': tessera_rw's float8_e4m3 is "
                "ml_dtypes.float8_e4m3fn and float8_e5m2 is ml_dtypes.float8_e5m2; convert with x.astype(...)")
    return None
