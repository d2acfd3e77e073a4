"""The gradient of attention as transformers writes it in bf16: the scores upcast to float32 for the
softmax and the probabilities cast back (softmax(…, dtype=float32).to(dtype)), the mask filled with
finfo.min, added, or a float32 mask promoting the scores (LLaMA's). Reverse mode computes dS in
float32 and casts it back; the rules read that as the fused backward's dS, so the backward is
FlashAttention-2's three kernels, and its gradients are float64 numpy's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.ops.attention import causal_keep
from tests.attention_grads import float64_attention_grads

S, SCALE = 256, 0.125
FILL = float(ml_dtypes.finfo(ml_dtypes.bfloat16).min)


def upcast_softmax_attention(s, v):
    return op.cast(op.softmax(op.cast(s, "float32"), axis=-1), "bfloat16") @ v


def unmasked(q, k, v, w):
    return op.sum(upcast_softmax_attention(q @ k.mT * SCALE, v) * w)


def causal_fill(q, k, v, w):                  # where(tril, s, finfo.min)
    keep = op.tril(op.ones((S, S), dtype="bool"))
    return op.sum(upcast_softmax_attention(op.where(keep, q @ k.mT * SCALE, FILL), v) * w)


def additive_causal(q, k, v, w):              # s + triu(full(finfo.min), 1)
    mask = op.triu(op.full((S, S), FILL, dtype="bfloat16"), 1)
    return op.sum(upcast_softmax_attention(q @ k.mT * SCALE + mask, v) * w)


def float32_mask(q, k, v, w):                 # LLaMA's: a float32 finfo.min mask promotes the bf16 scores
    mask = op.triu(op.full((S, S), float(np.finfo(np.float32).min)), 1)[None, None]
    return op.sum(upcast_softmax_attention(q @ k.mT * SCALE + mask, v) * w)


def sliding_window(q, k, v, w):               # Mistral's band of the last 64 keys
    ones = op.ones((S, S), dtype="bool")
    keep = op.tril(ones) & ~op.tril(ones, -64)
    return op.sum(upcast_softmax_attention(op.where(keep, q @ k.mT * SCALE, FILL), v) * w)


KEEP = {unmasked: None, causal_fill: causal_keep(S, S), additive_causal: causal_keep(S, S),
        float32_mask: causal_keep(S, S), sliding_window: causal_keep(S, S, 64)}


@pytest.mark.parametrize("loss", list(KEEP), ids=lambda f: f.__name__)
def test_the_backward_is_flash_attentions_and_matches_float64(loss):
    shape = (1, 2, S, 64)
    grad = op.grad(loss, argnums=(0, 1, 2))
    steps = [s.op for s in grad.program(*(op.tensor(shape, "bf16") for _ in range(4))).plan.steps]
    assert steps == ["flash_attention_lse", "attention_row_stats_from_lse", "flash_attention_bwd"], steps
    rng = np.random.default_rng(5)
    q, k, v, w = (rng.standard_normal(shape).astype(ml_dtypes.bfloat16) for _ in range(4))
    for got, want in zip(grad(q, k, v, w), float64_attention_grads(q, k, v, w, SCALE, KEEP[loss])):
        assert got.dtype == ml_dtypes.bfloat16
        assert np.max(np.abs(got.astype(np.float64) - want)) < 2e-2 * (np.sqrt(np.mean(want ** 2)) + np.abs(want).max())


def repeat_kv(x, groups: int):                # transformers' repeat_kv
    b, h, seq, d = x.shape
    spread = op.broadcast_to(op.reshape(x, (b, h, 1, seq, d)), (b, h, groups, seq, d))
    return op.reshape(spread, (b, h * groups, seq, d))


def llama_attention(q, k, v, w):
    mask = op.triu(op.full((S, S), float(np.finfo(np.float32).min)), 1)[None, None]
    return op.sum(upcast_softmax_attention(q @ repeat_kv(k, 4).mT * SCALE + mask, repeat_kv(v, 4)) * w)


def test_llamas_attention_trains_causal_on_the_fused_backward_storing_nothing_quadratic():
    q, kv = op.tensor((2, 8, S, 64), "bf16"), op.tensor((2, 2, S, 64), "bf16")
    program = op.grad(llama_attention, argnums=(0, 1, 2)).program(q, kv, kv, q)
    attention = [s for s in program.plan.steps if "attention" in s.op]
    # K and V read as their own heads, through views (the GQA rules undo repeat_kv)
    assert [s.op for s in attention] == ["strided_attention_lse", "attention_row_stats_from_lse",
                                         "strided_attention_bwd"], [s.op for s in program.plan.steps]
    assert attention[0].node.attr_map["causal"] and not attention[0].node.attr_map["has_mask"]
    assert max(b.nbytes for b in program.plan.buffers) < 2 * 8 * S * S * 2
