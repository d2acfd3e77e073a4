"""Dtype names, aliases, host twins and promotion."""

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import DType, DTypeError
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.dtypes import promote


@pytest.mark.parametrize("name, dtype", [
    ("float64", DType.float64), ("fp64", DType.float64), ("float32", DType.float32), ("fp32", DType.float32),
    ("float16", DType.float16), ("fp16", DType.float16), ("bfloat16", DType.bfloat16), ("bf16", DType.bfloat16),
    ("float8_e4m3", DType.float8_e4m3), ("fp8_e4m3", DType.float8_e4m3), ("float8_e5m2", DType.float8_e5m2),
    ("fp8_e5m2", DType.float8_e5m2), ("int32", DType.int32), ("int64", DType.int64), ("bool", DType.bool),
    (np.float32, DType.float32), (np.dtype("int64"), DType.int64), (ml_dtypes.bfloat16, DType.bfloat16),
    (ml_dtypes.float8_e4m3fn, DType.float8_e4m3), (ml_dtypes.float8_e5m2, DType.float8_e5m2), (bool, DType.bool),
])
def test_parse(name, dtype):
    assert DType.parse(name) is dtype


def test_host_twins_round_trip():
    for d in DType:
        assert DType.parse(d.numpy) is d


def test_float_is_refused_as_ambiguous_and_the_python_type_is_float64():
    with pytest.raises(DTypeError, match="ambiguous.*float32.*float64"):
        DType.parse("float")
    assert DType.parse(float) is DType.float64


def test_unknown_dtypes_are_named():
    with pytest.raises(DTypeError, match="float13"):
        DType.parse("float13")
    with pytest.raises(DTypeError, match="uint8"):
        DType.parse(np.uint8)


@pytest.mark.parametrize("a, b, want", [
    ("bf16", "fp32", "fp32"), ("fp16", "bf16", "fp32"), ("fp8_e4m3", "bf16", "bf16"),
    ("fp8_e4m3", "fp8_e5m2", "fp16"), ("int32", "fp16", "fp16"), ("int32", "int64", "int64"),
    ("bool", "int32", "int32"), ("fp32", "fp64", "fp64"), ("complex64", "float64", "complex128"),
])
def test_promotion_is_symmetric(a, b, want):
    a, b, want = DType.parse(a), DType.parse(b), DType.parse(want)
    assert promote(a, b) is want and promote(b, a) is want


def test_limits():
    assert DType.bfloat16.eps == 2 ** -7 and DType.float8_e4m3.lowest == -448
    assert DType.float32.lowest == float(np.finfo(np.float32).min)


def test_int64_constants_beyond_two_to_the_53_come_out_exact():
    # the e-graph's numbers are doubles; such constants travel as literals, not rounded
    from tessera_rw import op
    big = 2**53 + 1
    x = np.arange(3, dtype=np.int64)
    assert np.array_equal(op.kernel(lambda x: x * 3 + big)(x), x * 3 + big)
    assert np.array_equal(op.kernel(lambda x: x - op.full((3,), -big, dtype="int64"))(x), x + big)
    assert np.array_equal(op.kernel(lambda x: op.pad(x, 1, constant_values=big))(x), np.pad(x, 1, constant_values=big))
    with pytest.raises(AttributeValueError, match="beyond 2\\*\\*53"):
        op.kernel(lambda x: x + op.arange(big, big + 3))(x)


def test_a_dtype_compares_and_converts_as_numpy_dtypes_do():
    from tessera_rw import op
    assert DType.float16 == np.float16 and DType.float16 == np.dtype("float16") and DType.bfloat16 == "bf16"
    assert DType.bfloat16 == ml_dtypes.bfloat16 and not DType.float32 == "float64" and DType.float64 != None  # noqa: E711
    assert DType.float32 != "no such dtype" and {DType.float32: 1}["float32"] == 1     # the canonical name hashes alike
    assert np.dtype(DType.bfloat16) == ml_dtypes.bfloat16 and float(np.finfo(DType.float32).min) < -3e38

    @op.kernel
    def doubled_in_half(x):                 # a traced function branching on its input's dtype
        fill = float(np.finfo(x.dtype).min)
        return op.where(x > 0, x * 2 if x.dtype == np.float16 else x, fill)
    half, single = np.ones(2, np.float16), np.ones(2, np.float32)
    assert doubled_in_half(half).tolist() == [2, 2] and doubled_in_half(single).tolist() == [1, 1]
