"""Shape and dtype inference on op.tensor placeholders, checked against numpy on random shapes.

Every expected shape comes from numpy itself (np.broadcast_shapes, or the op run on zeros), so a
wrong shape rule shows up as a mismatch rather than as a restatement of the rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera_rw import AttributeValueError, AxisError, DType, DTypeError, ShapeError, TesseraError, op

SETTINGS = settings(max_examples=60, deadline=None)
FEW = settings(max_examples=30, deadline=None)

BINARY = [op.add, op.subtract, op.multiply, op.divide, op.power, op.maximum, op.minimum,
          op.equal, op.not_equal, op.less, op.less_equal, op.greater, op.greater_equal]
COMPARE = {op.equal, op.not_equal, op.less, op.less_equal, op.greater, op.greater_equal}
Spec = type(op.tensor((1,), "float32"))

dims = st.integers(min_value=0, max_value=5)
pos_dims = st.integers(min_value=1, max_value=5)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
pos_shapes = st.lists(pos_dims, min_size=0, max_size=4).map(tuple)


def ph(shape, dtype="float32"):
    return op.tensor(tuple(shape), dtype)


def short(shape, dtype="f32") -> str:
    """The operand form errors print: f32[2,3]."""
    return f"{dtype}[{','.join(map(str, shape))}]"


def check_spec(result, shape, dtype):
    assert isinstance(result, Spec), f"expected a placeholder, got {type(result).__name__}"
    assert isinstance(result.shape, tuple)
    assert result.shape == tuple(shape), f"shape {result.shape} != numpy's {tuple(shape)}"
    assert isinstance(result.dtype, DType)
    assert str(result.dtype) == dtype, f"dtype {result.dtype} != {dtype}"


# ---- broadcasting ---------------------------------------------------------------------------

@st.composite
def broadcastable_pair(draw):
    """Two shapes that broadcast: each drops some leading axes of a base and sets some axes to 1."""
    base = draw(st.lists(dims, min_size=0, max_size=5))

    def derive():
        keep = draw(st.integers(0, len(base)))
        tail = base[len(base) - keep:]
        return tuple(1 if draw(st.booleans()) else d for d in tail)

    return derive(), derive()


@SETTINGS
@given(pair=broadcastable_pair(), fn=st.sampled_from(BINARY), swap=st.booleans())
def test_binary_broadcast_matches_numpy(pair, fn, swap):
    a, b = pair[::-1] if swap else pair
    out = fn(ph(a), ph(b))
    check_spec(out, np.broadcast_shapes(a, b), "bool" if fn in COMPARE else "float32")


@SETTINGS
@given(pair=broadcastable_pair(), fn=st.sampled_from([op.add, op.multiply, op.less]))
def test_placeholder_with_array_operand_broadcasts(pair, fn):
    a, b = pair
    out = fn(ph(a), np.ones(b, np.float32))
    check_spec(out, np.broadcast_shapes(a, b), "bool" if fn in COMPARE else "float32")


@st.composite
def incompatible_pair(draw):
    a = draw(st.lists(pos_dims, min_size=1, max_size=4).map(tuple))
    # pick an aligned axis of a whose size is >= 2 (make one if needed)
    k = draw(st.integers(1, len(a)))  # axis -k
    if a[-k] < 2:
        a = a[:len(a) - k] + (draw(st.integers(2, 5)),) + a[len(a) - k + 1:]
    bad = draw(st.integers(2, 7).filter(lambda v: v != a[-k]))
    extra = draw(st.lists(pos_dims, max_size=2))
    b_tail = [draw(st.sampled_from([1, a[-j]])) for j in range(k - 1, 0, -1)]
    b = tuple(extra) + (bad,) + tuple(b_tail)
    return a, b


@SETTINGS
@given(pair=incompatible_pair(), fn=st.sampled_from(BINARY), swap=st.booleans())
def test_incompatible_broadcast_raises_shape_error(pair, fn, swap):
    a, b = pair[::-1] if swap else pair
    with pytest.raises(ValueError):
        np.broadcast_shapes(a, b)  # sanity: numpy agrees these do not broadcast
    with pytest.raises(ShapeError) as info:
        fn(ph(a), ph(b, "int32"))
    msg = str(info.value)
    assert "broadcast" in msg
    assert short(a) in msg and short(b, "i32") in msg, msg
    assert str(a) in msg and str(b) in msg, msg


def test_broadcast_error_names_the_op():
    with pytest.raises(ShapeError) as info:
        op.multiply(ph((2, 3)), ph((2,)))
    assert str(info.value).startswith("mul") or "multiply" in str(info.value).splitlines()[0]


@FEW
@given(pair=broadcastable_pair(), third=st.booleans())
def test_where_broadcasts_three_ways(pair, third):
    a, b = pair
    c = a if third else ()
    out = op.where(ph(a, "bool"), ph(b), ph(c))
    check_spec(out, np.broadcast_shapes(a, b, c), "float32")


# ---- matmul ---------------------------------------------------------------------------------

@st.composite
def matmul_shapes(draw):
    m, n, k = draw(pos_dims), draw(pos_dims), draw(pos_dims)
    batch_a, batch_b = draw(broadcastable_pair())
    batch_a, batch_b = batch_a[-3:], batch_b[-3:]
    a = (k,) if draw(st.integers(0, 4)) == 0 else batch_a + (m, k)
    b = (k,) if draw(st.integers(0, 4)) == 0 else batch_b + (k, n)
    return a, b


@SETTINGS
@given(shapes_=matmul_shapes())
def test_matmul_shape_matches_numpy(shapes_):
    a, b = shapes_
    want = np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    check_spec(op.matmul(ph(a), ph(b)), want, "float32")
    check_spec(ph(a) @ ph(b), want, "float32")


@pytest.mark.parametrize("a, b", [((3,), (3,)), ((3,), (2, 3, 4)), ((2, 5, 3), (3,)),
                                  ((4, 1, 2, 3), (5, 3, 6)), ((1, 3), (7, 3, 2))])
def test_matmul_one_d_and_batch_edge_cases(a, b):
    want = np.matmul(np.zeros(a), np.zeros(b)).shape
    check_spec(op.matmul(ph(a), ph(b)), want, "float32")


@SETTINGS
@given(shapes_=matmul_shapes(), delta=st.integers(1, 3))
def test_matmul_contraction_mismatch_raises(shapes_, delta):
    a, b = shapes_
    if len(b) == 1:
        b = (b[0] + delta,)
    else:
        b = b[:-2] + (b[-2] + delta, b[-1])
    with pytest.raises(ValueError):
        np.matmul(np.zeros(a), np.zeros(b))
    with pytest.raises(ShapeError) as info:
        op.matmul(ph(a), ph(b))
    msg = str(info.value)
    assert msg.startswith("matmul:"), msg
    assert short(a) in msg and short(b) in msg


def test_matmul_batch_mismatch_raises():
    with pytest.raises(ShapeError, match="broadcast"):
        op.matmul(ph((2, 3, 4)), ph((5, 4, 6)))


@pytest.mark.parametrize("da, db, want", [("bf16", "float32", "float32"), ("float16", "bfloat16", "float32"),
                                          ("bf16", "bf16", "bfloat16"), ("float64", "float32", "float64")])
def test_matmul_dtype(da, db, want):
    check_spec(op.matmul(ph((2, 3), da), ph((3, 4), db)), (2, 4), want)


@pytest.mark.parametrize("da, db", [("int32", "float32"), ("float32", "int64"), ("bool", "bool")])
def test_matmul_rejects_non_float(da, db):
    with pytest.raises(DTypeError, match="matmul"):
        op.matmul(ph((2, 3), da), ph((3, 4), db))


def test_matmul_rejects_0d():
    with pytest.raises(ShapeError):
        op.matmul(ph(()), ph((3,)))


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

def _factor(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


@st.composite
def reshape_case(draw):
    shape = draw(st.lists(pos_dims, min_size=0, max_size=4).map(tuple))
    numel = math.prod(shape)
    rank = draw(st.integers(1, 4))
    target = [1] * rank
    for f in _factor(numel):
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


@st.composite
def index_for(draw, shape):
    """A basic index for `shape`: ints, slices (steps >= 1, bounds possibly out of range), Nones and
    at most one Ellipsis, which may sit between explicitly indexed leading and trailing axes."""
    n = len(shape)
    lead = draw(st.integers(0, n))
    ellipsis = draw(st.booleans())
    trail = draw(st.integers(0, n - lead)) if ellipsis else 0
    axes = list(range(lead)) + list(range(n - trail, n))
    items = []
    for k, ax in enumerate(axes):
        if ellipsis and k == lead:
            items.append(Ellipsis)
        d = shape[ax]
        if d and draw(st.integers(0, 2)) == 0:
            items.append(draw(st.integers(-d, d - 1)))
        else:
            bound = st.one_of(st.none(), st.integers(-2 * d - 3, 2 * d + 3))
            items.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, 7]))))
        if draw(st.integers(0, 3)) == 0:
            items.append(None)
    if ellipsis and Ellipsis not in items:
        items.append(Ellipsis)
    if draw(st.integers(0, 4)) == 0:
        items.insert(draw(st.integers(0, len(items))), None)
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


@SETTINGS
@given(shape=st.lists(dims, min_size=0, max_size=4).map(tuple), data=st.data())
def test_placeholder_getitem_shape_matches_numpy(shape, data):
    index = data.draw(index_for(shape))
    check_spec(ph(shape)[index], np.zeros(shape)[index].shape, "float32")
    check_spec(op.getitem(ph(shape, "bf16"), index), np.zeros(shape)[index].shape, "bfloat16")


# ---- dtype promotion ------------------------------------------------------------------------

PROMOTION = [
    ("float32", "float32", "float32"), ("bfloat16", "bfloat16", "bfloat16"),
    ("bfloat16", "float32", "float32"), ("float32", "bfloat16", "float32"),
    ("float16", "bfloat16", "float32"), ("bfloat16", "float16", "float32"),
    ("float16", "float32", "float32"), ("float32", "float64", "float64"),
    ("int32", "float32", "float32"), ("int64", "bfloat16", "bfloat16"), ("float16", "int32", "float16"),
    ("int32", "int64", "int64"), ("int64", "int32", "int64"), ("int32", "int32", "int32"),
    ("bool", "int32", "int32"), ("int64", "bool", "int64"), ("bool", "bool", "bool"),
    ("bool", "float32", "float32"),
]


@pytest.mark.parametrize("fn", [op.add, op.subtract, op.multiply, op.maximum, op.minimum])
@pytest.mark.parametrize("da, db, want", PROMOTION)
def test_binary_promotion_table(fn, da, db, want):
    check_spec(fn(ph((2, 3), da), ph((3,), db)), (2, 3), want)


@pytest.mark.parametrize("da, db, want", [("int32", "int32", "float32"), ("int64", "int32", "float32"),
                                          ("int64", "int64", "float32"), ("bf16", "bf16", "bfloat16"),
                                          ("float16", "float16", "float16"), ("int32", "bf16", "bfloat16"),
                                          ("float32", "float64", "float64")])
def test_divide_promotion(da, db, want):
    check_spec(op.divide(ph((4,), da), ph((4,), db)), (4,), want)


@pytest.mark.parametrize("alias, name", [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"),
                                         ("fp8_e4m3", "float8_e4m3"), ("fp8_e5m2", "float8_e5m2"),
                                         ("fp64", "float64")])
def test_dtype_aliases(alias, name):
    assert str(ph((2,), alias).dtype) == name
    assert str(op.cast(ph((2,), "int32"), alias).dtype) == name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32", "int64", "bool"])
@pytest.mark.parametrize("fn", sorted(COMPARE, key=lambda f: f.__name__))
def test_comparisons_give_bool(dtype, fn):
    check_spec(fn(ph((3, 1), dtype), ph((4,), dtype)), (3, 4), "bool")


@pytest.mark.parametrize("dtype, scalar, want", [
    ("bfloat16", 0.5, "bfloat16"), ("float16", 3, "float16"), ("int32", 2, "int32"),
    ("int32", 2.5, "float32"), ("int64", 7, "int64"), ("float32", True, "float32"),
])
def test_python_scalar_adopts_tensor_dtype(dtype, scalar, want):
    check_spec(op.multiply(ph((2, 2), dtype), scalar), (2, 2), want)
    check_spec(op.add(scalar, ph((2, 2), dtype)), (2, 2), want)
    check_spec(ph((2, 2), dtype) * scalar, (2, 2), want)


@pytest.mark.parametrize("dx, dy, want", [("float32", "float32", "float32"), ("bf16", "float32", "float32"),
                                          ("int32", "int64", "int64"), ("bool", "int32", "int32")])
def test_where_promotes_branches(dx, dy, want):
    check_spec(op.where(ph((2, 1), "bool"), ph((3,), dx), ph((2, 3), dy)), (2, 3), want)


def test_where_needs_bool_condition():
    with pytest.raises(DTypeError):
        op.where(ph((2,), "int32"), ph((2,)), ph((2,)))


@SETTINGS
@given(da=st.sampled_from(["float32", "bfloat16", "float16", "float64", "int32", "int64", "bool"]),
       db=st.sampled_from(["float32", "bfloat16", "float16", "float64", "int32", "int64", "bool"]))
def test_promotion_is_symmetric(da, db):
    assert op.add(ph((2,), da), ph((2,), db)).dtype is op.add(ph((2,), db), ph((2,), da)).dtype


def test_unknown_dtype_raises():
    with pytest.raises(DTypeError):
        ph((2,), "float13")
    with pytest.raises(TesseraError):
        op.cast(ph((2,)), "int8")
