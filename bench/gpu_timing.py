"""Running and timing on the GPU for `python -m bench gpu`: our kernels and torch's under one protocol.

Ours are timed by the launch runtime's `time_kernel`; torch's here, the same way: `warmup` calls,
then `reps` calls each bracketed by CUDA events on its stream, a buffer twice the L2 overwritten
before each so every rep starts cold, the median taken. Our outputs are checked from a run whose
output buffer was first filled with NaN bytes, so an element the kernel never writes shows.

Everything here needs torch and a GPU; the module imports neither until called.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tessera_rw.codegen.kernel_op import KernelOp

POISON = 0xFF      # every byte: NaN in any float type


@dataclass(frozen=True)
class Protocol:
    """How every timing in one run is taken."""
    warmup: int
    reps: int
    flush_bytes: int          # overwritten before each rep (0: no flush)


@dataclass(frozen=True)
class Timing:
    """A median with its spread: two batches of reps timed apart; their medians' relative gap is the
    noise a difference between two versions must exceed to mean anything."""
    median_ms: float
    spread: float

    @staticmethod
    def of(first: Sequence[float], second: Sequence[float]) -> Timing:
        a, b = statistics.median(first), statistics.median(second)
        return Timing(statistics.median([*first, *second]), abs(a - b) / min(a, b))


def run_poisoned(op: KernelOp, inputs: Sequence[Any], schedule=None):
    """Our kernel for `op` on torch CUDA tensors, its output poisoned before the launch; a torch tensor."""
    from cuda.core import Buffer
    from tessera_rw.codegen.launch import finish, launch, prepare
    p = prepare(op, inputs, schedule=schedule)
    out = p.args[-1]
    if out.nbytes:
        Buffer.from_handle(out.ptr, out.nbytes, owner=out.owner).fill(POISON, stream=p.stream)
    launch(p.source, p.compiled, p.args, p.stream)
    return finish(p)


def time_ours(op: KernelOp, inputs: Sequence[Any], schedule, protocol: Protocol, batches: int = 2) -> Timing:
    """Our kernel under `protocol`: `batches` batches of reps, L2 flushed between reps."""
    from tessera_rw.codegen.launch import time_kernel
    runs = [time_kernel(op, inputs, schedule=schedule, warmup=protocol.warmup, reps=protocol.reps,
                        flush_l2=protocol.flush_bytes > 0) for _ in range(batches)]
    return Timing.of(runs[0], runs[-1])


def time_torch(fn: Callable[[], Any], protocol: Protocol, batches: int = 2) -> Timing:
    """A torch callable under `protocol`, timed by torch.cuda.Event pairs on the current stream."""
    import torch
    for _ in range(protocol.warmup):
        fn()
    flush = torch.empty(protocol.flush_bytes, dtype=torch.uint8, device="cuda") if protocol.flush_bytes else None
    runs = []
    for _ in range(batches):
        pairs = []
        for rep in range(protocol.reps):
            if flush is not None:
                flush.fill_(rep & 0xFF)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        runs.append([s.elapsed_time(e) for s, e in pairs])
    return Timing.of(runs[0], runs[-1])


def copy_bandwidth(nbytes: int, protocol: Protocol) -> float:
    """Bytes per second of a device-to-device copy of `nbytes` (read + write counted), random data."""
    import torch
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t = time_torch(lambda: dst.copy_(src), protocol)
    return 2 * src.numel() * src.element_size() / (t.median_ms * 1e-3)


def matmul_rate(n: int, protocol: Protocol) -> float:
    """FLOP/s of torch.matmul on random n x n bf16 matrices: the matrix-unit ceiling as the library sees it."""
    import torch
    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    t = time_torch(lambda: torch.matmul(a, b), protocol)
    return 2 * n ** 3 / (t.median_ms * 1e-3)


def rel_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 on the device; inf when `out` has a NaN or inf (poison left)."""
    import torch
    out = out.double()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float((out - ref).norm() / ref.norm())
