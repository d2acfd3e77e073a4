"""The `attention` ruleset: softmax(c · Q Kᵀ [+ mask]) V → flash_attention(Q, K, V, c, mask).

One fusion rule (with and without a mask) plus the `algebra` ruleset catch the ways attention is
written: the scale on either side of the product or as a division, or none (c = 1: the scale
folded into Q's projection), the softmax spelled out, where-masks, causal masks from tril,
pre-transposed or permuted K, 3-d and 4-d batches, fp32 upcasts (a float32 mask added to upcast
scores included: the kernel adds its mask to float32 scores; to 16-bit scores too, the add
promoting them), probabilities kept in float32 (V promoted: the kernel's result upcast).
A where-mask, softmax(where(m, c · Q Kᵀ, −∞)) V, fuses to the bool mask m: both keep the scores
where m holds and discard the others, whatever they are (a NaN from a padded key row included; an
additive −∞ mask would turn it into NaN, so where(m, x, −∞) is never rewritten to x + mask outside
the fused node). A where with another fill (finfo.min) over any mask but those below stays unfused:
as an additive mask it would differ exactly there, and as a bool mask a fully masked row would be
NaN, not V's average. The remaining rules refine a fused node's mask: an additive −∞ mask is a bool
mask, a mask given leading dims of 1 is the 2-D one, and a lower-triangular bool mask is `causal`. A
causal mask filled with any value at or below CAUSAL_FILL_LIMIT (−1e9, −1e4, finfo.min: what models
write) is filled with −∞: a lower-triangular mask keeps every row's first key (a square sliding
window, tril(k1) ∧ ¬tril(k2), its diagonal), and exp(fill − row max) is 0 in float32 whenever some
score of the row exceeds fill + 104, so the softmax is the same. An additive causal mask,
where(tril(1), 0, fill) (or triu(full(fill), 1), as transformers build it), is `causal` on the same
grounds, the masked scores being s + fill: exact for −∞, and for a finite fill whenever a row's
scores lie within −fill − 104 of each other.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.api.dispatch import apply
from tessera_rw.rules.library import attention_unfused, attention_window
from tessera_rw.rules.library.algebra import const, mT, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset

t = TermBuilder()
q, kt, v, mask, m, c, cd, ss, sd, ax, acc, s, d, full_shape = t.vars("q kt v mask m c cd ss sd ax acc s d fs")
T = (s, d)
K, K_FACTS = mT(kt)
SOFTMAX_ON_LAST_AXIS = ("(= ax (- (vec-length ss) 1))", "(>= (vec-length ss) 2)")
CAUSAL_FILL_LIMIT = -1e4
# a fill of −∞ needs no assumption, and takes the exact rules (bool-mask-from-neg-inf, then
# causal-from-tril-mask); these rules, and what they assume, are for finite fills
FINITE_FILL = "(> c -inf)"
WHERE_FILL_ASSUMED = ("that each row of the causal mask's scores holds a kept score above its finite fill + 104, "
                      "so the fill reads as −∞")
ADDITIVE_FILL_ASSUMED = ("that each row's scores lie within −fill − 104 of each other, so the causal mask's finite "
                         "fill reads as −∞")


def qkv(rng: np.random.Generator, lead: int = 2) -> dict[str, np.ndarray]:
    batch = tuple(int(n) for n in rng.integers(1, 4, size=lead))
    sq, sk, dh, dv = (int(n) for n in rng.integers(1, 9, size=4))
    return {"q": rand(rng, *batch, sq, dh), "k": rand(rng, *batch, sk, dh), "v": rand(rng, *batch, sk, dv)}


def with_mask(rng: np.random.Generator) -> dict[str, np.ndarray]:
    inputs = qkv(rng)
    sq, sk = inputs["q"].shape[-2], inputs["k"].shape[-2]
    return inputs | {"mask": rand(rng, 1, 1, sq, sk)}


def keep(rng: np.random.Generator, sq: int, sk: int) -> np.ndarray:
    """A random bool mask that keeps every row's first key (a fully masked row is NaN under −∞)."""
    return (rng.random((sq, sk)) > 0.4) | (np.arange(sk) == 0)


def with_keep(rng: np.random.Generator) -> dict[str, np.ndarray]:
    inputs = qkv(rng)
    return inputs | {"m": keep(rng, inputs["q"].shape[-2], inputs["k"].shape[-2])}


def _scores(scaled: bool) -> Expr:
    """The scores of a pattern: c · Q Kᵀ, or Q Kᵀ alone (a scale folded into the projection of Q)."""
    return t.mul(t.matmul(q, kt), const(), of=(ss, sd)) if scaled else t.matmul(q, kt, of=(ss, sd))


def _scale(scaled: bool) -> Expr | float:
    return c if scaled else 1.0


def _named(name: str, scaled: bool) -> str:
    return name if scaled else name.replace("flash-attention", "flash-attention-unscaled", 1)


def _shown(text: str, scaled: bool) -> str:
    return text if scaled else text.replace("c · ", "").replace(", c", ", 1")


def _where_scores(fill: Expr, scaled: bool) -> Expr:
    return t.where(m, _scores(scaled), fill, of=(ss, sd))


# (mask, scale before the upcast) of each upcast rule: a bool mask by where, a float one added (to
# the upcast scores, or to scores scaled in their own type first, as c · Q Kᵀ + M is written), or none
UPCAST_FORMS = ((None, False), ("where", False), ("add", False), ("add", True))


def _upcast_example(masked: str | None, scaled: bool, scale_first: bool, cast_back: bool = True):
    """Scores upcast to float32 (before or after the scale), a mask applied (a bool one by where,
    or a float32 one added), the probabilities cast back (or kept float32, V promoted to them)."""
    def body(q, k, v, m=None):
        product = q @ k.mT * 0.3 if scale_first else q @ k.mT
        scores = op.cast(product, "float32")
        scores = scores * 0.3 if scaled and not scale_first else scores
        if masked == "where":
            scores = op.where(m, scores, -math.inf)
        elif masked == "add":
            scores = scores + m
        probabilities = op.softmax(scores, axis=-1)
        return (op.cast(probabilities, q.dtype) if cast_back else probabilities) @ v

    def example(rng: np.random.Generator):
        inputs = {name: x.astype(ml_dtypes.bfloat16) for name, x in qkv(rng).items()}
        sq, sk = inputs["q"].shape[-2], inputs["k"].shape[-2]
        if masked == "where":
            inputs["m"] = keep(rng, sq, sk)
        elif masked == "add":
            inputs["m"] = rand(rng, 1, 1, sq, sk)
        return body, inputs
    return example


def _upcast_scores(scaled: bool, scale_first: bool, masked: str | None) -> Expr:
    """The float32 scores of an upcast rule, masked."""
    if scale_first:
        scores = t.cast(_scores(scaled), dtype="float32", of=(ss, "float32"))
    else:
        upcast = t.cast(t.matmul(q, kt, of=(ss, d)), dtype="float32", of=(ss, "float32"))
        scores = t.mul(upcast, const(), of=(ss, "float32")) if scaled else upcast
    if masked == "where":
        return t.where(m, scores, const(value=float("-inf"), dtype="float32"), of=(ss, "float32"))
    if masked == "add":
        return t.add(scores, mask, of=(ss, "float32"))
    return scores


def _upcast_rules(scaled: bool):
    """softmax(cast(Q Kᵀ, f32) · c [masked]) cast back, then V: the fused kernel's own arithmetic
    (its scores are float32 before the scale, and a float mask is added to them in float32), so it
    fuses as the unconverted form does. A where-mask after c · Q Kᵀ upcast reaches this form by
    upcast-after-mask, c · Q Kᵀ + M of a float32 M by promote-*-of-add. Probabilities kept float32
    promote V, and the product is float32: the kernel's result upcast, as precise as the 16-bit
    scores the program computes first."""
    for (masked, scale_first), cast_back in itertools.product(UPCAST_FORMS, (True, False)):
        if scale_first and not scaled:
            continue                            # without a scale the two forms are one
        name = ("flash-attention-upcast-" + ("scaled-scores" if scale_first else "scores")
                + {"where": "-where-masked", "add": "-additive-masked", None: ""}[masked]
                + ("" if cast_back else "-float32-result"))
        shown_mask = {"where": " masked by M", "add": " + M", None: ""}[masked]
        shown_scores = "cast(c · Q Kᵀ, f32)" if scale_first else "cast(Q Kᵀ, f32) · c"
        probs = t.softmax(_upcast_scores(scaled, scale_first, masked), axis=ax)
        fused = t.flash_attention(q, K, v, *{"where": (m,), "add": (mask,), None: ()}[masked],
                                  scale=_scale(scaled), causal=False, has_mask=masked is not None, window=0, of=T)
        when = SOFTMAX_ON_LAST_AXIS + K_FACTS + (('(= (dt m) "bool")',) if masked == "where" else ())
        shown = "flash_attention(Q, K, V, c" + (", M" if masked else "") + ")"
        if cast_back:
            shown = f"cast(softmax({shown_scores}{shown_mask}), d) V = {shown}"
            lhs, rhs = t.matmul(t.cast(probs, dtype=d, of=(ss, d)), v, accum_dtype=acc, of=T), fused
        else:
            shown = f"softmax({shown_scores}{shown_mask}) cast(V, f32) = cast({shown}, f32)"
            wide = (s, "float32")
            lhs = t.matmul(probs, t.cast(v, dtype="float32", of=(Expr("sv"), "float32")), accum_dtype=acc, of=wide)
            rhs = t.cast(fused, dtype="float32", of=wide)
            when += ("(= sv (shp v))", "(= d (dt v))", '(!= d "float32")')
        yield Rule(_named(name, scaled), _shown(shown, scaled), lhs=lhs, rhs=rhs, when=when,
                   example=_upcast_example(masked, scaled, scale_first, cast_back))


def _fusion_rules(scaled: bool):
    """The three forms of softmax(scores [masked]) V, the scores scaled by a constant or not: a scale
    of 1 is what attention with the scale folded into Q's projection writes."""
    def scores(q, k):
        return q @ k.mT * 0.3 if scaled else q @ k.mT
    yield Rule(_named("flash-attention-where-masked", scaled),
               _shown("softmax(where(M, c · Q Kᵀ, −∞)) V = flash_attention(Q, K, V, c, M)", scaled),
               lhs=t.matmul(t.softmax(_where_scores(const(value=float("-inf"), dtype=Expr("cf")), scaled), axis=ax),
                            v, accum_dtype=acc, of=T),
               rhs=t.flash_attention(q, K, v, m, scale=_scale(scaled), causal=False, has_mask=True, window=0, of=T),
               when=SOFTMAX_ON_LAST_AXIS + K_FACTS + ('(= (dt m) "bool")',),
               example=lambda rng: (lambda q, k, v, m: op.softmax(op.where(m, scores(q, k), -math.inf), axis=-1) @ v,
                                    with_keep(rng)))
    yield Rule(_named("flash-attention", scaled),
               _shown("softmax(c · Q Kᵀ + M) V = flash_attention(Q, K, V, c, M)", scaled),
               lhs=t.matmul(t.softmax(t.add(_scores(scaled), mask, of=(ss, sd)), axis=ax), v, accum_dtype=acc, of=T),
               rhs=t.flash_attention(q, K, v, mask, scale=_scale(scaled), causal=False, has_mask=True, window=0, of=T),
               when=SOFTMAX_ON_LAST_AXIS + K_FACTS,
               example=lambda rng: (lambda q, k, v, mask: op.softmax(scores(q, k) + mask, axis=-1) @ v,
                                    with_mask(rng)))
    yield Rule(_named("flash-attention-unmasked", scaled),
               _shown("softmax(c · Q Kᵀ) V = flash_attention(Q, K, V, c)", scaled),
               lhs=t.matmul(t.softmax(_scores(scaled), axis=ax), v, accum_dtype=acc, of=T),
               rhs=t.flash_attention(q, K, v, scale=_scale(scaled), causal=False, has_mask=False, window=0, of=T),
               when=SOFTMAX_ON_LAST_AXIS + K_FACTS,
               example=lambda rng: (lambda q, k, v: op.softmax(scores(q, k), axis=-1) @ v, qkv(rng)))


RULES = tuple(rule for scaled in (True, False) for rule in (*_fusion_rules(scaled), *_upcast_rules(scaled)))


def expand_heads(x, groups: int):
    """(B, Hkv, S, D) -> (B, Hkv·groups, S, D), each head repeated: how GQA is written by hand."""
    b, h, seq, dim = x.shape
    return op.reshape(op.broadcast_to(op.reshape(x, (b, h, 1, seq, dim)), (b, h, groups, seq, dim)),
                      (b, h * groups, seq, dim))


def gqa_inputs(rng: np.random.Generator, masked: bool) -> dict[str, np.ndarray]:
    b, hkv, sq, sk, dh = (int(n) for n in rng.integers(1, 4, size=5))
    g = int(rng.integers(2, 4))  # heads actually shared
    inputs = {"q": rand(rng, b, hkv * g, sq, dh), "k": rand(rng, b, hkv, sk, dh), "v": rand(rng, b, hkv, sk, dh)}
    return inputs | ({"mask": rand(rng, 1, 1, sq, sk)} if masked else {})


def _gqa_rules():
    """A K or V whose heads were repeated by reshape/broadcast_to is the unrepeated one (GQA, MQA)."""
    kv, k0, s1, s2, s3, sk = t.vars("kv k0 s1 s2 s3 sk")
    expanded = t.reshape(t.broadcast_to(t.reshape(k0, shape=s1), shape=s2), shape=s3)
    facts = ("(= sk (shp k0))", "(= (vec-length sk) 4)",
             "(= s1 (vec-of (vec-get sk 0) (vec-get sk 1) 1 (vec-get sk 2) (vec-get sk 3)))",
             "(= (vec-length s2) 5)", "(= g (vec-get s2 2))",
             "(= s2 (vec-of (vec-get sk 0) (vec-get sk 1) g (vec-get sk 2) (vec-get sk 3)))",
             "(= s3 (vec-of (vec-get sk 0) (* (vec-get sk 1) g) (vec-get sk 2) (vec-get sk 3)))")
    for masked in (False, True):
        extra = (mask,) if masked else ()
        flags = dict(scale=c, causal=Expr("causal"), has_mask=masked, window=Expr("win"), of=T)
        for which in ("k", "v"):
            before = (q, expanded, v) if which == "k" else (q, kv, expanded)
            after = (q, k0, v) if which == "k" else (q, kv, k0)
            body = (lambda q, k, v, mask=None, which=which: op.flash_attention(
                q, expand_heads(k, q.shape[1] // k.shape[1]) if which == "k" else k,
                expand_heads(v, q.shape[1] // v.shape[1]) if which == "v" else v, mask=mask))
            yield Rule(f"grouped-{which}-heads{'-masked' if masked else ''}",
                       f"flash(Q, repeat_heads({which.upper()})) = flash(Q, {which.upper()}) (GQA)",
                       lhs=t.flash_attention(*before, *extra, **flags),
                       rhs=t.flash_attention(*after, *extra, **flags), when=facts,
                       example=lambda rng, body=body, masked=masked: (body, gqa_inputs(rng, masked)))


# ---- mask refinement, for the forward and the backward ops alike -----------------------------------
#
# Each attention op takes its mask last: flash_attention(q, k, v, mask), attention_row_stats(q, k,
# o, dO, mask), flash_attention_bwd(q, k, v, dO, stats, mask). A where-mask reaches the backward
# ops as the additive mask the gradient rules match; these rules make it a bool mask or `causal`.

def _attention_family(rng: np.random.Generator, mask_of, causal: bool = False):
    """A forward and backward attention built with `mask_of(mask)` as its mask (and `causal`): every
    op of the family carries the same one."""
    def body(q, k, v, g, mask):
        m = mask_of(mask)
        flags = dict(scale=0.3, causal=causal, has_mask=True)
        out = op.flash_attention(q, k, v, mask=m, scale=0.3, causal=causal)
        stats = apply("attention_row_stats", (q, k, out, g, m), **flags)
        return out, apply("flash_attention_bwd", (q, k, v, g, stats, m), **flags)
    inputs = qkv(rng)
    sq, sk, dv = inputs["q"].shape[-2], inputs["k"].shape[-2], inputs["v"].shape[-1]
    inputs["g"] = rand(rng, *inputs["q"].shape[:-1], dv)
    return body, inputs | {"mask": rand(rng, 1, 1, sq, sk)}


FAMILY = {"flash_attention": (q, kt, v), "attention_row_stats": (q, kt, v, Expr("g")),
          "flash_attention_bwd": (q, kt, v, Expr("g"), Expr("st"))}


def _mask_rules():
    neg_inf_mask = t.where(m, const(value=0.0), const(value=float("-inf"), dtype=Expr("cd2")))
    tril = t.tril(t.full(shape=full_shape, value=True, dtype="bool"), k=0)
    for name, operands in FAMILY.items():
        term = getattr(t, name)
        suffix = "" if name == "flash_attention" else f"-{name.replace('_', '-')}"
        yield Rule(f"bool-mask-from-neg-inf{suffix}", f"{name}(…, where(m, 0, −∞)) = {name}(…, m)",
                   lhs=term(*operands, neg_inf_mask, scale=c, causal=False, has_mask=True, window=0, of=T),
                   rhs=term(*operands, m, scale=c, causal=False, has_mask=True, window=0, of=T),
                   when=('(= (dt m) "bool")',),
                   example=lambda rng: _attention_family(rng, lambda mask: op.where(mask > 0, 0.0, -math.inf)))
        yield Rule(f"causal-from-additive-fill{suffix}", f"{name}(…, where(tril(1), 0, c)) = {name}(…, causal) "
                   f"for c ≤ {CAUSAL_FILL_LIMIT:g}",
                   lhs=term(*operands, t.where(tril, const(value=0.0, dtype=Expr("cd2")), const()),
                            scale=Expr("sc"), causal=False, has_mask=True, window=0, of=T),
                   rhs=term(*operands, scale=Expr("sc"), causal=True, has_mask=False, window=0, of=T),
                   when=("(= (vec-length fs) 2)", f"(<= c {CAUSAL_FILL_LIMIT:.1f})", FINITE_FILL),
                   example=_additive_causal_example, assumes=ADDITIVE_FILL_ASSUMED)
        yield Rule(f"causal-from-tril-mask{suffix}", f"{name}(…, tril(1)) = {name}(…, causal)",
                   lhs=term(*operands, tril, scale=c, causal=False, has_mask=True, window=0, of=T),
                   rhs=term(*operands, scale=c, causal=True, has_mask=False, window=0, of=T),
                   when=("(= (vec-length fs) 2)",),
                   example=lambda rng: _attention_family(
                       rng, lambda mask: op.tril(op.ones((mask.shape[-2], mask.shape[-1]), "bool"))))


def _lifted_mask_rules():
    """A mask given leading dims of 1 (`mask[None, None]`, `.view(1, 1, T, T)`) is the mask itself:
    each attention op broadcasts its mask over the batch and heads. The 2-D mask then meets the
    refinement rules (a causal triangle becomes the `causal` flag)."""
    rs = Expr("rs")
    for name, operands in FAMILY.items():
        term = getattr(t, name)
        suffix = "" if name == "flash_attention" else f"-{name.replace('_', '-')}"
        for lead in (1, 2):
            flags = dict(scale=c, causal=Expr("causal"), has_mask=True, window=Expr("win"), of=T)
            lifted = "(vec-of " + "1 " * lead + "(vec-get ms 0) (vec-get ms 1))"
            yield Rule(f"mask-of-{lead + 2}-dims-is-2-d{suffix}",
                       f"{name}(…, reshape(m, (1,)·{lead} + shape(m))) = {name}(…, m)",
                       lhs=term(*operands, t.reshape(m, shape=rs), **flags),
                       rhs=term(*operands, m, **flags),
                       when=("(= ms (shp m))", "(= (vec-length ms) 2)", f"(= rs {lifted})"),
                       example=lambda rng, lead=lead: _lifted_mask_example(rng, lead))


def _lifted_mask_example(rng: np.random.Generator, lead: int):
    """An attention family whose (sq, sk) mask is given `lead` leading dims of 1."""
    body, inputs = _attention_family(rng, lambda mask: op.reshape(mask, (1,) * lead + mask.shape))
    if lead == 1:            # one batch dim: q, k, v and g of rank 3
        inputs = {n: x[0] if n != "mask" else x for n, x in inputs.items()}
    return body, inputs | {"mask": inputs["mask"][0, 0]}


def _additive_causal_example(rng: np.random.Generator):
    """An attention family masked by a lower-triangular additive mask filled with what models write
    above the diagonal (the random mask gives only its shape)."""
    fill = float(rng.choice([-1e9, CAUSAL_FILL_LIMIT, float(np.finfo(np.float32).min)]))      # finite: FINITE_FILL
    return _attention_family(
        rng, lambda mask: op.where(op.tril(op.ones((mask.shape[-2], mask.shape[-1]), "bool")), 0.0, fill))


def _fill_example(window: bool, upcast: bool):
    """A softmax over scores masked by a causal (or sliding-window) triangle filled with what models
    write, in x's own type or upcast to float32 after the mask (HF's softmax(…, dtype=float32))."""
    def example(rng: np.random.Generator):
        n = int(rng.integers(1, 9))
        fill = float(rng.choice([-1e9, CAUSAL_FILL_LIMIT, float(np.finfo(np.float32).min)]))
        width = int(rng.integers(1, n + 1))

        def body(x):
            ones = op.ones((x.shape[-2], x.shape[-1]), "bool")
            keep = op.tril(ones) & ~op.tril(ones, -width) if window else op.tril(ones)
            masked = op.where(keep, x, fill)
            return op.softmax(op.cast(masked, "float32") if upcast else masked, axis=-1)
        dtype = ml_dtypes.bfloat16 if upcast else np.float32
        return body, {"x": rand(rng, int(rng.integers(1, 4)), n, n, dtype=dtype)}
    return example


def _fill_rules():
    """softmax(where(M, x, c)) = softmax(where(M, x, −∞)) for a finite c ≤ CAUSAL_FILL_LIMIT, where M
    keeps a key in every row: a causal triangle (its first key), or a square sliding window,
    tril(k1) ∧ ¬tril(k2) with k1 ≥ 0 > k2 (the diagonal); the scores upcast to float32 after the mask
    or not."""
    ones = t.full(shape=full_shape, value=True, dtype="bool")
    window = t.logical_and(t.tril(ones, k=Expr("k1")), t.logical_not(t.tril(ones, k=Expr("k2"))))
    masks = {"causal": (t.tril(ones, k=0), ()),
             "window": (window, ("(>= k1 0)", "(< k2 0)", "(= (vec-get fs 0) (vec-get fs 1))"))}
    for kind, (mask, facts) in masks.items():
        for upcast in (False, True):
            def softmax_of(fill: Expr) -> Expr:
                masked = t.where(mask, Expr("x"), fill, of=(ss, sd))
                return t.softmax(t.cast(masked, dtype="float32", of=(ss, "float32")) if upcast else masked,
                                 axis=ax, of=T)
            shown = "cast(where(M, x, c), f32)" if upcast else "where(M, x, c)"
            yield Rule(f"{kind}-fill-is-neg-inf{'-upcast' if upcast else ''}",
                       f"softmax({shown}) = softmax({shown.replace(', c)', ', −∞)')}) for c ≤ −1e4, M {kind}",
                       lhs=softmax_of(const()), rhs=softmax_of(const(value=float("-inf"), dtype=sd)),
                       when=SOFTMAX_ON_LAST_AXIS + ("(= (vec-length fs) 2)", "(= (dt x) sd)",
                                                    f"(<= c {CAUSAL_FILL_LIMIT:.1f})", FINITE_FILL,
                                                    '(!= sd "float8_e4m3")') + facts,     # a type with −∞
                       example=_fill_example(kind == "window", upcast),
                       assumes=WHERE_FILL_ASSUMED.replace("causal mask", f"{kind} mask"))


RULES = (RULES + tuple(_mask_rules()) + tuple(_lifted_mask_rules()) + tuple(_fill_rules()) + tuple(_gqa_rules())
         + tuple(attention_window.window_rules(FAMILY, _attention_family)) + attention_unfused.RULES)

ATTENTION = Ruleset("attention", RULES, doc="softmax(c·QKᵀ + M)V → flash_attention, with mask refinement")

