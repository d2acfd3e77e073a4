"""Search strategies compared on timing logs: every schedule of a kernel's space measured on a GPU
(`python -m bench tune` writes them to tests/data/tuning_logs/), replayed here without one.

The bar: to get within 5% of the exhaustive best, the model-based search (cost-model seed + TPE)
needs at most half the trials random search needs, median over seeds."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.templates.registry import template_for
from tessera_rw.tune.cost import best_schedule
from tessera_rw.tune.measure import CostModelMeasurer, Measurement
from tessera_rw.tune.search import search_space
from tessera_rw.tune.space import ranked_space, schedule_config
from tessera_rw.tune.timing_log import ReplayMeasurer, TimingLog

LOGS = sorted((Path(__file__).resolve().parents[1] / "data" / "tuning_logs").glob("*.json"))
SEEDS = range(9)
TOLERANCE = 0.05


def trials_needed(log: TimingLog, strategy: str, seed: int) -> int:
    """Trials the strategy takes until its incumbent is within TOLERANCE of the log's best."""
    op = log.kernel_op()
    template = template_for(op)
    ranked = ranked_space(template, op, arch_named(log.arch))
    # the schedules the log timed, in the cost model's order (a space grown since has more)
    logged = [e.config for e in log.entries]
    kept = [(s, e) for s, e in zip(ranked.schedules, ranked.estimates) if schedule_config(s) in logged]
    space, estimates = [s for s, _ in kept], [e for _, e in kept]
    replay = ReplayMeasurer(log)
    best = min(e.measurement().median_us for e in log.entries)
    result = search_space(space, estimates, replay, strategy=strategy, max_trials=len(space), seed=seed)
    n = result.trials_to_within(best, TOLERANCE)
    return len(space) + 1 if n is None else n


def compare(log: TimingLog) -> tuple[float, float]:
    model = statistics.median(trials_needed(log, "model", s) for s in SEEDS)
    rand = statistics.median(trials_needed(log, "random", s) for s in SEEDS)
    return model, rand


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_model_search_needs_at_most_half_the_trials_of_random_search(path):
    log = TimingLog.load(path)
    model, rand = compare(log)
    assert model <= rand / 2, f"{path.stem}: model-based {model} trials, random {rand} (median over {len(SEEDS)} seeds)"


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_the_first_default_schedule_is_within_5_percent_of_the_exhaustive_best(path):
    """What a call gets without tuning: the cost model's best default schedule, as measured."""
    log = TimingLog.load(path)
    op = log.kernel_op()
    first = best_schedule(template_for(op), op, arch_named(log.arch))[0]
    default = ReplayMeasurer(log).measure([first])[0]
    best = min(e.measurement().median_us for e in log.entries if e.failure is None)
    assert default.ok, f"{path.stem}: the default {first.describe()}: {default.failure}"
    assert default.median_us <= (1 + TOLERANCE) * best, \
        f"{path.stem}: the default {first.describe()} takes {default.median_us:.1f} µs, the best {best:.1f} µs"


def test_gpu_timing_logs_are_recorded():
    if not LOGS:
        pytest.skip("no GPU timing logs under tests/data/tuning_logs yet: `python -m bench tune` on a GPU "
                    "records them")
    for path in LOGS:
        log = TimingLog.load(path)
        assert sum(e.failure is None for e in log.entries) >= 8, f"{path.stem}: too few schedules ran"


def synthetic_log(seed: int) -> TimingLog:
    """A stand-in log for the replay machinery itself: the cost model's estimates, each scaled by a
    random factor in [0.7, 1.4] (the model's typical error) with 2% sample noise. It checks the
    plumbing, not the strategies: only real logs can do that."""
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.kernel_op import KernelOp
    t = TensorType((2048, 2048), DType.bfloat16)
    op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
    arch = arch_named("H100-SXM")
    template = template_for(op)
    rng = random.Random(seed)
    model = CostModelMeasurer(template, op, arch)
    entries = []
    for s in template.space(op, arch):
        est = model.estimate(s)
        if not math.isfinite(est):
            entries.append((schedule_config(s), Measurement.failed("does not fit")))
            continue
        true = est * rng.uniform(0.7, 1.4)
        entries.append((schedule_config(s), Measurement.of([true * rng.gauss(1, 0.02) for _ in range(5)])))
    return TimingLog.of(op, arch.name, "synthetic", entries)


def test_replay_answers_from_the_log_and_reports_what_it_lacks(tmp_path):
    log = synthetic_log(0)
    path = tmp_path / "log.json"
    log.save(path)
    again = TimingLog.load(path)
    assert again == log
    op = again.kernel_op()
    template = template_for(op)
    space = template.space(op, arch_named("H100-SXM"))
    replay = ReplayMeasurer(again)
    measured = replay.measure(space[:3])
    assert [m.median_us for m in measured] == [e.measurement().median_us for e in log.entries[:3]]
    from dataclasses import replace
    odd = replace(space[0], stages=space[0].stages + 10)
    assert "not in the timing log" in replay.measure([odd])[0].failure


def test_replay_of_a_whole_search_runs_every_strategy():
    log = synthetic_log(1)
    for strategy in ("exhaustive", "random", "model"):
        assert trials_needed(log, strategy, 0) >= 1


def test_a_log_with_bad_fields_is_rejected(tmp_path):
    from pydantic import ValidationError
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "tessera_rw.timing-log/1", "arch": "../x", "device": "d", '
                    '"recorded": "2026-01-01T00:00:00Z", "op": {}, "entries": []}')
    with pytest.raises(ValidationError):
        TimingLog.load(path)


def test_every_template_sample_op_round_trips_through_a_timing_log():
    # dtype attributes (cast's target, full's and arange's dtype) come back as DTypes, not names
    from tessera_rw.codegen.templates.registry import templates
    ops = [op for t in templates() for op in t.samples()]
    for op in ops:
        log = TimingLog.of(op, "H100-SXM", "test", [({"threads": 256}, Measurement.of([1.0]))])
        assert TimingLog.model_validate_json(log.model_dump_json(by_alias=True)).kernel_op() == op, op
    assert {"cast", "full", "arange"} <= {op.op for op in ops}


def test_a_log_spelling_every_field_answers_for_the_schedule():
    from tessera_rw.tune.space import full_config
    log = synthetic_log(2)
    op = log.kernel_op()
    space = template_for(op).space(op, arch_named("H100-SXM"))
    from dataclasses import replace
    plain = space[0]
    walked = replace(plain, group=2)                                   # a quiet field off its default
    spelled = TimingLog.of(op, "H100-SXM", "test", [(full_config(plain), Measurement.of([7.0])),
                                                    (schedule_config(walked), Measurement.of([6.0]))])
    got = ReplayMeasurer(spelled).measure([plain, walked])
    assert [m.median_us for m in got] == [7.0, 6.0]
