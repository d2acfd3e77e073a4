"""The tuning grids of the direct convolution: the tiles DirectConvTemplate.space() tries beyond its
defaults, before its own checks (_fits, _depthwise_fits) keep those that fit and the kernels support.

Points are plain tuples in the schedules' field order, so this module needs nothing from conv.py:

>>> next(implicit_gemm_grid(tensor_cores=True, widest=64))
(32, 32, 32, 2, 2)
>>> sorted({tile for _, _, tile in depthwise_grid(oh=1, ow=2048)})[:3]
[(1, 64), (1, 128), (1, 256)]
"""

from __future__ import annotations

from collections.abc import Iterator

# Implicit GEMM: block tile (bm output positions x bn output channels), bk taps per k-step, warps.
# mma.sync k-steps are 16 deep; the FFMA tile steps one tap at a time, so its bk can be shallower.
# (Other k-depths and warp shapes compile too; calibrated_gemm_tile says why they are left out.)
GEMM_BM, GEMM_BN, GEMM_WARPS_M, GEMM_WARPS_N = (32, 64, 128, 256), (16, 32, 64, 128), (1, 2, 4, 8), (1, 2, 4)
MMA_BK, SIMT_BK = (32, 64), (16,)
# Depthwise: block sizes, outputs per thread (one vector store), and tile widths in powers of two
DEPTHWISE_THREADS, DEPTHWISE_OUTPUTS = (64, 128, 256, 512), (1, 2, 4, 8)


def implicit_gemm_grid(tensor_cores: bool, widest: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(bm, bn, bk, warps_m, warps_n) points, bn no wider than `widest` (wider tiles only pad), in
    the region the register model holds (calibrated_gemm_tile)."""
    for bm in GEMM_BM:
        for bn in (n for n in GEMM_BN if n <= widest):
            for bk in MMA_BK if tensor_cores else SIMT_BK:
                for wm in GEMM_WARPS_M:
                    for wn in GEMM_WARPS_N:
                        if calibrated_gemm_tile(tensor_cores, bk, wm, wn, bm // wm, bn // wn):
                            yield bm, bn, bk, wm, wn


def calibrated_gemm_tile(tensor_cores: bool, bk: int, warps_m: int, warps_n: int, warp_m: int, warp_n: int) -> bool:
    """Whether an implicit-GEMM tile lies where the register model was checked against ptxas (sm_80
    and sm_90, every sample: no spills, within about 25%): 4 or 8 warps, at most 4 along M, warp tiles
    of 16 to 64 each way, and k-steps of 32 or 64 taps (mma) or 16 (FFMA, as its defaults). Outside it
    ptxas trades spills for occupancy (8 warps along M) or allocates a third more or less than
    modelled (one- and two-warp blocks, 8- and 128-wide warp tiles, 16-tap mma and 32-tap FFMA k-steps)."""
    return (warps_m * warps_n in (4, 8) and warps_m <= 4 and warp_m in (16, 32, 64) and warp_n in (16, 32, 64)
            and bk in ((32, 64) if tensor_cores else (16,)))


def depthwise_grid(oh: int, ow: int) -> Iterator[tuple[int, int, tuple[int, int]]]:
    """(threads, outputs_per_thread, (rows, columns)) points: tiles from one vector wide to a block's
    worth of outputs, no wider than the output row and no taller than the plane (to powers of two),
    so no row or column of threads is idle throughout."""
    for threads in DEPTHWISE_THREADS:
        for v in DEPTHWISE_OUTPUTS:
            tw = v
            while tw <= min(threads * v, max(v, _pow2(ow))):
                th = threads * v // tw
                if th <= _pow2(oh):
                    yield threads, v, (th, tw)
                tw *= 2


def _pow2(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << (n - 1).bit_length()
