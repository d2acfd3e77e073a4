"""The Hopper GEMM kernel with TMA loads and a producer warpgroup (sm_90a).

The block is wg_m x wg_n consumer warpgroups, which issue the wgmmas and run the epilogue exactly
as the cp.async kernel's do (gemm_wgmma_cuda.py: same shared layout, descriptors, accumulators),
and one producer warpgroup after them, of which one thread does all the loading: per k-tile and
stage, one TMA copy per operand box (a K-major operand's whole tile, an MN-major one's 64-wide
blocks), the tensor map writing each box in the 128-byte swizzled layout wgmma reads and
zero-filling what lies past M, N or K. No consumer thread spends an instruction or a register on
addresses, predicates or copies.

Two mbarriers per stage hand the tiles over:
- full[s]: the producer arrives on it, expecting the stage's bytes; the TMA copies complete the
  phase as they land. A consumer waits on it before issuing the stage's MMAs.
- empty[s]: each consumer warp arrives on it once its wgmmas on the stage have retired (one
  k-tile later, after `wgmma.wait_group 1`); the producer waits on it before refilling the stage.
The parity waited for is the phase's: round kt / STAGES of stage kt % STAGES.

A bias gradient's row of ones (row MA of A, past the tensor, so zero-filled by the copy) is
written into each A tile by the warpgroup whose slab holds it, after the tile lands: each thread
fences the proxies and the warpgroup meets at a named barrier before issuing its MMAs (only
schedules with one warpgroup across N, so no other warpgroup reads that slab).

A persistent schedule launches a block per SM slot (gemm_variants.persistent_grid), and each walks
tiles blockIdx.x, blockIdx.x + gridDim.x, ... in the grid's order. Its stages and barrier phases
run on across tiles (`it` counts the block's k-tiles), and the consumers hand a tile's last stage
back before its epilogue, so the producer is loading the next tile while they store this one.

Products the TMA cannot map fall back to the cp.async kernel (`tma_blocker`): rows not 16-byte
aligned (a tensor map's strides must be) and operands broadcast over some batch dims but not all.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.prelude import ATOM_BYTES, ROW_BYTES
from tessera_rw.codegen.tensor_map import TensorMapSpec
from tessera_rw.codegen.templates.gemm_cuda import CTYPE, common
from tessera_rw.codegen.templates.gemm_tile_order import tile_origin
from tessera_rw.codegen.templates.gemm_wgmma_cuda import (accumulators, issue_mmas, kernel_opening,
                                                         store_accumulators)
from tessera_rw.codegen.templates.warp_specialization import register_split

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm_footprint import TmaSchedule
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem

MBARRIER_BYTES = 8


def tma_blocker(p: GemmProblem) -> str | None:
    """Why the product's operands cannot be loaded through tensor maps, or None when they can."""
    if not (p.stride_aligned(p.a_stride) and p.stride_aligned(p.b_stride)):
        return "a tensor map's row stride must be a multiple of 16 bytes"
    for batch in (p.a_batch, p.b_batch):
        if _batched(p, batch) is None:
            return "an operand broadcast over some batch dims but not all has no single batch stride"
    return None


def _batched(p: GemmProblem, batch: tuple[int, ...]) -> bool | None:
    """Whether an operand with leading dims `batch` has one matrix per batch of the product (True),
    one for all of them (False), or neither (None)."""
    if math.prod(batch) == 1:
        return False
    padded = (1,) * (len(p.batch) - len(batch)) + tuple(batch)
    return True if padded == tuple(p.batch) else None


def tensor_maps(p: GemmProblem, s: TmaSchedule) -> tuple[TensorMapSpec, TensorMapSpec]:
    """The kernel's tensor maps in parameter order, A's then B's: a K-major operand's box is a whole tile (BK along its rows, BM or BN of
    them), an MN-major one's a 64-wide block of BK rows; batched operands get a third dim."""
    es = p.in_dtype.itemsize
    wide = ROW_BYTES // es               # elements per swizzled row
    maps = []
    for operand, rows, k_major, extent in ((0, p.a_rows, not p.trans_a, s.bm), (1, p.n, p.trans_b, s.bn)):
        inner, outer = (p.k, rows) if k_major else (rows, p.k)
        box = (wide, extent) if k_major else (wide, s.bk)
        dims, strides = (inner, outer), (inner * es,)
        if _batched(p, p.a_batch if operand == 0 else p.b_batch):
            batches = p.nbatch
            dims, strides, box = (*dims, batches), (*strides, inner * outer * es), (*box, 1)
        maps.append(TensorMapSpec(operand, es, dims, strides, box))
    return maps[0], maps[1]


def _copies(p: GemmProblem, s: TmaSchedule, operand: str) -> str:
    """The producer's statements copying one stage's tile of `operand` into d{operand}."""
    a = operand == "A"
    spec = tensor_maps(p, s)[0 if a else 1]
    k_major = (not p.trans_a) if a else p.trans_b
    origin, extent = ("m0", "BM") if a else ("n0", "BN")
    batch = ", z" if len(spec.dims) == 3 else ""
    load = f"tma_load_{len(spec.dims)}d"
    if k_major:
        return f"{load}(d{operand}, &tma_{operand.lower()}, k0, {origin}{batch}, &full[s]);"
    return (f"for (int b = 0; b < {extent} / BOX; ++b)   // 64-wide blocks, BK rows apart\n"
            f"            {load}(d{operand} + b * BK * BOX, &tma_{operand.lower()}, {origin} + b * BOX, k0{batch}, "
            f"&full[s]);")


_ONE_BITS = {DType.bfloat16: "0x3F80u", DType.float16: "0x3C00u"}


def _ones_here(p: GemmProblem) -> str:
    """Whether this warpgroup's slab of A holds a bias gradient's row of ones (row MA)."""
    if not p.bias_grad:
        return ""
    return "    const bool ones_here = MA >= m0 + wm0 && MA < m0 + wm0 + WARPGROUP_M;   // the bias gradient's row of A"


def _ones_row(p: GemmProblem) -> str:
    """The statements writing ones into row MA of the landed A tile cA, for k < K."""
    if not p.bias_grad:
        return ""
    # K-major: row r of 128 swizzled bytes; MN-major: element r of each k-row, in its 64-wide block
    at = ("r * ROW + gemm_swz(r, c / EL) * EL + c % EL" if not p.trans_a
          else "r / BOX * BK * BOX + c * ROW + gemm_swz(c, r % BOX / EL) * EL + r % EL")
    return f"""        if (ones_here) {{                                   // the copy zero-filled row MA: ones where k < K
            const int r = MA - m0;
            for (int c = tid & 127; c < BK; c += 128)
                if (kt * BK + c < K) ((unsigned short*)cA)[{at}] = {_ONE_BITS[p.in_dtype]};
            fence_proxy_async();                           // where the tensor cores read them
            warpgroup_sync(1 + warpgroup);                 // written by every thread before any MMA reads them
        }}
"""


def emit_tma(p: GemmProblem, s: TmaSchedule, name: str, group: int, grid: int) -> str:
    """The TMA kernel, after its launch comment and device helpers; a persistent schedule's `grid`
    blocks each walk tiles blockIdx.x, blockIdx.x + gridDim.x, ..."""
    fns, signature, args = common(p)
    t = CTYPE[p.in_dtype]
    signature += ", const __grid_constant__ TmaMap tma_a, const __grid_constant__ TmaMap tma_b"
    opening = kernel_opening(p, s, name, fns, signature, smem_bytes_of(p, s))
    tiles = p.tiles(s.bm, s.bn)
    if s.persistent:
        opening = opening.replace(f"<<<{tiles}, ", f"<<<{grid}, ").replace(
            "(a 1-d grid of resources().blocks", f"(a persistent 1-d grid walking all {tiles} tiles")
    # a persistent block's stages and barrier phases run on across its tiles: `it` counts its k-tiles
    step = "it" if s.persistent else "kt"
    producer, consumer = _producer(p, s, step), _consumer(p, s, step, args)
    if s.persistent:
        walk = "    for (int tile = blockIdx.x, it = 0; tile < TILES; tile += gridDim.x) {"
        origin = tile_origin(group, "tile", " " * 8)
        producer = f"{walk}\n{origin}\n{_indented(producer, 4)}\n    }}"
        consumer = f"{walk}\n{origin}\n{_indented(consumer, 4)}\n    }}"
        head = f"    constexpr int TILES = {tiles};"
    else:
        head = tile_origin(group)
    return opening + f"""    constexpr int CONSUMERS = {s.consumers}, BOX = ROW_BYTES / sizeof({t});
    constexpr unsigned STAGE_BYTES = (BM + BN) * BK * sizeof({t});
    unsigned long long* const full = (unsigned long long*)(sB + STAGES * BK * BN);   // a stage's tiles have landed
    unsigned long long* const empty = full + STAGES;     // every consumer warp is done with a stage
    const int tid = threadIdx.x, lane = tid & 31, warpgroup = tid >> 7, warp = (tid >> 5) & 3;
{head}
    if (tid == 0) {{
        for (int s = 0; s < STAGES; ++s) {{
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * CONSUMERS);
        }}
        fence_mbarrier_init();
    }}
    __syncthreads();

    if (warpgroup == CONSUMERS) {{     // the producer warpgroup: its first thread issues every copy
{register_split(s.consumers, "dec", 8)}
        if (tid == CONSUMERS * 128) {{
{_indented(producer, 8)}
        }}
        return;
    }}
{register_split(s.consumers, "inc", 4)}
    const int wm0 = (warpgroup / WG_N) * WARPGROUP_M, wn0 = (warpgroup % WG_N) * WARPGROUP_N;

{consumer}
}}
"""


def _indented(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line if line else line for line in text.splitlines())


def _producer(p: GemmProblem, s: TmaSchedule, step: str) -> str:
    """The producer thread's loop over one tile's k-tiles (at 4 spaces), `step` counting the
    k-tiles its stages have taken."""
    t = CTYPE[p.in_dtype]
    advance = "++kt" if step == "kt" else "++kt, ++it"
    return f"""    for (int kt = 0; kt < KT; {advance}) {{
        const int s = {step} % STAGES, k0 = kt * BK;
        if ({step} >= STAGES) mbar_wait(&empty[s], ({step} / STAGES - 1) & 1);   // tile {step} - STAGES's MMAs retired
        mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
        {t}* dA = sA + s * BM * BK;
        {t}* dB = sB + s * BK * BN;
        {_copies(p, s, "A")}
        {_copies(p, s, "B")}
    }}"""


def _consumer(p: GemmProblem, s: TmaSchedule, step: str, args: str) -> str:
    """A consumer warpgroup's work on one tile (at 4 spaces): MMAs over its k-tiles, each stage
    handed back once its MMAs retire, then the epilogue."""
    t = CTYPE[p.in_dtype]
    advance = "++kt" if step == "kt" else "++kt, ++it"
    # a persistent block hands its last stage back before the epilogue: the next tile's loads overlap it
    release = "" if step == "kt" else "    if (lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);   // the last stage\n"
    return f"""{accumulators()}

{_ones_here(p)}
    for (int kt = 0; kt < KT; {advance}) {{
        const int s = {step} % STAGES;
        mbar_wait(&full[s], ({step} / STAGES) & 1);            // tile {step} has landed
        const {t}* cA = sA + s * BM * BK;
        const {t}* cB = sB + s * BK * BN;
{_ones_row(p)}{issue_mmas(p, s, "        ")}
        wgmma_wait<1>();                                    // tile {step} - 1's MMAs are done; tile {step}'s run on
        wgmma_hold<MI * NI * 4>(&acc[0][0][0]);
        if (kt > 0 && lane == 0) mbar_arrive(&empty[({step} - 1) % STAGES]);
    }}
    wgmma_wait<0>();
    wgmma_hold<MI * NI * 4>(&acc[0][0][0]);   // the epilogue reads them after the wait, not before
{release}
{store_accumulators(p, args)}"""


def smem_bytes_of(p: GemmProblem, s: TmaSchedule) -> int:
    """Dynamic shared memory the kernel asks for: its stages, room to align them to an atom, and
    two mbarriers per stage."""
    return s.stages * (s.bm + s.bn) * s.bk * p.in_dtype.itemsize + ATOM_BYTES + 2 * s.stages * MBARRIER_BYTES
