"""The order a GEMM's flat grid walks its output tiles, and the HBM traffic that order costs.

Blocks start in blockIdx order, a wave (every SM's resident blocks) at a time, and the blocks of
one wave stream their K panels side by side: a panel that several blocks of a wave read comes from
HBM once. A row-major walk (column tiles fastest) puts a wave across one or a few tile rows: they
share A's row panels, but each wave reads up to all of B, again for every wave once B does not stay
in L2. Walking the tiles in groups of `group` tile rows, down a group's column before the next
column, makes a wave a patch of `group` rows by wave / group columns: `group` panels of A and
wave / group panels of B (the square patch reads the fewest). `tile_order` picks the group that
moves the fewest bytes under this model, and `tile_origin` writes the walk into a kernel.

The model knows which panels a wave shares, not how the L2 replaces lines or how waves drift
apart, so a schedule may also fix its group: `other_groups` lists the walks a tuner times beside
the model's pick wherever the walk can matter (operands past half the L2, more than one tile row
and column).

>>> order = tile_order(tiles_m=64, tiles_n=32, wave=132, a_bytes=128 << 20, b_bytes=128 << 20,
...                    l2_bytes=50 << 20)
>>> order.group, order.a_reads, order.b_reads      # 8192³ bf16 in 128 x 256 tiles on an H100
(16, 4, 4)
>>> tile_order(64, 32, 132, 128 << 20, 128 << 20, 50 << 20, group=1).b_reads   # row-major: 4 rows a wave
16
>>> other_groups(64, 32, 132, 128 << 20, 128 << 20, 50 << 20)
(1, 2, 4, 8, 32, 64)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TileOrder:
    """Tile rows per group, and how many times A's and B's bytes come from HBM walking them."""
    group: int
    a_reads: int
    b_reads: int

    def hbm_bytes(self, a_bytes: int, b_bytes: int) -> int:
        return a_bytes * self.a_reads + b_bytes * self.b_reads


def _patch(tiles_m: int, tiles_n: int, wave: int, group: int) -> tuple[int, int]:
    """The tile rows and columns one wave spans when the grid walks groups of `group` rows."""
    if wave >= group * tiles_n:          # whole groups a wave: whole tile rows side by side
        rows = min(tiles_m, max(1, wave // tiles_n))
    else:                                # part of one group: its rows, a few columns
        rows = min(tiles_m, group, wave)
    return rows, min(tiles_n, max(1, wave // rows))


def tile_order(tiles_m: int, tiles_n: int, wave: int, a_bytes: int, b_bytes: int, l2_bytes: int,
               group: int | None = None) -> TileOrder:
    """The walk over a tiles_m x tiles_n grid (`wave` blocks resident at once) of operands of
    `a_bytes` and `b_bytes`: `group` tile rows per group, or the group reading the fewest bytes.
    Operands that fit in L2 together (half of it, beside what the wave streams) are read once,
    whatever the order; one that fits alone is read once too."""
    if group is None:
        candidates = [tile_order(tiles_m, tiles_n, wave, a_bytes, b_bytes, l2_bytes, g)
                      for g in _powers_of_two(tiles_m)]
        return min(candidates, key=lambda o: (o.hbm_bytes(a_bytes, b_bytes), o.group))
    if a_bytes + b_bytes <= l2_bytes // 2:
        return TileOrder(group, 1, 1)
    rows, cols = _patch(tiles_m, tiles_n, wave, group)
    a_reads = 1 if a_bytes <= l2_bytes // 2 else -(-tiles_n // cols)
    b_reads = 1 if b_bytes <= l2_bytes // 2 else -(-tiles_m // rows)
    return TileOrder(group, a_reads, b_reads)


def other_groups(tiles_m: int, tiles_n: int, wave: int, a_bytes: int, b_bytes: int, l2_bytes: int
                 ) -> tuple[int, ...]:
    """The groups, powers of two up to `tiles_m`, other than the one `tile_order` picks; none where
    every walk is the same order (one tile row or column) or reads the operands once (they fit in
    L2 together)."""
    if tiles_m == 1 or tiles_n == 1 or a_bytes + b_bytes <= l2_bytes // 2:
        return ()
    picked = tile_order(tiles_m, tiles_n, wave, a_bytes, b_bytes, l2_bytes).group
    return tuple(g for g in _powers_of_two(tiles_m) if g != picked)


def _powers_of_two(limit: int) -> list[int]:
    out = [1]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return out


def tile_origin(group: int, index: str = "blockIdx.x", indent: str = "    ") -> str:
    """Kernel lines placing the flat grid's tile number `index` (a block's own, or the one a
    persistent block is on): its first row m0 and column n0 and its batch z, given constants M, N,
    BM, BN; `group` tile rows per group (1: row-major)."""
    head = "constexpr int TILES_N = (N + BN - 1) / BN, TILES_M = (M + BM - 1) / BM;"
    if group == 1:
        lines = f"""// one flat grid: column tiles fastest (blocks sharing an A row panel run together), then rows, then batch
{head}
const int n0 = ({index} % TILES_N) * BN, m0 = ({index} / TILES_N % TILES_M) * BM;
const int z = {index} / (TILES_N * TILES_M);"""
    else:
        lines = f"""// one flat grid: groups of GROUP tile rows, each walked column by column (a wave's blocks share GROUP
// row panels of A and a few column panels of B), then the next group, then batch
{head}
constexpr int GROUP = {group};
const int z = {index} / (TILES_N * TILES_M), in_batch = {index} % (TILES_N * TILES_M);
const int first = in_batch / (GROUP * TILES_N) * GROUP, in_group = in_batch % (GROUP * TILES_N);
const int rows = TILES_M - first < GROUP ? TILES_M - first : GROUP;   // the last group may be short
const int m0 = (first + in_group % rows) * BM, n0 = in_group / rows * BN;"""
    return "\n".join(indent + line for line in lines.splitlines())
