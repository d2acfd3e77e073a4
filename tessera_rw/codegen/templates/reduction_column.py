"""A column reduce's kernel body (the innermost kept group: sum over axis 0, say): consecutive
threads own consecutive outputs, `vec` each, so every load of the walk down the reduced axis is
coalesced; `split` rows of threads walk interleaved rows and meet in shared memory.

With few output tiles (a layer's weight and bias gradients: 4096 outputs over 8192 tokens fill 16
blocks of 256 outputs), `blocks` blocks share each tile, walking every `blocks`-th stripe of rows:
they park their partial sums in the zeroed workspace, and the last to arrive combines them in part
order, so every run gives the same bits whichever block comes last.

>>> column_split(tiles=16, n_red=8192, rows=8, sm_count=132)
17
>>> column_split(tiles=256, n_red=8192, rows=8, sm_count=132)
1
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.cuda_scalar import store
from tessera_rw.codegen.templates.reduction_reads import Layout
from tessera_rw.codegen.templates.reduction_split import GRID_SPLIT_WAVES, MAX_GRID_SPLIT
from tessera_rw.codegen.templates.reduction_walk import Walk

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.reduction import ReductionSchedule

MIN_ROWS_PER_THREAD = 16    # rows each thread of a sharing block walks at least


def column_split(tiles: int, n_red: int, rows: int, sm_count: int) -> int:
    """How many blocks share each of a column reduce's `tiles` output tiles (1: none)."""
    if tiles >= sm_count:            # a block per tile on every SM already
        return 1
    wanted = math.ceil(GRID_SPLIT_WAVES * sm_count / tiles)
    walkable = n_red // (rows * MIN_ROWS_PER_THREAD)
    return max(1, min(wanted, walkable, MAX_GRID_SPLIT))


def column_body(op: KernelOp, s: ReductionSchedule, lay: Layout, walk: Walk, ident: str, value: str, kahan: bool,
                unroll: int, part_bytes: int) -> str:
    """The CUDA body of the column reduce `op` under schedule `s`."""
    v, ry, parts, a = s.vec, s.split, s.blocks, walk.acc
    tx = s.threads // ry
    if kahan:
        add = walk.per_lane(lambda e: f"kahan_add(acc[j], comp[j], {e});")
        merge = f"kahan_merge(acc[j], comp[j], partial[k][tx * {v}u + j], partial_comp[k][tx * {v}u + j]);"
    else:
        add = walk.per_lane(lambda e: f"acc[j] = reduction_combine(acc[j], {e});")
        merge = f"acc[j] = reduction_combine(acc[j], partial[k][tx * {v}u + j]);"
    pairs = [f"    __shared__ {a} partial_comp[{ry}][{tx * v}];"] if kahan else []
    stash = f"{{ partial[ty][tx * {v}u + j] = acc[j]; partial_comp[ty][tx * {v}u + j] = comp[j]; }}" if kahan \
        else f"partial[ty][tx * {v}u + j] = acc[j];"
    tile = f"blockIdx.x / {parts}u" if parts > 1 else "blockIdx.x"
    first = f"part * {ry}u + ty" if parts > 1 else "ty"
    lines = [
        f"    const unsigned tx = threadIdx.x % {tx}u, ty = threadIdx.x / {tx}u;",
        *([f"    const unsigned part = blockIdx.x % {parts}u;"] if parts > 1 else []),
        f"    const unsigned o = (({tile}) * {tx}u + tx) * {v}u;",
        f"    {a} acc[{v}]{f', comp[{v}]' if kahan else ''};",
        "    #pragma unroll",
        f"    for (int j = 0; j < {v}; ++j) acc[j] = {ident};",
        *(["    #pragma unroll", f"    for (int j = 0; j < {v}; ++j) comp[j] = {ident};"] if kahan else []),
        f"    if (o < {lay.n_out}u) {{",
        *(f"        {line}" for line in walk.bases("o")),
        f"        #pragma unroll {unroll}",
        f"        for (unsigned r = {first}; r < {lay.n_red}u; r += {parts * ry}u) {{",
        *(f"            {line}" for line in walk.loads("r")),
        "            #pragma unroll",
        f"            for (int j = 0; j < {v}; ++j) {add}",
        "        }",
        "    }",
        f"    __shared__ {a} partial[{ry}][{tx * v}];",
        *pairs,
        "    #pragma unroll",
        f"    for (int j = 0; j < {v}; ++j) {stash}",
        "    __syncthreads();",
    ]
    if parts > 1:
        lines += _parts_met(lay.n_out, parts, part_bytes, a, ident, kahan, merge, v, ry, tile)
    else:
        lines += [f"    if (ty != 0 || o >= {lay.n_out}u) return;",
                  "    #pragma unroll",
                  f"    for (int j = 0; j < {v}; ++j) for (int k = 1; k < {ry}; ++k) {merge}"]
    total = "kahan_total(acc[j], comp[j])" if kahan else "acc[j]"
    lines += ["    #pragma unroll",
              f"    for (int j = 0; j < {v}; ++j) {{",
              f"        const {a} acc_j = {total};",
              f"        out[o + j] = {store(op.result.dtype, value.replace('acc', 'acc_j'))};",
              "    }"]
    return "\n".join(lines)


def column_workspace_bytes(n_out: int, parts: int, part_bytes: int, tiles: int) -> int:
    """Each block's partial of each output of its tile, then an arrival counter per tile."""
    return 0 if parts == 1 else n_out * parts * part_bytes + 4 * tiles


def _parts_met(n_out: int, parts: int, part_bytes: int, a: str, ident: str, kahan: bool, merge: str,
               v: int, ry: int, tile: str) -> list[str]:
    """Row 0 of the block merges the rows' partials and parks them at [part][output] (neighbouring
    lanes, neighbouring words); the block arrives at its tile's counter, and in the last block to
    arrive row 0 combines every part."""
    n = n_out * parts
    mine_at, at = f"part * {n_out}u + o + j", f"k * {n_out}u + o + j"
    keep = f" comps[{mine_at}] = comp[j];" if kahan else ""
    combine = (f"kahan_merge(acc[j], comp[j], ((volatile {a}*)parts)[{at}], ((volatile {a}*)comps)[{at}]);"
               if kahan else f"acc[j] = reduction_combine(acc[j], ((volatile {a}*)parts)[{at}]);")
    return [
        f"    {a}* parts = reinterpret_cast<{a}*>(work);",
        *([f"    {a}* comps = parts + {n}u;"] if kahan else []),
        f"    unsigned* arrived = reinterpret_cast<unsigned*>(work + {n * part_bytes}u);",
        f"    const bool mine = ty == 0 && o < {n_out}u;",
        "    if (mine) {",
        "        #pragma unroll",
        f"        for (int j = 0; j < {v}; ++j) {{",
        f"            for (int k = 1; k < {ry}; ++k) {merge}",
        f"            parts[{mine_at}] = acc[j];{keep}",
        "        }",
        "        __threadfence();",
        "    }",
        "    __shared__ unsigned last;",
        "    __syncthreads();",
        f"    if (threadIdx.x == 0) last = atomicAdd(&arrived[{tile}], 1u) == {parts - 1}u;",
        "    __syncthreads();",
        "    if (!last || !mine) return;       // another block of the tile comes later",
        "    __threadfence();",
        "    #pragma unroll",
        f"    for (int j = 0; j < {v}; ++j) {{",
        f"        acc[j] = {ident};" + (f" comp[j] = {ident};" if kahan else ""),
        "        #pragma unroll 4             // bounded: the same registers whatever the parts' count",
        f"        for (unsigned k = 0; k < {parts}u; ++k) {combine}",
        "    }",
    ]
