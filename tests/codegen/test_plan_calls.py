"""What a DevicePlan call costs the host, checked without a GPU (the device calls stubbed): each
kernel is made ready once, launches are bound once per set of input and output addresses and
stream, a call on torch tensors runs on torch's stream (nothing to order), other streams are
ordered once per call rather than per tensor, and every launch gets its step's pointers in step
order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen import plan_binding, plan_runtime
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.device import DeviceError
from tessera_rw.codegen.device_arrays import DeviceTensor
from tessera_rw.codegen.numerics import Numerics

H100 = arch_named("H100-SXM")


@op.kernel
def gelu_then_softmax(x, w):
    return op.softmax(op.gelu(x @ w), axis=-1)


class Device:
    """The stubbed device: a stream, an allocator that hands each call's outputs the same blocks
    (as torch's caching allocator does in a loop), and a log of what the runtime asks of it."""

    def __init__(self):
        self.stream = SimpleNamespace(device=SimpleNamespace(arch="90", device_id=0), sync=lambda: None, handle=7)
        self.torch_stream = SimpleNamespace(device=self.stream.device, handle=5)
        self.next_address, self.made_ready, self.bound, self.launched, self.orders = 0x10000, [], [], [], []
        self.order_flags = []

    def allocate(self, kind, shape, dtype, stream, order=True):
        self.order_flags.append(order)
        tensor = DeviceTensor(self.next_address, tuple(shape), dtype, None, kind)
        self.next_address += 0x10000
        return tensor, tensor

    def launcher(self, source, binary, stream, arguments, workspace=None):
        self.made_ready.append(source.name)
        device = self

        class Ready:
            def bound(self, args, stream):
                device.bound.append(source.name)
                assert len(args) == arguments
                pointers = [a.ptr for a in args]
                return lambda: device.launched.append((source.name, pointers, stream))
        return Ready()

    def order_after(self, waiter, producer):        # as device.order_after: nothing to order on one stream
        if waiter.handle != producer.handle:
            self.orders.append((waiter.handle, producer.handle))


@pytest.fixture
def device(monkeypatch):
    d = Device()
    monkeypatch.setattr(plan_runtime, "require_gpu", lambda *a, **k: None)
    monkeypatch.setattr(plan_runtime, "resolve_stream", lambda *a: d.stream)
    monkeypatch.setattr(plan_runtime, "empty_like_kind", d.allocate)
    monkeypatch.setattr(plan_runtime, "launcher", d.launcher)
    monkeypatch.setattr(plan_runtime, "kind_of", lambda value: "torch")
    monkeypatch.setattr(plan_runtime, "library_stream", lambda kind, index: d.torch_stream)
    monkeypatch.setattr(plan_runtime, "order_after", d.order_after)

    def to_device(value, stream, index=0, order=True):
        d.order_flags.append(order)
        return value
    monkeypatch.setattr(plan_runtime, "to_device", to_device)
    monkeypatch.setattr(plan_binding, "compile_cuda", lambda source, sm: (source.name, sm))
    return d


def _inputs(x_address: int) -> dict[str, DeviceTensor]:
    return {"x": DeviceTensor(x_address, (64, 32), DType.bfloat16, None, "torch"),
            "w": DeviceTensor(0x900000, (32, 48), DType.bfloat16, None, "torch")}


def _plan():
    return gelu_then_softmax.program(op.tensor((64, 32), "bf16"), op.tensor((32, 48), "bf16")).plan


def test_launches_are_bound_once_per_set_of_addresses(device):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    kernels = [k.source.name for k in plan.kernels]
    assert device.made_ready == kernels and len(kernels) >= 2
    first_output = device.next_address
    for x_address in (0x800000, 0x800000, 0xA00000):
        device.next_address = first_output            # the allocator hands the same output blocks back
        plan.run(_inputs(x_address))
    assert device.made_ready == kernels               # made ready when the plan was made, never again
    assert device.bound == kernels * 2                # the second call reused the first's launches
    assert [name for name, _, _ in device.launched] == kernels * 3


def test_each_launch_gets_its_steps_pointers(device):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    plan.run(_inputs(0x800000))
    (_, first, _), *_, (_, last, _) = device.launched
    assert first[:2] == [0x800000, 0x900000]          # x @ w reads x, then w
    assert last[-1] not in (0x800000, 0x900000)       # the last step writes the output buffer


def test_a_call_on_torch_tensors_runs_on_torch_s_stream_with_nothing_to_order(device):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    device.order_flags.clear()
    plan.run(_inputs(0x800000))
    assert device.orders == [] and {s.handle for _, _, s in device.launched} == {device.torch_stream.handle}
    assert device.order_flags and not any(device.order_flags)   # no tensor ordered on its own


def test_a_call_on_another_stream_is_ordered_once_each_way_and_after_the_call_before(device):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    plan.run(_inputs(0x800000))                                 # on torch's stream
    device.launched.clear()
    device.order_flags.clear()
    plan.run(_inputs(0x800000), stream=device.stream)
    # before the launches our stream waits for torch's (its tensors, and the call before), after
    # them torch's waits for ours; no tensor is ordered on its own
    ours, torch = device.stream.handle, device.torch_stream.handle
    assert set(device.orders) == {(ours, torch), (torch, ours)} and device.orders[-1] == (torch, ours)
    assert {s.handle for _, _, s in device.launched} == {ours} and not any(device.order_flags)


def test_a_call_on_another_stream_waits_for_the_call_before_it(device, monkeypatch):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    monkeypatch.setattr(plan_runtime, "kind_of", lambda value: "cuda")         # no library's stream to order
    monkeypatch.setattr(plan_runtime, "library_stream", lambda kind, index: None)
    monkeypatch.setattr(plan_runtime, "order_after", lambda waiter, producer: None in (waiter, producer) or
                        device.order_after(waiter, producer))
    other = SimpleNamespace(device=device.stream.device, handle=8)
    for stream in (None, other, other, None):
        monkeypatch.setattr(plan_runtime, "resolve_stream", lambda *a, s=stream: s or device.stream)
        plan.run(_inputs(0x800000), stream=stream)
    ours = device.stream.handle
    assert device.orders == [(8, ours), (ours, 8)]        # each switch waits for the call before, once


def test_a_launch_is_bound_once_per_stream_and_reused_on_it(device, monkeypatch):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    first_output = device.next_address
    other = SimpleNamespace(device=device.stream.device, handle=8)
    for stream in (device.stream, other, device.stream):
        device.next_address = first_output
        monkeypatch.setattr(plan_runtime, "resolve_stream", lambda *a, s=stream: s)
        plan.run(_inputs(0x800000), stream=stream)
    kernels = len(plan.kernels)
    assert len(device.bound) == 2 * kernels              # the same addresses: bound once on each stream
    assert [s for _, _, s in device.launched] == [device.stream] * kernels + [other] * kernels + [device.stream] * kernels


def test_a_stream_on_another_device_is_refused_before_anything_runs(device, monkeypatch):
    plan = plan_runtime.DevicePlan(_plan(), 0, Numerics.DETERMINISTIC, H100)
    elsewhere = SimpleNamespace(device=SimpleNamespace(arch="90", device_id=1), handle=9)
    monkeypatch.setattr(plan_runtime, "resolve_stream", lambda *a: elsewhere)
    with pytest.raises(DeviceError, match="made for cuda:0, the stream is on cuda:1"):
        plan.run(_inputs(0x800000), stream=elsewhere)
    assert not device.launched and not device.orders
