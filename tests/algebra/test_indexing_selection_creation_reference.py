"""Values of the indexing, selection and creation ops against numpy on random data.

Slicing (getitem) and the selection ops (tril/triu, where, cast) must be bit-exact: same dtype, same
shape, same bytes; so must the creation ops (full/ones/zeros, integer arange). Most cases run both
eagerly on numpy arrays and through a traced @op.kernel, since both go through the graph executor.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera_rw import ShapeError, TesseraError, op
from tests.algebra.layout_helpers import (
    BF16, DTYPES, SETTINGS, assert_bitexact, both, constant, dims, dtype_names, index_for, rand, seeds,
    traced,
)


# ---- slicing (traced) -----------------------------------------------------------------------

S = (4, 5, 6, 3)
E = Ellipsis
INDEX_FORMS = [
    0, 3, -1, -4, np.int64(-2), (1, 2), (-1, -2, -3), (0, 0, 0, 0), (-4, -5, -6, -3),
    slice(1, 3), slice(None, None, 2), slice(-3, None), slice(-100, 100), slice(10, 20), slice(3, 1),
    slice(1, None, 3), slice(None, -1, 4), slice(-2, -100), slice(2, 2),
    (E,), (), (E, 1), (1, E), (1, E, -1), (slice(1, 3), E, slice(None, None, 2)), (E, slice(0, 2), 1),
    (None,), (None, E, None), (1, None, E, None, -1), (slice(None), None, 2, E), (E, None),
    (slice(1, None, 2), None, slice(-4, 100, 3), E, -2), (None, None, 0, slice(None, None, 5)),
    (-1, E, slice(-2, None), slice(0, 1)), (slice(-7, 7, 2), slice(4, -1), slice(None), slice(1, 2)),
    (2, slice(0, 99, 2), None, E), (E, -1, slice(None, None, 2)),
]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("index", INDEX_FORMS, ids=repr)
def test_getitem_forms(index, dtype):
    x = rand(np.random.default_rng(5), S, dtype)
    want = x[index]
    assert_bitexact(traced(lambda t: t[index])(x), want)
    assert_bitexact(op.getitem(x, index), want)


@pytest.mark.parametrize("index", [(), E, None, (None, E, None)], ids=repr)
def test_getitem_on_0d(index):
    x = np.asarray(np.float32(2.5))
    assert_bitexact(traced(lambda t: t[index])(x), x[index])


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), dtype=dtype_names, seed=seeds, data=st.data())
def test_getitem_random(shape, dtype, seed, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    index = data.draw(index_for(shape))
    assert_bitexact(traced(lambda t: t[index])(x), x[index])


def test_chained_slices_in_one_kernel():
    x = rand(np.random.default_rng(6), (6, 7, 8), "bfloat16")

    @op.kernel
    def f(t):
        return t[1:, None, ..., ::2][..., -2, 1:][:, :, ::3]

    assert_bitexact(f(x), x[1:, None, ..., ::2][..., -2, 1:][:, :, ::3])


@pytest.mark.parametrize("index", [slice(None, None, -1), (0, slice(3, 0, -1)), (E, slice(None, None, -2)),
                                   (slice(2, None, -1), slice(-1, 0, -3)), (slice(0, 1, -1),), (slice(1, 2, -1), 0)],
                         ids=repr)
def test_negative_steps_read_backwards(index):
    x = rand(np.random.default_rng(7), (3, 4), "float32")
    assert_bitexact(traced(lambda t: t[index])(x), x[index])
    assert op.tensor((3, 4), "float32")[index].shape == x[index].shape


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (2, 0, 1)], ids=repr)
def test_flip_values(axis):
    x = rand(np.random.default_rng(8), (3, 1, 5), "bfloat16")
    assert_bitexact(op.flip(x, axis), np.flip(x, axis))
    assert_bitexact(traced(lambda t: op.flip(t, axis))(x), np.flip(x, axis))


def test_flip_of_size_one_axes_adds_no_node():
    t = op.tensor((3, 1), "float32")
    assert op.flip(t, 1) is t


def test_zero_step_raises_shape_error():
    x = rand(np.random.default_rng(7), (3, 4), "float32")
    with pytest.raises(ShapeError):
        op.tensor((3, 4), "float32")[::0]
    with pytest.raises(ShapeError):
        traced(lambda t: t[:, 1:3:0])(x)


@pytest.mark.parametrize("index", [(0, 0, 0), (0, 1, 2, 3), (E, 0, 0, 0), (None, 0, slice(None), 1)],
                         ids=repr)
def test_too_long_index_raises_shape_error(index):
    x = rand(np.random.default_rng(8), (3, 4), "int32")
    with pytest.raises(ShapeError) as info:
        traced(lambda t: t[index])(x)
    assert "getitem" in str(info.value)
    with pytest.raises(ShapeError):
        op.tensor((3, 4), "int32")[index]


@pytest.mark.parametrize("index", [3, -4, (0, 4), (E, -5)], ids=repr)
def test_out_of_range_int_raises_shape_error(index):
    x = rand(np.random.default_rng(9), (3, 4), "float32")
    with pytest.raises(IndexError):
        x[index]
    with pytest.raises(ShapeError):
        traced(lambda t: t[index])(x)


def test_two_ellipses_raise_shape_error():
    with pytest.raises(ShapeError):
        op.tensor((3, 4), "float32")[E, 0, E]


# ---- tril / triu ----------------------------------------------------------------------------

@SETTINGS
@given(shape=st.lists(dims, min_size=2, max_size=4).map(tuple), dtype=dtype_names, seed=seeds,
       k=st.integers(-6, 6), upper=st.booleans())
def test_tril_triu_values(shape, dtype, seed, k, upper):
    x = rand(np.random.default_rng(seed), shape, dtype)
    ours, ref = (op.triu, np.triu) if upper else (op.tril, np.tril)
    both(lambda t: ours(t, k=k), x, ref(x, k))


def test_tril_needs_rank_2():
    with pytest.raises(ShapeError):
        op.tril(np.ones(3, np.float32))


# ---- where / cast ---------------------------------------------------------------------------

@SETTINGS
@given(shape=st.lists(st.integers(1, 4), max_size=3).map(tuple), dtype=dtype_names, seed=seeds, data=st.data())
def test_where_values(shape, dtype, seed, data):
    rng = np.random.default_rng(seed)
    cshape = tuple(1 if data.draw(st.booleans()) else d for d in shape)
    yshape = shape[data.draw(st.integers(0, len(shape))):]
    cond, x, y = rand(rng, cshape, "bool"), rand(rng, shape, dtype), rand(rng, yshape, dtype)
    want = np.where(cond, x, y)
    assert_bitexact(op.where(cond, x, y), want)

    @op.kernel
    def f(c, a, b):
        return op.where(c, a, b)

    assert_bitexact(f(cond, x, y), want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_where_with_python_scalar(dtype):
    rng = np.random.default_rng(10)
    x = rand(rng, (3, 4), dtype)
    assert_bitexact(traced(lambda t: op.where(t > 0, t, -float("inf")))(x),
                    np.where(x > 0, x, np.asarray(-np.inf, x.dtype)))
    assert_bitexact(op.where(x < 0, 0.5, x), np.where(x < 0, np.asarray(0.5, x.dtype), x))


@pytest.mark.parametrize("cond", [True, np.bool_(False)], ids=repr)
def test_where_with_scalar_bool_condition(cond):
    x = rand(np.random.default_rng(15), (2, 3), "float32")
    y = rand(np.random.default_rng(16), (2, 3), "float32")
    assert_bitexact(op.where(cond, x, y), np.where(cond, x, y))


CASTS = [("float32", "bfloat16"), ("float32", "float16"), ("float32", "int32"), ("float32", "bool"),
         ("float32", "float64"), ("float32", "float8_e4m3"), ("float32", "float8_e5m2"),
         ("bfloat16", "float32"), ("bfloat16", "int32"), ("bfloat16", "float16"), ("int32", "float32"),
         ("int32", "bfloat16"), ("int32", "int64"), ("int32", "bool"), ("bool", "int32"), ("bool", "float32"),
         ("bool", "bfloat16"), ("float64", "bfloat16")]
NP_OF = {"float64": np.dtype(np.float64), "float16": np.dtype(np.float16), "int64": np.dtype(np.int64),
         "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
         **DTYPES}


@pytest.mark.parametrize("src, dst", CASTS)
def test_cast_values(src, dst):
    rng = np.random.default_rng(11)
    x = rand(rng, (5, 7), NP_OF[src])
    if src in ("float32", "float64", "bfloat16"):
        x = (x * 20).astype(NP_OF[src])  # several integer parts for the int casts, within fp8 range
    want = x.astype(NP_OF[dst])
    both(lambda t: op.cast(t, dst), x, want)


@pytest.mark.parametrize("alias, dst", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32"),
                                        ("fp8_e4m3", "float8_e4m3"), ("fp64", "float64")])
def test_cast_aliases(alias, dst):
    x = rand(np.random.default_rng(12), (4,), "float32")
    assert_bitexact(op.cast(x, alias), x.astype(NP_OF[dst]))


# ---- creation: full / ones / zeros / arange -------------------------------------------------

@SETTINGS
@given(shape=st.lists(dims, max_size=3).map(tuple), dtype=dtype_names, seed=seeds)
def test_full_values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    value = constant(rng, dtype)
    npdt = DTYPES[dtype]
    assert_bitexact(op.full(shape, value, dtype), np.full(shape, value, dtype=npdt))
    assert_bitexact(op.ones(shape, dtype), np.ones(shape, dtype=npdt))
    assert_bitexact(op.zeros(shape, dtype), np.zeros(shape, dtype=npdt))


def test_full_default_dtype_and_in_kernel():
    assert_bitexact(op.full((2, 3), 1.25), np.full((2, 3), 1.25, np.float32))
    x = rand(np.random.default_rng(13), (2, 3), "bfloat16")
    assert_bitexact(traced(lambda t: t + op.full((2, 3), 0.5, "bf16"))(x), (x.astype(np.float32) + 0.5).astype(BF16))


def test_full_casts_value_like_numpy():
    assert_bitexact(op.full((3,), 2.7, "int32"), np.full((3,), 2.7).astype(np.int32))
    assert_bitexact(op.full((3,), -2.7, "int32"), np.full((3,), -2.7).astype(np.int32))
    assert_bitexact(op.full((2,), 0.5, "bool"), np.full((2,), True))


@SETTINGS
@given(start=st.integers(-20, 20), stop=st.integers(-20, 20), step=st.integers(-5, 5).filter(bool),
       one_arg=st.booleans())
def test_arange_int_values(start, stop, step, one_arg):
    if one_arg:
        assert_bitexact(op.arange(stop), np.arange(stop, dtype=np.int64))
    else:
        assert_bitexact(op.arange(start, stop, step), np.arange(start, stop, step, dtype=np.int64))
        assert_bitexact(op.arange(start, stop, step, dtype="int32"), np.arange(start, stop, step, dtype=np.int32))


@SETTINGS
@given(start=st.integers(-40, 40), length=st.integers(-3, 40), step=st.sampled_from([0.5, 0.25, -0.5, 1.5, 0.3, -0.7]))
def test_arange_float_values(start, length, step):
    start = start / 4
    stop = start + length * step + step / 3
    want = np.arange(start, stop, step)
    got = op.arange(start, stop, step)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-5)
    got_bf = op.arange(start, stop, step, dtype="bf16")
    assert got_bf.dtype == BF16 and got_bf.shape == want.shape
    np.testing.assert_allclose(got_bf.astype(np.float32), want.astype(BF16).astype(np.float32), rtol=1e-2, atol=0.05)


def test_arange_exact_small_steps():
    assert_bitexact(op.arange(0, 4, 0.5), np.arange(0, 4, 0.5).astype(np.float32))
    assert_bitexact(op.arange(-2, 2, 0.25, dtype="bf16"), np.arange(-2, 2, 0.25).astype(BF16))
    assert_bitexact(op.arange(5, dtype="float32"), np.arange(5, dtype=np.float32))


def test_arange_in_kernel():
    x = rand(np.random.default_rng(14), (6,), "int32")
    assert_bitexact(traced(lambda t: t + op.arange(6, dtype="int32"))(x), x + np.arange(6, dtype=np.int32))


def test_arange_zero_step_rejected():
    with pytest.raises(TesseraError):
        op.arange(0, 5, 0)
