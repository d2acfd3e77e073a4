"""An MLP's gradient plan on the GPU of this machine, its dz gemm applying act'(pre) in the epilogue:
run through the plan runtime against the float64 gradients of the unfused graph (same rounded inputs)
and against the numpy executor running the same plan. test_kernel_numerics.py already checks the
derivative-epilogue samples of the gemm template at every default schedule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tests.test_activation_gradient import ACTIVATIONS, float64_gradients, mlp_grad, shapes

pytestmark = pytest.mark.gpu


def relative_error(got, want) -> float:
    got = np.asarray(got).astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_gradient_plan_on_device_matches_float64_and_the_numpy_executor(activation, dtype):
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(s) for s in shapes(512, 256, 1000)]      # a hidden size of ragged tiles
    args[1] /= np.sqrt(256)
    args = [a.astype(dtype) for a in args]
    program = mlp_grad(activation).program(*args)
    assert any(f"d{activation}" in k.fused for k in program.candidate.kernels)
    inputs = dict(zip(("x", "w1", "b1", "w2", "dy"), args))
    on_device = run_plan_on_gpu(program.plan, inputs)
    on_host = run_plan_on_cpu(program.plan, inputs)
    for got, host, want in zip(on_device, on_host, float64_gradients(activation, args)):
        got = np.asarray(got)
        assert np.isfinite(got.astype(np.float32)).all()
        assert relative_error(got, want) < 2e-2
        assert relative_error(got, host.astype(np.float64)) < 2e-2
