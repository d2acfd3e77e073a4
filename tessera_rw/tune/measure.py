"""Measurements of schedules, and the measurers that make them: the cost model, a replay of a timing
log, or (in `tune.device_measure`) the GPU itself.

A Measurement keeps every sample and its noise: the standard error of the median, from the median
absolute deviation (robust to the odd slow repetition a context switch causes). A challenger
replaces the incumbent only when it is faster by more than twice their combined noise and by at
least 1% (clocks drift by about that between interleaved rounds): a tie stays with the incumbent,
which is the cost model's choice, so tuning never trades a good schedule for a lucky one.

>>> a = Measurement.of([10.0, 10.2, 9.9, 10.1, 10.0])
>>> b = Measurement.of([9.95, 10.1, 9.9, 10.0, 10.05])
>>> a.median_us, b.beats(a)
(10.0, False)
>>> Measurement.of([7.0, 7.1, 6.9]).beats(a)
True
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Hashable, Protocol, TypeVar

from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule, Template
from tessera_rw.tune.cost import timing
from tessera_rw.tune.records import ChosenBy

MAD_TO_SIGMA = 1.4826          # a normal distribution's sigma per median absolute deviation
MEDIAN_STANDARD_ERROR = 1.2533  # the median's standard error per sigma/sqrt(n), for normal samples
RELATIVE_FLOOR = 0.01          # a challenger must win by at least 1%
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Measurement:
    """Microseconds of one schedule: the median of its samples and that median's noise, or the
    reason it could not be measured (then its time is infinite)."""
    median_us: float
    noise_us: float = 0.0
    samples: tuple[float, ...] = ()
    failure: str | None = None

    @staticmethod
    def of(samples_us: Sequence[float]) -> Measurement:
        """The median and its standard error of `samples_us` (at least one sample)."""
        samples = tuple(float(s) for s in samples_us)
        if not samples:
            raise ValueError("a measurement needs at least one sample")
        median = statistics.median(samples)
        mad = statistics.median(abs(s - median) for s in samples)
        noise = MEDIAN_STANDARD_ERROR * MAD_TO_SIGMA * mad / math.sqrt(len(samples))
        return Measurement(median, noise, samples)

    @staticmethod
    def failed(reason: str) -> Measurement:
        """A schedule that did not compile, did not fit or gave wrong results: infinitely slow."""
        return Measurement(math.inf, 0.0, (), reason)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def beats(self, incumbent: Measurement) -> bool:
        """Whether this is faster than `incumbent` by more than the noise of both (see the module)."""
        if not self.ok:
            return False
        if not incumbent.ok:
            return True
        margin = max(2.0 * math.hypot(self.noise_us, incumbent.noise_us), RELATIVE_FLOOR * incumbent.median_us)
        return self.median_us < incumbent.median_us - margin

    def __str__(self) -> str:
        if not self.ok:
            return f"failed: {self.failure}"
        return f"{self.median_us:.2f} µs ± {self.noise_us:.2f}"


class Measurer(Protocol):
    """Measures schedules of one kernel. `method` names the source of its numbers in records and
    reports (ON_DEVICE, COST_MODEL, REPLAY; their strings do too); `measure` takes a batch so a
    measurer can compile in parallel and interleave the batch's timing."""
    method: ChosenBy

    def measure(self, schedules: Sequence[Schedule]) -> list[Measurement]: ...


def interleaved(runs: Mapping[K, Callable[[], float]], *, warmup: int = 2, rounds: int = 10) -> dict[K, list[float]]:
    """Samples of every run, taken round-robin: each round calls every run once, in an order rotated
    by one per round, so a drift in clocks or temperature spreads over all of them alike instead
    of favouring whichever went first. Each run times itself and returns microseconds.

    >>> samples = interleaved({"a": lambda: 1.0, "b": lambda: 2.0}, warmup=0, rounds=3)
    >>> samples["b"]
    [2.0, 2.0, 2.0]
    """
    keys = list(runs)
    for _ in range(warmup):
        for key in keys:
            runs[key]()
    samples: dict[K, list[float]] = {key: [] for key in keys}
    for r in range(rounds):
        shift = r % len(keys) if keys else 0
        for key in keys[shift:] + keys[:shift]:
            samples[key].append(float(runs[key]()))
    return samples


class CostModelMeasurer:
    """The roofline cost model's estimate as the 'measurement' (noise 0): tuning without a GPU."""
    method = ChosenBy.COST_MODEL

    def __init__(self, template: Template, op: KernelOp, arch: ArchSpec):
        self.template, self.op, self.arch = template, op, arch

    def estimate(self, schedule: Schedule) -> float:
        t = self.template
        res = t.resources(self.op, schedule, self.arch)
        return timing(self.op, t.kind_of(self.op), t.fused(self.op), schedule.describe(), res, self.arch).est_us

    def measure(self, schedules: Sequence[Schedule]) -> list[Measurement]:
        out = []
        for s in schedules:
            est = self.estimate(s)
            out.append(Measurement(est, 0.0, (est,)) if math.isfinite(est)
                       else Measurement.failed(f"{s.describe()} does not fit {self.arch.name}"))
        return out
