"""The attention ops of emulated_ops.EMULATED: the forward (mma.sync and, on sm_90, wgmma head dims),
the forward writing its logsumexps, and the backward's kernels (row statistics, the gradients, and
under `fast` the form that sums dQ with atomics), at emulator sizes, ragged, causal and masked."""

from __future__ import annotations

from dataclasses import replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention import with_lse
from tessera_rw.codegen.templates.attention_backward_problem import packed_qkv_backward
from tessera_rw.codegen.templates.attention_problem import packed_qkv_attention, packed_qkv_lse
from tessera_rw.codegen.templates.attention_backward import AttentionRowStatsTemplate, FlashAttentionBwdTemplate
from tessera_rw.codegen.templates.attention_stats import AttentionStatsFromLseTemplate
from tests.codegen.ragged_ops import of

BF16, F16, BOOL = DType.bfloat16, DType.float16, DType.bool


def attention(b, hq, hkv, s, d, dtype, causal=False, mask=None, mask_batch=(), window=0) -> KernelOp:
    q, kv = TensorType((b, hq, s, d), dtype), TensorType((b, hkv, s, d), dtype)
    extra = (TensorType(mask_batch + (s, s), mask),) if mask else ()
    return of("flash_attention", q, kv, kv, *extra, scale=d ** -0.5, causal=causal, has_mask=mask is not None,
              window=window)


def windowed(op: KernelOp, window: int) -> KernelOp:
    """A causal attention `op` (dense or strided) narrowed to a sliding window of `window` keys."""
    return of(op.op, *op.operands, **(dict(op.attr_map) | {"window": window}))



def with_mask(op: KernelOp, shape: tuple[int, ...]) -> KernelOp:
    """A strided_attention `op` with a bool mask of `shape` as its fourth operand."""
    return of("strided_attention", *op.operands, TensorType(shape, BOOL), **(dict(op.attr_map) | {"has_mask": True}))


def dq_moved(op: KernelOp) -> KernelOp:
    """A packed strided_attention_bwd `op` (q, k, v of [b, h, s, d]) writing dQ with the heads side
    by side within its run, dK and dV as they are."""
    b, h, s, d = op.attr_map["shapes"][:4]
    n = b * h * s * d
    writes = dict(shape=(3 * n,), out_strides=(s * h * d, d, h * d, 1, h * s * d, s * d, d, 1, h * s * d, s * d, d, 1),
                  out_offsets=(0, n, 2 * n))
    return of(op.op, *op.operands, **(dict(op.attr_map) | writes))


def masked_backward(op: KernelOp) -> KernelOp:
    """A strided_attention_bwd `op` with a bool mask per batch item as its sixth operand."""
    batch, seq = op.operands[0].shape[0], op.operands[0].shape[1]
    mask = TensorType((batch, 1, seq, seq), BOOL)
    return of(op.op, *op.operands, mask, **(dict(op.attr_map) | {"has_mask": True}))


def _attention_ops() -> dict[str, KernelOp]:
    rows, bwd = AttentionRowStatsTemplate(), FlashAttentionBwdTemplate()
    ops = {
        "attention S=256 D=64 bf16": attention(1, 2, 2, 256, 64, BF16),
        "attention S=192 D=128 causal bf16": attention(1, 2, 2, 192, 128, BF16, causal=True),
        "attention f16 float mask per batch": attention(2, 2, 2, 128, 64, F16, mask=F16, mask_batch=(2, 1)),
        "attention GQA 4/2 heads D=128 bf16": attention(1, 4, 2, 128, 128, BF16),
        "attention S=16 D=128 bool mask f16": attention(1, 2, 2, 16, 128, F16, mask=BOOL),
        # head dims beyond 64 and 128: 96 and 32 swizzle within groups of 4 chunks, 80 of 2; 256
        # runs on sm_90's wgmma kernel alone, over 32-key tiles
        "attention S=130 D=96 causal bf16": attention(1, 2, 2, 130, 96, BF16, causal=True),
        "attention S=70 D=80 f16 mask": attention(1, 2, 2, 70, 80, F16, mask=F16),
        "attention GQA 4/2 heads S=100 D=32 bf16": attention(1, 4, 2, 100, 32, BF16),
        "attention S=150 D=256 causal bf16": attention(1, 2, 2, 150, 256, BF16, causal=True),
        "attention S=40 D=256 bool mask f16": attention(1, 2, 2, 40, 256, F16, mask=BOOL),
        # sliding windows: the walk starts at the first key block a query block's band meets
        "attention S=300 D=64 window 100 bf16": attention(1, 2, 2, 300, 64, BF16, causal=True, window=100),
        "attention S=200 D=128 window 1 f16": attention(1, 1, 1, 200, 128, F16, causal=True, window=1),
        "attention S=170 D=64 window 70 bool mask f16": attention(1, 2, 2, 170, 64, F16, causal=True, mask=BOOL,
                                                                  window=70),
        "attention S=260 D=256 window 90 bf16": attention(1, 2, 2, 260, 256, BF16, causal=True, window=90),
        "attention packed qkv S=200 D=128 window 64 bf16": windowed(
            packed_qkv_attention(1, 2, 200, 128, BF16, causal=True), 64),
    }
    # q, k and v read where a fused projection wrote them, O written with the heads side by side
    ops |= {
        "attention packed qkv S=128 D=64 causal bf16": packed_qkv_attention(2, 2, 128, 64, BF16, causal=True),
        "attention packed qkv GQA 4/2 heads S=100 D=128 f16": packed_qkv_attention(1, 4, 100, 128, F16, kv_heads=2),
        "attention packed qkv S=70 D=256 causal bf16": packed_qkv_attention(1, 2, 70, 256, BF16, causal=True),
        "attention packed qkv bool mask f16": with_mask(packed_qkv_attention(2, 2, 48, 64, F16), (2, 1, 48, 48)),
    }
    for name, template in (("row stats", rows), ("backward", bwd)):
        ops |= {
            f"attention {name} S=128 D=64 bf16": template.sample(1, 2, 128, 64, BF16, False),
            f"attention {name} S=128 D=128 causal bf16": template.sample(1, 1, 128, 128, BF16, True),
            f"attention {name} S=200 D=64 causal f16": template.sample(1, 2, 200, 64, F16, True),
            f"attention {name} S=72 D=128 f16": template.sample(1, 1, 72, 128, F16, False),
            f"attention {name} bool mask per batch": template.sample(2, 2, 128, 64, BF16, False,
                                                                    mask=TensorType((2, 1, 128, 128), BOOL)),
            f"attention {name} f16 mask causal ragged": template.sample(1, 1, 100, 128, F16, True,
                                                                       mask=TensorType((100, 100), F16)),
        }
    # sliding windows in the backward: key blocks stop at the last query their band reaches, query
    # blocks start at the first key block theirs meets
    ops |= {
        "attention row stats S=200 D=64 window 50 f16": windowed(rows.sample(1, 2, 200, 64, F16, True), 50),
        "attention backward S=200 D=64 window 50 f16": windowed(bwd.sample(1, 2, 200, 64, F16, True), 50),
        "attention backward S=192 D=128 window 17 bf16": windowed(bwd.sample(1, 1, 192, 128, BF16, True), 17),
        "attention backward bool mask window 40": windowed(bwd.sample(2, 1, 160, 64, BF16, True,
                                                                      mask=TensorType((2, 1, 160, 160), BOOL)), 40),
        "attention backward fast S=230 D=64 window 70 f16": replace(
            windowed(bwd.sample(1, 2, 230, 64, F16, True), 70), numerics=Numerics.FAST),
        "attention lse S=210 D=128 window 60 bf16": with_lse(attention(1, 2, 2, 210, 128, BF16, causal=True,
                                                                      window=60)),
        "attention backward packed qkv S=150 D=64 window 33 bf16": windowed(
            packed_qkv_backward(1, 2, 150, 64, BF16, causal=True), 33),
    }
    # the forward that also writes each row's logsumexp (for the backward's row statistics)
    ops |= {
        "attention lse S=130 D=64 causal bf16": with_lse(attention(1, 2, 2, 130, 64, BF16, causal=True)),
        "attention lse GQA 4/2 heads D=128 f16 bool mask": with_lse(attention(1, 4, 2, 100, 128, F16, mask=BOOL)),
        "attention lse S=150 D=256 causal bf16": with_lse(attention(1, 2, 2, 150, 256, BF16, causal=True)),
        "attention row stats from lse D=64 bf16": AttentionStatsFromLseTemplate.sample((2, 3, 77, 64), BF16),
        "attention row stats from lse D=96 f16": AttentionStatsFromLseTemplate.sample((5, 33, 96), F16),
    }
    # a training step's: q, k, v read where one projection holds them, dO with the heads side by side,
    # dQ, dK and dV written as that projection's gradient
    ops |= {
        "attention lse packed qkv S=130 D=64 causal bf16": packed_qkv_lse(1, 2, 130, 64, BF16, causal=True),
        "attention lse packed qkv S=96 D=128 f16 O dense": packed_qkv_lse(2, 2, 96, 128, F16, merged=False),
        "attention row stats from lse merged heads D=64 bf16":
            AttentionStatsFromLseTemplate.sample((2, 3, 77, 64), BF16, merged=True),
        "attention backward packed qkv S=128 D=64 causal bf16": packed_qkv_backward(1, 2, 128, 64, BF16, causal=True),
        "attention backward packed qkv S=72 D=128 f16 gradients packed": packed_qkv_backward(2, 2, 72, 128, F16,
                                                                                           written=False),
        "attention backward packed qkv GQA 4/2 heads S=90 D=64 causal bf16":
            packed_qkv_backward(1, 4, 90, 64, BF16, causal=True, written=False, kv_heads=2),
        "attention backward packed qkv dQ heads side by side f16":
            dq_moved(packed_qkv_backward(2, 2, 70, 64, F16, causal=True, written=False)),
        "attention backward packed qkv bool mask per batch bf16":
            masked_backward(packed_qkv_backward(2, 2, 80, 64, BF16)),
        "attention backward fast packed qkv S=100 D=64 causal f16":
            replace(packed_qkv_backward(1, 2, 100, 64, F16, causal=True), numerics=Numerics.FAST),
    }
    # under `fast` the backward's defaults add the form whose key blocks sum dQ (dq="atomic")
    ops |= {
        f"attention backward fast {name}": replace(op, numerics=Numerics.FAST) for name, op in (
            ("S=128 D=64 bf16", bwd.sample(1, 2, 128, 64, BF16, False)),
            ("S=200 D=64 causal f16", bwd.sample(1, 2, 200, 64, F16, True)),
            ("S=72 D=128 f16", bwd.sample(1, 1, 72, 128, F16, False)),
            ("f16 mask causal ragged", bwd.sample(1, 1, 100, 128, F16, True, mask=TensorType((100, 100), F16))))
    }
    return ops


ATTENTION_OPS = _attention_ops()
