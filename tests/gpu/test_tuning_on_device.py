"""The tuner on the GPU: measured schedules are checked against the reference before they are timed,
a second tuning comes from the cache, whole plans are timed, and the public API measures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_check import KernelMismatchError
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.registry import templates_for

pytestmark = pytest.mark.gpu


def gemm(n: int) -> KernelOp:
    t = TensorType((n, n), DType.bfloat16)
    return KernelOp.of("matmul", (t, t), t, accum_dtype=None)


def test_device_measurer_times_correct_kernels_with_noise(tmp_path):
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.tune.device_measure import DeviceMeasurer
    op = gemm(1024)
    template = templates_for(op)[0]
    space = template.space(op, current_arch())
    measured = DeviceMeasurer(template, op, current_arch()).measure(space[:4])
    assert all(m.ok for m in measured), [m.failure for m in measured]
    assert all(0 < m.median_us < 10_000 and m.noise_us < m.median_us for m in measured)


def test_wrong_kernel_is_a_failure_not_a_time():
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.compile import KernelSource
    from tessera_rw.tune.device_measure import DeviceMeasurer
    op = gemm(256)
    template = templates_for(op)[0]

    class Zeros(type(template)):
        def emit(self, op, schedule, arch):             # writes nothing: the output stays poisoned
            return KernelSource("noop", 'extern "C" __global__ void noop(const void* a, const void* b, void* c) {}',
                                32, (1, 1, 1))
    measured = DeviceMeasurer(Zeros(), op, current_arch()).measure(template.schedules(op, current_arch())[:1])
    assert not measured[0].ok and math.isinf(measured[0].median_us)


def test_tune_on_device_then_the_cache_answers(tmp_path):
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.tune.cache import TuneCache
    from tessera_rw.tune.kernel_tuner import tune_kernel
    cache = TuneCache("gpu", tmp_path)
    first = tune_kernel(gemm(2048), current_arch(), method="on_device", cache=cache, max_trials=8)
    assert first.chosen_by == "on_device" and len(first.trials) == 8 and first.record.noise_us >= 0
    again = tune_kernel(gemm(2048), current_arch(), method="on_device", cache=cache)
    assert again.chosen_by == "cache" and again.schedule == first.schedule


def test_time_plans_weighs_a_programs_candidates(tmp_path, monkeypatch):
    from tessera_rw import autotune, op
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))

    @op.kernel
    def attention(q, k, v):
        return op.softmax(op.matmul(q, op.transpose(k, (0, 1, 3, 2))) * 0.125, axis=-1) @ v
    cfg = autotune(attention, shapes=[(1, 4, 512, 64)] * 3, dtype="bf16", method="on_device", max_trials=6)
    assert cfg.chosen_by == "on_device"
    assert all(w.measurement.ok for w in cfg.program.tuning.weighed)
    q = np.random.default_rng(0).standard_normal((1, 4, 512, 64)).astype(DType.bfloat16.numpy)
    autotune.enable(True)
    try:
        out = attention(q, q, q)
    finally:
        autotune.enable(False)
    assert np.isfinite(out.astype(np.float32)).all()


def test_a_pinned_kernel_is_checked_before_its_plan_is_timed(tmp_path, monkeypatch):
    from tessera_rw import autotune, op
    from tessera_rw.tune import device_measure
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device_measure, "_VERIFIED", set())

    @op.kernel
    def mlp(x, w, v):
        return op.softmax(op.matmul(x, w, tile_shape=(64, 64, 32)), axis=-1) @ v
    shapes = [(512, 256), (256, 512), (512, 128)]
    cfg = autotune(mlp, shapes=shapes, dtype="bf16", method="on_device", max_trials=4)
    pinned = [k for k in cfg.program.tuning.tuning.kernels if k.chosen_by == "pinned"]
    assert pinned and all((k.op, k.schedule) in device_measure._VERIFIED for k in pinned)

    def wrong(template, op_, schedule, source, binary, stream):   # a kernel that fails its check
        raise KernelMismatchError("stand-in mismatch")
    monkeypatch.setattr(device_measure, "verify_kernel", wrong)
    from tessera_rw.codegen.numerics import current_numerics
    [measurement] = device_measure.time_plans([(cfg.program.plan, cfg.program.schedules)], current_numerics())
    assert not measurement.ok and "wrong results: stand-in mismatch" in measurement.failure
