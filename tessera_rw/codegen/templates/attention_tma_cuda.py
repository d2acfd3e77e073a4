"""The Hopper FlashAttention forward kernel with a producer warpgroup and TMA loads (sm_90a).

The consumer warpgroups (64 query rows each) compute exactly as the wgmma kernel's do
(attention_wgmma_cuda.py: the same swizzled shared tiles, descriptors, products and online
softmax); what differs is who loads and how the stages are handed over. One more warpgroup, after
the consumers, is the producer: its first thread copies Q once and each K/V tile with TMA copies
(64-value column blocks of the head dim, the tensor map writing them in the 128-byte swizzled
layout wgmma reads), and no consumer thread spends an instruction on addresses or copies, nor waits
at a block-wide barrier: the warpgroups run apart.

Three kinds of mbarrier:
- q_full: Q's copies have landed (once);
- full[s]: a stage's K and V tiles have landed; the producer arrives on it expecting their bytes;
- empty[s]: every consumer warp is done with a stage: it arrives once the P V reading the stage's V
  has retired (`wgmma_wait<0>` in the next tile's step; the stage's K was read by a product that
  retired before). The producer waits on it before refilling the stage.
The parity waited for is the phase's: round t / STAGES of stage t % STAGES.

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


def tma_head_dim(d: int) -> bool:
    """Whether the head dim splits into whole 64-value column blocks, the boxes the copies move."""
    return d % BOX_COLUMNS == 0


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
    mbarrier for Q and two per stage."""
    return (s.bm + 2 * s.stages * s.bn) * shape.d * ELEMENT_BYTES + ATOM_BYTES + (2 * s.stages + 1) * MBARRIER_BYTES


def emit_tma_kernel(op: KernelOp, shape: AttentionShape, s: WarpgroupAttentionSchedule, smem: int) -> KernelSource:
    """The producer kernel for `op` under schedule `s` (`smem` bytes of dynamic shared memory)."""
    return fill_kernel(kernel_text(s.pingpong), op, shape, s, smem, target=HOPPER_TARGET,
                       tensor_maps=tensor_maps(op, shape, s), suffix="_tma" + "_pingpong" * s.pingpong,
                       LAUNCH_BOUNDS=f"{s.threads}, 1", WG_S=wgmma_name(s.bn, shape.kind),
                       WG_PV=wgmma_rs_name(shape.d, shape.kind), PRODUCER_REGISTERS=register_split(s.consumers, "dec", 8),
                       CONSUMER_REGISTERS=register_split(s.consumers, "inc", 4),
                       RESCALE_O="rescale[m][h] = corr;                 // once the pending P V retires")


KERNEL = SIGNATURE + CONSTANTS + WG_CONSTANTS + r"""    constexpr int CONSUMERS = WARPS / 4, BOX = ROW_BYTES / sizeof($ELEM);
    constexpr unsigned Q_BYTES = BM * D * sizeof($ELEM), STAGE_BYTES = 2 * BN * D * sizeof($ELEM);

    // tiles start on 1024-byte atoms: the swizzle is a function of the shared address
    extern __shared__ __align__(16) unsigned char fa_smem[];
    $ELEM* const q_s = ($ELEM*)(fa_smem + ((ATOM - (smem_addr(fa_smem) & (ATOM - 1))) & (ATOM - 1)));  // [D/64][BM][64]
    $ELEM* const k_s = q_s + BM * D;                      // [STAGES][D/64][BN][64]
    $ELEM* const v_s = k_s + STAGES * BN * D;             // [STAGES][D/64][BN][64]
    unsigned long long* const full = (unsigned long long*)(v_s + STAGES * BN * D);   // a stage's K and V have landed
    unsigned long long* const empty = full + STAGES;      // every consumer warp is done with a stage
    unsigned long long* const q_full = empty + STAGES;    // Q has landed

""" + BLOCK_INDEX + r"""    const int warpgroup = tid >> 7;
    if (tid == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(&full[st], 1);
            mbar_init(&empty[st], 4 * CONSUMERS);
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
            mbar_arrive_expect_tx(q_full, Q_BYTES);
            for (int c = 0; c < D / BOX; ++c) tma_load_3d(q_s + c * BM * BOX, &tma_q, c * BOX, q0, q_mat, q_full);
            for (int t = 0; t < n_tiles; ++t) {
                const int st = t % STAGES;
                if (t >= STAGES) mbar_wait(&empty[st], (t / STAGES - 1) & 1);   // tile t - STAGES's P V retired
                mbar_arrive_expect_tx(&full[st], STAGE_BYTES);
                for (int c = 0; c < D / BOX; ++c) {
                    tma_load_3d(k_s + st * BN * D + c * BN * BOX, &tma_k, c * BOX, t * BN, k_mat, &full[st]);
                    tma_load_3d(v_s + st * BN * D + c * BN * BOX, &tma_v, c * BOX, t * BN, v_mat, &full[st]);
                }
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
        mbar_wait(&full[t % STAGES], (t / STAGES) & 1);   // tile t has landed
"""

RELEASE = r"""        if (t > 0 && lane == 0) mbar_arrive(&empty[(t - 1) % STAGES]);   // tile t - 1's stage is free
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
    return (KERNEL + first + LOOP + S_CLEARED + take + PRODUCTS_ISSUED + give + S_WAITED + ONLINE_SOFTMAX
            + PV_RETIRED + RELEASE + RESCALE_AND_PACK + LAST_PV + STORE_OUTPUT[:closing] + last
            + STORE_OUTPUT[closing:])
