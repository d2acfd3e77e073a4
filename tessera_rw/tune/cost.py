"""The cost model: a kernel's time on an architecture, from its template's resource model.

    time = max(compute, memory) + launch + spill penalty
    compute = FLOPs / (peak(unit) · efficiency · latency hiding · wave fill)
    memory  = HBM bytes / min(achievable bandwidth, SMs busy · one SM's reach · latency hiding)

Occupancy (resident blocks per SM) follows from registers, shared memory and warps per block;
latency hiding is how far the resident warps are from what the pipe needs to stay busy; wave fill
is the busiest SM's share of blocks over the average (a partial last wave leaves SMs idle). Every
number the model uses is kept in the KernelCost, so `--explain` can show why a kernel costs what
it does.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.arch import arch_named
>>> t = TensorType((4096, 4096), DType.bfloat16)
>>> cost = kernel_cost(KernelOp.of("matmul", (t, t), t, accum_dtype=None), arch_named("h100"))
>>> cost.kind, cost.bound
('gemm', 'compute')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from tessera_rw.algebra.opdef import OpKind
from tessera_rw.algebra.ops import opdef
from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, first_schedule
from tessera_rw.codegen.templates.registry import NO_KERNEL_OPS, templates_for
from tessera_rw.lower.lowering import view_offset

# Resident warps per SM a pipe needs to hide its latency: tensor-core MMAs pipeline deeply within a
# warp; SIMT arithmetic and memory loads need more warps in flight (Little's law on ~0.5-1 µs DRAM
# latency at 16-byte loads).
WARPS_TO_HIDE_LATENCY = {MathUnit.BF16: 4, MathUnit.FP8: 4, MathUnit.TF32: 4, MathUnit.FP32: 8, MathUnit.FP64: 8}
MEMORY_WARPS_TO_HIDE_LATENCY = 8
ACHIEVABLE_BANDWIDTH = 0.9      # of the spec-sheet HBM bandwidth, what a streaming copy reaches
LONE_SM_BANDWIDTH_SHARE = 4     # an SM with the memory system to itself pulls ~4x its fair share
# DRAM latency under load: bytes in flight / latency bounds a starved grid's bandwidth (fitted to
# a bf16 column sum of 8192x4096 on 64 blocks of 256 threads, 16 bytes in flight each, on an H200:
# about 0.3 TB/s).
MEMORY_LATENCY_S = 0.8e-6
SPILL_REUSE = 4                 # each spilled byte is stored once and reloaded a few times in the main loop


@dataclass(frozen=True)
class KernelCost:
    """One kernel under its best default schedule, with every figure its time came from."""
    op: KernelOp
    kind: str
    fused: tuple[str, ...]
    schedule: str
    threads: int
    blocks: int
    registers: int
    smem_bytes: int
    hbm_bytes: int
    flops: int                # the op's own FLOPs
    executed_flops: int       # what the schedule executes: partial tiles padded, masked work included
    unit: str
    blocks_per_sm: int
    occupancy: float          # resident warps / the SM's maximum
    compute_us: float
    memory_us: float
    launch_us: float
    spill_us: float
    est_us: float
    has_template: bool = True
    l2_feed_us: float = 0.0   # the L2 feed's time: memory_us is the larger of it and HBM's

    @property
    def bound(self) -> str:
        """'compute', 'memory' (HBM), 'L2 feed' (the tiles' loads from L2 into the SMs) or 'launch':
        what the time is mostly made of."""
        if self.launch_us >= max(self.compute_us, self.memory_us):
            return "launch"
        if self.compute_us >= self.memory_us:
            return "compute"
        return "L2 feed" if self.l2_feed_us >= self.memory_us else "memory"

    def why(self) -> str:
        """'compute-bound: 137.4 GFLOP on bf16 at 62% occupancy': the bound, in one line."""
        if self.bound == "launch":
            return f"launch-bound: {self.launch_us:.1f} µs launch > {max(self.compute_us, self.memory_us):.1f} µs of work"
        if self.bound == "compute":
            return (f"compute-bound: {self.executed_flops / 1e9:.3g} GFLOP on {self.unit}, "
                    f"occupancy {self.occupancy:.0%}")
        if self.bound == "L2 feed":
            return (f"bound by the L2 feed: {self.l2_feed_us:.3g} µs of tile loads from L2, "
                    f"occupancy {self.occupancy:.0%}")
        return f"memory-bound: {self.hbm_bytes / 1e6:.3g} MB through HBM, occupancy {self.occupancy:.0%}"


def timing(op: KernelOp, kind: str, fused: tuple[str, ...], schedule: str, res: Resources, arch: ArchSpec,
           has_template: bool = True) -> KernelCost:
    """The time of a kernel with resources `res` on `arch` (infinite when the schedule does not fit)."""
    per_sm = arch.resident_blocks(res.threads, res.registers, res.smem_bytes)
    warps = math.ceil(res.threads / 32)
    if per_sm == 0:
        compute = memory = math.inf
        occupancy = feed = 0.0
    elif res.blocks == 0:         # an empty tensor: nothing to compute or move
        compute = memory = occupancy = feed = 0.0
    else:
        busiest = math.ceil(res.blocks / arch.sm_count)            # blocks on the busiest SM
        resident_warps = min(per_sm, busiest) * warps
        occupancy = per_sm * warps / arch.max_warps_per_sm
        fill = res.blocks / (arch.sm_count * busiest)
        hide = min(1.0, resident_warps / WARPS_TO_HIDE_LATENCY[res.unit])
        compute = res.flops / (arch.peak_flops(res.unit) * res.efficiency * hide * fill) * 1e6 if res.flops else 0.0
        busy_sms = min(res.blocks, arch.sm_count)
        hide_memory = min(1.0, resident_warps / MEMORY_WARPS_TO_HIDE_LATENCY)
        one_sm = LONE_SM_BANDWIDTH_SHARE * arch.hbm_bytes_per_s / arch.sm_count
        bandwidth = min(arch.hbm_bytes_per_s * ACHIEVABLE_BANDWIDTH, busy_sms * one_sm * hide_memory)
        if res.bytes_in_flight:   # Little's law: an SM pulls what its threads keep in flight per latency
            in_flight = min(per_sm, busiest) * res.threads * res.bytes_in_flight
            bandwidth = min(bandwidth, busy_sms * in_flight / MEMORY_LATENCY_S)
        feed = res.l2_feed_bytes / (arch.l2_feed_bytes_per_s * busy_sms / arch.sm_count) * 1e6
        memory = max(res.hbm_bytes / bandwidth * 1e6, feed)
    spill = res.spill_bytes * res.threads * res.blocks * SPILL_REUSE / arch.hbm_bytes_per_s * 1e6
    est = max(compute, memory) + arch.launch_us + spill
    return KernelCost(op, kind, fused, schedule, res.threads, res.blocks, res.registers, res.smem_bytes,
                      res.hbm_bytes, op.flops, res.flops, res.unit.value, per_sm, occupancy, compute, memory,
                      arch.launch_us, spill, est, has_template, feed)


# The kernel kind an op without a template reports, by how it moves data (the vocabulary of the
# explain report's `kind`).
GENERIC_KINDS = {OpKind.SOURCE: "elementwise", OpKind.ELEMENTWISE: "elementwise", OpKind.REDUCTION: "reduction",
                 OpKind.LAYOUT: "copy", OpKind.MATMUL: "gemm", OpKind.CONV: "conv",
                 OpKind.ATTENTION: "flash_attention"}
GENERIC_NAMED_KINDS = {"softmax": "softmax", "log_softmax": "softmax", "layernorm": "layernorm",
                       "rmsnorm": "layernorm", "fft": "fft", "rfft": "fft", "ifft": "ifft", "irfft": "ifft"}


def generic_kind(op: KernelOp) -> str:
    """The kind of the kernel computing `op` where no template implements it (float64, say).

    >>> from tessera_rw.algebra.dtypes import DType
    >>> from tessera_rw.algebra.node import TensorType
    >>> x = TensorType((4, 4), DType.float64)
    >>> generic_kind(KernelOp.of("matmul", (x, x), x, accum_dtype=None)), generic_kind(KernelOp.of("mul", (x, x), x))
    ('gemm', 'elementwise')
    """
    if op.op in GENERIC_NAMED_KINDS:
        return GENERIC_NAMED_KINDS[op.op]
    return GENERIC_KINDS.get(opdef(op.op).kind, "elementwise")


def _generic(op: KernelOp, arch: ArchSpec) -> KernelCost:
    """An op no template implements: a streaming SIMT kernel over its result, read and write once."""
    threads = 256
    blocks = max(1, math.ceil(op.result.numel / (threads * 4)))
    res = Resources(threads=threads, blocks=blocks, registers=32, smem_bytes=0,
                    hbm_bytes=op.operand_bytes + op.result.nbytes, flops=op.flops, unit=MathUnit.FP32)
    return timing(op, generic_kind(op), (), "generic", res, arch, has_template=False)


def schedule_cost(template: Template, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelCost:
    """The cost of `template`'s kernel for `op` under `schedule` on `arch`."""
    return timing(op, template.kind_of(op), template.fused(op), schedule.describe(),
                  template.resources(op, schedule, arch), arch)


def best_schedule(template: Template, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, KernelCost]:
    """The default schedule of `template` for `op` with the least estimated time."""
    schedules = template.schedules(op, arch) or (first_schedule(template, op, arch),)   # none: raises, saying why
    costs = [(s, schedule_cost(template, op, s, arch)) for s in schedules]
    return min(costs, key=lambda sc: sc[1].est_us)


@lru_cache(maxsize=65536)
def kernel_cost(op: KernelOp, arch: ArchSpec, *, fused_op: bool = False) -> KernelCost | None:
    """The cost of the kernel computing `op`, None for ops that launch nothing (views, inputs):
    reshapes, and slices that lowering makes views (one aligned contiguous run of the operand).

    A fused op no template implements costs infinity, so extraction never picks a kernel that
    cannot be generated; a plain op without a template gets a generic streaming estimate.

    >>> from tessera_rw.algebra.dtypes import DType
    >>> from tessera_rw.algebra.node import TensorType
    >>> from tessera_rw.codegen.arch import arch_named
    >>> x, row = TensorType((9, 64), DType.float32), TensorType((1, 64), DType.float32)
    >>> last_row = KernelOp.of("slice", (x,), row, starts=(8, 0), stops=(9, 64), steps=(1, 1))
    >>> kernel_cost(last_row, arch_named("h100")) is None
    True
    """
    if op.op in NO_KERNEL_OPS or (op.operands and view_offset(op.op, op.operands[0], op.attr_map) is not None):
        return None
    if op.result.numel == 0 or any(t.numel == 0 for t in op.operands):
        return _generic(op, arch)        # over zero-size tensors: the host computes it, no template asked
    options = [best_schedule(t, op, arch)[1] for t in templates_for(op) if t.schedules(op, arch)]
    if options:
        return min(options, key=lambda c: c.est_us)
    cost = _generic(op, arch)
    if fused_op:
        cost = replace(cost, est_us=math.inf)
    return cost
