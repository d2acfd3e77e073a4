"""matmul_bias_grad(a, b) = [a; 1ᵀ] @ b: the product with the column sums of b as one more row."""

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import DTypeError, ShapeError, TesseraError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS

OP = OPS["matmul_bias_grad"]
RNG = np.random.default_rng(5)


def _node(a_shape, b_shape, a_dtype=DType.float32, b_dtype=DType.float32):
    return make("matmul_bias_grad", make_input("a", a_shape, a_dtype), make_input("b", b_shape, b_dtype),
                accum_dtype=None)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 5, 4), (17, 64, 9)])
def test_rows_are_the_product_then_the_column_sums(m, k, n):
    a, b = RNG.standard_normal((m, k)), RNG.standard_normal((k, n))
    out = OP.reference(a, b, accum_dtype=None)
    assert out.shape == (m + 1, n)
    np.testing.assert_allclose(out[:m], a @ b, rtol=1e-12)
    np.testing.assert_allclose(out[m], b.sum(axis=0), rtol=1e-12)


def test_type_flops_and_low_precision_evaluation():
    node = _node((6, 8), (8, 5), DType.bfloat16, DType.bfloat16)
    assert node.type == TensorType((7, 5), DType.bfloat16)
    assert OP.flops(node.type, *(x.type for x in node.args), accum_dtype=None) == 2 * 6 * 5 * 8 + 8 * 5
    a = RNG.standard_normal((6, 8)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((8, 5)).astype(ml_dtypes.bfloat16)
    (out,) = evaluate(Graph("g", node.args, (node,)), {"a": a, "b": b})
    assert out.dtype == ml_dtypes.bfloat16
    wide = np.vstack([a.astype(np.float32), np.ones((1, 8), np.float32)]) @ b.astype(np.float32)
    np.testing.assert_array_equal(out, wide.astype(ml_dtypes.bfloat16))   # one rounding, as a kernel


@pytest.mark.parametrize("a, b, error, words", [
    ((2, 3, 4), (4, 5), ShapeError, "2-d operands"),
    ((3,), (3, 5), ShapeError, "2-d operands"),
    ((3, 4), (5, 6), ShapeError, "contracts 4 with 5"),
])
def test_bad_shapes_say_what_to_do(a, b, error, words):
    with pytest.raises(error, match=words) as info:
        _node(a, b)
    text = str(info.value)
    assert text.startswith("matmul_bias_grad:") and "operands: a: f32" in text and "hint:" in text


@pytest.mark.parametrize("a_dtype, b_dtype", [(DType.float32, DType.bfloat16), (DType.int32, DType.int32)])
def test_dtypes_must_be_one_float(a_dtype, b_dtype):
    with pytest.raises(DTypeError, match="one floating-point dtype") as info:
        _node((3, 4), (4, 5), a_dtype, b_dtype)
    assert "cast" in str(info.value)


def test_it_is_a_fused_op_without_a_vjp():
    with pytest.raises(TesseraError, match="write fn with the plain ops"):
        OP.vjp(None, None)
