"""Ops with an attribute that elementwise chains take in under a name of their own (gelu, exact and
tanh, and casts between float dtypes) and a selection on a bool mask: a chain through them is one
kernel and computes what numpy does. A 16-bit softmax over a middle axis keeps its max and sum in
fp32. A cast to the dtype a tensor has already saturates."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy import special

from tessera_rw import op
from tessera_rw.algebra.ops.fused_expr import expression_name, expression_op, fused, infer_fused
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.node import TensorType
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite

BF16 = ml_dtypes.bfloat16


def kernels(kernel, *args) -> list[str]:
    return [s.op for s in kernel.program(*args).plan.steps]


def gelu(x, tanh=False):
    x = np.asarray(x, np.float64)
    if tanh:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + special.erf(x / np.sqrt(2)))


@pytest.mark.parametrize("name, op_, attrs", [("gelu", "gelu", {"approximate": "none"}),
                                              ("gelu_tanh", "gelu", {"approximate": "tanh"}),
                                              ("cast_bfloat16", "cast", {"dtype": DType.bfloat16})])
def test_an_expression_names_an_op_with_attributes_and_back(name, op_, attrs):
    assert expression_op(name) == (op_, attrs) and expression_name(op_, attrs) == name
    assert expression_name("gelu", {"approximate": "sigmoid"}) is None and expression_name("exp", {}) == "exp"


def test_an_expression_casts_where_it_says():
    x = np.array([1.00390625, -3.0], np.float32)        # 1 + 2^-8: not a bf16 value
    assert infer_fused(TensorType((2,), DType.float32), expr="cast_bfloat16($0)").dtype is DType.bfloat16
    got = fused(x, expr="mul(cast_float32(cast_bfloat16($0)),2.0:float32)")
    np.testing.assert_array_equal(got, [2.0, -6.0])


@pytest.mark.parametrize("tanh", [False, True])
def test_a_gelu_chain_is_one_kernel(tanh):
    approximate = "tanh" if tanh else "none"
    chain = op.kernel(lambda x, b: op.gelu(x + b, approximate=approximate) * 0.5)
    x, b = np.random.default_rng(1).standard_normal((2, 64, 48)).astype(np.float32), np.float32(0.25)
    assert kernels(chain, x, b) == ["fused_elementwise"]
    np.testing.assert_allclose(chain(x, b), 0.5 * gelu(x + b, tanh), rtol=1e-5, atol=1e-6)


def test_a_normalization_and_a_convolution_take_a_gelu():
    rows = op.tensor((4096, 1024), "bf16")
    assert kernels(op.kernel(lambda x: op.gelu(op.layernorm(x))), rows) == ["fused_normalization"]
    conv = op.kernel(lambda x, w, b: op.gelu(op.conv1d(x, w, padding=1) + b))
    assert kernels(conv, op.tensor((8, 64, 1024), "bf16"), op.tensor((64, 64, 3), "bf16"),
                   op.tensor((64, 1), "bf16")) == ["fused_conv"]


def test_an_upcast_compute_downcast_chain_is_one_kernel():
    mixed = op.kernel(lambda x: op.cast(op.cast(x, "float32") * 2.0 + 1.0, "bf16"))
    assert kernels(mixed, op.tensor((4096, 4096), "bf16")) == ["fused_elementwise"]
    x = np.random.default_rng(2).standard_normal((64, 96)).astype(BF16)
    got = mixed(x)
    assert got.dtype == BF16
    np.testing.assert_array_equal(got, (x.astype(np.float32) * 2 + 1).astype(BF16))


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_a_16_bit_softmax_over_a_middle_axis_keeps_its_statistics_in_fp32(dtype):
    softmax = op.kernel(lambda x: op.softmax(x * 2.0, axis=1))
    x = np.random.default_rng(3).standard_normal((16, 512, 8)).astype(dtype)
    plan = softmax.program(x).plan
    stats = [s.output.type for s in plan.steps if s.op == "fused_reduction"]
    assert stats and all(t.dtype is DType.float32 for t in stats)
    wide = x.astype(np.float64) * 2
    e = np.exp(wide - wide.max(1, keepdims=True))
    want = (e / e.sum(1, keepdims=True)).astype(dtype).astype(np.float64)
    # within one rounding of the exact softmax: a 16-bit denominator would be off by up to 2^-8
    np.testing.assert_allclose(np.asarray(softmax(x), np.float64), want, rtol=float(ml_dtypes.finfo(dtype).eps), atol=1e-6)


def test_a_selection_on_a_mask_the_caller_passes_is_one_kernel():
    masked = op.kernel(lambda m, x: op.where(m, x * 3.0, 0.0))
    rng = np.random.default_rng(4)
    m, x = rng.random((64, 96)) < 0.5, rng.standard_normal((64, 96)).astype(np.float32)
    assert kernels(masked, m, x) == ["fused_elementwise"]
    np.testing.assert_array_equal(masked(m, x), np.where(m, x * 3, 0))


REDUNDANT_CASTS = {      # .float() on what is float32 already, as model code writes it
    "an elementwise chain": (lambda x: op.exp(op.cast(x * 2.0, "float32")), (np.float32,)),
    "a softmax of scores a float32 mask promoted": (
        lambda s, m: op.softmax(op.cast(s + m, "float32"), axis=-1), (BF16, np.float32)),
    "a reduction": (lambda x: op.sum(op.cast(op.exp(op.cast(x, "float32")), "float32"), axis=-1), (np.float32,)),
}


@pytest.mark.parametrize("form", sorted(REDUNDANT_CASTS))
def test_a_cast_to_the_dtype_a_tensor_has_saturates_and_costs_no_kernel(form):
    fn, dtypes = REDUNDANT_CASTS[form]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 32, 32)).astype(dtype) for dtype in dtypes]
    kernel = op.kernel(fn)
    report = rewrite(kernel.trace(*args), BUILTIN_RULESETS).report
    assert report.stop_reason.value == "saturated", f"{report.stop_reason.value} at {report.enodes} e-nodes"
    assert len(kernels(kernel, *args)) == 1
    graph = kernel.trace(*args)
    want = evaluate(graph, dict(zip(graph.input_names, args)))[0]
    np.testing.assert_allclose(np.asarray(kernel(*args), np.float64), np.asarray(want, np.float64),
                               rtol=1e-5, atol=1e-6)
