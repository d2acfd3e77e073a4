"""Whole plans through the CPU emulator (codegen/emulator_plan.py): every generated kernel of a plan,
over the plan's own buffers (views at offsets, reused temporaries, packed outputs), against float64
numpy and against the numpy executor running the same plan. These are the GPU plan tests
(tests/gpu/test_*_on_device.py) at emulator sizes: the training plans of op.grad with their fused
backward kernels, and plans whose kernels read and write views."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.lower.lowering import lower
from tests.test_activation_gradient import ACTIVATIONS, float64_gradients, mlp_grad, shapes
from tests.test_attention_gradient import (atomic_backward_pin, bf16_inputs, masked_attention_loss, numpy_grads,
                                          random_masks)

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def relative_error(got, want) -> float:
    got = np.asarray(got).astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def assert_matches(emulated, on_host, want, bound: float = 2e-2) -> None:
    for got, host, ref in zip(emulated, on_host, want, strict=True):
        assert np.isfinite(got.astype(np.float32)).all(), "an output element was never written"
        assert relative_error(got, ref) < bound
        assert relative_error(got, host.astype(np.float64)) < bound


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_mlp_gradient_plan_with_derivative_epilogues(activation, dtype):
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(s) for s in shapes(96, 64, 200)]      # a hidden size of ragged tiles
    args[1] /= np.sqrt(64)
    args = [a.astype(dtype) for a in args]
    program = mlp_grad(activation).program(*args)
    assert any(f"d{activation}" in k.fused for k in program.candidate.kernels)
    assert "transpose" not in [s.op for s in program.plan.steps]     # Xᵀ, Wᵀ and hᵀ read in place
    inputs = dict(zip(("x", "w1", "b1", "w2", "dy"), args))
    assert_matches(run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs),
                   float64_gradients(activation, args))


@pytest.mark.parametrize("b, h, s, d, causal, dtype", [
    pytest.param(1, 2, 128, 64, False, ml_dtypes.bfloat16, id="d64"),
    pytest.param(1, 1, 130, 128, True, ml_dtypes.bfloat16, id="d128-causal-ragged"),
    pytest.param(1, 2, 77, 64, True, np.float16, id="fp16-shorter-than-a-block")])
def test_attention_gradient_plan(b, h, s, d, causal, dtype):
    rng = np.random.default_rng(5)
    q, k, v, w = (rng.standard_normal((b, h, s, d)).astype(dtype) for _ in range(4))

    def loss(q, k, v, w):
        return op.sum(op.flash_attention(q, k, v, causal=causal) * w)
    program = op.grad(loss, argnums=(0, 1, 2)).program(q, k, v, w)
    steps = [step.op for step in program.plan.steps]
    assert steps == ["flash_attention_lse", "attention_row_stats_from_lse", "flash_attention_bwd"], steps
    inputs = {"q": q, "k": k, "v": v, "w": w}
    want = numpy_grads(q, k, v, w, causal, scale=d ** -0.5)
    on_host = run_plan_on_cpu(program.plan, inputs)
    assert_matches(run_plan_emulated(program.plan, inputs), on_host, want)
    # under `fast`, pinned to the form that sums dQ with atomics into a workspace the launch zeroes
    pin = dict(atomic_backward_pin(program.plan, arch_named("h100")))
    assert_matches(run_plan_emulated(program.plan, inputs, numerics=Numerics.FAST, schedules=pin), on_host, want)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masked_attention_gradient_plan(kind):
    rng = np.random.default_rng(6)
    mask = random_masks(rng)[kind]
    q, k, v, w = bf16_inputs(rng)
    program = op.grad(masked_attention_loss, argnums=(0, 1, 2)).program(q, k, v, w, mask)
    assert "flash_attention_bwd" in [step.op for step in program.plan.steps]
    inputs = {"q": q, "k": k, "v": v, "w": w, "mask": mask}
    assert_matches(run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs),
                   numpy_grads(q, k, v, w, False, mask=mask))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_linear_backward_plan_writes_dw_and_db_from_one_gemm(dtype):
    @op.kernel
    def linear_backward(x, dy):
        return x.T @ dy, op.sum(dy, axis=0)
    rng = np.random.default_rng(3)
    numpy_dtype = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    x, dy = (rng.standard_normal(s).astype(numpy_dtype) for s in ((200, 96), (200, 136)))
    program = linear_backward.program(x, dy)
    assert any("bias_grad" in k.fused for k in program.candidate.kernels)
    want = (x.astype(np.float64).T @ dy.astype(np.float64), dy.astype(np.float64).sum(0))
    inputs = {"x": x, "dy": dy}
    assert_matches(run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs), want)


def _rows(x, a, b):
    return make("slice", x, starts=(a, *(0,) * (x.type.ndim - 1)), stops=(b, *x.shape[1:]), steps=(1,) * x.type.ndim)


def _row(x, i):
    return make("reshape", _rows(x, i, i + 1), shape=x.shape[1:])


def test_kernels_read_views_at_their_offsets_and_share_packed_outputs():
    x = make_input("x", (65, 512), DType.bfloat16)
    h = make("exp", x)
    y = make("add", make("tanh", _rows(h, 1, 65)), _row(h, 0))
    packed = make("matmul", make("tanh", x), make_input("w", (512, 64), DType.bfloat16), accum_dtype=None)
    plan = lower(Graph("views", (x, *[n for n in packed.args if n.op == "input"]),
                       (y, _rows(packed, 0, 64), _row(packed, 64))))
    assert plan.steps[1].inputs[0].offset == 1024 and plan.outputs[2].offset == 64 * 64 * 2
    rng = np.random.default_rng(11)
    feeds = {"x": (rng.standard_normal((65, 512)) * 0.5).astype(ml_dtypes.bfloat16),
             "w": (rng.standard_normal((512, 64)) * 0.1).astype(ml_dtypes.bfloat16)}
    for got, want in zip(run_plan_emulated(plan, feeds), run_plan_on_cpu(plan, feeds), strict=True):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "f32"])
def test_a_transposed_product_plan_is_one_swapped_gemm(dtype):
    @op.kernel
    def projection_to_channels(x, w, b):
        return op.gelu(x @ w + b).mT

    rng = np.random.default_rng(13)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((2, 96, 40), (40, 72), (72,)))
    program = projection_to_channels.program(x, w, b)
    (step,) = program.plan.steps
    assert step.node.attr("trans_a") and step.node.attr("trans_b")
    inputs = {"x": x, "w": w, "b": b}
    wide = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    want = np.swapaxes(0.5 * wide * (1 + erf(wide / np.sqrt(2))), -1, -2)
    assert_matches(run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs), [want])


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=["e4m3", "e5m2"])
def test_an_fp8_linear_layer_is_one_gemm_reading_the_weight_as_stored(dtype):
    """x Wᵀ + b with torch's [out, in] weight: the fp8 mma reads W where it lies (trans_b), writes
    bf16 through the bias and gelu epilogue; the other orientation transposes W on its way in."""
    @op.kernel
    def linear(x, w, b):
        return op.gelu(x @ w.mT + b)

    @op.kernel
    def linear_in_out(x, w, b):
        return op.gelu(x @ w + b)

    rng = np.random.default_rng(17)
    x, b = rng.standard_normal((100, 96)).astype(dtype), rng.standard_normal(72).astype(ml_dtypes.bfloat16)
    for kernel, w in ((linear, rng.standard_normal((72, 96))), (linear_in_out, rng.standard_normal((96, 72)))):
        w = (w / np.sqrt(96)).astype(dtype)
        program = kernel.program(x, w, b)
        (step,) = program.plan.steps
        assert step.node.attr("trans_b") is (kernel is linear) and step.node.dtype is DType.bfloat16
        inputs = {"x": x, "w": w, "b": b}
        read = w.astype(np.float64).T if kernel is linear else w.astype(np.float64)
        wide = x.astype(np.float64) @ read + b.astype(np.float64)
        want = 0.5 * wide * (1 + erf(wide / np.sqrt(2)))
        assert_matches(run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs), [want])


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "f32"])
def test_a_normalization_of_a_plain_tensor_with_an_epilogue_is_one_row_kernel(dtype):
    @op.kernel
    def normed_then_scaled(x, w):
        return op.softmax(x, axis=-1) * w + op.layernorm(x) * w

    rng = np.random.default_rng(17)
    x, w = rng.standard_normal((33, 200)).astype(dtype), rng.standard_normal(200).astype(dtype)
    program = normed_then_scaled.program(x, w)
    steps = [s.op for s in program.plan.steps]        # two row kernels, the products and the sum in an epilogue
    assert len(steps) == 2 and "fused_normalization" in steps and not {"mul", "add", "fused_elementwise"} & set(steps)
    wide, w64 = x.astype(np.float64), w.astype(np.float64)
    e = np.exp(wide - wide.max(-1, keepdims=True))
    centered = wide - wide.mean(-1, keepdims=True)
    want = e / e.sum(-1, keepdims=True) * w64 + centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5) * w64
    inputs = {"x": x, "w": w}
    assert_matches(run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs), [want])


def _correlate_layer(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """conv2d with padding 1 in float64, by scipy: y[n, o] = Σ_c x[n, c] ⋆ w[o, c]."""
    from scipy.signal import correlate
    return np.stack([np.stack([sum(correlate(np.pad(x[n, c], 1), w[o, c], mode="valid") for c in range(x.shape[1]))
                               for o in range(w.shape[0])]) for n in range(x.shape[0])])


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "f32"])
def test_a_resnet_block_is_two_convolutions_with_their_epilogues(dtype):
    @op.kernel
    def block(x, w1, b1, w2, b2):
        h = op.relu(op.conv2d(x, w1, padding=1) + b1)
        return op.relu(op.conv2d(h, w2, padding=1) + b2 + x)

    rng = np.random.default_rng(4)
    shapes = {"x": (2, 24, 9, 11), "w1": (24, 24, 3, 3), "b1": (24, 1, 1), "w2": (24, 24, 3, 3), "b2": (24, 1, 1)}
    inputs = {k: (rng.standard_normal(s) / (1 if k[0] != "w" else 12)).astype(dtype) for k, s in shapes.items()}
    plan = block.program(*inputs.values()).plan
    assert [(s.op, s.node.attr_map["post"]) for s in plan.steps] == [
        ("fused_conv", "relu(add($0,$1))"), ("fused_conv", "relu(add(add($0,$1),$2))")]
    x, w1, b1, w2, b2 = (v.astype(np.float64) for v in inputs.values())
    h = np.maximum(_correlate_layer(x, w1) + b1, 0)
    want = np.maximum(_correlate_layer(h, w2) + b2 + x, 0)
    assert_matches(run_plan_emulated(plan, inputs), run_plan_on_cpu(plan, inputs), [want])
