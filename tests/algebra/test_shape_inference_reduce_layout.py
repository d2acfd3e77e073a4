"""Shape and dtype inference on op.tensor placeholders, checked against numpy on random shapes:
reductions and softmax, and the layout ops (transpose, reshape, concatenate, squeeze/expand_dims,
broadcast_to, pad, getitem).

Every expected shape comes from numpy itself (the op run on zeros), so a wrong shape rule shows up
as a mismatch rather than as a restatement of the rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tessera_rw import AttributeValueError, AxisError, DTypeError, ShapeError, op
from tests.algebra.layout_helpers import factor, index_for
from tests.algebra.shape_helpers import SETTINGS, check_spec, dims, pos_dims, ph

shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
pos_shapes = st.lists(pos_dims, min_size=0, max_size=4).map(tuple)


# ---- reductions -----------------------------------------------------------------------------

@st.composite
def reduction_case(draw, positive=False):
    shape = draw(pos_shapes if positive else shapes)
    ndim = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]) if ndim else st.sampled_from(["none", "tuple"]))
    if kind == "none":
        axis = None
    elif kind == "int":
        a = draw(st.integers(0, ndim - 1))
        axis = a - ndim if draw(st.booleans()) else a
    else:
        chosen = draw(st.lists(st.integers(0, max(ndim - 1, 0)), unique=True, max_size=ndim)) if ndim else []
        axis = tuple(a - ndim if draw(st.booleans()) else a for a in chosen)
    return shape, axis, draw(st.booleans())


@pytest.mark.parametrize("keepdims", ["no", 2, None, 0.5])
def test_keepdims_is_true_or_false_not_any_truthy_value(keepdims):
    with pytest.raises(AttributeValueError, match=r"sum: keepdims must be True or False"):
        op.sum(ph((2, 3)), axis=0, keepdims=keepdims)
    assert op.sum(ph((2, 3)), axis=0, keepdims=np.True_).shape == (1, 3)
    assert op.sum(ph((2, 3)), axis=0, keepdims=0).shape == (3,)


@pytest.mark.parametrize("causal", ["no", "yes", 2, None])
def test_attention_causal_is_true_or_false_not_any_truthy_value(causal):
    q = ph((1, 2, 8, 4))
    with pytest.raises(AttributeValueError, match=r"flash_attention: causal must be True or False"):
        op.flash_attention(q, q, q, causal=causal)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), True, "0.1"])
def test_attention_scale_is_a_finite_number(scale):
    q = ph((1, 2, 8, 4))
    with pytest.raises(AttributeValueError, match=r"flash_attention: scale must be a finite number"):
        op.flash_attention(q, q, q, scale=scale)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("eps", [float("inf"), float("nan"), -1e-5, True])
def test_a_norms_eps_is_a_finite_number_not_below_zero(norm, eps):
    with pytest.raises(AttributeValueError, match=rf"{norm}: eps must be a finite number >= 0"):
        getattr(op, norm)(ph((2, 8)), eps=eps)


REDUCE_DTYPE = {  # (op, input dtype) -> result dtype
    ("sum", "float32"): "float32", ("sum", "int32"): "int64", ("sum", "bool"): "int64",
    ("sum", "bfloat16"): "bfloat16",
    ("mean", "float32"): "float32", ("mean", "int32"): "float32", ("mean", "bfloat16"): "bfloat16",
    ("max", "float32"): "float32", ("max", "int32"): "int32", ("min", "bfloat16"): "bfloat16",
    ("min", "int64"): "int64",
}


@SETTINGS
@given(case=reduction_case(), name=st.sampled_from(["sum", "mean"]))
def test_sum_mean_shapes_match_numpy(case, name):
    shape, axis, keepdims = case
    want = np.sum(np.zeros(shape), axis=axis, keepdims=keepdims).shape  # np.mean warns on empty axes
    check_spec(getattr(op, name)(ph(shape), axis=axis, keepdims=keepdims), want, "float32")


@SETTINGS
@given(case=reduction_case(positive=True), name=st.sampled_from(["max", "min"]))
def test_max_min_shapes_match_numpy(case, name):
    shape, axis, keepdims = case
    want = getattr(np, name)(np.zeros(shape), axis=axis, keepdims=keepdims).shape
    check_spec(getattr(op, name)(ph(shape, "int32"), axis=axis, keepdims=keepdims), want, "int32")


@pytest.mark.parametrize("name, dtype", sorted(REDUCE_DTYPE))
def test_reduction_dtype(name, dtype):
    out = getattr(op, name)(ph((2, 3), dtype), axis=-1)
    check_spec(out, (2,), REDUCE_DTYPE[name, dtype])


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis", [2, -3, (0, 5), (0, 0), (1, -1)])
def test_reduction_bad_axis_raises_axis_error(name, axis):
    with pytest.raises(AxisError) as info:
        getattr(op, name)(ph((4, 3)), axis=axis)
    assert str(info.value).startswith(f"{name}:"), str(info.value)
    assert isinstance(info.value, ShapeError)  # AxisError is a ShapeError


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [2, -3, 7])
def test_softmax_bad_axis_raises_axis_error(name, axis):
    with pytest.raises(AxisError) as info:
        getattr(op, name)(ph((4, 3)), axis=axis)
    assert str(info.value).startswith(f"{name}:"), str(info.value)


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), data=st.data())
def test_softmax_keeps_shape_and_dtype(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    check_spec(op.softmax(ph(shape, dtype), axis=axis), shape, dtype)


def test_softmax_rejects_integers():
    with pytest.raises(DTypeError, match="softmax"):
        op.softmax(ph((2, 3), "int32"))


@pytest.mark.parametrize("a, b", [(0, 2), (-3, 0), (1, 5)])
def test_swapaxes_bad_axis_raises_axis_error(a, b):
    with pytest.raises(AxisError) as info:
        op.swapaxes(ph((4, 3)), a, b)
    assert str(info.value).startswith("swapaxes:"), str(info.value)


# ---- transpose / swapaxes -------------------------------------------------------------------

@SETTINGS
@given(shape=shapes, data=st.data())
def test_transpose_random_permutation(shape, data):
    n = len(shape)
    perm = data.draw(st.permutations(range(n)))
    perm = tuple(p - n if data.draw(st.booleans()) else p for p in perm)
    want = np.transpose(np.zeros(shape), perm).shape
    check_spec(op.transpose(ph(shape, "bf16"), perm), want, "bfloat16")
    check_spec(op.transpose(ph(shape)), np.zeros(shape).T.shape, "float32")


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), data=st.data())
def test_swapaxes_matches_numpy(shape, data):
    n = len(shape)
    a, b = data.draw(st.integers(-n, n - 1)), data.draw(st.integers(-n, n - 1))
    check_spec(op.swapaxes(ph(shape, "int32"), a, b), np.swapaxes(np.zeros(shape), a, b).shape, "int32")


@pytest.mark.parametrize("axes", [(0, 0, 1), (0, 1), (0, 1, 2, 3)])
def test_transpose_rejects_non_permutation(axes):
    with pytest.raises((AxisError, AttributeValueError)) as info:
        op.transpose(ph((2, 3, 4)), axes)
    assert "transpose" in str(info.value)


def test_transpose_out_of_range_axis():
    with pytest.raises(AxisError):
        op.transpose(ph((2, 3, 4)), (0, 1, 3))


# ---- reshape --------------------------------------------------------------------------------

@st.composite
def reshape_case(draw):
    shape = draw(st.lists(pos_dims, min_size=0, max_size=4).map(tuple))
    numel = math.prod(shape)
    rank = draw(st.integers(1, 4))
    target = [1] * rank
    for f in factor(numel):
        target[draw(st.integers(0, rank - 1))] *= f
    if draw(st.booleans()):
        target[draw(st.integers(0, rank - 1))] = -1
    return shape, tuple(target)


@SETTINGS
@given(case=reshape_case())
def test_reshape_matches_numpy(case):
    shape, target = case
    want = np.reshape(np.zeros(shape), target).shape
    check_spec(op.reshape(ph(shape, "bool"), target), want, "bool")


def test_reshape_minus_one_with_zero_size():
    check_spec(op.reshape(ph((0, 3)), (-1, 3)), (0, 3), "float32")
    check_spec(op.reshape(ph((2, 0, 3)), (3, -1)), (3, 0), "float32")


@pytest.mark.parametrize("shape, target", [((2, 3), (4, -1)), ((2, 3), (-1, -1)), ((2, 3), (7,)),
                                           ((2, 3), (-2, -3)), ((6,), (4, 2))])
def test_reshape_bad_target_raises(shape, target):
    with pytest.raises(ValueError):
        np.reshape(np.zeros(shape), target)
    with pytest.raises(ShapeError) as info:
        op.reshape(ph(shape), target)
    assert "reshape" in str(info.value)


# ---- concatenate / squeeze / expand_dims / broadcast_to / pad / getitem ---------------------

@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), data=st.data())
def test_concatenate_matches_numpy(shape, data):
    n = len(shape)
    axis = data.draw(st.integers(-n, n - 1))
    sizes = data.draw(st.lists(dims, min_size=1, max_size=4))
    parts = [shape[:axis % n] + (s,) + shape[axis % n + 1:] for s in sizes]
    want = np.concatenate([np.zeros(p) for p in parts], axis=axis).shape
    check_spec(op.concatenate([ph(p, "int64") for p in parts], axis=axis), want, "int64")


def test_concatenate_errors():
    with pytest.raises(ShapeError):
        op.concatenate([ph((2, 3)), ph((3, 3))], axis=1)
    with pytest.raises(ShapeError):
        op.concatenate([ph((2, 3)), ph((2, 3, 1))], axis=0)
    with pytest.raises(AxisError) as info:
        op.concatenate([ph((2, 3)), ph((2, 3))], axis=2)
    assert "concatenate" in str(info.value)


@SETTINGS
@given(shape=shapes, data=st.data())
def test_expand_dims_matches_numpy(shape, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check_spec(op.expand_dims(ph(shape), axis), np.expand_dims(np.zeros(shape), axis).shape, "float32")


def test_expand_dims_bad_axis():
    with pytest.raises(AxisError):
        op.expand_dims(ph((2, 3)), 3)
    with pytest.raises(AxisError):
        op.expand_dims(ph((2, 3)), -4)


@SETTINGS
@given(shape=st.lists(st.sampled_from([1, 1, 2, 3]), max_size=5).map(tuple), data=st.data())
def test_squeeze_matches_numpy(shape, data):
    ones = [i for i, d in enumerate(shape) if d == 1]
    if data.draw(st.booleans()) or not ones:
        axis = None
    else:
        chosen = data.draw(st.lists(st.sampled_from(ones), unique=True, min_size=1))
        axis = tuple(a - len(shape) if data.draw(st.booleans()) else a for a in chosen)
        if len(axis) == 1 and data.draw(st.booleans()):
            axis = axis[0]
    check_spec(op.squeeze(ph(shape, "bf16"), axis), np.squeeze(np.zeros(shape), axis).shape, "bfloat16")


def test_squeeze_non_unit_axis_raises():
    with pytest.raises(ShapeError):
        op.squeeze(ph((1, 3)), axis=1)
    with pytest.raises(AxisError):
        op.squeeze(ph((1, 3)), axis=2)


@SETTINGS
@given(shape=shapes, data=st.data())
def test_broadcast_to_matches_numpy(shape, data):
    lead = tuple(data.draw(st.lists(dims, max_size=2)))
    target = lead + tuple(data.draw(dims) if d == 1 else d for d in shape)
    check_spec(op.broadcast_to(ph(shape, "int32"), target),
               np.broadcast_to(np.zeros(shape), target).shape, "int32")


@pytest.mark.parametrize("shape, target", [((2, 3), (2, 4)), ((2, 3), (3,)), ((3,), (3, 2))])
def test_broadcast_to_bad_target_raises(shape, target):
    with pytest.raises(ValueError):
        np.broadcast_to(np.zeros(shape), target)
    with pytest.raises(ShapeError):
        op.broadcast_to(ph(shape), target)


@SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), data=st.data())
def test_pad_shape_matches_numpy(shape, data):
    n = len(shape)
    form = data.draw(st.sampled_from(["int", "pair", "per_axis"]))
    small = st.integers(0, 3)
    if form == "int":
        pw = data.draw(small)
    elif form == "pair":
        pw = (data.draw(small), data.draw(small))
    else:
        pw = tuple((data.draw(small), data.draw(small)) for _ in range(n))
    check_spec(op.pad(ph(shape), pw), np.pad(np.zeros(shape), pw).shape, "float32")


@SETTINGS
@given(shape=st.lists(dims, min_size=0, max_size=4).map(tuple), data=st.data())
def test_placeholder_getitem_shape_matches_numpy(shape, data):
    index = data.draw(index_for(shape))
    check_spec(ph(shape)[index], np.zeros(shape)[index].shape, "float32")
    check_spec(op.getitem(ph(shape, "bf16"), index), np.zeros(shape)[index].shape, "bfloat16")
