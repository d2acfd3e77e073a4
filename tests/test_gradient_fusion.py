"""Gradient-reduction fusion end to end: a linear layer's backward (dW = Xᵀ dY, db = Σ_rows dY) and
its micro-batched form (Σ_i X_iᵀ dY_i, Σ over micro-batches and rows of dY), from the traced kernel to
the plan: the bias gradient comes out of the weight-gradient GEMM as the extra row of one
matmul_bias_grad, with dW and db as views of its result, no reduction kernel over dY and no copy
of Xᵀ (the GEMM reads X as its transposed A).

The e-graph holds that program, and the cost model prices it below a GEMM plus a reduction (by the
reduction's time: the ones row rides along in the GEMM's tiles). Extraction picks it although
switching dW alone to a view of the packed GEMM adds a whole GEMM: it tries the two switches that
bring in the same packed product together (extract._paired_switch).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.lower.lowering import lower
from tessera_rw.tune.cost import kernel_cost
from tessera_rw.tune.extract import Candidate, extract_candidates

TOKENS, D_IN, D_OUT, MICRO_BATCHES = 8192, 4096, 4096, 4


@op.kernel
def linear_backward(x, dy):
    return x.T @ dy, op.sum(dy, axis=0)


@op.kernel
def micro_batch_backward(x, dy):
    return op.sum(x.mT @ dy, axis=0), op.sum(dy, axis=(0, 1))


def shapes(kernel, tokens: int, d_in: int, d_out: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if kernel is linear_backward:
        return (tokens, d_in), (tokens, d_out)
    per = tokens // MICRO_BATCHES
    return (MICRO_BATCHES, per, d_in), (MICRO_BATCHES, per, d_out)


CASES = [pytest.param(k, dtype, id=f"{k.name}-{dtype}") for k in (linear_backward, micro_batch_backward)
         for dtype in ("bf16", "fp32")]


def program_of(kernel, dtype: str):
    x, dy = shapes(kernel, TOKENS, D_IN, D_OUT)
    return kernel.program(op.tensor(x, dtype), op.tensor(dy, dtype))


def packed_candidate(program) -> Candidate:
    """The cheapest program of the e-graph that runs no sum: the one sharing a packed GEMM."""
    return extract_candidates(program.rewrite, program.arch, forbid=frozenset({"sum"}))[0]


def fused_gemms(candidate: Candidate) -> list:
    return [k for k in candidate.kernels if k.kind == "gemm" and "bias_grad" in k.fused]


@pytest.mark.parametrize("kernel, dtype", CASES)
def test_the_packed_program_is_one_gemm_and_costs_less(kernel, dtype):
    program = program_of(kernel, dtype)
    packed = packed_candidate(program)
    (gemm,) = fused_gemms(packed)
    assert gemm.op.op == "matmul_bias_grad" and gemm.fused == ("bias_grad",)
    assert gemm.op.operands[1].shape == (TOKENS, D_OUT)          # one GEMM over every token
    assert [k.kind for k in packed.kernels] == ["gemm"]           # Xᵀ read in place: no copy
    assert gemm.op.attr_map["trans_a"] and gemm.op.operands[0].shape == (TOKENS, D_IN)
    plan = lower(packed.graph)
    assert [s.op for s in plan.steps] == ["matmul_bias_grad"]
    assert plan.outputs[0].buffer == plan.outputs[1].buffer      # dW and db are views of its result
    # the ones row rides along in the GEMM's tiles: within a few percent of the plain product's time
    product = TensorType((D_IN, D_OUT), gemm.op.result.dtype)
    plain = kernel_cost(KernelOp.of("gemm", gemm.op.operands, product, scale=1.0, activation="none", has_bias=False,
                                    has_residual=False, accum_dtype=None, dtype=product.dtype, trans_a=True,
                                    numerics=gemm.op.numerics), program.arch)
    assert gemm.est_us <= 1.05 * plain.est_us
    # so the packed program beats the best one without it, which runs a reduction over dY
    unpacked = extract_candidates(program.rewrite, program.arch, forbid=frozenset({"matmul_bias_grad"}))[0]
    assert any(k.kind == "reduction" and k.op.operands[0].numel == TOKENS * D_OUT for k in unpacked.kernels)
    assert packed.est_us < unpacked.est_us


@pytest.mark.parametrize("kernel, dtype", CASES)
def test_chosen_plan_fuses_the_bias_gradient(kernel, dtype):
    program = program_of(kernel, dtype)
    assert fused_gemms(program.candidate), [(k.kind, k.fused) for k in program.candidate.kernels]
    assert not any(k.kind == "reduction" for k in program.candidate.kernels)
    assert "sum" not in [s.op for s in program.plan.steps]


@pytest.mark.parametrize("kernel, dtype", [(linear_backward, np.float32), (micro_batch_backward, np.float32),
                                           (linear_backward, ml_dtypes.bfloat16)])
def test_results_match_numpy_on_the_numpy_executor(kernel, dtype):
    rng = np.random.default_rng(4)
    xs, dys = shapes(kernel, 64, 24, 40)
    x, dy = rng.standard_normal(xs).astype(dtype), rng.standard_normal(dys).astype(dtype)
    wide_x, wide_dy = x.astype(np.float64).reshape(-1, 24), dy.astype(np.float64).reshape(-1, 40)
    want = (wide_x.T @ wide_dy, wide_dy.sum(axis=0))
    tol = 1e-5 if dtype is np.float32 else 3e-2
    program = kernel.program(x, dy)
    packed = lower(packed_candidate(program).graph)
    assert "matmul_bias_grad" in [s.op for s in packed.steps]
    for got in (kernel(x, dy), run_plan_on_cpu(packed, {"x": x, "dy": dy})):   # the chosen plan, the packed
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=tol, atol=tol * np.abs(w).max())


def test_a_squared_error_gradient_folds_its_seed_and_exponent():
    # d/dW ½Σ(xW + b)²: the seed (ones · ½, reshaped, broadcast, · 2) and the exponent 2 - 1 fold
    # away, leaving the forward GEMM and one packed dW, db GEMM (before: 5 kernels, a 6 MB broadcast)
    def loss(x, w, b):
        return op.sum((x @ w + b) ** 2) * 0.5
    grad = op.grad(loss, argnums=(1, 2))
    types = op.tensor((256, 64), "bf16"), op.tensor((64, 128), "bf16"), op.tensor((128,), "bf16")
    assert [s.op for s in grad.program(*types).plan.steps] == ["gemm", "matmul_bias_grad"]
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(t.shape) for t in types)
    dw, db = op.grad(loss, argnums=(1, 2))(x, w, b)
    np.testing.assert_allclose(dw, x.T @ (x @ w + b), rtol=1e-10)
    np.testing.assert_allclose(db, (x @ w + b).sum(axis=0), rtol=1e-10)


def test_a_squared_error_written_as_a_product_folds_its_two_halves():
    # d/dy ½Σ y·y is reverse mode's y·½ + ½·y, one value read twice under two scales: they add up
    # to y·1, which is y, so no elementwise kernel runs before the packed dW, db GEMM
    def loss(x, w, b):
        y = x @ w + b
        return op.sum(y * y) * 0.5
    grad = op.grad(loss, argnums=(1, 2))
    types = op.tensor((256, 64), "bf16"), op.tensor((64, 128), "bf16"), op.tensor((128,), "bf16")
    assert [s.op for s in grad.program(*types).plan.steps] == ["gemm", "matmul_bias_grad"]
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(t.shape) for t in types)
    dw, db = grad(x, w, b)
    np.testing.assert_allclose(dw, x.T @ (x @ w + b), rtol=1e-10)
    np.testing.assert_allclose(db, (x @ w + b).sum(axis=0), rtol=1e-10)


def test_a_relu_gradient_reads_its_input_and_cotangent_in_one_pass():
    # reverse mode's relu′: where(pre > 0, g, 0); one fused kernel, not a comparison writing a mask
    # and a selection reading it back
    def loss(x, w, b, t):
        return op.sum(op.relu(x @ w + b) * t)
    grad = op.grad(loss, argnums=(1, 2))
    types = (op.tensor((256, 64), "float32"), op.tensor((64, 128), "float32"), op.tensor((128,), "float32"),
             op.tensor((256, 128), "float32"))
    plan = grad.program(*types).plan
    assert [s.op for s in plan.steps] == ["gemm", "fused_elementwise", "matmul_bias_grad"], plan
    rng = np.random.default_rng(2)
    x, w, b, t = (rng.standard_normal(s.shape) for s in types)
    dw, db = grad(x, w, b, t)
    g = np.where(x @ w + b > 0, t, 0.0)
    np.testing.assert_allclose(dw, x.T @ g, rtol=1e-10)
    np.testing.assert_allclose(db, g.sum(axis=0), rtol=1e-10)
    if emulator.available():           # the generated kernels, the comparison's mask in registers
        feeds = {"x": x, "w": w, "b": b, "t": t}
        got = run_plan_emulated(plan, {k: v.astype(np.float32) for k, v in feeds.items()})
        for out, want in zip(got, (x.T @ g, g.sum(axis=0))):
            np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_a_convolutions_input_gradient_flips_its_kernel_in_one_copy():
    from scipy.signal import correlate
    # the transposed convolution reads the kernel reversed along both spatial axes: one flip, not a
    # product with an exchange matrix per axis
    conv_grad = op.grad(lambda x, w: op.sum(op.conv2d(x, w, padding=1) ** 2))
    x, w = op.tensor((2, 8, 10, 10), "float32"), op.tensor((8, 8, 3, 3), "float32")
    graph = conv_grad.trace(x, w)
    ops = [n.op for n in graph.nodes]
    assert ops.count("flip") == 1 and "matmul" not in ops, ops
    rng = np.random.default_rng(5)
    xv, wv = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    y = np.stack([sum(correlate(np.pad(xv[n, c], 1), wv[o, c], mode="valid") for c in range(8)) for n in range(2)
                  for o in range(8)]).reshape(2, 8, 10, 10)
    dx = np.zeros_like(xv)
    for n in range(2):
        for c in range(8):
            full = sum(correlate(2 * y[n, o], wv[o, c][::-1, ::-1], mode="full") for o in range(8))
            dx[n, c] = full[1:-1, 1:-1]
    np.testing.assert_allclose(conv_grad(xv, wv), dx, rtol=1e-8, atol=1e-8)


def test_a_resnet_blocks_relu_masks_read_the_relu_outputs_its_convolutions_write():
    # relu′ is where(z > 0, g, 0); z > 0 is relu(z) > 0, and the forward computes relu(z) anyway:
    # each convolution writes h = relu(conv + b) in its epilogue, z is never written, and no kernel
    # computes a relu of its own (extraction frees z's kernel by moving both its readers off it)
    def loss(x, w1, b1, w2, b2, t):
        h = op.relu(op.conv2d(x, w1, padding=1) + b1)
        return op.sum((op.relu(op.conv2d(h, w2, padding=1) + b2 + x) - t) ** 2)
    grad = op.grad(loss, argnums=(0, 1, 2, 3, 4))
    shapes = [(2, 8, 10, 10), (8, 8, 3, 3), (8, 1, 1), (8, 8, 3, 3), (8, 1, 1), (2, 8, 10, 10)]
    plan = grad.program(*(op.tensor(s, "float32") for s in shapes)).plan
    assert "relu(add($0,$1))" in [s.node.attr_map.get("post") for s in plan.steps if s.op == "fused_conv"]
    assert not [s for s in plan.steps if s.op == "fused_elementwise" and s.node.attr_map["expr"] == "relu($0)"]
    rng = np.random.default_rng(6)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = grad(*(v.astype(np.float64) for v in values))            # float64: no kernel fuses, the VJPs run as written
    feeds = dict(zip(("x", "w1", "b1", "w2", "b2", "t"), values))
    runs = [run_plan_on_cpu(plan, feeds)] + ([run_plan_emulated(plan, feeds)] if emulator.available() else [])
    for got in runs:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3 * np.abs(w).max())
