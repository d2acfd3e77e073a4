"""The Hopper FlashAttention forward kernel: both products on warpgroup MMAs (wgmma, sm_90a).

Each 128-thread warpgroup owns 64 query rows of the block; the block's threads copy Q once and the
head's K/V tiles (`stages` in flight) with cp.async into shared memory, in the layout wgmma reads
through its matrix descriptors: rows of 128 bytes (64 values of the head dim) in 1024-byte atoms of
8 rows, 16-byte chunks XOR-swizzled by row, a head dim of 128 as two such column blocks one after
the other. Per key tile a warpgroup issues

- S = Q Kᵀ as m64 x BN wgmmas reading both operands from shared memory, K-major: Q's rows and K's
  rows (Kᵀ's columns) each run along the head dim;
- the online softmax on S in registers: the wgmma accumulator layout per warp is mma.sync's m16n8,
  so the mma.sync kernel's softmax text (attention_cuda.ONLINE_SOFTMAX) runs on it unchanged;
- O += P V as m64 x D wgmmas with P from registers (packed to 16 bits, S's accumulators are already
  laid out as the register A operand) and V from shared memory, N-major (its rows run along D).

cp.async writes through the generic proxy and wgmma reads through the async one: each thread fences
the proxies after its copies land, before the barrier that also tells every warpgroup has retired
the MMAs on the stage the next refill overwrites.

>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
>>> from tessera_rw.codegen.templates.attention_problem import AttentionShape
>>> t = FlashAttentionTemplate()
>>> op = t.samples()[0]
>>> s = t.schedules(op, arch_named("h100"))[0]
>>> emit_wgmma_kernel(op, AttentionShape.of(op), s, 99328).name
'flash_attention_wg_bf16_d64_bm128_bn64_w8_s4'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.prelude import ATOM_BYTES, HOPPER_TARGET, ROW_BYTES, wgmma_name, wgmma_rs_name
from tessera_rw.codegen.templates.attention_cuda import (BLOCK_INDEX, CONSTANTS, ONLINE_SOFTMAX, RUNNING_STATE,
                                                       SIGNATURE, STORE_OUTPUT, fill_kernel)

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.attention_problem import AttentionSchedule, AttentionShape

def emit_wgmma_kernel(op: KernelOp, shape: AttentionShape, s: AttentionSchedule, smem: int) -> KernelSource:
    """The wgmma kernel for `op` under schedule `s` (`smem` bytes of dynamic shared memory, the
    alignment slack included)."""
    return fill_kernel(KERNEL, op, shape, s, smem, target=HOPPER_TARGET, LAUNCH_BOUNDS=f"{s.warps} * 32, 1",
                       WG_S=wgmma_name(s.bn, shape.kind), WG_PV=wgmma_rs_name(shape.d, shape.kind),
                       RESCALE_O="rescale[m][h] = corr;                 // once the pending P V retires")


TILE_LOADER = r"""
// rows [0, valid) of a [ROWS][D] global tile, its rows SRC_ROW elements apart, into shared memory
// in wgmma's 128-byte swizzled layout: [D / 64][ROWS][64], chunk c of a row's 64-value block at chunk
// (c ^ row) % 8; later rows read as zero
template <int ROWS, int D, int THREADS, int SRC_ROW = D>
__device__ __forceinline__ void fa_load_wg_tile(unsigned short* dst, const unsigned short* src, int valid, int tid) {
    constexpr int CHUNKS = ROWS * D / 8;
    #pragma unroll
    for (int it = 0; it < (CHUNKS + THREADS - 1) / THREADS; ++it) {
        const int c = it * THREADS + tid;
        if (CHUNKS % THREADS == 0 || c < CHUNKS) {
            const int r = c / (D / 8), cc = c % (D / 8);
            // a row past `valid` copies zero bytes from the tile's first row, inside the tensor
            cp_async_16(dst + (cc / 8) * ROWS * 64 + r * 64 + ((cc ^ r) & 7) * 8,
                        src + (r < valid ? r * SRC_ROW + cc * 8 : 0), r < valid ? 16 : 0);
        }
    }
}

"""

# the pieces the TMA kernel (attention_tma_cuda.py) shares: the shared tiles' layout constants, the
# P V product, the products of one tile (S cleared, both issued, S waited for), O rescaled and P
# packed once P V retired, the last P V
WG_CONSTANTS = f"""    constexpr unsigned ATOM = {ATOM_BYTES}, ROW_BYTES = {ROW_BYTES};""" + r"""
    static_assert(MT == 1 && WARPS % 4 == 0, "one 64-row slab per warpgroup");
"""

PV_PRODUCT = r"""    unsigned p[BN / 16][4];                               // the previous tile's P, packed: the pending P V's A
    float rescale[MT][2];                                 // rows g and g + 8: O's factor to the new max
    // O += P V for tile `tile`: P's 16-bit pairs are the register A operand as they lie; V's rows
    // (keys) are k, its head dim (contiguous) n
    auto issue_pv = [&](int tile) {
        const $ELEM* vt = v_s + (tile % STAGES) * BN * D;
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            $WG_PV<1>(&o[0][0][0], p[kk], wgmma_desc(vt + kk * 16 * 64, BN * ROW_BYTES, ATOM));
    };

"""

S_CLEARED = r"""        const $ELEM* kt = k_s + (t % STAGES) * BN * D;
        const int k0 = key0 + t * BN;

        // S = Q Kᵀ: per 16 values of the head dim, this warpgroup's 64 Q rows by the tile's BN keys
        float s[MT][BN / 8][4];
        #pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.f;
        wgmma_hold<BN / 2>(&s[0][0][0]);
        wgmma_hold<D / 2>(&o[0][0][0]);
"""

PRODUCTS_ISSUED = r"""        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            $WG_S<0, 0>(&s[0][0][0],
                wgmma_desc(q_s + (kk / 4) * BM * 64 + warpgroup * 64 * 64 + (kk % 4) * 16, 16, ATOM),
                wgmma_desc(kt + (kk / 4) * BN * 64 + (kk % 4) * 16, 16, ATOM));
        wgmma_commit();
        if (t > 0) issue_pv(t - 1);
        wgmma_commit();                                   // (empty on the first tile)
"""

S_WAITED = r"""        wgmma_hold<D / 2>(&o[0][0][0]);                   // no copy of O or S is taken while they are written
        wgmma_hold<BN / 2>(&s[0][0][0]);
        wgmma_wait<1>();                                  // S is in; P V may still run
        wgmma_hold<BN / 2>(&s[0][0][0]);

"""

TILE_PRODUCTS = S_CLEARED + PRODUCTS_ISSUED + S_WAITED

PV_RETIRED = r"""        wgmma_wait<0>();                                  // tile t - 1's P V has retired: O and P are free
"""

RESCALE_AND_PACK = r"""        wgmma_hold<D / 2>(&o[0][0][0]);
        wgmma_hold<BN / 4>(&p[0][0]);
        #pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[0][n][0] *= rescale[0][0]; o[0][n][1] *= rescale[0][0];
            o[0][n][2] *= rescale[0][1]; o[0][n][3] *= rescale[0][1];
        }
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            p[kk][0] = $PACK(s[0][2 * kk][0], s[0][2 * kk][1]);
            p[kk][1] = $PACK(s[0][2 * kk][2], s[0][2 * kk][3]);
            p[kk][2] = $PACK(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
            p[kk][3] = $PACK(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
        }
    }
"""

LAST_PV = r"""    // the last tile's P V
    wgmma_hold<D / 2>(&o[0][0][0]);
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0][0]);
    wgmma_hold<BN / 4>(&p[0][0]);

"""

KERNEL = TILE_LOADER + SIGNATURE + CONSTANTS + WG_CONSTANTS + r"""    static_assert(STAGES >= 3, "tile t - 1's V is read while tile t + STAGES - 2 loads");

    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char fa_smem[];
    $ELEM* const q_s = ($ELEM*)(fa_smem + ((ATOM - (smem_addr(fa_smem) & (ATOM - 1))) & (ATOM - 1)));  // [D/64][BM][64]
    $ELEM* const k_s = q_s + BM * D;                      // [STAGES][D/64][BN][64]
    $ELEM* const v_s = k_s + STAGES * BN * D;             // [STAGES][D/64][BN][64]

""" + BLOCK_INDEX + r"""    const int warpgroup = tid >> 7;

    fa_load_wg_tile<BM, D, THREADS, Q_ROW>(q_s, q + q_off + (long long)q0 * Q_ROW, SQ - q0, tid);
    cp_async_commit();
    #pragma unroll
    for (int t = 0; t < STAGES - 2; ++t) {
        if (t < n_tiles) {
            fa_load_wg_tile<BN, D, THREADS, K_ROW>(k_s + t * BN * D, kp + (long long)t * BN * K_ROW,
                                                   SK - key0 - t * BN, tid);
            fa_load_wg_tile<BN, D, THREADS, V_ROW>(v_s + t * BN * D, vp + (long long)t * BN * V_ROW,
                                                   SK - key0 - t * BN, tid);
        }
        cp_async_commit();
    }

""" + RUNNING_STATE + PV_PRODUCT + r"""    // Per tile t: S_t = Q K_t and, behind it, tile t - 1's O += P V are issued together; the
    // softmax of S_t runs while P V is still on the tensor cores, and O is rescaled once it retires.
    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<STAGES - 3>();                      // Q and tile t have landed
        fence_proxy_async();                              // where the tensor cores read them
        __syncthreads();                                  // for every thread; and tile t - 2 is retired everywhere
        const int next = t + STAGES - 2;                  // into the stage tile t - 2 held
        if (next < n_tiles) {
            const int st = next % STAGES;
            fa_load_wg_tile<BN, D, THREADS, K_ROW>(k_s + st * BN * D, kp + (long long)next * BN * K_ROW,
                                                   SK - key0 - next * BN, tid);
            fa_load_wg_tile<BN, D, THREADS, V_ROW>(v_s + st * BN * D, vp + (long long)next * BN * V_ROW,
                                                   SK - key0 - next * BN, tid);
        }
        cp_async_commit();                                // an empty group keeps the wait count uniform
""" + TILE_PRODUCTS + ONLINE_SOFTMAX + PV_RETIRED + RESCALE_AND_PACK + LAST_PV + STORE_OUTPUT
