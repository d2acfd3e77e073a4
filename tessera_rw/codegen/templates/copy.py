"""Copy kernels: a layout op materialized (transpose, pad, concatenate, slice, flip, broadcast_to, and
strided_copy, a chain of them folded into one: lower/layout_chains.py).

Two paths. A transpose that moves the innermost axis goes through shared memory: a block reads
a TILE x TILE tile along the input's inner axis and writes it along the output's (both
coalesced); the tile row is padded by one element so the column reads hit distinct banks.
Everything else is a gather driven by the result: each thread writes `vec` consecutive result
elements (one vector store) and reads them from where the op says (one vector load when the
source run is contiguous and aligned), with shapes baked into the index math.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = TensorType((4096, 4096), DType.bfloat16)
>>> op = KernelOp.of("transpose", (x,), x, axes=(1, 0))
>>> CopyTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=256 vec=1 tile=32'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.strided import concatenated_views
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import (MAX_ACCESS_BYTES, STORAGE, VEC_STRUCT, broadcast_strides,
                                                      coalesce, contiguous_strides, kernel_name, literal, offset_expr,
                                                      vector_widths)

TILE = 32
SECTOR_BYTES = 32         # a strided read still moves whole sectors
GRID_WAVES = 4
MAX_INDEX = 2**31         # index math is 32-bit
# The tuning grid (space()): block sizes, and the gather's vector widths up to one 16-byte access.
# The tiled transpose's tile stays TILE (a warp's 32 lanes are its columns) and its rows go to 4 to
# 16 warps: at 2 or 32, ptxas's registers part from the model by a third or more.
GRID_THREADS, GRID_VECS, GRID_TILE_THREADS = (64, 128, 256, 512, 1024), (1, 2, 4, 8, 16), (128, 256, 512)


@dataclass(frozen=True)
class CopySchedule(Schedule):
    quiet_defaults: ClassVar[frozenset[str]] = frozenset({"tile"})     # the gather is named without it
    threads: int = 256
    vec: int = 4          # gather: consecutive result elements per thread
    tile: int = 0         # TILE: the shared-memory transpose; 0: the gather


class CopyTemplate(Template):
    """transpose, pad (constant), concatenate, slice (strided), flip and broadcast_to as one pass."""

    kind = "copy"
    ops = frozenset({"transpose", "pad", "concatenate", "slice", "flip", "broadcast_to", "strided_copy",
                     "strided_concatenate"})

    def accepts(self, op: KernelOp) -> bool:
        types = op.operands + (op.result,)
        # a copy moves storage as it is: every stored dtype, fp8 included
        return (op.op in self.ops and all(t.dtype in STORAGE for t in types) and op.result.numel > 0
                and all(t.numel < MAX_INDEX for t in types))

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ()

    def tiled(self, op: KernelOp) -> bool:
        """A transpose whose innermost axis moves (after dropping size-1 axes)."""
        if op.op != "transpose" or op.operands[0].ndim == 0:
            return False
        x, axes = op.operands[0], op.attr_map["axes"]
        return axes[-1] != x.ndim - 1 and x.shape[-1] > 1 and x.shape[axes[-1]] > 1

    # -- the gather -----------------------------------------------------------------------------

    def _vec_ok(self, op: KernelOp, v: int) -> bool:
        out, a = op.result, op.attr_map
        if v == 1:
            return True
        if out.ndim == 0 or v * out.dtype.itemsize > MAX_ACCESS_BYTES or out.shape[-1] % v:
            return False
        if op.op == "pad":
            lo, _ = a["pads"][-1]
            return lo % v == 0 and op.operands[0].shape[-1] % v == 0
        if op.op == "slice":
            return a["steps"][-1] == 1 and a["starts"][-1] % v == 0 and op.operands[0].shape[-1] % v == 0
        if op.op == "flip":   # a reversed inner axis reads each run backwards: scalar loads
            return out.ndim - 1 not in a["axes"]
        if op.op == "concatenate":
            inner = math.prod(out.shape[a["axis"] + 1:])
            return all((t.shape[a["axis"]] * inner) % v == 0 for t in op.operands)
        if op.op == "strided_concatenate":   # each piece: whole vectors, read along its inner axis, aligned
            inner = math.prod(out.shape[a["axis"] + 1:])
            return all((shape[a["axis"]] * inner) % v == 0 and _aligned(shape, strides, offset, v)
                       for shape, strides, offset in _views(op))
        if op.op == "broadcast_to":
            x = op.operands[0]
            return v == 1 or (x.ndim > 0 and x.shape[-1] == out.shape[-1])
        if op.op == "strided_copy":   # vector runs along the inner axis, each starting aligned
            return _aligned(a["shape"], a["strides"], a["offset"], v)
        x, axes = op.operands[0], a["axes"]   # transpose: contiguous runs only if the inner axis stays
        return v == 1 or axes[-1] == x.ndim - 1

    def _source(self, op: KernelOp) -> tuple[str, list[str]]:
        """The C offset of result element i in operand 0 (or the lines choosing an operand)."""
        out, a, x = op.result.shape, op.attr_map, op.operands[0]
        if op.op == "transpose":
            st = contiguous_strides(x.shape)
            sizes, (strides,) = coalesce(out, [tuple(st[p] for p in a["axes"])])
            return offset_expr("i", sizes or (1,), strides or (0,)), []
        if op.op == "broadcast_to":
            sizes, (strides,) = coalesce(out, [broadcast_strides(out, x.shape)])
            return offset_expr("i", sizes or (1,), strides or (0,)), []
        if op.op == "strided_copy":
            sizes, (strides,) = coalesce(out, [tuple(a["strides"])])
            return f"{a['offset']}u + {offset_expr('i', sizes or (1,), strides or (0,))}", []
        st = contiguous_strides(x.shape)
        if op.op == "slice":
            base = sum(s0 * s for s0, s in zip(a["starts"], st))
            walk = tuple(step * s for step, s in zip(a["steps"], st))
        elif op.op == "flip":   # from the far end of each flipped axis, walking back (unsigned wrap-around)
            base = sum((x.shape[d] - 1) * st[d] for d in a["axes"])
            walk = tuple(-s if d in a["axes"] else s for d, s in enumerate(st))
        else:
            raise AssertionError(op.op)
        sizes, (strides,) = coalesce(out, [walk])
        return f"{base}u + {offset_expr('i', sizes or (1,), strides or (0,))}", []

    def _gather_body(self, op: KernelOp, v: int) -> list[str]:
        t = STORAGE[op.result.dtype]
        vt = f"vec_t<{t}, {v}>"
        a = op.attr_map
        if op.op == "pad":
            x = op.operands[0]
            lines, inside, offset = [], [], []
            st = contiguous_strides(x.shape)
            inner = 1
            for d in range(len(op.result.shape) - 1, -1, -1):
                size, (lo, _) = op.result.shape[d], a["pads"][d]
                coord = "i" if inner == 1 else f"i / {inner}u"
                lines.append(f"const int c{d} = (int)(({coord}) % {size}u) - {lo};")
                inside.append(f"(unsigned)c{d} < {x.shape[d]}u")
                offset.append(f"c{d} * {st[d]}")
                inner *= size
            fill = _fill(a["value"], op.result.dtype)
            return lines + [f"{vt} r;", f"if ({' && '.join(inside) or 'true'}) {{",
                            f"    r = *reinterpret_cast<const {vt}*>(in0 + ({' + '.join(offset) or '0'}));",
                            "} else {", f"    for (int j = 0; j < {v}; ++j) r.v[j] = {fill};", "}"]
        if op.op in ("concatenate", "strided_concatenate"):
            axis = a["axis"]
            inner = math.prod(op.result.shape[axis + 1:])
            total = op.result.shape[axis] * inner
            lines = [f"const unsigned outer = i / {total}u, col = i % {total}u;", f"{vt} r;"]
            start = 0
            views = _views(op) if op.op == "strided_concatenate" else [None] * len(op.operands)
            for k, (x, view) in enumerate(zip(op.operands, views)):
                width = (view[0] if view else x.shape)[axis] * inner
                last = k == len(op.operands) - 1
                cond = ("" if last else "if") if k == 0 else "} else" if last else "} else if"
                test = "" if last else f" (col < {start + width}u)"
                local = f"outer * {width}u + (col - {start}u)"
                if view:      # the piece's element `local` (row-major in its view) where its view puts it
                    sizes, (strides,) = coalesce(view[0], [view[1]])
                    local = f"{view[2]}u + {offset_expr(f'({local})', sizes or (1,), strides or (0,))}"
                lines += [f"{cond}{test} {{", f"    r = *reinterpret_cast<const {vt}*>(in{k} + ({local}));"]
                start += width
            return lines + ["}"]
        src, _ = self._source(op)
        if op.op == "broadcast_to" and v > 1 or v == 1 or op.op in ("transpose", "slice", "flip", "strided_copy"):
            return [f"const {vt} r = *reinterpret_cast<const {vt}*>(in0 + ({src}));"]
        raise AssertionError(op.op)

    # -- schedules and resources ----------------------------------------------------------------

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[CopySchedule, ...]:
        if self.tiled(op):
            return (CopySchedule(256, 1, TILE), CopySchedule(512, 1, TILE))
        vecs = [v for v in (8, 4, 2, 1) if self._vec_ok(op, v)]
        return tuple(dict.fromkeys((CopySchedule(256, vecs[0], 0), CopySchedule(128, vecs[min(1, len(vecs) - 1)], 0))))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[CopySchedule, ...]:
        if self.tiled(op):
            grid = (CopySchedule(t, 1, TILE) for t in GRID_TILE_THREADS)
        else:
            vecs = vector_widths(GRID_VECS, lambda v: self._vec_ok(op, v))
            grid = (CopySchedule(t, v, 0) for t in GRID_THREADS for v in vecs)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        s = schedule
        if not (isinstance(s, CopySchedule) and self.accepts(op) and s.threads % 32 == 0
                and 0 < s.threads <= arch.max_threads_per_block):
            return False
        if self.tiled(op):   # the tile's rows are walked by threads / 32 warps
            return s.tile == TILE and s.vec == 1 and s.threads // 32 <= TILE
        return s.tile == 0 and s.vec >= 1 and self._vec_ok(op, s.vec)

    def _tiles(self, op: KernelOp) -> tuple[int, int, int]:
        """(input inner size A, output inner size B, batch) of a tiled transpose."""
        x, axes = op.operands[0], op.attr_map["axes"]
        inner_in, inner_out = x.shape[-1], x.shape[axes[-1]]
        return inner_in, inner_out, x.numel // (inner_in * inner_out)

    def resources(self, op: KernelOp, s: CopySchedule, arch: ArchSpec) -> Resources:
        if s.tile:
            a_, b_, batch = self._tiles(op)
            blocks = math.ceil(a_ / s.tile) * math.ceil(b_ / s.tile) * batch
            smem = s.tile * (s.tile + 1) * op.result.dtype.itemsize
            regs = REG_TILE_BASE + REG_TILE_PER_ROW * (s.tile // (s.threads // 32))   # rows per thread
        else:
            units = op.result.numel // s.vec
            resident = min(arch.max_blocks_per_sm, arch.max_warps_per_sm * 32 // s.threads)
            blocks = max(1, min(math.ceil(units / s.threads), arch.sm_count * resident * GRID_WAVES))
            smem = 0
            words = max(1, s.vec * op.result.dtype.itemsize // 4)
            regs = (REG_BASE + (REG_SM90 if arch.compute_capability >= (9, 0) else 0) + REG_PER_WORD * words
                    + (REG_PER_PAD_AXIS * sum(1 for d in op.result.shape if d > 1) if op.op == "pad" else 0)
                    + (REG_SM90_PER_PIECE * len(op.operands)
                       if op.op == "strided_concatenate" and arch.compute_capability >= (9, 0) else 0))
        reads = op.operand_bytes
        if op.op == "strided_concatenate":       # each piece read once, along its contiguous inner axis
            reads = op.result.nbytes
        if op.op in ("slice", "strided_copy"):   # only the elements read, in whole sectors when strided
            size = op.operands[0].dtype.itemsize
            inner = op.attr_map["steps"][-1] if op.op == "slice" else op.attr_map["strides"][-1]
            waste = min(max(1, inner), max(1, SECTOR_BYTES // size))
            reads = min(reads, op.result.nbytes * waste)
        return Resources(threads=s.threads, blocks=blocks, registers=round(regs), smem_bytes=smem,
                         hbm_bytes=reads + op.result.nbytes, flops=0, unit=MathUnit.FP32)

    # -- emission -------------------------------------------------------------------------------

    def emit(self, op: KernelOp, s: CopySchedule, arch: ArchSpec) -> KernelSource:
        name = kernel_name(self.kind, op, s)
        t = STORAGE[op.result.dtype]
        params = [f"const {STORAGE[x.dtype]}* __restrict__ in{i}" for i, x in enumerate(op.operands)]
        params.append(f"{t}* __restrict__ out")
        grid = self.resources(op, s, arch).blocks
        args = ", ".join([f"in{i}" for i in range(len(op.operands))] + ["out"])
        head = f"""// {op}
// copy ({'shared-memory tiled transpose' if s.tile else 'gather'}), schedule {s.describe()}; shapes baked in.
// launch: {name}<<<{grid}, {s.threads}>>>({args})
{VEC_STRUCT}
"""
        if s.tile:
            body = self._tiled_body(op, s)
        else:
            v, n = s.vec, op.result.numel
            lines = self._gather_body(op, v)
            body = f"""    const unsigned step = gridDim.x * blockDim.x * {v}u;
    for (unsigned i = (blockIdx.x * blockDim.x + threadIdx.x) * {v}u; i < {n}u; i += step) {{
{chr(10).join('        ' + x for x in lines)}
        *reinterpret_cast<vec_t<{t}, {v}>*>(out + i) = r;
    }}"""
        source = f"""{head}
extern "C" __global__ void __launch_bounds__({s.threads}) {name}({', '.join(params)}) {{
{body}
}}
"""
        return KernelSource(name, source, s.threads,
                            grid=(self.resources(op, s, arch).blocks, 1, 1),
                            fast_math=op.numerics is Numerics.FAST)

    def _tiled_body(self, op: KernelOp, s: CopySchedule) -> str:
        x, axes = op.operands[0], op.attr_map["axes"]
        out = op.result.shape
        n = x.ndim
        p = axes[-1]                       # the input axis that becomes the result's inner axis
        q = list(axes).index(n - 1)        # where the input's inner axis lands in the result
        a_, b_, batch = self._tiles(op)
        in_st, out_st = contiguous_strides(x.shape), contiguous_strides(out)
        rest = [d for d in range(n) if d not in (q, n - 1)]
        sizes, (bin_, bout) = coalesce(tuple(out[d] for d in rest) or (1,),
                                       [tuple(in_st[axes[d]] for d in rest) or (0,),
                                        tuple(out_st[d] for d in rest) or (0,)])
        sizes = sizes or (1,)
        in_batch = offset_expr("batch", sizes, bin_ or (0,))
        out_batch = offset_expr("batch", sizes, bout or (0,))
        ta, tb, rows = math.ceil(a_ / s.tile), math.ceil(b_ / s.tile), s.threads // 32
        T = s.tile
        t = STORAGE[op.result.dtype]
        return f"""    __shared__ {t} tile[{T}][{T + 1}];      // +1: column reads fall in distinct banks
    const unsigned tx = threadIdx.x % 32u, ty = threadIdx.x / 32u;
    const unsigned batch = blockIdx.x / {ta * tb}u, ab = blockIdx.x % {ta * tb}u;
    const unsigned a0 = (ab % {ta}u) * {T}u, b0 = (ab / {ta}u) * {T}u;
    const {t}* src = in0 + ({in_batch});
    {t}* dst = out + ({out_batch});
    #pragma unroll
    for (unsigned r = ty; r < {T}u; r += {rows}u)      // along the input's inner axis
        if (a0 + tx < {a_}u && b0 + r < {b_}u) tile[r][tx] = src[(b0 + r) * {in_st[p]}u + a0 + tx];
    __syncthreads();
    #pragma unroll
    for (unsigned r = ty; r < {T}u; r += {rows}u)      // along the result's inner axis
        if (b0 + tx < {b_}u && a0 + r < {a_}u) dst[(a0 + r) * {out_st[q]}u + b0 + tx] = tile[tx][r];"""

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32 = DType.bfloat16, DType.float32

        def mk(name, xs, **attrs):
            return KernelOp.of(name, xs, OPS[name].infer(*xs, **attrs), **attrs)

        sq = TensorType((4096, 4096), bf)
        return (
            mk("transpose", (sq,), axes=(1, 0)),                                          # tiled
            mk("transpose", (TensorType((8, 512, 12, 64), f32),), axes=(0, 2, 1, 3)),   # heads swap, inner kept
            mk("transpose", (TensorType((16, 1000, 300), f32),), axes=(0, 2, 1)),        # batched, ragged tiles
            mk("pad", (TensorType((1024, 1000), bf),), pads=((0, 0), (8, 16)), value=0.0),
            mk("pad", (TensorType((64, 3, 224, 224), f32),), pads=((0, 0), (0, 0), (1, 1), (1, 1)), value=-1.0),
            mk("concatenate", (TensorType((2048, 1024), bf), TensorType((2048, 512), bf)), axis=1),
            mk("slice", (TensorType((4096, 4096), f32),), starts=(0, 128), stops=(4096, 1152), steps=(2, 1)),
            mk("slice", (TensorType((4096, 4096), bf),), starts=(0, 0), stops=(4096, 4096), steps=(1, 2)),
            mk("broadcast_to", (TensorType((1, 4096), bf),), shape=(2048, 4096)),
            mk("flip", (TensorType((4096, 4096), bf),), axes=(1,)),                       # scalar reads
            mk("flip", (TensorType((16, 1024, 768), f32),), axes=(0, 1)),                # vector reads
            # q of a fused q|k|v projection, its heads brought forward: a folded slice + transpose
            mk("strided_copy", (TensorType((4, 1024, 3072), bf),), shape=(4, 16, 1024, 64),
               strides=(1024 * 3072, 64, 3072, 1), offset=0),
            # dQ, dK, dV transposed back from heads into the gradient of the q|k|v projection
            mk("strided_concatenate", (TensorType((4, 16, 1024, 64), bf),) * 3, axis=2, shape=(4, 1024, 3, 16, 64),
               sizes=(1, 1, 1), strides=(1 << 20, 64, 1, 65536, 1) * 3, offsets=(0, 0, 0)),
        )


def _aligned(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, v: int) -> bool:
    """Whether a strided view reads whole aligned vectors of v along its contiguous inner axis."""
    return strides[-1] == 1 and offset % v == 0 and all(st % v == 0 for n, st in zip(shape[:-1], strides) if n > 1)


def _views(op: KernelOp) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    a = op.attr_map
    return concatenated_views(op.result.shape, a["axis"], a["sizes"], a["strides"], a["offsets"])


def _fill(value: float, dtype: DType) -> str:
    """The C value of a pad's fill in the result's storage type."""
    if dtype is DType.bool:
        return f"(unsigned char){int(bool(value))}"
    if dtype in (DType.float8_e4m3, DType.float8_e5m2):   # its byte, as ml_dtypes rounds the value
        return f"(fp8_t){np.asarray(value, dtype.numpy).view(np.uint8).item():#04x}"
    if dtype.is_low_precision:
        return f"f32_to_{'bf16' if dtype is DType.bfloat16 else 'f16'}({literal(value, DType.float32)})"
    return literal(value, dtype)


# The register model (fit to ptxas 12.x on samples(), within 20% on sm_80 and sm_90). The gather's
# index math folds into a few multiply-highs that reuse the vector's registers.
REG_BASE = 9              # loop index, bound, step, source and result addresses
REG_SM90 = 3              # sm_90 code keeps the 64-bit addresses of both sides live
REG_PER_WORD = 0.75       # the vector in flight
REG_PER_PAD_AXIS = 0.5    # pad keeps each coordinate for its bounds test
REG_SM90_PER_PIECE = 1.7  # sm_90 code keeps each piece of a strided concatenate's address math live
REG_TILE_BASE = 12        # tile origin, batch offsets, both addresses
REG_TILE_PER_ROW = 0.5    # the unrolled rows each thread moves
