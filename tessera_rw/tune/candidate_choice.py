"""Choosing among a program's candidates (its fusion depths) once their kernels are tuned.

Extraction ranks candidates by the cost model; those within CLOSE_CALL of the best estimate (at
most MAX_WEIGHED) are close calls worth weighing. Each gets its kernels tuned; then on a GPU the
whole plans are timed interleaved and the cost model's first choice stays unless a rival beats it
beyond noise; without one the tuned estimates decide. The choice is cached per program signature
like a kernel's schedule, so a second run neither tunes nor times.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.lower.lowering import lower
from tessera_rw.lower.plan import KernelPlan
from tessera_rw.tune.extract import Candidate
from tessera_rw.tune.kernel_tuner import Method
from tessera_rw.tune.measure import Measurement
from tessera_rw.tune.plan_tuner import PlanTuning, TuneSettings, tune_plan
from tessera_rw.tune.progress import TuningProgress
from tessera_rw.tune.records import ChosenBy, TuneRecord
from tessera_rw.tune.search import Trial
from tessera_rw.tune.space import SpaceRestriction

CLOSE_CALL = 1.25
MAX_WEIGHED = 3


@dataclass(frozen=True)
class Weighed:
    """One candidate weighed: its index, its tuning and its time (measured or estimated)."""
    index: int
    tuning: PlanTuning
    measurement: Measurement


@dataclass(frozen=True)
class CandidateChoice:
    index: int
    chosen_by: ChosenBy
    plan: KernelPlan
    tuning: PlanTuning
    weighed: tuple[Weighed, ...]   # empty when the cache answered


def program_key(graph: Graph, candidates: Sequence[Candidate], numerics: Numerics,
                restriction: SpaceRestriction | None = None) -> tuple[str, str]:
    """(op_name, signature_hash) of a program's record: its name as a token, and a hash of its text,
    the numerics policy, the candidates weighed (the record names one of them by its index: other
    rules, such as a plugin's, or another policy make other candidates) and the search space's
    restriction (a choice among restricted kernels does not answer for free ones)."""
    name = "program:" + (re.sub(r"[^A-Za-z0-9_.\-]", "_", graph.name) or "kernel")
    narrowed = [] if restriction is None or restriction.is_free else [repr(restriction)]
    text = "\n\n".join([str(graph), numerics.value, *(str(c.graph) for c in candidates), *narrowed])
    return name[:120], hashlib.sha256(text.encode()).hexdigest()[:16]


def choose_candidate(graph: Graph, candidates: Sequence[Candidate], arch: ArchSpec, settings: TuneSettings,
                     numerics: Numerics = Numerics.DETERMINISTIC, *,
                     on_trial: Callable[[KernelOp, Trial], None] | None = None) -> CandidateChoice:
    """Tune the close candidates of `graph` and pick one (see the module)."""
    method = Method.resolve(settings.method, graph.name, arch)
    cache = settings.open_cache()
    op_name, sig = program_key(graph, candidates, numerics, settings.restriction)
    shapes, dtypes = [i.type.shape for i in graph.inputs], [i.type.dtype for i in graph.inputs]
    if cache is not None:
        record = cache.get(op_name, sig, shapes, dtypes, arch)
        index = _cached_index(record, candidates, method)
        if index is not None:
            plan = lower(candidates[index].graph)
            tuning = tune_plan(plan, arch, settings, numerics, on_trial=on_trial)
            return CandidateChoice(index, ChosenBy.CACHE, plan, tuning, ())
    best = candidates[0].est_us
    close = [i for i, c in enumerate(candidates[:MAX_WEIGHED]) if c.est_us <= best * CLOSE_CALL]
    plans = {i: lower(candidates[i].graph) for i in close}
    progress = TuningProgress(graph.name)

    def heard(op: KernelOp, trial: Trial) -> None:
        progress.on_trial(op, trial)
        if on_trial is not None:
            on_trial(op, trial)
    tunings: dict[int, PlanTuning] = {}
    deadline = None if settings.time_budget_s is None else time.monotonic() + settings.time_budget_s
    try:
        for n, i in enumerate(close):     # a time budget is shared out among the candidates left
            share = settings if deadline is None else replace(
                settings, time_budget_s=max(deadline - time.monotonic(), 1e-9) / (len(close) - n))
            tunings[i] = tune_plan(plans[i], arch, share, numerics, on_trial=heard)
    finally:
        progress.close({k.op: k.schedule for t in tunings.values() for k in t.kernels})
    if method is Method.ON_DEVICE:
        from tessera_rw.tune.device_measure import time_plans
        times = time_plans([(plans[i], tunings[i].schedules) for i in close], numerics)
    else:
        times = [Measurement(tunings[i].time_us, 0.0, (tunings[i].time_us,)) for i in close]
    weighed = tuple(Weighed(i, tunings[i], m) for i, m in zip(close, times))
    chosen = weighed[0]
    for w in weighed[1:]:
        if method is Method.ON_DEVICE and w.measurement.beats(chosen.measurement) or (
                method is Method.COST_MODEL and w.measurement.median_us < chosen.measurement.median_us):
            chosen = w
    by = ChosenBy.ON_DEVICE if method is Method.ON_DEVICE else ChosenBy.COST_MODEL
    if cache is not None and chosen.measurement.ok:
        cache.put_or_warn(TuneRecord.create(   # an unwritable cache costs a warning, not the choice
            op_name=op_name, signature_hash=sig, shapes=shapes, dtypes=dtypes, arch=arch,
            config={"candidate": chosen.index, "fusion_depth": _token(candidates[chosen.index]),
                    "kernels": len(plans[chosen.index].steps)},
            time_us=chosen.measurement.median_us, chosen_by=by, noise_us=chosen.measurement.noise_us,
            trials=len(weighed)))
    return CandidateChoice(chosen.index, by, plans[chosen.index], chosen.tuning, weighed)


def _token(candidate: Candidate) -> str:
    return candidate.fusion_depth.label.replace(" ", "-")


def _cached_index(record: TuneRecord | None, candidates: Sequence[Candidate], method: Method) -> int | None:
    """The cached candidate when the record still describes one of `candidates` and answers `method`."""
    if record is None or (record.chosen_by is ChosenBy.COST_MODEL and method is not Method.COST_MODEL):
        return None
    index = record.config.get("candidate")
    if not isinstance(index, int) or not 0 <= index < len(candidates):
        return None
    return index if record.config.get("fusion_depth") == _token(candidates[index]) else None
