"""A row reduce's grid split: several blocks share one output when the outputs are too few to fill
the GPU a block each (a loss, the norm of a whole tensor, a few long rows). A column reduce's split
(reduction_column.py) shares these limits.

Block `part` of an output walks every `blocks`-th run of the row; its total (and compensation,
under kahan_sum) goes to the zeroed workspace, then an arrival counter per output is bumped. The
last of the output's blocks to arrive combines the parts in part order, its warp's lanes striding
over them and meeting through the same shuffles as the walk: whichever block comes last, the
result is the same bits on every run.

>>> split_workspace_bytes(n_out=1, blocks=8, part_bytes=4)
36
"""

from __future__ import annotations

import math

from tessera_rw.codegen.arch import ArchSpec, WARP_SIZE

GRID_SPLIT_WAVES = 2      # blocks per SM a split aims for, all outputs together
MAX_GRID_SPLIT = 1024     # blocks sharing one output at most (the last one's warp combines their parts)
MIN_VECTORS = 4           # vectors each thread of a sharing block loads at least


def grid_split(lay, threads: int, split: int, vec: int, arch: ArchSpec) -> int:
    """How many blocks share each output of a row reduce with a block per output (1: none)."""
    if not lay.row or split != threads:
        return 1
    wanted = math.ceil(GRID_SPLIT_WAVES * arch.sm_count / lay.n_out)
    walkable = lay.n_red // (threads * vec * MIN_VECTORS)
    return max(1, min(wanted, walkable, MAX_GRID_SPLIT))


def split_workspace_bytes(n_out: int, blocks: int, part_bytes: int) -> int:
    """The zeroed workspace: each block's part of its output, then an arrival counter per output."""
    return 0 if blocks == 1 else n_out * blocks * part_bytes + 4 * n_out


def parts_met(n_out: int, parts: int, part_bytes: int, acc: str, ident: str, kahan: bool, shuffle: str) -> list[str]:
    """The kernel's ending after a block reduced its part into `acc` (and `comp`) in warp 0: park it,
    arrive, and in the last block to arrive combine every part of the row into `acc`."""
    n = n_out * parts
    comps = [f"    {acc}* comps = parts + {n}u;"] if kahan else []
    keep = f" comps[row * {parts}u + part] = comp;" if kahan else ""
    merge = (f"kahan_merge(acc, comp, ((volatile {acc}*)parts)[k], ((volatile {acc}*)comps)[k]);" if kahan
             else f"acc = reduction_combine(acc, ((volatile {acc}*)parts)[k]);")
    return [
        f"    {acc}* parts = reinterpret_cast<{acc}*>(work);", *comps,
        f"    unsigned* arrived = reinterpret_cast<unsigned*>(work + {n * part_bytes}u);",
        f"    if (lane == 0) {{ parts[row * {parts}u + part] = acc;{keep} __threadfence(); }}",
        "    unsigned last = 0;",
        f"    if (lane == 0) last = atomicAdd(&arrived[row], 1u) == {parts - 1}u;",
        "    if (!__shfl_sync(0xffffffffu, last, 0)) return;       // another block of the row comes later",
        "    __threadfence();",
        f"    acc = {ident};" + (f" comp = {ident};" if kahan else ""),
        f"    for (unsigned k = row * {parts}u + lane; k < (row + 1u) * {parts}u; k += {WARP_SIZE}u) {merge}",
        shuffle,
    ]
