"""A reduction of an elementwise expression is one kernel (fused_reduction): the expression is
computed as its operands are read, nothing its size is written. Rows and columns, statistics
broadcast along the walk, every reduce; an operand it cannot walk keeps the two kernels."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.reduction import ReductionTemplate
from tests.codegen.ragged_ops import of

rng = np.random.default_rng(17)


def steps(kernel, *args):
    return [s.op for s in kernel.program(*args).plan.steps]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_a_reduction_of_an_expression_is_one_kernel_and_matches_numpy(reduce):
    x, w, dy = rng.standard_normal((33, 96)), rng.standard_normal(96), rng.standard_normal((33, 96))
    k = op.kernel(lambda x, w, dy: getattr(op, reduce)(dy * w * x + 1.0, axis=-1, keepdims=True))
    assert steps(k, x, w, dy) == ["fused_reduction"]
    want = getattr(np, reduce)(dy * w * x + 1.0, axis=-1, keepdims=True)
    np.testing.assert_allclose(k(x, w, dy), want, rtol=1e-12)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_loss_s_leading_minus_is_part_of_its_reduction(reduce):
    x, y = rng.standard_normal((33, 96)), rng.standard_normal((33, 96))
    k = op.kernel(lambda x, y: -getattr(op, reduce)(x * op.log(op.abs(y) + 1.0), axis=-1))
    assert steps(k, x, y) == ["fused_reduction"]
    np.testing.assert_allclose(k(x, y), -getattr(np, reduce)(x * np.log(np.abs(y) + 1.0), axis=-1), rtol=1e-12)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_an_integer_or_bool_reduction_keeps_its_minus_outside(reduce):
    # −x wraps at int32's minimum before the wider sum (or float mean) would; bool has no minus
    x = np.array([[-2 ** 31, 1, 2], [5, -7, 9]], np.int32)
    k = op.kernel(lambda x: -getattr(op, reduce)(x, axis=-1))
    np.testing.assert_array_equal(k(x), -getattr(np, reduce)(x.astype(np.int64), axis=-1).astype(k(x).dtype))
    y = rng.standard_normal((4, 8)).astype(np.float32)
    counts = op.kernel(lambda y: -getattr(op, reduce)(y > 0.0, axis=-1))
    np.testing.assert_allclose(counts(y), -getattr(np, reduce)(y > 0.0, axis=-1), rtol=1e-6)


def test_an_entropy_is_two_kernels_the_softmax_and_a_row_kernel_summing_its_product_with_log_softmax():
    x = rng.standard_normal((33, 96)).astype(np.float32)
    k = op.kernel(lambda x: -op.sum(op.softmax(x, axis=-1) * op.log_softmax(x, axis=-1), axis=-1))
    plan = steps(k, x)         # the product, the minus and the row sum in log_softmax's row kernel
    assert plan == ["softmax", "reduced_normalization"], plan
    z = x.astype(np.float64) - x.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(k(x), -(np.exp(log_p) * log_p).sum(-1), rtol=1e-5)


def test_the_explain_report_names_the_reduction_and_what_it_fused():
    t = op.tensor((8192, 4096), "bf16")
    report = op.kernel(lambda x, y: op.sum((x - y) * (x - y), axis=0)).explain(t, t)
    kernels = report.candidates[report.chosen].kernels
    assert [(k.kind, k.fused) for k in kernels] == [("reduction", ("mul", "sub"))]


def test_a_layer_norms_weight_and_bias_gradients_reduce_without_writing_their_products():
    x, g, b, dy = (op.tensor((8192, 4096), "bf16"), op.tensor((4096,), "bf16"), op.tensor((4096,), "bf16"),
                   op.tensor((8192, 4096), "bf16"))
    grad = op.grad(lambda x, g, b, dy: op.sum(op.layernorm(x, g, b) * dy), argnums=(1, 2))
    plan = steps(grad, x, g, b, dy)
    assert plan.count("fused_reduction") >= 2 and len(plan) <= 5      # 9 kernels when products were written


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_an_operand_broadcast_along_part_of_a_run_of_axes_splits_the_walk():
    # (64, 128) would coalesce into one kept group; a (128, 1) operand repeats along the first only,
    # and a loss Σ x·w over all axes with w (H,) repeats w along the rows only
    xs = (TensorType((4, 8, 16), DType.float32), TensorType((8, 1), DType.float32))
    split = of("fused_reduction", *xs, expr="mul($0,$1)", reduce="sum", axes=(2,), keepdims=False)
    loss = of("fused_reduction", TensorType((6, 40), DType.float32), TensorType((40,), DType.float32),
              expr="mul($0,$1)", reduce="sum", axes=(0, 1), keepdims=False)
    x, s = rng.standard_normal((4, 8, 16)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    y, w = rng.standard_normal((6, 40)).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    for kernel_op, args, want in ((split, [x, s], (x * s).sum(2)), (loss, [y, w], (y * w).sum())):
        assert ReductionTemplate().accepts(kernel_op)
        for schedule in ReductionTemplate().schedules(kernel_op, arch_named("H100-SXM")):
            np.testing.assert_allclose(emulator.run_emulated(kernel_op, args, schedule=schedule), want, rtol=1e-5)
    k = op.kernel(lambda y, w: op.sum(y * w))
    assert steps(k, y, w) == ["fused_reduction"]


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("name", ["sum", "fused_reduction"])
def test_compensated_sums_keep_infinities_and_nans_as_plain_summation_does(name):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1, 3], x[2, 5], x[3, 1] = -np.inf, np.inf, np.nan
    attrs = {"expr": "mul($0,$0)", "reduce": "mean"} if name == "fused_reduction" else {}
    kernel_op = replace(of(name, TensorType((4, 64), DType.float32), axes=(1,), keepdims=False, **attrs),
                        numerics=Numerics.KAHAN_SUM)
    wide = x.astype(np.float64)          # the exact sums, as float32's own pairwise sum is not
    want = ((wide * wide).mean(1) if name == "fused_reduction" else wide.sum(1)).astype(np.float32)
    for schedule in ReductionTemplate().schedules(kernel_op, arch_named("H100-SXM")):
        got = emulator.run_emulated(kernel_op, [x], schedule=schedule)
        # an infinity's compensation was inf - inf; a finite row's sum is within float32's rounding
        # of the terms' magnitude (a row summing near 0 has no relative bound)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(wide[np.isfinite(wide)]).max() * 64)


@pytest.mark.parametrize("outer, inner", [("sum", "sum"), ("mean", "mean"), ("mean", "sum")])
def test_a_reduction_of_per_row_reductions_is_one_kernel(outer, inner):
    x, y = rng.standard_normal((33, 96)).astype(np.float32), rng.standard_normal((33, 96)).astype(np.float32)
    k = op.kernel(lambda x, y: getattr(op, outer)(getattr(op, inner)(x * y, axis=-1)))
    assert steps(k, x, y) == ["fused_reduction"]
    want = getattr(np, outer)(getattr(np, inner)(x.astype(np.float64) * y, axis=-1))
    np.testing.assert_allclose(k(x, y), want, rtol=1e-5, atol=1e-6)


def test_a_cross_entropy_averaged_over_its_rows_is_two_kernels():
    x, y = rng.standard_normal((33, 96)).astype(np.float32), np.abs(rng.standard_normal((33, 96))).astype(np.float32)
    k = op.kernel(lambda x, y: op.mean(-op.sum(y * op.log_softmax(x, axis=-1), axis=-1)))
    assert len(steps(k, x, y)) == 2
    z = x.astype(np.float64) - x.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(k(x, y), (-(y * log_p).sum(-1)).mean(), rtol=1e-5)


def test_a_mean_of_row_sums_in_bf16_keeps_its_two_reductions():
    # mean_i Σ_j x = mean(x · n_j) needs n_j exact in x's dtype; bf16 holds 257 as 256, so never in bf16
    x = rng.standard_normal((33, 257)).astype(ml_dtypes.bfloat16)
    k = op.kernel(lambda x: op.mean(op.sum(x, axis=-1)))
    assert len(steps(k, x)) == 2
