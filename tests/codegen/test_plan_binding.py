"""Plans bound to templates and compiled (no GPU needed), where a call runs, and — on a GPU — whole
plans launched against the numpy executor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import numerics, op
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.codegen.device import DeviceError
from tessera_rw.codegen import emulator, library_kernels
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.calibration import arch_for_sm
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.plan_binding import NoTemplateError, bind_plan
from tessera_rw.codegen.templates.base import ScheduleError
from tessera_rw.execute import where_to_run
from tessera_rw.tune.plan_tuner import tunable_ops

BF16 = np.dtype(ml_dtypes.bfloat16)
H100 = arch_named("H100-SXM")


@op.kernel
def attention(q, k, v):
    return op.softmax((q @ k.mT) * (q.shape[-1] ** -0.5), axis=-1) @ v


@op.kernel
def mlp(x, w, b):
    return op.gelu(x @ w + b)


@op.kernel
def norm_then_sum(x, w):
    return op.sum(op.layernorm(x, w, None, axis=-1), axis=0)


@op.kernel
def long_conv(x, w):
    return op.conv1d(x, w, padding="same")


def placeholders(*shapes, dtype="bf16"):
    return [op.tensor(s, dtype) for s in shapes]


@pytest.mark.parametrize("kernel, shapes, kinds", [
    (attention, [(2, 8, 1024, 64)] * 3, ["flash_attention"]),
    (attention, [(2, 8, 1000, 128)] * 3, ["flash_attention"]),
    (mlp, [(512, 768), (768, 3072), (3072,)], ["gemm"]),
    (norm_then_sum, [(4096, 1024), (1024,)], ["layernorm", "reduction"]),
])
@pytest.mark.parametrize("sm", ["sm_80", "sm_90"])
def test_plans_bind_and_every_kernel_compiles_without_spills(kernel, shapes, kinds, sm):
    plan = kernel.program(*placeholders(*shapes)).plan
    arch = arch_for_sm(sm)
    bound = bind_plan(plan, arch)
    assert [b.kind for b in bound] == kinds
    for b in bound:
        assert b.schedule in b.schedules
        source, compiled = b.compile(arch, sm)
        assert compiled.spill_bytes == 0, (b.op, compiled.spill_bytes)
        assert source.source.startswith(f"// {b.op.op}(")


def test_the_fused_epilogue_is_reported():
    (b,) = bind_plan(mlp.program(*placeholders((64, 128), (128, 256), (256,))).plan, H100)
    assert b.fused == ("bias", "gelu")


def test_a_float64_plan_names_every_kernel_without_a_gpu_template():
    plan = mlp.program(*placeholders((64, 128), (128, 256), (256,), dtype="float64")).plan
    with pytest.raises(NoTemplateError, match=r"kernel\(s\) have no GPU template") as e:
        bind_plan(plan, H100)
    assert "f64[64,128]" in str(e.value) and "TESSERA_DEVICE=cpu" in str(e.value)
    assert "(the gemm kernel multiplies f32, bf16, fp16 or fp8, not f64)" in str(e.value)
    assert "cast the float64 operands" in e.value.hint


def test_an_fp8_plan_binds_from_sm_89_and_says_what_to_do_before():
    plan = mlp.program(*placeholders((64, 128), (128, 256), dtype="fp8_e4m3"), op.tensor((256,), "bf16")).plan
    (b,) = bind_plan(plan, H100)
    assert b.kind == "gemm" and "mma_e4m3_16832" in b.source(H100).source
    with pytest.raises(NoTemplateError, match="need fp8 tensor cores") as e:
        bind_plan(plan, arch_named("a100"))
    assert "cast the operands to bfloat16" in str(e.value)


def test_an_fp8_program_planned_for_an_arch_without_fp8_still_plans_and_runs_on_the_host(monkeypatch):
    monkeypatch.setenv("TESSERA_ARCH", "a100")

    @op.kernel
    def product(x, w):
        return x @ w

    x, w = (np.random.default_rng(3).standard_normal(s).astype(ml_dtypes.float8_e4m3fn) for s in ((32, 64), (64, 16)))
    program = product.program(x, w)
    with pytest.raises(NoTemplateError, match="need fp8 tensor cores"):
        bind_plan(program.plan, arch_named("a100"))
    assert tunable_ops(program.plan, numerics.Numerics.DETERMINISTIC, arch_named("a100")) == []   # nothing to tune
    if emulator.available():      # running its kernel there says why not, as binding does
        (step,) = program.plan.steps
        with pytest.raises(ScheduleError, match="has no schedule on A100-SXM") as e:
            emulator.run_emulated(KernelOp.from_node(step.node, numerics.Numerics.DETERMINISTIC), [x, w], arch="a100")
        assert "cast the operands to bfloat16" in e.value.hint
    (got,) = run_plan_on_cpu(program.plan, {"x": x, "w": w})
    np.testing.assert_allclose(got.astype(np.float32), x.astype(np.float32) @ w.astype(np.float32), rtol=1e-2, atol=1e-1)


def test_library_kernels_are_named_with_the_reason_while_their_library_is_missing(monkeypatch):
    monkeypatch.setattr(library_kernels, "library_available", lambda name: False)
    plan = long_conv.program(*placeholders((2, 64, 4096), (64, 64, 1024), dtype="float32")).plan
    with pytest.raises(NoTemplateError, match="cuFFT call, not made here") as e:
        bind_plan(plan, H100)
    assert str(e.value).count("cuFFT call") == 3 and "nvmath-python" in str(e.value)


def test_a_plan_bound_to_be_listed_keeps_its_library_steps_while_the_library_is_missing(monkeypatch):
    monkeypatch.setattr(library_kernels, "library_available", lambda name: False)
    plan = long_conv.program(*placeholders((2, 64, 4096), (64, 64, 1024), dtype="float32")).plan
    bound = bind_plan(plan, H100, runnable=False)
    assert [(b.kind, b.call.transform.name) for b in bound if b.is_library] == [("fft", "R2C"), ("fft", "R2C"),
                                                                               ("ifft", "C2R")]
    assert len(bound) == len(plan.steps)


def test_library_kernels_bind_to_their_calls_when_the_library_loads(monkeypatch):
    monkeypatch.setattr(library_kernels, "library_available", lambda name: True)
    plan = long_conv.program(*placeholders((2, 64, 4096), (64, 64, 1024), dtype="float32")).plan
    bound = bind_plan(plan, H100)
    assert [b.kind for b in bound if b.is_library] == ["fft", "fft", "ifft"]
    assert all(b.call is None for b in bound if not b.is_library)


def test_where_a_call_runs(monkeypatch):
    x = np.ones((4, 8), np.float32)
    program = mlp.program(x, np.ones((8, 8), np.float32), np.ones(8, np.float32))
    monkeypatch.delenv("TESSERA_DEVICE", raising=False)
    from tessera_rw.codegen.device import gpu_available
    assert where_to_run(program, {"x": x}) == ("gpu" if gpu_available() else "cpu")
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    assert where_to_run(program, {"x": x}) == "cpu"
    monkeypatch.setenv("TESSERA_DEVICE", "tpu")
    with pytest.raises(ArgumentError, match="TESSERA_DEVICE='tpu' is not a device"):
        where_to_run(program, {"x": x})


def test_a_plan_without_gpu_kernels_on_a_gpu_host_runs_on_the_host_and_says_so(monkeypatch):
    from tessera_rw import HostFallbackWarning, execute
    monkeypatch.delenv("TESSERA_DEVICE", raising=False)
    monkeypatch.setattr(execute, "gpu_available", lambda: True)
    execute._runs_on_gpu.cache_clear()          # it warns once per plan
    x = np.ones((4, 8), np.float64)
    program = mlp.program(x, np.ones((8, 8)), np.ones(8))
    with pytest.warns(HostFallbackWarning, match=r"(?s)runs on the host, not the GPU.*f64\[4,8\]") as w:
        assert where_to_run(program, {"x": x}) == "cpu"
    assert w[0].filename == __file__


def test_forcing_the_gpu_without_one_says_so(monkeypatch):
    from tessera_rw.codegen.device import gpu_available
    if gpu_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("TESSERA_DEVICE", "gpu")
    x = np.ones((4, 8), np.float32)
    with pytest.raises(DeviceError, match="needs an NVIDIA GPU"):
        mlp(x, np.ones((8, 8), np.float32), np.ones(8, np.float32))


# -- on a GPU ---------------------------------------------------------------------------------------

def _random(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, shapes, tol", [
    (attention, [(2, 4, 333, 64)] * 3, 2e-2),
    (mlp, [(77, 129), (129, 200), (200,)], 3e-2),
    (norm_then_sum, [(1000, 1000), (1000,)], 5e-2),
])
def test_plans_on_the_gpu_match_the_numpy_executor(kernel, shapes, tol, monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "gpu")
    args = [_random(s, BF16, i) for i, s in enumerate(shapes)]
    got = kernel(*args)
    program = kernel.program(*args)
    want = run_plan_on_cpu(program.plan, dict(zip(program.graph.input_names, args)))[0]
    scale = max(1.0, float(np.abs(want.astype(np.float32)).max()))
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=tol * scale, rtol=tol)


@pytest.mark.gpu
def test_the_deterministic_policy_is_bitwise_stable_over_runs(monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "gpu")
    args = [_random(s, BF16, i) for i, s in enumerate([(2048, 1024), (1024,)])]
    with numerics.policy("deterministic"):
        runs = [norm_then_sum(*args) for _ in range(3)]
    assert all(np.array_equal(r.view(np.uint16), runs[0].view(np.uint16)) for r in runs)


@pytest.mark.gpu
def test_torch_tensors_come_back_as_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    got = mlp(x, w, b)
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.bfloat16
    want = torch.nn.functional.gelu(x.float() @ w.float() + b.float())
    torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=3e-2)
    got_t = mlp(x, w.t().contiguous().t(), b)          # a non-contiguous weight is made dense first
    torch.testing.assert_close(got_t.float(), want, atol=5e-2, rtol=3e-2)
