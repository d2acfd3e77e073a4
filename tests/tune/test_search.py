"""Measurements, the noise rule, interleaving and the search strategies, on measurers whose answers
are known (tables of times), so every expectation is exact."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import pytest

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.tune.measure import Measurement, interleaved
from tessera_rw.tune.search import SEED_TRIALS, search_space


class Table:
    """Times per schedule; a schedule missing from the table fails with a reason."""
    method = "replay"

    def __init__(self, times: dict, noise: float = 0.0):
        self.times, self.noise, self.batches = times, noise, []

    def measure(self, schedules):
        self.batches.append(list(schedules))
        out = []
        for s in schedules:
            t = self.times.get(s)
            out.append(Measurement.failed(f"{s} crashed") if t is None else
                       Measurement(t, self.noise, (t,)))
        return out


def test_measurement_median_and_noise_from_samples():
    m = Measurement.of([10.0, 10.0, 10.0, 50.0, 10.0])   # one slow outlier moves neither
    assert m.median_us == 10.0 and m.noise_us == 0.0
    spread = Measurement.of([9.0, 10.0, 11.0, 10.0])
    assert spread.noise_us > 0


def test_challenger_within_noise_does_not_replace_the_incumbent():
    incumbent = Measurement(100.0, 2.0)
    assert not Measurement(97.0, 2.0).beats(incumbent)      # 3 µs faster, noise says maybe
    assert Measurement(90.0, 2.0).beats(incumbent)
    assert not Measurement(99.5, 0.0).beats(Measurement(100.0, 0.0))   # under the 1% floor
    assert not Measurement.failed("x").beats(incumbent)
    assert Measurement(1e9).beats(Measurement.failed("x"))


def test_failed_measurement_is_infinite_and_keeps_its_reason():
    m = Measurement.failed("ptxas: too many resources")
    assert math.isinf(m.median_us) and not m.ok and "ptxas" in str(m)


def test_interleaved_rotates_the_order_every_round():
    order = []
    runs = {k: (lambda k=k: order.append(k) or 1.0) for k in "abc"}
    interleaved(runs, warmup=0, rounds=3)
    assert order == list("abc") + list("bca") + list("cab")


def test_interleaved_spreads_a_drift_over_every_run():
    clock = iter(range(1000))
    runs = {k: (lambda: float(next(clock))) for k in "ab"}   # later calls are 'slower'
    samples = interleaved(runs, warmup=0, rounds=10)
    assert abs(sum(samples["a"]) - sum(samples["b"])) <= 10   # neither gets all the early slots


def test_exhaustive_measures_every_schedule_in_cost_model_order():
    table = Table({"a": 3.0, "b": 1.0, "c": 2.0})
    result = search_space(["a", "b", "c"], [1, 2, 3], table, strategy="exhaustive")
    assert [t.schedule for t in result.trials] == ["a", "b", "c"]
    assert result.best.schedule == "b" and result.stop_reason == "exhausted"


def test_failing_candidate_scores_infinite_with_its_reason_and_search_goes_on():
    table = Table({"a": 3.0, "c": 2.0})
    result = search_space(["a", "b", "c"], [1, 2, 3], table, strategy="exhaustive")
    failed = result.trials[1]
    assert failed.measurement.failure == "b crashed" and math.isinf(failed.measurement.median_us)
    assert result.best.schedule == "c"


def test_incumbent_is_the_cost_models_pick_until_beaten_beyond_noise():
    table = Table({"a": 10.0, "b": 9.95, "c": 5.0}, noise=0.2)
    result = search_space(["a", "b", "c"], [1, 2, 3], table, strategy="exhaustive")
    assert [result.trials[i].schedule for i in result.incumbents] == ["a", "a", "c"]


def test_max_trials_and_time_budget_stop_the_search():
    table = Table({i: float(i) for i in range(20)})
    result = search_space(list(range(20)), list(range(20)), table, strategy="random", max_trials=5)
    assert len(result.trials) == 5 and result.stop_reason == "max_trials"
    ticks = iter(range(100))
    result = search_space(list(range(20)), list(range(20)), table, strategy="exhaustive",
                          time_budget_s=2, clock=lambda: float(next(ticks)))
    assert result.stop_reason == "time_budget" and len(result.trials) < 20


def test_batches_are_handed_to_the_measurer_together():
    table = Table({i: float(i) for i in range(10)})
    search_space(list(range(10)), list(range(10)), table, strategy="exhaustive")
    assert [len(b) for b in table.batches] == [4, 4, 2]


def test_random_search_is_repeatable_by_seed():
    table = Table({i: float(i) for i in range(30)})
    a = search_space(list(range(30)), list(range(30)), table, strategy="random", seed=3, max_trials=8)
    b = search_space(list(range(30)), list(range(30)), table, strategy="random", seed=3, max_trials=8)
    assert [t.schedule for t in a.trials] == [t.schedule for t in b.trials]


def test_unknown_strategy_and_bad_budget_are_clear_errors():
    with pytest.raises(ArgumentError, match="unknown search strategy"):
        search_space([1], [1.0], Table({1: 1.0}), strategy="annealing")
    with pytest.raises(ArgumentError, match="max_trials"):
        search_space([1], [1.0], Table({1: 1.0}), max_trials=0)


def _tiles():
    from dataclasses import make_dataclass
    T = make_dataclass("T", [("bm", int), ("bn", int), ("stages", int)], frozen=True)
    space = [T(bm, bn, st) for bm in (32, 64, 128, 256) for bn in (32, 64, 128, 256) for st in (1, 2, 3, 4)
             if not (bm == 256 and bn == 256)]          # a hole: not every combination is valid
    return space


def _bowl(s):   # fastest at bm=128, bn=64, stages=3
    return 10.0 + abs(math.log2(s.bm / 128)) * 4 + abs(math.log2(s.bn / 64)) * 3 + abs(s.stages - 3) * 2


def test_model_search_measures_only_schedules_of_the_space_each_once():
    space = _tiles()
    table = Table({s: _bowl(s) for s in space})
    result = search_space(space, [0.0] * len(space), table, strategy="model", max_trials=30, seed=1)
    measured = [t.schedule for t in result.trials]
    assert len(measured) == len(set(measured)) == 30 and all(s in space for s in measured)


def test_model_search_starts_from_the_cost_models_best():
    space = _tiles()
    estimates = [_bowl(s) for s in space]
    ranked = sorted(range(len(space)), key=lambda i: estimates[i])
    table = Table({s: _bowl(s) for s in space})
    result = search_space([space[i] for i in ranked], sorted(estimates), table, strategy="model", max_trials=10)
    assert [t.schedule for t in result.trials[:SEED_TRIALS]] == [space[i] for i in ranked[:SEED_TRIALS]]


def test_model_search_without_a_prior_finds_a_bowls_bottom_sooner_than_random():
    """With a useless prior (the space in a random order, equal estimates), TPE alone must still
    learn the bowl's shape: over eight seeds its median trials to within 5% of the optimum is under
    half random search's (a search that never gets there counts as 41)."""
    import random
    counts = {"model": [], "random": []}
    for seed in (0, 1, 5, 7, 42, 99, 1234, 31337):
        space = _tiles()
        random.Random(seed).shuffle(space)
        table = Table({s: _bowl(s) for s in space})
        for strategy, found in counts.items():
            result = search_space(space, [0.0] * len(space), table, strategy=strategy, max_trials=40, seed=seed)
            found.append(result.trials_to_within(10.0, 0.05) or 41)
    model, rand = (statistics.median(c) for c in counts.values())
    assert model <= rand / 2, counts


def test_search_of_250_schedules_by_model_takes_well_under_a_second_per_trial():
    space = _tiles()
    table = Table({s: _bowl(s) for s in space})
    start = time.perf_counter()
    search_space(space, [0.0] * len(space), table, strategy="model", max_trials=40)
    assert (time.perf_counter() - start) / 40 < 0.25


@dataclass(frozen=True)
class Tile(Schedule):
    a: int
    b: int


GRID = [Tile(a, b) for a in range(8) for b in range(8)]     # ranked: the cost model favours a == 0


def test_failures_before_any_success_never_teach_the_model_search_that_they_are_best():
    # the cost model's favourites (a == 0) all fail on this device; the fast region is a == 7
    table = Table({s: 100.0 - 10 * s.a for s in GRID if s.a != 0})
    result = search_space(GRID, [float(i) for i in range(len(GRID))], table, strategy="model", max_trials=20)
    failed = [t.schedule for t in result.trials if not t.measurement.ok]
    assert len(failed) <= SEED_TRIALS + 1, failed     # before: failures scored best, so TPE proposed more of them
    assert result.best.schedule.a >= 5


def test_a_zero_time_success_after_failures_does_not_stop_the_model_search():
    table = Table({s: 0.0 if s.a == 7 else 100.0 for s in GRID if s.a != 0})     # seeds fail, then 0 µs
    result = search_space(GRID, [float(i) for i in range(len(GRID))], table, strategy="model", max_trials=20)
    assert result.best.measurement.ok


def test_model_search_measures_the_named_schedules_right_after_its_seeds():
    table = Table({s: 10.0 + s.a for s in GRID})
    first = [63, 40, 1]                              # 1 is a seed already: measured once
    result = search_space(GRID, [float(i) for i in range(len(GRID))], table, strategy="model",
                          max_trials=SEED_TRIALS + 4, first=first)
    measured = [t.schedule for t in result.trials]
    assert measured[:SEED_TRIALS + 2] == [GRID[i] for i in (*range(SEED_TRIALS), 63, 40)]
    assert len(set(measured)) == len(measured) == SEED_TRIALS + 4
