"""Transposes around GEMMs, end to end: the chosen plan reads a transposed operand in place
(trans_a / trans_b) and writes a transposed product directly, launching no copy kernel, and the
plan computes what numpy does (numpy executor here; the generated kernels in the emulator's plan
tests, tests/codegen/test_emulated_plans.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf

from tessera_rw import op
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu

RNG = np.random.default_rng(12)


def _random(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _steps(plan):
    return [(s.op, bool(s.node.attr("trans_a")), bool(s.node.attr("trans_b"))) for s in plan.steps]


def _assert_close(got, want, dtype):
    tol = 3e-2 if dtype is ml_dtypes.bfloat16 else 1e-4
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=tol * scale, rtol=0)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_a_linear_backward_reads_x_and_w_transposed_in_place(dtype):
    @op.kernel
    def linear_backward(x, w, dy):
        return dy @ w.T, x.T @ dy

    x, w, dy = _random(64, 48, dtype=dtype), _random(48, 40, dtype=dtype), _random(64, 40, dtype=dtype)
    program = linear_backward.program(x, w, dy)
    assert sorted(_steps(program.plan)) == [("gemm", False, True), ("gemm", True, False)]
    fired = {rule for rule, _, _ in program.rewrite.report.fired()}
    assert {"transposed-a-into-gemm2", "transposed-b-into-gemm2"} <= fired
    got = run_plan_on_cpu(program.plan, {"x": x, "w": w, "dy": dy})
    wx, ww, wdy = (a.astype(np.float64) for a in (x, w, dy))
    _assert_close(got[0], wdy @ ww.T, dtype)
    _assert_close(got[1], wx.T @ wdy, dtype)


def test_a_transpose_that_is_also_an_output_is_copied_once():
    @op.kernel
    def both(x, dy):
        return x.T, x.T @ dy

    x, dy = _random(32, 24), _random(32, 16)
    plan = both.program(x, dy).plan
    ops = [s.op for s in plan.steps]
    assert ops.count("transpose") == 1 and ops.count("gemm") + ops.count("matmul") == 1
    got = run_plan_on_cpu(plan, {"x": x, "dy": dy})
    np.testing.assert_array_equal(got[0], x.T)
    _assert_close(got[1], x.astype(np.float64).T @ dy, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["f32", "bf16"])
def test_a_transposed_product_is_written_by_the_swapped_gemm(dtype):
    @op.kernel
    def projection_to_channels(x, w, b):
        return op.gelu(x @ w + b).mT

    x, w, b = _random(2, 64, 32, dtype=dtype), _random(32, 48, dtype=dtype), _random(48, dtype=dtype)
    program = projection_to_channels.program(x, w, b)
    (step,) = program.plan.steps
    assert step.op == "gemm" and step.node.attr("trans_a") and step.node.attr("trans_b")
    assert step.node.attr("activation") == "gelu" and step.inputs[2].type.shape == (48, 1)   # bias per row
    got = run_plan_on_cpu(program.plan, {"x": x, "w": w, "b": b})[0]
    pre = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    want = np.swapaxes(0.5 * pre * (1 + erf(pre / np.sqrt(2))), -1, -2)
    assert got.shape == (2, 48, 64)
    _assert_close(got, want, dtype)


def test_an_fp8_operand_stored_across_k_is_copied_k_major_where_the_copy_pays():
    """fp8 wgmma reads A as [M, K] and B as [N, K]: a large product takes a transpose kernel and the
    warpgroup-MMA GEMM, a small one the single mma.sync kernel that transposes on its way in; a
    bf16 product, whose wgmma reads either layout, is never offered the copy."""
    @op.kernel
    def linear_in_out(x, w, b):
        return op.gelu(x @ w + b)

    def choice(m, k, n, dtype):
        program = linear_in_out.program(op.tensor((m, k), dtype), op.tensor((k, n), dtype), op.tensor((n,), "bf16"))
        fired = {rule for rule, _, _ in program.rewrite.report.fired()}
        return _steps(program.plan), {r for r in fired if "k-major" in r}

    big, fired = choice(8192, 4096, 4096, "fp8_e4m3")
    assert big == [("transpose", False, False), ("gemm", False, True)] and "fp8-b-k-major3" in fired
    small, fired = choice(128, 96, 72, "fp8_e5m2")
    assert small == [("gemm", False, False)] and fired           # offered, not taken
    assert choice(8192, 4096, 4096, "bf16") == ([("gemm", False, False)], set())

    @op.kernel
    def weight_gradient(x, dy):
        return x.mT @ dy

    x, dy = (op.tensor((8192, 4096), "fp8_e4m3") for _ in range(2))
    program = weight_gradient.program(x, dy)         # xᵀ read as [M, K], dy as [N, K]: both copied
    assert _steps(program.plan) == [("transpose", False, False)] * 2 + [("gemm", False, True)]
    assert {"fp8-a-k-major2", "fp8-b-k-major2"} <= {rule for rule, _, _ in program.rewrite.report.fired()}
