"""The host's roofline, which the profiler's efficiencies on the numpy executor are against: what
numpy reaches here on a float32 matmul and a large copy, raised to any rate a profiled kernel
reached since (a probe run while the machine was busy reads low).

>>> str(HostRoofline(2e11, 3e10))
'the host roofline (numpy executor): 200 GFLOP/s float32 matmul, 30.0 GB/s copy'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from tessera_rw.codegen.step_timing import host_clock

# The host roofline's probes: big enough to leave the caches and reach BLAS's steady state; each
# repeated for HOST_PROBE_NS (at least HOST_PROBE_REPS times) and its best kept, so a busy moment
# of a shared machine is outlasted rather than measured (3 repetitions read 13 to 197 GFLOP/s
# across runs on a loaded 2-core host).
HOST_MATMUL_N = 512
HOST_COPY_BYTES = 32 << 20
HOST_PROBE_REPS = 3
HOST_PROBE_NS = 60_000_000


@dataclass(frozen=True)
class HostRoofline:
    """What this host's numpy reaches: FLOP/s of a float32 matmul, bytes/s of a large copy."""
    flops_per_s: float
    bytes_per_s: float

    def __str__(self) -> str:
        return (f"the host roofline (numpy executor): {self.flops_per_s / 1e9:.0f} GFLOP/s float32 matmul, "
                f"{self.bytes_per_s / 1e9:.1f} GB/s copy")


def _best_ns(fn) -> int:
    fn()                                   # warm-up: thread pools start, pages get mapped
    best, reps, began = math.inf, 0, host_clock()
    while reps < HOST_PROBE_REPS or host_clock() - began < HOST_PROBE_NS:
        start = host_clock()
        fn()
        best, reps = min(best, host_clock() - start), reps + 1
    return max(int(best), 1)


@cache
def _measured_host_roofline() -> HostRoofline:
    a = np.full((HOST_MATMUL_N, HOST_MATMUL_N), 0.5, np.float32)
    matmul_ns = _best_ns(lambda: a @ a)
    src = np.ones(HOST_COPY_BYTES // 8)
    dst = np.empty_like(src)
    copy_ns = _best_ns(lambda: np.copyto(dst, src))
    return HostRoofline(2 * HOST_MATMUL_N ** 3 / matmul_ns * 1e9, 2 * src.nbytes / copy_ns * 1e9)  # read + write


_HOST_SEEN = [0.0, 0.0]     # the best FLOP/s and bytes/s a profiled host kernel reached


def host_roofline() -> HostRoofline:
    """The host's roofline: measured on first use (a float32 matmul, a large copy), raised to any
    rate a profiled kernel reached since (a probe run while the machine was busy reads low, and
    an efficiency over 100% would say nothing).

    >>> host_roofline().flops_per_s > 0 and host_roofline().bytes_per_s > 0
    True
    """
    probe = _measured_host_roofline()
    return HostRoofline(max(probe.flops_per_s, _HOST_SEEN[0]), max(probe.bytes_per_s, _HOST_SEEN[1]))


def saw_host_rate(flops: float, nbytes: float, duration_ns: int) -> None:
    """A host kernel did `flops` and moved `nbytes` in `duration_ns`: the roofline is at least that."""
    _HOST_SEEN[0] = max(_HOST_SEEN[0], flops / max(duration_ns, 1) * 1e9)
    _HOST_SEEN[1] = max(_HOST_SEEN[1], nbytes / max(duration_ns, 1) * 1e9)
