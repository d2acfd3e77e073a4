"""Running a KernelPlan on the GPU: kernels compiled once, buffers allocated once, launches in order.

A `DevicePlan` is a plan made ready on one device under one numerics policy: every step bound to
its template and compiled for the device's sm_XY (steps of one kernel, as repeated layers are,
share one; a library step, an FFT, gets its cuFFT plan made instead), temporaries allocated (a
reused buffer is one allocation, sized for the largest value it holds), one workspace for the
kernels that take one (sized for the largest; each launch zeroes it), constants uploaded. A call moves the inputs in (numpy copied, torch / CuPy used
in place), allocates the output buffers of the first input's kind, enqueues every kernel and
library call on the stream and hands the outputs back (numpy copied out).

A value is its buffer's pointer plus the value's byte offset (views: contiguous slices and
reshapes launch nothing). Outputs that are views of one value share its output buffer: it is
allocated flat and each caller gets a tensor over their own part of it (a torch or CuPy view, a
DeviceTensor at the offset); an output that fills its buffer alone is allocated at its own shape.

A call runs on the stream it is given, else, for torch tensors, on torch's current stream (where
torch's own next op on the outputs runs: nothing to order between the two; its legacy default
stream only on the current device), else on the plan's own. Temporaries and the workspace belong
to the DevicePlan, so calls enqueue their work one at a time (a lock), and a call on another
stream than the call before waits for that call first.

What a call costs the host is kept to what changes between calls: each kernel is loaded and
configured when the plan is made (launch.KernelLauncher); the launches made for one set of input
and output addresses on one stream are kept for the next call that has the same (torch's allocator
hands the same blocks back to a loop); and the streams are ordered once each way per call, not
per tensor (not at all where the call runs on torch's stream).

>>> run_plan_on_gpu(plan, {"x": x})          # doctest: +SKIP
(array([...], dtype=float32),)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Callable, Mapping, Sequence

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.evaluate import evaluate_node
from tessera_rw.codegen.arch import ArchSpec, current_arch
from tessera_rw.codegen.compile import CompiledKernel, KernelSource
from tessera_rw.codegen.device import DeviceError, library_stream, order_after, require_gpu, resolve_stream
from tessera_rw.codegen.device_arrays import (DeviceTensor, device_index_of, empty_like_kind, kind_of, to_device,
                                             to_host, window)
from tessera_rw.codegen.launch import launcher
from tessera_rw.codegen.library_kernels import CuFFTKernel, FFTCall
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.plan_binding import BoundStep, bind_plan
from tessera_rw.codegen.step_timing import DeviceStepTimer, PlanRun, active_recorders, stream_id
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.lower.plan import BufferRole, KernelPlan, ValueRef


def _view(base: DeviceTensor, ref: ValueRef) -> DeviceTensor:
    """Value `ref` in the allocation `base`: `ref.offset` bytes past its pointer (lowering keeps
    offsets 16-byte multiples, so vector loads stay aligned), at the value's shape and dtype."""
    return DeviceTensor(base.ptr + ref.offset, ref.type.shape, ref.type.dtype, base.owner, base.kind, base.device)


def _output_groups(plan: KernelPlan) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Each output buffer with the indexes of the outputs in it, in order of first appearance.

    >>> from tessera_rw.algebra.builder import make, make_input
    >>> from tessera_rw.algebra.dtypes import DType
    >>> from tessera_rw.algebra.graph import Graph
    >>> from tessera_rw.lower.lowering import lower
    >>> x = make_input("x", (5, 4), DType.float32)
    >>> e = make("exp", x)
    >>> rows = lambda a, b: make("slice", e, starts=(a, 0), stops=(b, 4), steps=(1, 1))
    >>> _output_groups(lower(Graph("f", (x,), (rows(0, 4), make("tanh", x), rows(4, 5)))))
    ((1, (0, 2)), (2, (1,)))
    """
    groups: dict[int, list[int]] = {}
    for i, ref in enumerate(plan.outputs):
        groups.setdefault(ref.buffer, []).append(i)
    return tuple((b, tuple(outs)) for b, outs in groups.items())


def _fills(ref: ValueRef, nbytes: int) -> bool:
    return ref.offset == 0 and ref.type.nbytes == nbytes


BOUND_CALLS = 8          # (address set, stream) pairs whose launches a DevicePlan keeps


@dataclass(frozen=True)
class _Compiled:
    step: BoundStep
    source: Any = None                     # a generated kernel's source and cubin
    binary: Any = None
    library: CuFFTKernel | None = None     # or the library call that runs the step


class DevicePlan:
    """`plan` compiled and allocated on one device; call `run(values, stream)` as often as needed."""

    def __init__(self, plan: KernelPlan, device_index: int, numerics: Numerics, arch: ArchSpec | None = None,
                 schedules: Mapping[int, Schedule] | None = None):
        require_gpu("running a plan", op=plan.name)
        self.plan, self.numerics = plan, numerics
        self.stream = resolve_stream(None, device_index)
        dev = self.stream.device
        self.arch = arch or current_arch()
        sm = f"sm_{dev.arch}"
        calls: dict[FFTCall, CuFFTKernel] = {}    # steps run in order on one stream: equal calls share one
        built: dict[tuple, tuple[KernelSource, CompiledKernel]] = {}   # by kernel_key: each kernel emitted once
        kernels = []
        for b in bind_plan(plan, self.arch, numerics, schedules):
            if b.call is None:
                if b.kernel_key not in built:
                    built[b.kernel_key] = b.compile(self.arch, sm)
                kernels.append(_Compiled(b, *built[b.kernel_key]))
                continue
            if b.call not in calls:
                calls[b.call] = CuFFTKernel(b.call, dev.device_id)
            kernels.append(_Compiled(b, library=calls[b.call]))
        self.kernels = tuple(kernels)
        self.output_groups = _output_groups(plan)
        scratch = max((k.source.workspace_bytes for k in kernels if k.source is not None), default=0)
        self.workspace = empty_like_kind("cuda", (scratch,), DType.bool, self.stream)[0] if scratch else None
        self.resident: dict[int, DeviceTensor] = {}
        for b in plan.buffers:
            if b.role is BufferRole.TEMP:
                self.resident[b.id] = empty_like_kind("cuda", (max(b.nbytes, 1),), DType.bool, self.stream)[0]
        for node, ref in plan.constants:
            value = evaluate_node(node, []).astype(ref.type.dtype.numpy)
            self.resident[ref.buffer] = to_device(value, self.stream)
        self.launchers = tuple(None if k.library is not None else
                               launcher(k.source, k.binary, self.stream, len(k.step.step.inputs) + 1, self.workspace)
                               for k in self.kernels)
        # the buffers whose addresses change between calls: the inputs' and the outputs'
        self.varying = tuple(dict.fromkeys([ref.buffer for _, ref in plan.inputs] + [b for b, _ in self.output_groups]))
        self._launches_by_key: dict[tuple[int, ...], tuple[Any, ...]] = {}     # see _launches
        self.has_library_steps = any(k.library is not None for k in self.kernels)
        self._lock = threading.Lock()
        self._last_stream = None         # the stream of the last call (see _stream_for)
        self.stream.sync()

    def run(self, values: Mapping[str, Any], stream: Any = None) -> tuple[Any, ...]:
        plan = self.plan
        missing = [n for n, _ in plan.inputs if n not in values]
        if missing:
            raise ArgumentError(f"plan {plan.name}: no value for inputs {missing}")
        with self._lock:            # one call's work is enqueued before another's: they share temporaries
            return self._run(values, stream)

    def _run(self, values: Mapping[str, Any], stream: Any) -> tuple[Any, ...]:
        plan = self.plan
        device = self.stream.device.device_id
        first = values[plan.inputs[0][0]] if plan.inputs else None
        kind = kind_of(first) if first is not None else "numpy"
        given, stream = stream, self._stream_for(kind, stream, device)
        on_torch_stream = given is None and kind == "torch" and stream is not self.stream    # torch's current stream
        memory = dict(self.resident)
        for i, (name, ref) in enumerate(plan.inputs):
            memory[ref.buffer] = to_device(values[name], stream, index=i, order=False)
            if memory[ref.buffer].shape != ref.type.shape or memory[ref.buffer].dtype is not ref.type.dtype:
                got = memory[ref.buffer]
                raise ArgumentError(f"plan {plan.name}: input {name!r} is {got.dtype}{list(got.shape)}, "
                                    f"the plan was built for {ref.type}")
        results = self._allocate_outputs(kind, stream, memory)
        # the libraries' pending work comes first: what produced the inputs, and what may still use
        # the memory their allocators just handed out (nothing to order where we run on their stream)
        library_streams = [stream if library == "torch" and on_torch_stream else library_stream(library, device)
                           for library in sorted({memory[ref.buffer].kind for _, ref in plan.inputs} | {kind})]
        for library in library_streams:
            order_after(stream, library)
        recorders = active_recorders()
        if recorders:                   # profiled: CUDA events around each launch, one sync after the last
            timer = DeviceStepTimer(stream)
            for i, launch in enumerate(self._launches(memory, stream)):
                timer.launch(i, launch)
            where, schedules = f"cuda:{device}", tuple(k.step.schedule for k in self.kernels)
            timer.report(recorders, PlanRun(plan, self.numerics, where, stream_id(stream), self.arch, schedules))
        else:
            for launch in self._launches(memory, stream):
                launch()
        # ... and the libraries' next work comes after ours: their outputs, and the memory of their
        # inputs (a contiguous copy made for this call goes back to its allocator now)
        for library in library_streams:
            order_after(library, stream)
        if kind == "numpy":
            return tuple(to_host(_view(memory[ref.buffer], ref), stream) for ref in plan.outputs)
        return tuple(results)

    def _stream_for(self, kind: str, stream: Any, device: int) -> Any:
        """The stream a call runs on: the one given, else torch's current stream for torch tensors
        (as a torch op would run) and the plan's own for the rest. A call on another stream than
        the call before waits for it: the plan's temporaries are one set."""
        if stream is not None:
            stream = resolve_stream(stream, device)
            if stream.device.device_id != device:
                raise DeviceError(f"plan {self.plan.name} was made for cuda:{device}, the stream is on "
                                  f"cuda:{stream.device.device_id}",
                                  hint="pass a stream on the device the plan's inputs live on")
        else:
            stream = (self._torch_stream(device) if kind == "torch" else None) or self.stream
        if self._last_stream is not None:
            order_after(stream, self._last_stream)
        self._last_stream = stream
        return stream

    @staticmethod
    def _torch_stream(device: int) -> Any:
        """torch's current stream on `device` where a launch on it runs there, else None: a stream
        of torch's own is tied to its device; the legacy default stream (handle 0) runs on the
        current device, and cuda.core's wrapper of it keeps the device it first met."""
        stream = library_stream("torch", device)
        if stream.device.device_id != device:
            return None
        if int(stream.handle) == 0:
            import torch
            return stream if torch.cuda.current_device() == device else None
        return stream

    def _allocate_outputs(self, kind: str, stream: Any, memory: dict[int, DeviceTensor]) -> tuple[Any, ...]:
        """Allocate every output buffer of the caller's `kind` into `memory`; returns what the caller
        gets for each output (None for numpy: copied out after the run)."""
        outputs = self.plan.outputs
        handed: list[Any] = [None] * len(outputs)
        for buffer, indexes in self.output_groups:
            nbytes, dtype = self.plan.buffers[buffer].nbytes, outputs[indexes[0]].type.dtype
            if len(indexes) == 1 and _fills(outputs[indexes[0]], nbytes):
                only = indexes[0]
                memory[buffer], handed[only] = empty_like_kind(kind, outputs[only].type.shape, dtype, stream,
                                                               order=False)
                continue
            memory[buffer], flat = empty_like_kind(kind, (nbytes // dtype.itemsize,), dtype, stream,
                                                   order=False)
            if flat is not None:
                for i in indexes:
                    handed[i] = window(flat, outputs[i].offset, outputs[i].type.shape)
        return tuple(handed)

    def _launches(self, memory: dict[int, DeviceTensor], stream: Any) -> Sequence[Callable[[], None]]:
        """Each step's launch on `memory` and `stream`: the kernels' launches made once per set of
        addresses and stream, the library calls made afresh (they hold the tensors themselves)."""
        key = (*(memory[b].ptr for b in self.varying), int(stream.handle))
        found = self._launches_by_key.get(key)
        if found is None:
            found = tuple(None if ready is None else ready.bound(self._arguments(k, memory), stream)
                          for k, ready in zip(self.kernels, self.launchers))
            if len(self._launches_by_key) >= BOUND_CALLS:        # the oldest goes
                self._launches_by_key.pop(next(iter(self._launches_by_key), None), None)
            self._launches_by_key[key] = found
        if not self.has_library_steps:
            return found
        return [partial(k.library, self._arguments(k, memory), stream) if launch is None else launch
                for k, launch in zip(self.kernels, found)]

    @staticmethod
    def _arguments(k: _Compiled, memory: dict[int, DeviceTensor]) -> list[DeviceTensor]:
        """A step's operands, then its output, in `memory`."""
        step = k.step.step
        return [_view(memory[r.buffer], r) for r in (*step.inputs, step.output)]


@lru_cache(maxsize=64)
def device_plan(plan: KernelPlan, device_index: int, numerics: Numerics,
                schedules: tuple[tuple[int, Schedule], ...] = ()) -> DevicePlan:
    """The DevicePlan of `plan` on a device under a policy, with some steps' schedules pinned
    ((step index, schedule) pairs), made once."""
    return DevicePlan(plan, device_index, numerics, schedules=dict(schedules))


def run_plan_on_gpu(plan: KernelPlan, values: Mapping[str, Any], *, numerics: Numerics = Numerics.DETERMINISTIC,
                    stream: Any = None, schedules: tuple[tuple[int, Schedule], ...] = ()) -> tuple[Any, ...]:
    """Run `plan` on the device its CUDA inputs live on (numpy inputs: the current device), with
    the schedules of the steps `schedules` names pinned (the others: their template's default)."""
    devices = {d for d in map(device_index_of, values.values()) if d is not None}
    if len(devices) > 1:
        raise ArgumentError(f"plan {plan.name}: inputs live on devices {sorted(devices)}",
                            hint="put every input on one GPU")
    return device_plan(plan, devices.pop() if devices else 0, numerics, schedules).run(values, stream)
