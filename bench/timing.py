"""Timing for host-side benchmarks: warm-up, repetitions, median and spread; interleaved where two
figures are compared, so a burst of load on a shared machine falls on both."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping


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


def time_interleaved(fns: Mapping[str, Callable[[], object]], rounds: int = 5, warmup: int = 1,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Each of `fns` timed once per round, the rounds alternating between them, by `clock`
    (time.process_time: this process's CPU time, which other processes' load does not inflate)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            gc.collect()
            start = clock()
            fn()
            samples[name].append(clock() - start)
    return {name: Timing(statistics.median(t), min(t), max(t), rounds) for name, t in samples.items()}
