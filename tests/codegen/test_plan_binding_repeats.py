"""A model's layers repeat a few kernels: binding decides once per distinct op and the runtime emits
and compiles once per distinct kernel, and every step still gets what binding it alone would give."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tessera_rw import op
from tessera_rw.codegen import plan_binding, plan_runtime
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.plan_binding import NoTemplateError, bind_plan

H100 = arch_named("H100-SXM")
LAYERS = 4


@op.kernel
def mlp_stack(x, w1, b1, w2):
    for _ in range(LAYERS):
        x = x + op.gelu(x @ w1 + b1) @ w2
    return op.softmax(x, axis=-1)


def stack_plan(dtype="bf16"):
    return mlp_stack.program(op.tensor((128, 64), dtype), op.tensor((64, 256), dtype), op.tensor((256,), dtype),
                             op.tensor((256, 64), dtype)).plan


def test_steps_of_one_kernel_emit_one_source():
    bound = bind_plan(stack_plan(), H100)
    keys = {b.kernel_key for b in bound}
    assert len(keys) < len(bound) and len({b.op for b in bound}) == len(keys)
    sources = {}
    for b in bound:
        assert sources.setdefault(b.kernel_key, b.source(H100)) == b.source(H100)


def test_a_pinned_schedule_stays_on_its_step_when_its_op_repeats():
    bound = bind_plan(stack_plan(), H100)
    first, *repeats = [i for i, b in enumerate(bound) if b.op == bound[0].op]
    other = bound[first].schedules[-1]
    assert repeats and other != bound[first].schedule
    pinned = bind_plan(stack_plan(), H100, schedules={repeats[0]: other})
    assert pinned[repeats[0]].schedule == other
    assert all(pinned[i].schedule == bound[i].schedule for i in (first, *repeats[1:]))
    assert [b.kernel_key for b in pinned].count(pinned[repeats[0]].kernel_key) == 1


def test_every_repeated_step_without_a_template_is_named():
    with pytest.raises(NoTemplateError) as e:
        bind_plan(stack_plan("float64"), H100)        # no float64 GEMM template: 2 matmuls a layer
    lines = str(e.value).splitlines()
    assert lines[0] == f"plan mlp_stack: {2 * LAYERS} kernel(s) have no GPU template:"
    assert [line.split(": ")[1] for line in lines[1:3]] * LAYERS == [line.split(": ")[1] for line in lines[1:-1]]
    assert "cast the float64 operands" in e.value.hint


def test_a_device_plan_compiles_each_kernel_once(monkeypatch):
    """Without a GPU: the device calls stubbed, NVRTC counted."""
    stream = SimpleNamespace(device=SimpleNamespace(arch="90", device_id=0), sync=lambda: None)
    monkeypatch.setattr(plan_runtime, "require_gpu", lambda *a, **k: None)
    monkeypatch.setattr(plan_runtime, "resolve_stream", lambda *a: stream)
    monkeypatch.setattr(plan_runtime, "empty_like_kind", lambda *a: (None, None))
    monkeypatch.setattr(plan_runtime, "to_device", lambda *a, **k: None)
    monkeypatch.setattr(plan_runtime, "launcher", lambda *a: None)
    compiled = []
    monkeypatch.setattr(plan_binding, "compile_cuda", lambda source, sm: compiled.append(source) or (source.name, sm))
    plan = stack_plan()
    device_plan = plan_runtime.DevicePlan(plan, 0, Numerics.DETERMINISTIC, H100)
    bound = bind_plan(plan, H100)
    assert len(compiled) == len({b.kernel_key for b in bound}) < len(plan.steps)
    for kernel, b in zip(device_plan.kernels, bound, strict=True):
        assert kernel.source == b.source(H100) and kernel.binary == (kernel.source.name, "sm_90")
