"""The Hopper FlashAttention forward kernel with a producer warpgroup and TMA loads (sm_90a).

The consumer warpgroups (64 query rows each) compute exactly as the wgmma kernel's do
(attention_wgmma_cuda.py: the same swizzled shared tiles, descriptors, products and online
softmax); what differs is who loads and how the stages are handed over. One more warpgroup, after
the consumers, is the producer: its first thread copies Q once and each K/V tile with TMA copies
(64-value column blocks of the head dim, the tensor map writing them in the 128-byte swizzled
layout wgmma reads), and no consumer thread spends an instruction on addresses or copies, nor waits
at a block-wide barrier: the warpgroups run apart.

The block is two consumer warpgroups and the producer; the producer warpgroup hands most of its
registers to the consumers (setmaxnreg, warp_specialization.py). The mbarriers:
- q_full: Q's copies have landed (once);
- full_k[s], full_v[s]: a stage's K tile, or its V tile, has landed; the producer arrives on it
  expecting the tile's bytes;
- empty_k[s]: every consumer warp's S = Q Kᵀ reading the stage's K has retired (`wgmma_wait<1>`
  in the same step); empty_v[s]: every consumer warp's P V reading the stage's V has retired
  (`wgmma_wait<0>` in the next step). The producer waits on them before refilling the stage.
The parity waited for is the phase's: round t / STAGES of stage t % STAGES. K runs a tile ahead of
V (K_{t+1} is copied before V_t, as S_{t+1} is issued beside tile t's P V) and each is handed back as
soon as its product retires, so two stages already load ahead.

Each operand's map is 3-d, (head dim, rows, matrices), so the copies past a head's last row read
zeros, not the next head's rows; a block finds its matrices from the broadcast offsets every
forward kernel computes.

>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
>>> from tessera_rw.codegen.templates.attention_problem import AttentionShape, WarpgroupAttentionSchedule
>>> op = FlashAttentionTemplate().samples()[0]
>>> s = WarpgroupAttentionSchedule(bm=128, bn=64, warps=8, stages=4, producer=True)
>>> [m.dims for m in tensor_maps(op, AttentionShape.of(op), s)]
[(64, 4096, 64), (64, 4096, 64), (64, 4096, 64)]
>>> emit_tma_kernel(op, AttentionShape.of(op), s, smem_bytes(AttentionShape.of(op), s)).name
'flash_attention_wg_bf16_d64_bm128_bn64_w8_s4_tma'
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.prelude import ATOM_BYTES, HOPPER_TARGET, ROW_BYTES, wgmma_name, wgmma_rs_name
from tessera_rw.codegen.tensor_map import TensorMapSpec
from tessera_rw.codegen.templates.attention_cuda import (BLOCK_INDEX, CONSTANTS, ONLINE_SOFTMAX, RUNNING_STATE,
                                                       SIGNATURE, STORE_OUTPUT, fill_kernel)
from tessera_rw.codegen.templates.attention_wgmma_cuda import (LAST_PV, PRODUCTS_ISSUED, PV_PRODUCT, PV_RETIRED,
                                                             RESCALE_AND_PACK, S_CLEARED, S_WAITED, WG_CONSTANTS)
from tessera_rw.codegen.templates.warp_specialization import register_split

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.attention_problem import AttentionShape, WarpgroupAttentionSchedule

MBARRIER_BYTES = 8
ELEMENT_BYTES = 2            # bf16 / fp16 operands
BOX_COLUMNS = ROW_BYTES // ELEMENT_BYTES     # head-dim values per swizzled box row


def tensor_maps(op: KernelOp, shape: AttentionShape, s: WarpgroupAttentionSchedule) -> tuple[TensorMapSpec, ...]:
    """Q's, K's and V's maps, in parameter order: (head dim, rows, matrices), a box of one column
    block of a block's query rows or of a key tile's rows."""
    maps = []
    for operand, rows, box_rows in ((0, shape.sq, s.bm), (1, shape.sk, s.bn), (2, shape.sk, s.bn)):
        matrices = math.prod(op.operands[operand].shape[:-2])
        maps.append(TensorMapSpec(operand, ELEMENT_BYTES, (shape.d, rows, matrices),
                                  (shape.d * ELEMENT_BYTES, rows * shape.d * ELEMENT_BYTES), (BOX_COLUMNS, box_rows, 1)))
    return tuple(maps)


def smem_bytes(shape: AttentionShape, s: WarpgroupAttentionSchedule) -> int:
    """Dynamic shared memory: Q's tile and the K/V stages, room to align them to an atom, and an
    mbarrier for Q and four per stage (K's and V's, full and empty)."""
    return (s.bm + 2 * s.stages * s.bn) * shape.d * ELEMENT_BYTES + ATOM_BYTES + (4 * s.stages + 1) * MBARRIER_BYTES


def emit_tma_kernel(op: KernelOp, shape: AttentionShape, s: WarpgroupAttentionSchedule, smem: int) -> KernelSource:
    """The producer kernel for `op` under schedule `s` (`smem` bytes of dynamic shared memory)."""
    return fill_kernel(kernel_text(s.pingpong), op, shape, s, smem, target=HOPPER_TARGET,
                       tensor_maps=tensor_maps(op, shape, s), suffix="_tma" + "_pingpong" * s.pingpong,
                       LAUNCH_BOUNDS=f"{s.threads}, 1", WG_S=wgmma_name(s.bn, shape.kind),
                       WG_PV=wgmma_rs_name(shape.d, shape.kind), PRODUCER_REGISTERS=register_split(s.consumers, "dec", 8),
                       CONSUMER_REGISTERS=register_split(s.consumers, "inc", 4),
                       RESCALE_O="rescale[m][h] = corr;                 // once the pending P V retires")


KERNEL = SIGNATURE + CONSTANTS + WG_CONSTANTS + r"""    constexpr int CONSUMERS = WARPS / 4, BOX = ROW_BYTES / sizeof($ELEM);
    constexpr unsigned Q_BYTES = BM * D * sizeof($ELEM), TILE_BYTES = BN * D * sizeof($ELEM);

    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char fa_smem[];
    $ELEM* const q_s = ($ELEM*)(fa_smem + ((ATOM - (smem_addr(fa_smem) & (ATOM - 1))) & (ATOM - 1)));  // [D/64][BM][64]
    $ELEM* const k_s = q_s + BM * D;                      // [STAGES][D/64][BN][64]
    $ELEM* const v_s = k_s + STAGES * BN * D;             // [STAGES][D/64][BN][64]
    unsigned long long* const full_k = (unsigned long long*)(v_s + STAGES * BN * D);   // a stage's K has landed
    unsigned long long* const empty_k = full_k + STAGES;  // every consumer warp's S = Q K of it has retired
    unsigned long long* const full_v = empty_k + STAGES;  // a stage's V has landed
    unsigned long long* const empty_v = full_v + STAGES;  // every consumer warp's P V of it has retired
    unsigned long long* const q_full = empty_v + STAGES;  // Q has landed

""" + BLOCK_INDEX + r"""    const int warpgroup = tid >> 7;
    if (tid == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(&full_k[st], 1);
            mbar_init(&empty_k[st], 4 * CONSUMERS);
            mbar_init(&full_v[st], 1);
            mbar_init(&empty_v[st], 4 * CONSUMERS);
        }
        mbar_init(q_full, 1);
        fence_mbarrier_init();
    }
    __syncthreads();

    if (warpgroup == CONSUMERS) {     // the producer warpgroup: its first thread issues every copy
$PRODUCER_REGISTERS
        if (tid == CONSUMERS * 128) {
            // the matrices of this (batch, head) in each operand's map
            const int q_mat = (int)(q_off / (SQ * D)), k_mat = (int)(k_off / (SK * D)), v_mat = (int)(v_off / (SK * D));
            // tile t of K or V into its stage, once the products that read the stage's last tile retired
            auto load = [&](int t, $ELEM* tiles, const TmaMap* map, int mat, unsigned long long* full,
                            unsigned long long* empty) {
                const int st = t % STAGES;
                if (t >= STAGES) mbar_wait(&empty[st], (t / STAGES - 1) & 1);
                mbar_arrive_expect_tx(&full[st], TILE_BYTES);
                for (int c = 0; c < D / BOX; ++c)
                    tma_load_3d(tiles + st * BN * D + c * BN * BOX, map, c * BOX, key0 + t * BN, mat, &full[st]);
            };
            mbar_arrive_expect_tx(q_full, Q_BYTES);
            for (int c = 0; c < D / BOX; ++c) tma_load_3d(q_s + c * BM * BOX, &tma_q, c * BOX, q0, q_mat, q_full);
            // K runs a tile ahead of V: S_{t+1} = Q K_{t+1} is issued beside tile t's P V
            load(0, k_s, &tma_k, k_mat, full_k, empty_k);
            for (int t = 0; t < n_tiles; ++t) {
                if (t + 1 < n_tiles) load(t + 1, k_s, &tma_k, k_mat, full_k, empty_k);
                load(t, v_s, &tma_v, v_mat, full_v, empty_v);
            }
        }
        return;
    }
$CONSUMER_REGISTERS
    __syncwarp();          // each warp whole again past the producer's branch, so ptxas keeps the wgmmas async

""" + RUNNING_STATE + PV_PRODUCT + r"""    // Per tile t: S_t = Q K_t and, behind it, tile t - 1's O += P V are issued together; the
    // softmax of S_t runs while P V is still on the tensor cores, and O is rescaled once it retires.
    mbar_wait(q_full, 0);
"""

LOOP = r"""    for (int t = 0; t < n_tiles; ++t) {
        mbar_wait(&full_k[t % STAGES], (t / STAGES) & 1); // K of tile t has landed
        if (t > 0) mbar_wait(&full_v[(t - 1) % STAGES], ((t - 1) / STAGES) & 1);   // and V of tile t - 1
"""

K_RELEASE = r"""        if (lane == 0) mbar_arrive(&empty_k[t % STAGES]);  // S_t has retired: K of tile t is free
"""

V_RELEASE = r"""        if (t > 0 && lane == 0) mbar_arrive(&empty_v[(t - 1) % STAGES]);   // V of tile t - 1 is free
"""

# the last tile's P V, once its V has landed
LAST_V = r"""    mbar_wait(&full_v[(n_tiles - 1) % STAGES], ((n_tiles - 1) / STAGES) & 1);
"""

# pingpong: the two consumers take turns issuing their products (named barriers 1 and 2 of 256
# threads, one warpgroup syncing, the other arriving), so one's softmax runs under the other's MMAs.
# The second warpgroup's first arrival lets the first go first; the first warpgroup's last sync takes
# the second's last arrival, after every wgmma (a turn given conditionally in the loop would make
# ptxas serialize the wgmmas).
FIRST_TURN = r"""    if (warpgroup == 1) named_barrier_arrive(1, 256);     // the first warpgroup issues first
"""
TAKE_TURN = r"""        named_barrier_sync(1 + warpgroup, 256);           // this warpgroup's turn at the tensor cores
"""
GIVE_TURN = r"""        named_barrier_arrive(2 - warpgroup, 256);         // the other's turn
"""
LAST_TURN = r"""    if (warpgroup == 0) named_barrier_sync(1, 256);       // the second's last turn given, taken
"""


def kernel_text(pingpong: bool) -> str:
    """The kernel's text, its consumers taking turns at the tensor cores or not."""
    first, take, give, last = (FIRST_TURN, TAKE_TURN, GIVE_TURN, LAST_TURN) if pingpong else ("",) * 4
    closing = STORE_OUTPUT.rindex("}")                    # the kernel's closing brace
    return (KERNEL + first + LOOP + S_CLEARED + take + PRODUCTS_ISSUED + give + S_WAITED + K_RELEASE
            + ONLINE_SOFTMAX + PV_RETIRED + V_RELEASE + RESCALE_AND_PACK + LAST_V + LAST_PV
            + STORE_OUTPUT[:closing] + last + STORE_OUTPUT[closing:])
