"""take: slices read at integer indices, written densely (an embedding lookup).

x is walked as (outer, n, inner) around the indexed axis and the result as (outer, m, inner) for m
indices. Each thread writes `vec` consecutive elements of an inner run (one vector store) read
from the run its index names (one vector load), in a grid-stride loop; an index out of [-n, n)
writes zeros. The indices are read once per run they pick, from L1 / L2 after the first.

>>> from tessera_rw.algebra.dtypes import DType
>>> table, tokens = TensorType((50257, 768), DType.bfloat16), TensorType((8, 1024), DType.int32)
>>> op = KernelOp.of("take", (table, tokens), TensorType((8, 1024, 768), DType.bfloat16), axis=0)
>>> TakeTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=256 vec=8'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import (MAX_ACCESS_BYTES, STORAGE, SUPPORTED, VEC_STRUCT, kernel_name,
                                                      vector_widths)

MAX_INDEX = 2**31         # index math is 32-bit
GRID_WAVES = 4            # blocks in flight per SM, at most, before the grid-stride loop takes over
INDEX_DTYPES = (DType.int32, DType.int64)
GRID_THREADS, GRID_VECS = (64, 128, 256, 512, 1024), (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class TakeSchedule(Schedule):
    threads: int = 256
    vec: int = 4          # consecutive elements of an inner run per thread


def take_dims(x: TensorType, indices: TensorType, axis: int) -> tuple[int, int, int, int]:
    """(outer, n, inner, m): x as (outer, n, inner) around `axis`, and the number of indices."""
    return math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]), indices.numel


class TakeTemplate(Template):
    """take along any axis, of any stored dtype, by int32 or int64 indices."""

    kind = "copy"
    ops = frozenset({"take"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops:
            return False
        x, indices = op.operands
        return (x.dtype in SUPPORTED and indices.dtype in INDEX_DTYPES and op.result.numel > 0
                and all(t.numel < MAX_INDEX for t in (x, indices, op.result)))

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ("take",)

    def _dims(self, op: KernelOp) -> tuple[int, int, int, int]:
        return take_dims(*op.operands, op.attr_map["axis"])

    def _vec_ok(self, op: KernelOp, v: int) -> bool:
        _, _, inner, _ = self._dims(op)
        return v == 1 or (inner % v == 0 and v * op.result.dtype.itemsize <= MAX_ACCESS_BYTES)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[TakeSchedule, ...]:
        vecs = [v for v in (8, 4, 2, 1) if self._vec_ok(op, v)]
        return tuple(dict.fromkeys((TakeSchedule(256, vecs[0]), TakeSchedule(128, vecs[min(1, len(vecs) - 1)]))))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[TakeSchedule, ...]:
        vecs = vector_widths(GRID_VECS, lambda v: self._vec_ok(op, v))
        grid = (TakeSchedule(t, v) for t in GRID_THREADS for v in vecs)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        s = schedule
        return (isinstance(s, TakeSchedule) and self.accepts(op) and s.threads % 32 == 0
                and 0 < s.threads <= arch.max_threads_per_block and s.vec >= 1 and self._vec_ok(op, s.vec))

    def resources(self, op: KernelOp, s: TakeSchedule, arch: ArchSpec) -> Resources:
        units = op.result.numel // s.vec
        resident = min(arch.max_blocks_per_sm, arch.max_warps_per_sm * 32 // s.threads)
        blocks = max(1, min(math.ceil(units / s.threads), arch.sm_count * resident * GRID_WAVES))
        words = max(1, s.vec * op.result.dtype.itemsize // 4)
        regs = (REG_BASE + REG_PER_WORD * words + (REG_SM90 if arch.compute_capability >= (9, 0) else 0)
                + (REG_INT64 if op.operands[1].dtype is DType.int64 else 0))
        # each picked run is read once and written once; the indices once (their re-reads hit L1 / L2)
        return Resources(threads=s.threads, blocks=blocks, registers=round(regs), smem_bytes=0,
                         hbm_bytes=2 * op.result.nbytes + op.operands[1].nbytes, flops=0, unit=MathUnit.FP32)

    def emit(self, op: KernelOp, s: TakeSchedule, arch: ArchSpec) -> KernelSource:
        name = kernel_name(self.kind, op, s)
        x, indices = op.operands
        outer, n, inner, m = self._dims(op)
        t, it, v = STORAGE[x.dtype], STORAGE[indices.dtype], s.vec
        vt = f"vec_t<{t}, {v}>"
        blocks = self.resources(op, s, arch).blocks
        runs = inner // v
        source = f"""// {op}
// copy (take: runs of {inner} read at {m} indices of an axis of {n}, {outer} outer), schedule {s.describe()}.
// launch: {name}<<<{blocks}, {s.threads}>>>(in0, in1, out)
{VEC_STRUCT}
extern "C" __global__ void __launch_bounds__({s.threads}) {name}(const {t}* __restrict__ in0,
        const {it}* __restrict__ in1, {t}* __restrict__ out) {{
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < {op.result.numel // v}u; e += step) {{
        const unsigned c = (e % {runs}u) * {v}u, picked = e / {runs}u;
        const unsigned i = picked % {m}u, a = picked / {m}u;
        long long j = (long long)in1[i];
        if (j < 0) j += {n}LL;                         // counted from the end, as numpy does
        {vt} r;
        if (j >= 0 && j < {n}LL) {{
            r = *reinterpret_cast<const {vt}*>(in0 + ((unsigned long long)a * {n}u + (unsigned long long)j) * {inner}u + c);
        }} else {{                                     // out of range: zeros
            #pragma unroll
            for (int k = 0; k < {v}; ++k) r.v[k] = {t}();
        }}
        *reinterpret_cast<{vt}*>(out + e * {v}u) = r;
    }}
}}
"""
        return KernelSource(name, source, s.threads, grid=(blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32 = DType.bfloat16, DType.float32

        def take(x: TensorType, indices: TensorType, axis: int = 0) -> KernelOp:
            return KernelOp.of("take", (x, indices), OPS["take"].infer(x, indices, axis=axis), axis=axis)
        return (
            take(TensorType((50257, 768), bf), TensorType((8, 1024), DType.int32)),       # an embedding lookup
            take(TensorType((32000, 4096), bf), TensorType((4096,), DType.int64)),
            take(TensorType((64, 1000, 3), f32), TensorType((500,), DType.int32), axis=1),  # a ragged inner run
            take(TensorType((16, 4096), f32), TensorType((2048,), DType.int32), axis=1),     # scalar runs
        )


# The register model (fit to ptxas 12.x on samples(), sm_80 and sm_90).
REG_BASE = 12             # the loop, the index arithmetic and the 64-bit address
REG_PER_WORD = 0.5        # a vector's 32-bit words
REG_SM90 = 2
REG_INT64 = 1             # an int64 index's high word
