"""Differently written attention programs all reach one flash_attention node, and it computes the same."""

import math

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.rules.choice import smallest_choice
from tessera_rw.rules.library import ALGEBRA, ATTENTION
from tessera_rw.rules.saturate import rewrite

D = 16


def plain(q, k, v): return op.softmax((q @ k.mT) * D ** -0.5, axis=-1) @ v
def scale_first(q, k, v): return op.softmax((q * D ** -0.5) @ k.mT, axis=-1) @ v
def scale_on_k(q, k, v): return op.softmax(q @ (k.mT * D ** -0.5), axis=-1) @ v
def scale_left(q, k, v): return op.softmax(D ** -0.5 * (q @ k.mT), axis=-1) @ v
def divided(q, k, v): return op.softmax(q @ k.mT / math.sqrt(D), axis=-1) @ v
def transposed_k(q, k, v): return op.softmax(q @ op.transpose(k, (0, 1, 3, 2)) * 0.25, axis=-1) @ v
def swapaxes_k(q, k, v): return op.softmax(q @ op.swapaxes(k, -2, -1) * 0.25, axis=-1) @ v


def explicit_softmax(q, k, v):
    s = (q @ k.mT) * 0.25
    e = op.exp(s - op.max(s, axis=-1, keepdims=True))
    return (e / op.sum(e, axis=-1, keepdims=True)) @ v


def additive_mask(q, k, v, mask): return op.softmax(q @ k.mT * 0.25 + mask, axis=-1) @ v
def where_mask(q, k, v, keep): return op.softmax(op.where(keep, q @ k.mT * 0.25, -math.inf), axis=-1) @ v


def causal(q, k, v):
    seq = q.shape[-2]
    keep = op.tril(op.ones((seq, seq), "bool"))
    return op.softmax(op.where(keep, q @ k.mT / math.sqrt(D), -math.inf), axis=-1) @ v


def causal_with_fill(fill):
    def causal_filled(q, k, v):
        seq = q.shape[-2]
        keep = op.tril(op.ones((seq, seq), "bool"))
        return op.softmax(op.where(keep, q @ k.mT * 0.25, fill), axis=-1) @ v
    return causal_filled


CAUSAL_FILLS = {"causal-minus-1e9": -1e9, "causal-minus-1e4": -1e4,
                "causal-finfo-min": float(np.finfo(np.float32).min)}


# torch's masked_fill(drop, fill): the mask names the keys to drop
def masked_fill_inverted(q, k, v, keep): return op.softmax(op.where(~keep, -math.inf, q @ k.mT * 0.25), axis=-1) @ v


def masked_fill_triu(fill):
    def causal_dropped(q, k, v):
        seq = q.shape[-2]
        drop = op.triu(op.ones((seq, seq), "bool"), k=1)
        return op.softmax(op.where(drop, fill, q @ k.mT * 0.25), axis=-1) @ v
    return causal_dropped


def masked_fill_tril_eq_zero(q, k, v):       # nanoGPT: att.masked_fill(bias == 0, -inf), bias = tril(ones)
    seq = q.shape[-2]
    return op.softmax(op.where(op.tril(op.ones((seq, seq))) == 0, -math.inf, q @ k.mT * 0.25), axis=-1) @ v


# transformers' additive causal masks: 0 on and below the diagonal, a large negative fill above it
def additive_causal_where(fill):
    def additive_causal(q, k, v):
        seq = q.shape[-2]
        keep = op.tril(op.ones((seq, seq), "bool"))
        return op.softmax(q @ k.mT * 0.25 + op.where(keep, op.zeros((), q.dtype), op.full((), fill, q.dtype)),
                          axis=-1) @ v
    return additive_causal


def additive_causal_triu(q, k, v):
    seq = q.shape[-2]
    mask = op.triu(op.full((seq, seq), float(np.finfo(np.float32).min), q.dtype), 1)
    return op.softmax(q @ k.mT * 0.25 + mask, axis=-1) @ v


def upcast_before_scale(q, k, v):
    return op.cast(op.softmax(op.cast(q @ k.mT, "float32") * 0.25, axis=-1), "bf16") @ v


def upcast_before_mask(q, k, v, keep):
    s = op.where(keep, op.cast(q @ k.mT * 0.25, "float32"), -math.inf)
    return op.cast(op.softmax(s, axis=-1), "bf16") @ v


def upcast_float32_mask(q, k, v, mask):      # a float32 padding mask beside bf16 scores
    return op.cast(op.softmax(op.cast(q @ k.mT, "float32") * 0.25 + mask, axis=-1), "bf16") @ v


def upcast_scaled_float32_mask(q, k, v, mask):
    return op.cast(op.softmax(op.cast(q @ k.mT * 0.25, "float32") + mask, axis=-1), "bf16") @ v


def float32_mask_on_bf16_scores(q, k, v, mask):    # promoted by the add, cast back as transformers do
    return op.cast(op.softmax(q @ k.mT * 0.25 + mask, axis=-1), "bf16") @ v


def float32_mask_promotes_v(q, k, v, mask):        # probabilities kept float32: V promoted, a float32 result
    return op.softmax(q @ k.mT * 0.25 + mask, axis=-1) @ v


def float32_probabilities(q, k, v):
    return op.softmax(op.cast(q @ k.mT, "float32") * 0.25, axis=-1) @ v


def lifted_causal_where(q, k, v):               # HF's causal_mask[None, None]
    keep = op.tril(op.ones((S, S), dtype="bool"))[None, None]
    return op.softmax(op.where(keep, q @ k.mT * 0.25, -math.inf), axis=-1) @ v


def lifted_additive_causal(q, k, v):
    return op.softmax(q @ k.mT * 0.25 + op.triu(op.full((S, S), -math.inf), 1)[None, None, :, :], axis=-1) @ v


def nanogpt_buffer(q, k, v):                    # tril(ones(N, N)).view(1, 1, N, N)[:, :, :T, :T] == 0
    bias = op.reshape(op.tril(op.ones((4 * S, 4 * S))), (1, 1, 4 * S, 4 * S))
    return op.softmax(op.where(bias[:, :, :S, :S] == 0, -math.inf, q @ k.mT * 0.25), axis=-1) @ v


def cast_causal_mask(q, k, v):                  # Meta's LLaMA: triu(full(−∞), 1).type_as(h)
    mask = op.cast(op.triu(op.full((S, S), -math.inf), 1), "bfloat16")
    return op.cast(op.softmax(op.cast(q @ k.mT * 0.25 + mask, "float32"), axis=-1), "bfloat16") @ v


def sliding_window_finfo_min(q, k, v):          # HF's Mistral: a window filled with bf16's finfo.min
    ones = op.ones((S, S), dtype="bool")
    keep = op.tril(ones) & ~op.tril(ones, -3)
    scores = op.where(keep, q @ k.mT * 0.25, float(ml_dtypes.finfo(ml_dtypes.bfloat16).min))
    return op.cast(op.softmax(op.cast(scores, "float32"), axis=-1), "bfloat16") @ v


def pretransposed_k(q, kt, v): return op.softmax(q @ kt * 0.25, axis=-1) @ v


def permuted_bshd(q, k, v):  # inputs in (B, S, H, D), heads moved in front of the sequence
    qh, kh, vh = (op.transpose(x, (0, 2, 1, 3)) for x in (q, k, v))
    return op.softmax(qh @ op.transpose(k, (0, 2, 3, 1)) * 0.25, axis=-1) @ vh


def fp32_softmax(q, k, v):
    s = op.cast((q @ k.mT) * 0.25, "float32")
    return op.cast(op.softmax(s, axis=-1), "bf16") @ v


def expand(x, groups):
    b, h, seq, dim = x.shape
    return op.reshape(op.broadcast_to(op.reshape(x, (b, h, 1, seq, dim)), (b, h, groups, seq, dim)),
                      (b, h * groups, seq, dim))


def gqa(q, k, v):
    g = q.shape[1] // k.shape[1]
    return op.softmax(q @ expand(k, g).mT * 0.25, axis=-1) @ expand(v, g)


def bmm_3d(q, k, v): return op.softmax(q @ k.mT * 0.25, axis=-1) @ v


# the scale folded into Q's projection: the scores are the product alone
def unscaled(q, k, v): return op.softmax(q @ k.mT, axis=-1) @ v
def unscaled_additive_mask(q, k, v, mask): return op.softmax(q @ k.mT + mask, axis=-1) @ v
def unscaled_where_mask(q, k, v, keep): return op.softmax(op.where(keep, q @ k.mT, -math.inf), axis=-1) @ v


def unscaled_causal(q, k, v):
    seq = q.shape[-2]
    return op.softmax(op.where(op.tril(op.ones((seq, seq), "bool")), q @ k.mT, -math.inf), axis=-1) @ v


def unscaled_upcast(q, k, v): return op.cast(op.softmax(op.cast(q @ k.mT, "float32"), axis=-1), "bf16") @ v


RNG = np.random.default_rng(3)
B, H, S = 2, 3, 8


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


QKV = {"q": rand(B, H, S, D), "k": rand(B, H, S, D), "v": rand(B, H, S, D)}
FORMS = {
    "plain": (plain, QKV), "scale-first": (scale_first, QKV), "scale-on-k": (scale_on_k, QKV),
    "scale-left": (scale_left, QKV), "divided-by-sqrt-d": (divided, QKV), "transpose-k": (transposed_k, QKV),
    "swapaxes-k": (swapaxes_k, QKV), "explicit-softmax": (explicit_softmax, QKV),
    "additive-mask": (additive_mask, QKV | {"mask": rand(B, 1, 1, S)}),
    "where-mask": (where_mask, QKV | {"keep": RNG.random((1, 1, S, S)) > 0.2}),
    "causal": (causal, QKV),
    **{name: (causal_with_fill(fill), QKV) for name, fill in CAUSAL_FILLS.items()},
    "pre-transposed-k": (pretransposed_k, {"q": QKV["q"], "kt": rand(B, H, D, S), "v": QKV["v"]}),
    "permuted-bshd": (permuted_bshd, {n: rand(B, S, H, D) for n in "qkv"}),
    "fp32-softmax-bf16": (fp32_softmax, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}),
    "bmm-3d": (bmm_3d, {n: rand(B * H, S, D) for n in "qkv"}),
    "masked-fill-inverted": (masked_fill_inverted, QKV | {"keep": RNG.random((1, 1, S, S)) > 0.2}),
    "masked-fill-triu": (masked_fill_triu(-math.inf), QKV),
    "masked-fill-triu-minus-1e9": (masked_fill_triu(-1e9), QKV),
    "masked-fill-tril-eq-zero": (masked_fill_tril_eq_zero, QKV),
    "additive-causal-neg-inf": (additive_causal_where(-math.inf), QKV),
    "additive-causal-minus-1e9": (additive_causal_where(-1e9), QKV),
    "additive-causal-triu-finfo-min": (additive_causal_triu, QKV),
    "upcast-before-scale": (upcast_before_scale, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}),
    "upcast-before-mask": (upcast_before_mask, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}
                           | {"keep": RNG.random((1, 1, S, S)) > 0.2}),
    "upcast-float32-mask": (upcast_float32_mask, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}
                            | {"mask": rand(B, 1, 1, S)}),
    "upcast-scaled-float32-mask": (upcast_scaled_float32_mask, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16)
                                                                for n in "qkv"} | {"mask": rand(B, 1, 1, S)}),
    "float32-mask-on-bf16-scores": (float32_mask_on_bf16_scores, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16)
                                                                  for n in "qkv"} | {"mask": rand(B, 1, 1, S)}),
    "float32-mask-promotes-v": (float32_mask_promotes_v, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16)
                                                          for n in "qkv"} | {"mask": rand(B, 1, 1, S)}),
    "float32-probabilities": (float32_probabilities, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}),
    "lifted-causal-where": (lifted_causal_where, QKV), "lifted-additive-causal": (lifted_additive_causal, QKV),
    "nanogpt-buffer": (nanogpt_buffer, QKV),
    "cast-causal-mask": (cast_causal_mask, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}),
    "sliding-window-finfo-min": (sliding_window_finfo_min, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16)
                                                            for n in "qkv"}),
    "gqa": (gqa, {"q": rand(B, 4, S, D), "k": rand(B, 2, S, D), "v": rand(B, 2, S, D)}),
    "mqa": (gqa, {"q": rand(B, 4, S, D), "k": rand(B, 1, S, D), "v": rand(B, 1, S, D)}),
    "unscaled": (unscaled, QKV), "unscaled-additive-mask": (unscaled_additive_mask, QKV | {"mask": rand(B, 1, 1, S)}),
    "unscaled-where-mask": (unscaled_where_mask, QKV | {"keep": RNG.random((1, 1, S, S)) > 0.2}),
    "unscaled-causal": (unscaled_causal, QKV),
    "unscaled-upcast": (unscaled_upcast, {n: rand(B, H, S, D, dtype=ml_dtypes.bfloat16) for n in "qkv"}),
}


def _flash_at(view, root: str) -> dict:
    """The choice of a flash_attention e-node for `root`, or of a float32 result's upcast of one
    (V promoted by float32 probabilities); empty when the class holds neither."""
    if flash := [n for n in view.classes[root] if n.op == "flash_attention"]:
        return {root: flash[-1]}
    for cast in (n for n in view.classes[root] if n.op == "cast"):
        if flash := [n for n in view.classes[cast.operands[0]] if n.op == "flash_attention"]:
            return {root: cast, cast.operands[0]: flash[-1]}
    return {}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_attention_form_reaches_flash_attention(form):
    fn, inputs = FORMS[form]
    graph = op.kernel(fn).trace(**inputs)
    result = rewrite(graph, [ALGEBRA, ATTENTION])
    view = result.view
    root = result.output_classes()[0]
    fused_root = _flash_at(view, root)
    assert fused_root, f"{form}: root class holds {view.ops_in(root)}; fired {result.report.fired()}"
    choice = smallest_choice(view) | fused_root
    fused = Graph(graph.name, graph.inputs, (view.decode(choice, root),)).verify()
    assert fused.op_counts()["flash_attention"] == 1 and "softmax" not in fused.op_counts()
    if form in ("gqa", "mqa"):  # K and V reach the kernel unrepeated
        assert "broadcast_to" not in fused.op_counts(), str(fused)
    want, got = evaluate(graph, inputs)[0], evaluate(fused, inputs)[0]
    tol = 3e-2 if inputs["v"].dtype == ml_dtypes.bfloat16 else 2e-5
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("form", ["causal", "unscaled-causal", *CAUSAL_FILLS, "masked-fill-triu",
                                  "masked-fill-triu-minus-1e9", "masked-fill-tril-eq-zero",
                                  "additive-causal-neg-inf", "additive-causal-minus-1e9",
                                  "additive-causal-triu-finfo-min", "lifted-causal-where", "lifted-additive-causal",
                                  "nanogpt-buffer", "cast-causal-mask"])
def test_causal_form_becomes_a_causal_flag(form):
    fn, inputs = FORMS[form]
    result = rewrite(op.kernel(fn).trace(**inputs), [ALGEBRA, ATTENTION])
    root = result.output_classes()[0]
    assert any(n.op == "flash_attention" and dict(n.attrs)["causal"] and not dict(n.attrs)["has_mask"]
               for n in result.view.classes[root])


def test_a_causal_fill_above_the_limit_stays_a_mask():
    """−100 does not vanish under exp for scores of order 100: that mask is not causal's."""
    result = rewrite(op.kernel(causal_with_fill(-100.0)).trace(**QKV), [ALGEBRA, ATTENTION])
    root = result.output_classes()[0]
    assert not any(n.op == "flash_attention" and dict(n.attrs)["causal"] for n in result.view.classes[root])
