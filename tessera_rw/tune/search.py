"""Search strategies over a ranked space: which schedules to measure, in what order, and when to stop.

- `exhaustive`: every schedule, in the cost model's order.
- `random`: a seeded shuffle (the baseline a smarter search must beat).
- `model`: a grid of the cost model's best few first (its prior), and the schedules the caller
  names `first` (the best estimate's variants, which only a measurement tells apart), then
  optuna's TPE sampler, which models where fast schedules lie from what was measured so far and
  proposes the next.

Each step measures a batch, so the measurer can compile the batch in parallel and interleave its
timing. The search stops at `max_trials` measured schedules, at `time_budget_s`, or when the space
is exhausted. The incumbent (the schedule the search would pick now) starts as the first schedule
measured, the cost model's best, and changes only to a challenger that beats it beyond noise
(`Measurement.beats`).

>>> from tessera_rw.tune.measure import Measurement
>>> class Table:                       # a measurer that looks times up
...     method = "replay"
...     def measure(self, schedules):
...         return [Measurement.of([float(s)]) for s in schedules]
>>> result = search_space([3, 1, 2], [1.0, 2.0, 3.0], Table(), strategy="exhaustive")
>>> result.best.schedule, len(result.trials), result.stop_reason
(1, 3, 'exhausted')
"""

from __future__ import annotations

import enum
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.tune.measure import Measurement, Measurer

SEED_TRIALS = 4        # the cost model's best few, measured first: the prior the model search starts from
BATCH = 4              # schedules measured per step: compiled in parallel, timed interleaved


class Strategy(enum.StrEnum):
    EXHAUSTIVE = "exhaustive"
    RANDOM = "random"
    MODEL = "model"

    @staticmethod
    def parse(value: str | Strategy) -> Strategy:
        try:
            return Strategy(value)
        except ValueError:
            raise ArgumentError(f"unknown search strategy {value!r}",
                                hint=f"use one of {[s.value for s in Strategy]}") from None


@dataclass(frozen=True)
class Trial:
    """One measured schedule, numbered in measuring order, with the cost model's estimate."""
    number: int
    schedule: object
    estimate_us: float
    measurement: Measurement


@dataclass(frozen=True)
class SearchResult:
    trials: tuple[Trial, ...]
    best: Trial                 # the incumbent at the end
    incumbents: tuple[int, ...]  # the incumbent's trial number after each trial
    stop_reason: str            # 'exhausted' | 'max_trials' | 'time_budget'
    seconds: float

    def trials_to_within(self, target_us: float, tolerance: float = 0.05) -> int | None:
        """How many trials it took until the incumbent was within `tolerance` of `target_us`."""
        for n, inc in enumerate(self.incumbents, 1):
            if self.trials[inc].measurement.median_us <= target_us * (1 + tolerance):
                return n
        return None


def search_space(space: Sequence[object], estimates: Sequence[float], measurer: Measurer, *,
                 strategy: Strategy | str = Strategy.MODEL, max_trials: int = 50, time_budget_s: float | None = None,
                 seed: int = 0, clock: Callable[[], float] = time.monotonic,
                 on_trial: Callable[[Trial], None] | None = None, first: Sequence[int] = ()) -> SearchResult:
    """Measure schedules of `space` (ranked: `estimates[i]` is schedule i's estimated µs, cheapest
    first) with `measurer` until a stop condition; see the module for strategies and stops.
    `on_trial` hears of every trial as it is measured (a progress bar); the model strategy
    measures the indices `first` right after its own seeds."""
    strategy = Strategy.parse(strategy)
    if not space:
        raise ArgumentError("search: the space is empty", hint="check the schedule space of the kernel")
    if max_trials < 1:
        raise ArgumentError(f"search: max_trials must be at least 1, got {max_trials}")
    proposer = {Strategy.EXHAUSTIVE: _Ordered(range(len(space))),
                Strategy.RANDOM: _Ordered(random.Random(seed).sample(range(len(space)), len(space))),
                Strategy.MODEL: _ModelProposer(space, estimates, seed, first)}[strategy]
    start = clock()
    trials: list[Trial] = []
    incumbents: list[int] = []
    measured: set[int] = set()
    incumbent: Trial | None = None
    stop = "exhausted"
    while len(measured) < len(space):
        if len(trials) >= max_trials:
            stop = "max_trials"
            break
        if trials and time_budget_s is not None and clock() - start >= time_budget_s:   # one trial at least
            stop = "time_budget"
            break
        batch = proposer.propose(min(BATCH, max_trials - len(trials)), measured)
        for index, m in zip(batch, measurer.measure([space[i] for i in batch])):
            measured.add(index)
            trial = Trial(len(trials), space[index], float(estimates[index]), m)
            trials.append(trial)
            if incumbent is None or m.beats(incumbent.measurement):
                incumbent = trial
            incumbents.append(incumbent.number)
            proposer.observe(index, m)
            if on_trial is not None:
                on_trial(trial)
    assert incumbent is not None
    return SearchResult(tuple(trials), incumbent, tuple(incumbents), stop, clock() - start)


class _Ordered:
    """Proposes indices in a fixed order."""

    def __init__(self, order: Sequence[int]):
        self.order = list(order)

    def propose(self, n: int, measured: set[int]) -> list[int]:
        return [i for i in self.order if i not in measured][:n]

    def observe(self, index: int, m: Measurement) -> None:
        pass


@contextmanager
def _quiet_optuna():
    import optuna
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield optuna
    finally:
        optuna.logging.set_verbosity(level)


def _params(schedule: object) -> dict[str, object]:
    """A schedule as optuna parameters: its dataclass fields as categories (tuples as strings)."""
    if is_dataclass(schedule):
        kind = {"kind": schedule.tag} if getattr(schedule, "tag", "") else {}
        return kind | {f.name: _scalar(getattr(schedule, f.name)) for f in fields(schedule)}
    return {"schedule": _scalar(schedule)}


def _scalar(value: object) -> object:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


class _ModelProposer:
    """The cost model's best SEED_TRIALS first, then TPE proposals (several per step with the
    constant-liar rule, so a batch spreads out). TPE proposes a value per field; a combination
    that is not in the space, or already measured, maps to the nearest unmeasured schedule, which
    is then told to the study under its own parameters."""

    def __init__(self, space: Sequence[object], estimates: Sequence[float], seed: int, first: Sequence[int] = ()):
        self.space, self.estimates = space, estimates
        self.params = [_params(s) for s in space]
        names = list(self.params[0])
        if any(list(p) != names for p in self.params):       # mixed schedule kinds: index them
            self.params = [{"schedule": i} for i in range(len(space))]
            names = ["schedule"]
        with _quiet_optuna() as optuna:
            self.distributions = {n: optuna.distributions.CategoricalDistribution(
                sorted({p[n] for p in self.params}, key=lambda v: (str(type(v)), str(v)))) for n in names}
            sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                                 n_startup_trials=SEED_TRIALS)
            self.study = optuna.create_study(sampler=sampler, direction="minimize")
        # the space is ranked: the model's best, then what the caller wants measured early
        self.seeded = list(dict.fromkeys([*range(min(SEED_TRIALS, len(space))), *first]))
        self.pending: dict[int, object] = {}
        self.worst: float | None = None           # the slowest success so far: the scale of a failure
        self.failed_unscaled: list[int] = []      # failures before any success: told once one sets a scale

    def propose(self, n: int, measured: set[int]) -> list[int]:
        chosen: list[int] = []
        while self.seeded and len(chosen) < n:
            i = self.seeded.pop(0)
            if i not in measured:
                chosen.append(i)
        with _quiet_optuna() as optuna:
            while len(chosen) < n and len(measured) + len(chosen) < len(self.space):
                trial = self.study.ask(self.distributions)
                index = self._nearest(trial.params, measured | set(chosen))
                if self.params[index] == trial.params:
                    self.pending[index] = trial
                else:
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                chosen.append(index)
        return chosen

    def _nearest(self, params: dict, taken: set[int]) -> int:
        """The untaken schedule with the fewest fields differing from `params`; ties go to the
        better estimate."""
        def distance(i: int) -> tuple[int, float]:
            return sum(self.params[i][k] != v for k, v in params.items()), self.estimates[i]
        return min((i for i in range(len(self.space)) if i not in taken), key=distance)

    def observe(self, index: int, m: Measurement) -> None:
        if not m.ok and self.worst is None:
            self.failed_unscaled.append(index)    # 'far worse' than nothing yet: no value to tell
            return
        if m.ok:
            self.worst = max(self.worst or 0.0, m.median_us)
            self._tell(index, math.log(max(m.median_us, 1e-9)))
            failures, self.failed_unscaled = self.failed_unscaled, []
        else:
            failures = [index]
        for failed in failures:     # a failure teaches 'far worse than anything seen'
            self._tell(failed, math.log(max(self.worst, 1e-9) * 10))

    def _tell(self, index: int, value: float) -> None:
        with _quiet_optuna() as optuna:
            trial = self.pending.pop(index, None)
            if trial is not None:
                self.study.tell(trial, value)
            else:
                self.study.add_trial(optuna.trial.create_trial(params=self.params[index],
                                                               distributions=self.distributions, value=value))
