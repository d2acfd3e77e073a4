"""Shape and dtype inference on op.tensor placeholders, checked against numpy on random shapes:
broadcasting of the elementwise ops and where, matmul, and dtype promotion.

Every expected shape comes from numpy itself (np.broadcast_shapes, or the op run on zeros), so a
wrong shape rule shows up as a mismatch rather than as a restatement of the rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera_rw import DTypeError, ShapeError, TesseraError, op
from tests.algebra.shape_helpers import SETTINGS, check_spec, dims, pos_dims, ph

FEW = settings(max_examples=30, deadline=None)

BINARY = [op.add, op.subtract, op.multiply, op.divide, op.power, op.maximum, op.minimum,
          op.equal, op.not_equal, op.less, op.less_equal, op.greater, op.greater_equal]
COMPARE = {op.equal, op.not_equal, op.less, op.less_equal, op.greater, op.greater_equal}


def short(shape, dtype="f32") -> str:
    """The operand form errors print: f32[2,3]."""
    return f"{dtype}[{','.join(map(str, shape))}]"


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


@pytest.mark.parametrize("operands, accum, ok", [("bf16", "fp32", True), ("float32", "float32", True),
                                                  ("float64", "fp64", True), ("bf16", "bf16", False),
                                                  ("float16", "fp16", False), ("float32", "fp64", False)])
def test_matmul_takes_the_accumulators_its_kernels_have(operands, accum, ok):
    a, b = ph((4, 8), operands), ph((8, 2), operands)
    if ok:
        assert op.matmul(a, b, accum_dtype=accum).shape == (4, 2)
    else:
        with pytest.raises(DTypeError, match="matmul: accum_dtype=.* they accumulate in float32"):
            op.matmul(a, b, accum_dtype=accum)


def test_matmul_rejects_0d():
    with pytest.raises(ShapeError):
        op.matmul(ph(()), ph((3,)))


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
