"""Values of the layout ops against numpy on random data.

Layout ops (transpose, swapaxes, reshape, broadcast_to, squeeze/expand_dims, pad, concatenate) must
be bit-exact: same dtype, same shape, same bytes. Each case runs both eagerly on numpy arrays and
through a traced @op.kernel, since both go through the graph executor.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera_rw import AttributeValueError, ShapeError, op
from tests.algebra.layout_helpers import (
    SETTINGS, assert_bitexact, both, constant, dims, dtype_names, factor, pos_dims, rand, seeds,
)


# ---- transpose / swapaxes / reshape / broadcast_to / squeeze / expand_dims ------------------

@SETTINGS
@given(shape=st.lists(dims, max_size=4).map(tuple), dtype=dtype_names, seed=seeds, data=st.data())
def test_transpose_values(shape, dtype, seed, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    n = len(shape)
    perm = data.draw(st.permutations(range(n)))
    perm = tuple(p - n if data.draw(st.booleans()) else p for p in perm)
    both(lambda t: op.transpose(t, perm), x, np.transpose(x, perm))
    both(lambda t: op.transpose(t), x, x.T)


@SETTINGS
@given(shape=st.lists(pos_dims, min_size=1, max_size=4).map(tuple), dtype=dtype_names, seed=seeds,
       data=st.data())
def test_swapaxes_values(shape, dtype, seed, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    n = len(shape)
    a, b = data.draw(st.integers(-n, n - 1)), data.draw(st.integers(-n, n - 1))
    both(lambda t: op.swapaxes(t, a, b), x, np.swapaxes(x, a, b))


def test_mT_and_T_in_kernel():
    x = rand(np.random.default_rng(1), (2, 3, 4), "float32")

    @op.kernel
    def f(t):
        return t.mT, t.T

    mt, tt = f(x)
    assert_bitexact(mt, np.swapaxes(x, -1, -2))
    assert_bitexact(tt, x.T)


@SETTINGS
@given(shape=st.lists(pos_dims, max_size=4).map(tuple), dtype=dtype_names, seed=seeds, data=st.data())
def test_reshape_values(shape, dtype, seed, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    rank = data.draw(st.integers(1, 4))
    target = [1] * rank
    for f in factor(math.prod(shape)):
        target[data.draw(st.integers(0, rank - 1))] *= f
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, rank - 1))] = -1
    target = tuple(target)
    both(lambda t: op.reshape(t, target), x, np.reshape(x, target))


def test_reshape_after_transpose_is_c_order():
    """A reshape of a transposed tensor reads it in its logical (not storage) order."""
    x = rand(np.random.default_rng(2), (2, 3, 4), "bfloat16")
    both(lambda t: op.reshape(op.transpose(t, (2, 0, 1)), (4, -1)), x, np.transpose(x, (2, 0, 1)).reshape(4, -1))


@SETTINGS
@given(shape=st.lists(st.sampled_from([1, 2, 3]), max_size=3).map(tuple), dtype=dtype_names, seed=seeds,
       data=st.data())
def test_broadcast_to_values(shape, dtype, seed, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    lead = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    target = lead + tuple(data.draw(st.integers(1, 4)) if d == 1 else d for d in shape)
    both(lambda t: op.broadcast_to(t, target), x, np.broadcast_to(x, target))


@SETTINGS
@given(shape=st.lists(st.sampled_from([1, 1, 2, 3]), max_size=4).map(tuple), dtype=dtype_names, seed=seeds,
       data=st.data())
def test_squeeze_expand_dims_values(shape, dtype, seed, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    both(lambda t: op.expand_dims(t, axis), x, np.expand_dims(x, axis))
    ones = tuple(i for i, d in enumerate(shape) if d == 1)
    both(lambda t: op.squeeze(t), x, np.squeeze(x))
    if ones:
        both(lambda t: op.squeeze(t, ones[-1]), x, np.squeeze(x, ones[-1]))


# ---- pad ------------------------------------------------------------------------------------

@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), dtype=dtype_names, seed=seeds,
       form=st.sampled_from(["int", "pair", "per_axis", "default"]), data=st.data())
def test_pad_values(shape, dtype, seed, form, data):
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, dtype)
    small = st.integers(0, 3)
    if form == "int":
        pw = data.draw(small)
    elif form == "pair":
        pw = (data.draw(small), data.draw(small))
    else:
        pw = tuple((data.draw(small), data.draw(small)) for _ in shape)
    if form == "default":
        both(lambda t: op.pad(t, pw), x, np.pad(x, pw))
    else:
        cv = constant(rng, dtype)
        both(lambda t: op.pad(t, pw, constant_values=cv), x, np.pad(x, pw, constant_values=cv))


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), dtype=dtype_names, seed=seeds,
       mode=st.sampled_from(["edge", "reflect", "symmetric", "wrap"]), data=st.data())
def test_pad_modes_that_read_the_array_match_numpy(shape, dtype, seed, mode, data):
    x = rand(np.random.default_rng(seed), shape, dtype)
    limit = {"reflect": lambda n: n - 1, "edge": lambda n: n + 3}.get(mode, lambda n: n)   # edge: a broadcast
    pw = tuple((data.draw(st.integers(0, limit(n))), data.draw(st.integers(0, limit(n)))) for n in shape)
    both(lambda t: op.pad(t, pw, mode=mode), x, np.pad(x, pw, mode=mode))


def test_pad_mode_errors_say_what_fits():
    x = rand(np.random.default_rng(5), (2, 3), "float32")
    with pytest.raises(AttributeValueError, match="mode 'reflect' pads axis 0 of length 2 by \\(2, 2\\): at most 1"):
        op.pad(x, 2, mode="reflect")
    with pytest.raises(AttributeValueError, match="not a padding mode") as e:
        op.pad(x, 1, mode="median")
    assert "'wrap'" in e.value.hint
    with pytest.raises(AttributeValueError, match="constant_values applies to mode 'constant'"):
        op.pad(x, 1, mode="edge", constant_values=1.0)
    with pytest.raises(AttributeValueError, match="constant_values applies to mode 'constant'"):
        op.pad(x, 1, mode="wrap", constant_values=np.array([1.0, 2.0]))
    with pytest.raises(AttributeValueError, match="an empty axis has nothing to copy"):
        op.pad(np.zeros((0, 3), np.float32), 1, mode="edge")
    assert op.pad(np.zeros((0, 3), np.float32), ((0, 0), (1, 1)), mode="reflect").shape == (0, 5)


def test_pad_bf16_constant_is_rounded_like_numpy():
    x = rand(np.random.default_rng(3), (2, 3), "bfloat16")
    both(lambda t: op.pad(t, ((1, 0), (2, 1)), constant_values=0.1), x,
         np.pad(x, ((1, 0), (2, 1)), constant_values=0.1))


def test_pad_rejects_negative_widths():
    x = rand(np.random.default_rng(4), (2, 3), "float32")
    with pytest.raises(AttributeValueError):
        op.pad(x, ((1, -1), (0, 0)))


def test_pad_int64_keeps_large_constant_exact():
    x = np.array([[1, 2], [3, 4]], np.int64)
    big = 2**53 + 1
    assert_bitexact(op.pad(x, 1, constant_values=big), np.pad(x, 1, constant_values=big))


# ---- concatenate ----------------------------------------------------------------------------

@SETTINGS
@given(shape=st.lists(pos_dims, min_size=1, max_size=3).map(tuple), dtype=dtype_names, seed=seeds,
       data=st.data())
def test_concatenate_values(shape, dtype, seed, data):
    rng = np.random.default_rng(seed)
    n = len(shape)
    axis = data.draw(st.integers(-n, n - 1))
    sizes = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    parts = [rand(rng, shape[:axis % n] + (s,) + shape[axis % n + 1:], dtype) for s in sizes]
    want = np.concatenate(parts, axis=axis)
    assert_bitexact(op.concatenate(parts, axis=axis), want)
    if len(parts) == 2:
        @op.kernel
        def f(a, b):
            return op.concatenate([a, b], axis=axis)
        assert_bitexact(f(*parts), want)


# ---- scalar operands ------------------------------------------------------------------------

@pytest.mark.parametrize("call, ref", [
    (lambda v: op.broadcast_to(v, (3,)), lambda v: np.broadcast_to(v, (3,))),
    (lambda v: op.reshape(v, (1, 1)), lambda v: np.reshape(v, (1, 1))),
    (lambda v: op.expand_dims(v, 0), lambda v: np.expand_dims(v, 0)),
    (lambda v: op.pad(v, 0), lambda v: np.pad(v, 0)),
    (lambda v: op.transpose(v), lambda v: np.transpose(v)),
    (lambda v: op.squeeze(v), lambda v: np.squeeze(v)),
    (lambda v: op.getitem(v, (None, Ellipsis)), lambda v: np.asarray(v)[None, ...]),
], ids=["broadcast_to", "reshape", "expand_dims", "pad", "transpose", "squeeze", "getitem"])
def test_layout_ops_on_numpy_scalar(call, ref):
    v = np.float32(2.5)
    assert_bitexact(np.asarray(call(v)), np.asarray(ref(v)))


def test_concatenate_joins_tensors_of_several_dtypes_in_the_one_they_promote_to():
    a, b = np.ones((2, 3), ml_dtypes.bfloat16), np.full((1, 3), 0.1, np.float32)
    want = np.concatenate([a.astype(np.float32), b])
    for got in (op.concatenate([a, b]), op.kernel(lambda a, b: op.concatenate([a, b]))(a, b)):
        assert got.dtype == np.float32
        assert_bitexact(got, want)


def test_concatenate_scalars_raises_tessera_error():
    with pytest.raises(ValueError):
        np.concatenate([np.float32(1.0), np.float32(2.0)])
    with pytest.raises(ShapeError):
        op.concatenate([np.float32(1.0), np.float32(2.0)])
