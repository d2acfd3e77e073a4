"""Wall-clock timing for host-side benchmarks: warm-up, repetitions, median and spread."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    reps: int

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3


def time_call(fn: Callable[[], object], reps: int = 7, warmup: int = 1) -> Timing:
    """`fn`'s wall time over `reps` calls after `warmup`; the garbage of the call before is
    collected before each, so every rep starts from the same heap (the collector still runs
    during the call, as it would for a user)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        gc.collect()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing(statistics.median(samples), min(samples), max(samples), reps)
