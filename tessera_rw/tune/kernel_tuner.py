"""Tuning one kernel: its schedule on one GPU, from the cache when it holds the answer, else by search.

Methods: `on_device` measures on the GPU (an error without one, suggesting `cost_model`);
`cost_model` ranks by the roofline model alone; `auto` is on_device when a GPU is present, else
cost_model. A cached on-device record answers any method; a cached estimate answers only
`cost_model` (a measurement is worth re-tuning for). A shape never tuned starts its search from
the nearest cached shape's schedule (interpolated), ahead of the cost model's picks.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.arch import arch_named
>>> t = TensorType((1024, 1024), DType.bfloat16)
>>> tuned = tune_kernel(KernelOp.of("matmul", (t, t), t, accum_dtype=None), arch_named("H100-SXM"),
...                     method="cost_model")
>>> tuned.kind, str(tuned.chosen_by), tuned.time_us > 0
('gemm', 'cost_model', True)
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera_rw.algebra.errors import ArgumentError, TesseraError
from tessera_rw.codegen.arch import ArchSpec, is_this_gpu, this_gpu_name
from tessera_rw.codegen.device import gpu_available
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule, Template
from tessera_rw.codegen.templates.registry import template_for
from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.measure import CostModelMeasurer, Measurer
from tessera_rw.tune.records import ChosenBy, TuneRecord
from tessera_rw.tune.search import SearchResult, Strategy, Trial, search_space
from tessera_rw.tune.space import SpaceRestriction, find_schedule, ranked_space, schedule_config


class Method(enum.StrEnum):
    ON_DEVICE = "on_device"
    COST_MODEL = "cost_model"
    AUTO = "auto"

    @staticmethod
    def parse(method: str | Method, what: str = "") -> Method:
        try:
            return Method(method)
        except ValueError:
            raise ArgumentError(f"autotune {what + ': ' if what else ''}unknown method {method!r}",
                                hint="use 'on_device' (time on the GPU), 'cost_model' (rank by the roofline "
                                     "model) or 'auto' (on_device on a GPU of the arch tuned for, else "
                                     "cost_model)") from None

    @staticmethod
    def resolve(method: str | Method, what: str, arch: ArchSpec | None = None) -> Method:
        """'auto' becomes on_device when this machine's GPU is an `arch` (any GPU when None), else
        cost_model; on_device without a GPU, or on another GPU than `arch`, is an error."""
        m = Method.parse(method, what)
        here = gpu_available() and (arch is None or is_this_gpu(arch))
        if m is Method.AUTO:
            return Method.ON_DEVICE if here else Method.COST_MODEL
        if m is Method.ON_DEVICE and not gpu_available():
            raise TesseraError(f"autotune {what}: method='on_device' times kernels on an NVIDIA GPU, and this "
                               "machine has none (or no usable CUDA driver)",
                               hint="use method='cost_model' to rank schedules by the roofline model, or 'auto' "
                                    "to measure when a GPU is present")
        if m is Method.ON_DEVICE and not here:
            raise TesseraError(f"autotune {what}: method='on_device' would time {arch.name}'s kernels on this "
                               f"machine's {this_gpu_name()}, and keep the times as {arch.name}'s",
                               hint=f"use method='cost_model' to rank schedules by {arch.name}'s roofline model, "
                                    f"or tune on a {arch.name}")
        return m


class TuneError(TesseraError):
    """A kernel could not be tuned: every schedule failed."""


def signature_hash(op: KernelOp, template: Template, restriction: SpaceRestriction | None = None) -> str:
    """What, besides shapes and dtypes, decides a kernel's code: op, attributes, result dtype,
    numerics policy and kind; and a user's restriction of the space searched, so the best of a
    restricted search never answers for the whole space. 16 hex digits, stable across processes."""
    key = (op.op, op.attrs, op.result.dtype.value, op.numerics.value, template.kind_of(op))
    if restriction is not None and not restriction.is_free:
        key += (restriction,)
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class KernelTuning:
    """The schedule chosen for one kernel, how, and what was weighed."""
    op: KernelOp
    kind: str
    schedule: Schedule
    default: Schedule                 # the cost model's pick among the template's defaults
    chosen_by: ChosenBy
    time_us: float
    noise_us: float
    search: SearchResult | None       # None when the cache answered
    space_size: int
    pruned: int
    record: TuneRecord | None = None

    @property
    def trials(self) -> tuple[Trial, ...]:
        return self.search.trials if self.search is not None else ()


def _record(op: KernelOp, template: Template, arch: ArchSpec, schedule: Schedule, time_us: float,
            chosen_by: ChosenBy, noise_us: float = 0.0, trials: int = 0,
            restriction: SpaceRestriction | None = None) -> TuneRecord:
    return TuneRecord.create(op_name=op.op, signature_hash=signature_hash(op, template, restriction),
                             shapes=[t.shape for t in op.operands], dtypes=[t.dtype for t in op.operands],
                             arch=arch, config=schedule_config(schedule), time_us=time_us, chosen_by=chosen_by,
                             noise_us=noise_us, trials=trials)


def _stale(cache: TuneCache, record: TuneRecord, space: Sequence[Schedule]) -> bool:
    """Whether the cache holds a record of `record`'s key whose schedule the space no longer has (a
    template narrowed its schedules, or an import brought one no template runs): the new result
    replaces it, however fast it claimed to be, or every run would tune again."""
    held = cache.get(record.op_name, record.signature_hash, record.shapes, record.dtypes, record.arch)
    return held is not None and find_schedule(space, held.config) is None


def cached_schedule(op: KernelOp, arch: ArchSpec, cache: TuneCache, *, space: Sequence[Schedule] | None = None,
                    interpolate: bool = True, restriction: SpaceRestriction | None = None,
                    ) -> tuple[Schedule, TuneRecord] | None:
    """The cached schedule for `op` on `arch` (or, with `interpolate`, the nearest shape's, its
    record marked interpolated) when that schedule is still in `space` (default: the template's
    whole space); else None. Under a `restriction`, its own searches' records answer first, then
    the whole space's best where the restriction admits it."""
    template = template_for(op)
    shapes, dtypes = [t.shape for t in op.operands], [t.dtype for t in op.operands]

    def in_space(record: TuneRecord) -> Schedule | None:
        # a nearer shape's winner in a form this shape's space lacks (persistent, another walk)
        # starts the search from its tile at the defaults of those fields
        found = find_schedule(template.space(op, arch) if space is None else space, record.config,
                              loose=record.interpolated)
        return found if found is None or restriction is None or restriction.admits(found) else None

    sig = signature_hash(op, template, restriction)
    record = cache.get(op.op, sig, shapes, dtypes, arch)
    if record is None and sig != (whole := signature_hash(op, template)):
        record = cache.get(op.op, whole, shapes, dtypes, arch)
        if record is not None and in_space(record) is None:
            record = None
    if record is None and interpolate:
        record = cache.nearest(op.op, shapes, dtypes, arch, signature_hash=sig)
    if record is None:
        return None
    found = in_space(record)
    return (found, record) if found is not None else None


def tune_kernel(op: KernelOp, arch: ArchSpec, *, method: str | Method = Method.AUTO, cache: TuneCache | None = None,
                restriction: SpaceRestriction | None = None, max_trials: int = 50,
                time_budget_s: float | None = None, strategy: str | Strategy = Strategy.MODEL, seed: int = 0,
                measurer: Measurer | None = None, on_trial: Callable[[Trial], None] | None = None) -> KernelTuning:
    """The best schedule for `op` on `arch` (see the module for methods and the cache). `measurer`
    replaces the method's own (a replay of a timing log); `on_trial` hears of each measurement."""
    template = template_for(op)
    space = ranked_space(template, op, arch, restriction)
    if measurer is None:
        m = Method.resolve(method, op.op, arch)
    else:                                       # a given measurer's numbers count as its method's
        m = Method.COST_MODEL if ChosenBy(measurer.method) is ChosenBy.COST_MODEL else Method.ON_DEVICE
    first = None
    if cache is not None:
        hit = cached_schedule(op, arch, cache, space=space.schedules, restriction=restriction)
        if hit is not None:
            schedule, record = hit
            if not record.interpolated and (record.chosen_by is ChosenBy.ON_DEVICE or m is Method.COST_MODEL):
                return KernelTuning(op, template.kind_of(op), schedule, space.default, ChosenBy.CACHE, record.time_us,
                                    record.noise_us, None, len(space), len(space.pruned), record)
            first = schedule
    schedules, estimates = list(space.schedules), list(space.estimates)
    if first is not None:                       # the nearest shape's winner goes first
        i = schedules.index(first)
        schedules.insert(0, schedules.pop(i))
        estimates.insert(0, estimates.pop(i))
    if measurer is None:
        if m is Method.COST_MODEL:
            measurer = CostModelMeasurer(template, op, arch)
            strategy, max_trials = Strategy.EXHAUSTIVE, len(schedules)   # estimates cost microseconds
        else:
            from tessera_rw.tune.device_measure import DeviceMeasurer
            measurer = DeviceMeasurer(template, op, arch)
    # the best estimate's variants (another walk, a persistent launch) tie with it: time them early
    variants = template.variants(op, space.schedules[0], arch)
    first = [schedules.index(v) for v in variants if v in schedules]
    result = search_space(schedules, estimates, measurer, strategy=strategy, max_trials=max_trials,
                          time_budget_s=time_budget_s, seed=seed, on_trial=on_trial, first=first)
    best = result.best
    if not best.measurement.ok:
        reasons = "; ".join(f"{t.schedule.describe()}: {t.measurement.failure}" for t in result.trials[:5])
        raise TuneError(f"autotune {op}: every schedule tried failed ({reasons})",
                        hint="run tessera-rewrite --explain on the kernel to see its schedules and resources")
    chosen_by = ChosenBy.COST_MODEL if m is Method.COST_MODEL else ChosenBy.ON_DEVICE
    record = None
    measured_by = ChosenBy(measurer.method)
    if measured_by in (ChosenBy.ON_DEVICE, ChosenBy.COST_MODEL):      # a replay is not this machine's result
        record = _record(op, template, arch, best.schedule, best.measurement.median_us, chosen_by,
                         best.measurement.noise_us, len(result.trials), restriction)
        if cache is not None:            # a cache that cannot be written costs a warning, not the result
            cache.put_or_warn(record, supersede=_stale(cache, record, space.schedules))
    return KernelTuning(op, template.kind_of(op), best.schedule, space.default, measured_by,
                        best.measurement.median_us, best.measurement.noise_us, result, len(space),
                        len(space.pruned), record)
