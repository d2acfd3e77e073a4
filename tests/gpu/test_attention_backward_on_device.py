"""The attention backward on the GPU of this machine: the gradient plan (the forward writing each
row's logsumexp, the row statistics read off it, flash_attention_bwd, dQ/dK/dV read as views of
its packed buffer) run through the plan runtime,
against float64 numpy on the same bf16/fp16 inputs and against the numpy executor running the
same plan. test_kernel_numerics.py already checks each kernel's samples (masked ones included) at
every default schedule with consistent row statistics (kernel_check); here the whole plan, ragged,
causal and masked included."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tests.test_attention_gradient import (atomic_backward_pin, bf16_inputs, masked_attention_loss, numpy_grads,
                                          random_masks)

pytestmark = pytest.mark.gpu

CASES = [pytest.param(2, 4, 512, 64, False, ml_dtypes.bfloat16, id="d64"),
         pytest.param(1, 4, 1024, 128, True, ml_dtypes.bfloat16, id="d128-causal"),
         pytest.param(2, 2, 1000, 64, True, np.float16, id="ragged-causal-fp16"),
         pytest.param(1, 2, 77, 128, False, np.float16, id="shorter-than-a-block")]


def loss_of(causal: bool):
    def loss(q, k, v, w):
        return op.sum(op.flash_attention(q, k, v, causal=causal) * w)
    return loss


def float64_grads(q, k, v, w, causal: bool):
    return numpy_grads(q, k, v, w, causal, scale=q.shape[-1] ** -0.5)


def relative_error(got, want) -> float:
    got = np.asarray(got).astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("b, h, s, d, causal, dtype", CASES)
def test_gradient_plan_on_device_matches_float64_and_the_numpy_executor(b, h, s, d, causal, dtype):
    rng = np.random.default_rng(5)
    q, k, v, w = (rng.standard_normal((b, h, s, d)).astype(dtype) for _ in range(4))
    grad = op.grad(loss_of(causal), argnums=(0, 1, 2))
    program = grad.program(q, k, v, w)
    steps = [step.op for step in program.plan.steps]
    assert steps == ["flash_attention_lse", "attention_row_stats_from_lse", "flash_attention_bwd"], steps
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    inputs = {"q": q, "k": k, "v": v, "w": w}
    on_device = run_plan_on_gpu(program.plan, inputs)
    on_host = run_plan_on_cpu(program.plan, inputs)
    for got, host, want in zip(on_device, on_host, float64_grads(q, k, v, w, causal)):
        got = np.asarray(got)
        assert np.isfinite(got.astype(np.float32)).all()
        assert relative_error(got, want) < 2e-2
        assert relative_error(got, host.astype(np.float64)) < 2e-2


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masked_gradient_plan_on_device_matches_float64(kind):
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    rng = np.random.default_rng(6)
    mask = random_masks(rng)[kind]
    q, k, v, w = bf16_inputs(rng)
    program = op.grad(masked_attention_loss, argnums=(0, 1, 2)).program(q, k, v, w, mask)
    assert "flash_attention_bwd" in [step.op for step in program.plan.steps]
    got = run_plan_on_gpu(program.plan, {"q": q, "k": k, "v": v, "w": w, "mask": mask})
    for g, want in zip(got, numpy_grads(q, k, v, w, False, mask=mask)):
        assert relative_error(g, want) < 2e-2


def test_torch_tensors_in_give_torch_gradients_out():
    torch = pytest.importorskip("torch")
    q, k, v, w = (torch.randn(1, 2, 256, 64, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    dq, dk, dv = op.grad(loss_of(True), argnums=(0, 1, 2))(q, k, v, w)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad(out, (q, k, v), w)
    for got, ref in zip((dq, dk, dv), want):
        assert got.device.type == "cuda" and got.dtype == torch.bfloat16
        assert (torch.linalg.norm((got - ref).double()) / torch.linalg.norm(ref.double())).item() < 3e-2


@pytest.mark.parametrize("b, h, s, d, causal, dtype", CASES)
def test_gradient_plan_summing_dq_with_atomics_matches_float64_twice_on_one_workspace(b, h, s, d, causal, dtype):
    from tessera_rw import numerics
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    rng = np.random.default_rng(7)
    q, k, v, w = (rng.standard_normal((b, h, s, d)).astype(dtype) for _ in range(4))
    program = op.grad(loss_of(causal), argnums=(0, 1, 2)).program(q, k, v, w)
    inputs = {"q": q, "k": k, "v": v, "w": w}
    want = float64_grads(q, k, v, w, causal)
    pin = atomic_backward_pin(program.plan, current_arch())
    for _ in range(2):                      # a second call reuses the plan's workspace, zeroed again
        got = run_plan_on_gpu(program.plan, inputs, numerics=numerics.Numerics.FAST, schedules=pin)
        for g, wanted in zip(got, want):
            assert relative_error(g, wanted) < 2e-2
