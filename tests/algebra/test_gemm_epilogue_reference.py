"""The gemm op's reference and shape rules for its activation-derivative epilogues: d<act> gives
(scale · a @ b + bias) · act'(aux), act' agreeing with central differences of the activation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.elementwise import activation_derivative
from tessera_rw.algebra.ops.fused_gemm import ACTIVATIONS, DERIVATIVES, epilogue_operands

GEMM = OPS["gemm"]
ATTRS = dict(scale=1.0, has_bias=False, has_residual=False, accum_dtype=None, dtype=DType.float64)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(DERIVATIVES.values())), st.integers(0, 2 ** 31))
def test_the_derivative_is_the_slope_of_the_activation(name, seed):
    x = np.random.default_rng(seed).uniform(-4, 4, size=64)
    x = x[np.abs(x) > 1e-3]                       # relu has no slope at its kink
    h = 1e-6
    slope = (ACTIVATIONS[name](x + h) - ACTIVATIONS[name](x - h)) / (2 * h)
    np.testing.assert_allclose(activation_derivative(name, x), slope, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("activation", sorted(DERIVATIVES))
def test_a_derivative_epilogue_multiplies_the_product_by_act_prime_of_aux(activation):
    rng = np.random.default_rng(3)
    a, b, bias, aux, res = (rng.standard_normal(s) for s in ((2, 5, 4), (4, 6), (6,), (2, 5, 6), (5, 6)))
    got = GEMM.reference(a, b, bias, aux, res, **ATTRS | dict(scale=0.5, has_bias=True, has_residual=True),
                         activation=activation)
    want = (0.5 * (a @ b) + bias) * activation_derivative(DERIVATIVES[activation], aux) + res
    np.testing.assert_allclose(got, want, rtol=1e-12)
    types = [TensorType(t.shape, DType.float64) for t in (a, b, bias, aux, res)]
    out = GEMM.infer(*types, **ATTRS | dict(has_bias=True, has_residual=True), activation=activation)
    assert out == TensorType((2, 5, 6), DType.float64)


def test_the_epilogue_operands_come_in_order_bias_aux_residual():
    assert epilogue_operands(True, "dgelu", True) == ("bias", "aux", "residual")
    assert epilogue_operands(False, "dsilu", False) == ("aux",)
    assert epilogue_operands(True, "gelu", False) == ("bias",)


def test_errors_name_the_missing_operand_and_the_activations():
    f = TensorType((8, 8), DType.float32)
    with pytest.raises(ShapeError, match=r"expects 1 epilogue operand\(s\) \['aux'\], got 0"):
        GEMM.infer(f, f, **ATTRS, activation="dgelu")
    with pytest.raises(ShapeError, match="aux .* does not broadcast"):
        GEMM.infer(f, f, TensorType((8, 9), DType.float32), **ATTRS, activation="drelu")
    with pytest.raises(AttributeValueError, match="dgelu"):
        GEMM.infer(f, f, **ATTRS, activation="dtanh")
