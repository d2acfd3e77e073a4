"""Measuring schedules of one kernel on the GPU.

For each batch of schedules: emit and compile them in parallel (NVRTC runs outside the GIL), run
each once on random inputs (never zeros) and check its output against the numpy reference at the
tolerance of its dtype and math unit (a wrong kernel is a failure, never a time), then time the
survivors interleaved (`measure.interleaved`): CUDA events around each launch, a buffer twice
the L2 overwritten before each one so every launch reads from HBM, and, when the operands are
small enough that several copies fit in L2, input sets rotated so no launch finds its operands
left in cache by its own previous run. A schedule that fails to emit, compile, launch or check
gets the reason as its failure; the others go on.

>>> measurer = DeviceMeasurer(template, op, arch)          # doctest: +SKIP
>>> measurer.measure(template.space(op, arch)[:4])          # doctest: +SKIP
[Measurement(median_us=41.2, noise_us=0.1, ...), ...]
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tessera_rw.codegen.arch import ArchSpec, current_arch
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.device import require_gpu, resolve_stream
from tessera_rw.codegen.device_arrays import empty_like_kind, to_device, to_host
from tessera_rw.codegen.kernel_check import Expected, KernelMismatchError, check, expected
from tessera_rw.codegen.kernel_inputs import Inputs, random_inputs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.launch import bind, l2_flush_buffer
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.step_timing import not_recording
from tessera_rw.codegen.templates.base import Schedule, Template
from tessera_rw.lower.plan import KernelPlan
from tessera_rw.tune.measure import Measurement, interleaved
from tessera_rw.tune.records import ChosenBy

WARMUP = 2
ROUNDS = 15
MAX_INPUT_SETS = 8          # rotating copies of the operands, when they fit in L2 several times over
COMPILE_WORKERS = min(8, os.cpu_count() or 1)


class DeviceMeasurer:
    """Times schedules of `op` on the current GPU (device `device_index`)."""
    method = ChosenBy.ON_DEVICE

    def __init__(self, template: Template, op: KernelOp, arch: ArchSpec, *, device_index: int = 0,
                 rounds: int = ROUNDS, warmup: int = WARMUP):
        require_gpu("timing kernels", op=op.op)
        from cuda.core import EventOptions
        self.template, self.op, self.arch = template, op, arch
        self.rounds, self.warmup = rounds, warmup
        self.stream = resolve_stream(None, device_index)
        self.sm = f"sm_{self.stream.device.arch}"
        self.timing = EventOptions(timing_enabled=True)
        inputs, self.reference = _problem(op)
        footprint = op.operand_bytes + op.result.nbytes
        sets = 1 if footprint == 0 else max(1, min(MAX_INPUT_SETS, math.ceil(2 * arch.l2_bytes / footprint)))
        if sets * footprint > 4 * arch.l2_bytes:
            sets = 1
        self.sets = []
        for _ in range(sets):
            self.sets.append(_on_device(op, inputs, self.stream))
        self.flush = l2_flush_buffer(self.stream.device.device_id, 2 * arch.l2_bytes)
        self.stream.sync()

    def _compile(self, schedule: Schedule):
        source = self.template.emit(self.op, schedule, self.arch)
        return source, compile_cuda(source, self.sm)

    def _checked(self, schedule: Schedule, source, binary) -> list:
        """The launches of `schedule`, one per input set, after its output passed the check."""
        launches = [bind(source, binary, args, self.stream) for args in self.sets]
        launches[0]()
        out = to_host(self.sets[0][-1], self.stream)
        unit = self.template.resources(self.op, schedule, self.arch).unit
        check(self.reference.on(unit), out, f"{self.op} at {schedule.describe()}")
        _VERIFIED.add((self.op, schedule))
        return launches

    def measure(self, schedules: Sequence[Schedule]) -> list[Measurement]:
        results: dict[int, Measurement] = {}
        with ThreadPoolExecutor(max_workers=COMPILE_WORKERS) as pool:
            futures = [pool.submit(self._compile, s) for s in schedules]
        runnable = {}
        for i, (s, future) in enumerate(zip(schedules, futures)):
            try:
                source, binary = future.result()
                runnable[i] = self._checked(s, source, binary)
            except KernelMismatchError as e:
                results[i] = Measurement.failed(f"wrong results: {e}")
            except Exception as e:       # a compile or launch error fails this schedule, not the batch
                results[i] = Measurement.failed(f"{type(e).__name__}: {e}")
        counters = {i: 0 for i in runnable}

        def timed(i: int):
            def run() -> float:
                launches = runnable[i]
                launch = launches[counters[i] % len(launches)]
                counters[i] += 1
                self.flush.fill(counters[i] & 0xFF, stream=self.stream)
                start = self.stream.record(options=self.timing)
                launch()
                end = self.stream.record(options=self.timing)
                end.sync()
                return (end - start) * 1e3           # events measure milliseconds
            return run

        samples = interleaved({i: timed(i) for i in runnable}, warmup=self.warmup, rounds=self.rounds)
        for i, times in samples.items():
            results[i] = Measurement.of(times)
        return [results[i] for i in range(len(schedules))]


_VERIFIED: set[tuple[KernelOp, Schedule]] = set()     # kernels that passed their check in this process


def verify_kernel(template: Template, op: KernelOp, schedule: Schedule, source, binary, stream) -> None:
    """Run the compiled `schedule` of `op` once on random inputs and check it against the numpy
    reference (KernelMismatchError when wrong), unless it passed already in this process: how a kernel
    that tuning did not measure (a pinned one, one read from the cache) is checked before a plan
    holding it is timed."""
    if (op, schedule) in _VERIFIED:
        return
    inputs, reference = _problem(op)
    args = _on_device(op, inputs, stream)
    bind(source, binary, args, stream)()
    unit = template.resources(op, schedule, current_arch()).unit
    check(reference.on(unit), to_host(args[-1], stream), f"{op} at {schedule.describe()}")
    _VERIFIED.add((op, schedule))


def _problem(op: KernelOp) -> tuple[Inputs, Expected]:
    """`op`'s random inputs (never zeros) and their float64 reference, the same for every check of it."""
    rng = np.random.default_rng(zlib.crc32(str(op).encode()))
    inputs = random_inputs(op, rng)
    return inputs, expected(op, inputs, rng)


def _on_device(op: KernelOp, inputs: Inputs, stream) -> tuple:
    """The operands copied to the device, then an output buffer: one launch's arguments."""
    args = [to_device(np.ascontiguousarray(a), stream, index=i) for i, a in enumerate(inputs.arrays)]
    return (*args, empty_like_kind("cuda", op.result.shape, op.result.dtype, stream)[0])


def _random_value(shape: tuple[int, ...], dtype, rng: np.random.Generator) -> np.ndarray:
    np_dtype = dtype.numpy
    if np_dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(np_dtype, np.integer):
        return rng.integers(1, 8, shape).astype(np_dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(np_dtype)


@not_recording()          # tuning's repetitions are not the user's launches: an open profiler session skips them
def time_plans(plans: Sequence[tuple[KernelPlan, tuple[tuple[int, Schedule], ...]]], numerics: Numerics, *,
               device_index: int = 0, rounds: int = ROUNDS, warmup: int = WARMUP) -> list[Measurement]:
    """Whole plans of one program (same inputs), each with its schedules, timed interleaved on the GPU
    on one set of random inputs, an L2 flush before each run. Each generated kernel is checked
    against its reference first (verify_kernel). A plan that fails to compile, check or run gets
    the reason as its failure."""
    require_gpu("timing plans", op=plans[0][0].name if plans else "plan")
    from cuda.core import EventOptions
    from tessera_rw.codegen.plan_runtime import device_plan
    stream = resolve_stream(None, device_index)
    rng = np.random.default_rng(0)
    values = {name: to_device(_random_value(ref.type.shape, ref.type.dtype, rng), stream)
              for name, ref in plans[0][0].inputs}
    flush = l2_flush_buffer(stream.device.device_id, 2 * current_arch().l2_bytes)
    timing = EventOptions(timing_enabled=True)
    results: dict[int, Measurement] = {}
    ready = {}
    for i, (plan, schedules) in enumerate(plans):
        try:
            ready[i] = device_plan(plan, device_index, numerics, schedules)
            for k in ready[i].kernels:
                if k.source is not None:
                    verify_kernel(k.step.template, k.step.op, k.step.schedule, k.source, k.binary, stream)
            ready[i].run(values)
            ready[i].stream.sync()
        except KernelMismatchError as e:
            results[i] = Measurement.failed(f"wrong results: {e}")
            ready.pop(i, None)
        except Exception as e:        # one candidate's failure leaves the others to compete
            results[i] = Measurement.failed(f"{type(e).__name__}: {e}")
            ready.pop(i, None)

    def timed(i: int):
        def run() -> float:
            dp = ready[i]
            flush.fill(0x5A, stream=dp.stream)
            start = dp.stream.record(options=timing)
            dp.run(values)
            end = dp.stream.record(options=timing)
            end.sync()
            return (end - start) * 1e3
        return run

    for i, times in interleaved({i: timed(i) for i in ready}, warmup=warmup, rounds=rounds).items():
        results[i] = Measurement.of(times)
    return [results[i] for i in range(len(plans))]
