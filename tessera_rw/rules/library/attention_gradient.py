"""Attention's backward pass as one fused node: part of the `gradient` ruleset.

Reverse mode turns softmax(c · Q Kᵀ [+ M]) V into (algebra.ops.attention.explicit_attention_grads)

    P = softmax(c · Q Kᵀ [+ M]),  dP = dO Vᵀ,  dS = P ∘ (dP − Σ dP∘P)
    dQ = (c dS) K,  dK = (Qᵀ (c dS))ᵀ,  dV = Pᵀ dO

which materializes P, dP and dS, three Sq×Sk tensors. The rules here read each gradient off

    grads = flash_attention_bwd(Q, K, V, dO, attention_row_stats(Q, K, O, dO))

where O = flash_attention(Q, K, V) is the forward output: dQ, dK, dV are its three contiguous
blocks (views, no copy). All three rules build the same two nodes, so one backward kernel serves
them. The dV rule sees neither V nor dS in its own pattern, so it joins on the dS term. The packed
length is a product of dims, which egglog spells per rank: the rules come in ranks 2..4 (batch
and heads), with K, V and dO of Q's batch; broadcast or GQA K/V reach them repeated, as the VJP
writes them. A mask is additive (s + M) or a bool mask the VJP applies as where(m, s, −∞) (a
causal mask too, as tril(1)); the fused nodes take the bool mask itself, and the `attention`
ruleset's mask rules turn a tril mask into the causal flag, a sliding window's band into its
window. A softmax taken in float32 and cast back (transformers' softmax(…, dtype=float32)) gives
dS in float32 cast back, which reads as the 16-bit dS these rules match; where a float32 mask
added to 16-bit scores promotes them (transformers' LLaMA), the `-upcast-masked` rules match that
float32 softmax's gradient itself.
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.ops.attention import explicit_attention_grads
from tessera_rw.algebra.ops.attention_backward import STATS
from tessera_rw.rules.library.algebra import const, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule
from tessera_rw.rules.tables import numel, swapped_last

t = TermBuilder()
q, kt, v, g, mask, c, ax, pk, s, d = t.vars("q kt v g mask c ax pk s d")
E = Expr
T = (s, d)
# the causal mask as attention written by hand spells it: every row keeps its first key; and a
# sliding window's band, every row keeping its own key (with no more queries than keys)
ONES = t.full(shape=E("fs"), value=True, dtype="bool")
CAUSAL = t.tril(ONES, k=0)
BAND = t.logical_and(CAUSAL, t.logical_not(t.tril(ONES, k=E("k2"))))
WRITTEN_MASKS = {"causal": (CAUSAL, ("(= (vec-length fs) 2)",)),
                 "window": (BAND, ("(= (vec-length fs) 2)", "(< k2 0)", "(<= (vec-get fs 0) (vec-get fs 1))"))}
RANKS = (2, 3, 4)
SCALE = 0.3
MASKS = ("none", "additive", "where", "upcast-additive")
# transformers' attention is 4-d ([B, H, S, D]), 3-d where batch and heads are merged: the float32-mask
# form, whose examples are the dearest to extract exactly, comes in those ranks
UPCAST_RANKS = (3, 4)


def _facts(rank: int) -> tuple[str, ...]:
    """Q [.., Sq, D], Kᵀ [.., D, Sk], V [.., Sk, Dv] and dO [.., Sq, Dv] of one batch and dtype d;
    the softmax on the last axis; nq, nk, nv the sizes of dQ, dK, dV."""
    same_batch = [f"(= (vec-get {x}_s {i}) (vec-get q_s {i}))" for x in ("kt", "v", "g") for i in range(rank - 2)]
    return (*(f"(= {x}_s (shp {x}))" for x in ("q", "kt", "v", "g")),
            *(f"(= (vec-length {x}_s) {rank})" for x in ("q", "kt", "v", "g")),
            *(f"(= (dt {x}) d)" for x in ("q", "kt", "v", "g")), *same_batch,
            f"(= ax {rank - 1})", f"(= pk (swap-last {rank}))", "(= sd (accum-float d))",
            f"(= nq {numel('q_s', rank)})", f"(= nk {numel('kt_s', rank)})", f"(= nv {numel('v_s', rank)})")


def _scores(masked: str, m: Expr = mask) -> Expr:
    scaled = t.mul(t.matmul(q, kt), const())
    if masked == "where":
        return t.where(m, scaled, const(value=float("-inf"), dtype=Expr("cf")))
    if masked == "upcast-additive":        # a float32 mask added to 16-bit scores promotes them
        return t.add(t.cast(scaled, dtype="float32"), m)
    return t.add(scaled, m) if masked == "additive" else scaled


def _p(masked: str, m: Expr = mask) -> Expr:
    return t.softmax(_scores(masked, m), axis=ax)


def _ds(masked: str, m: Expr = mask) -> Expr:
    return _ds_of(masked, _p(masked, m))


def _ds_of(masked: str, p: Expr) -> Expr:
    """dS of the probabilities `p` (P's pattern, or the variable naming its class)."""
    dp = t.matmul(g, t.transpose(v, axes=pk))
    if masked == "upcast-additive":        # the softmax's VJP in float32, its dS cast back
        dp = t.cast(dp, dtype="float32")
        return t.cast(t.mul(p, t.sub(dp, t.sum(t.mul(dp, p), axes=E("(vec-of ax)"), keepdims=True))), dtype=d)
    return t.mul(p, t.sub(dp, t.sum(t.mul(dp, p), axes=E("(vec-of ax)"), keepdims=True)))


def _probabilities(masked: str, p: Expr) -> Expr:
    """P (its class `p`) as dV = Pᵀ dO reads it: of dtype d, a float32 softmax cast back."""
    return t.cast(p, dtype=d) if masked == "upcast-additive" else p


def _packed(masked: str, m: Expr = mask) -> Expr:
    """flash_attention_bwd(Q, K, V, dO, attention_row_stats(Q, K, O, dO)) of dtype d, flat."""
    k = t.transpose(kt, axes=pk, of=(E(swapped_last("kt_s")), d))
    extra = () if masked == "none" else (m,)
    flags = dict(scale=c, causal=False, has_mask=bool(extra), window=0)
    out = t.flash_attention(q, k, v, *extra, **flags, of=(E("g_s"), d))
    stats = t.attention_row_stats(q, k, out, g, *extra, **flags, of=(E(f"(vec-set g_s ax {STATS})"), E("sd")))
    return t.flash_attention_bwd(q, k, v, g, stats, *extra, **flags, of=(E("(vec-of (+ nq (+ nk nv)))"), d))


def _block(masked: str, start: str, stop: str, m: Expr = mask) -> Expr:
    """Elements [start, stop) of the packed gradients, in the shape of the rule's left side."""
    flat = t.slice(_packed(masked, m), starts=E(f"(vec-of {start})"), stops=E(f"(vec-of {stop})"),
                   steps=E("(vec-of 1)"), of=(E(f"(vec-of (- {stop} {start}))"), d))
    return t.reshape(flat, shape=s, of=T)


def _inputs(rng: np.random.Generator, rank: int, masked: str) -> dict[str, np.ndarray]:
    batch = tuple(int(n) for n in rng.integers(1, 4, size=rank - 2))
    # two keys at least: with one, P ≡ 1 and dQ, dK are exactly zero on one side of the rule and
    # rounding noise on the other (D = dO·O equals dP only up to rounding)
    sq, dh, dv = (int(n) for n in rng.integers(1, 7, size=3))
    sk = int(rng.integers(2, 7))
    # float64: the fused side takes D = Σ dO·O where the other sums dP·P, and in float32 the two
    # roundings differ by a few ulps of terms that can cancel to far less than themselves
    f64 = dict(dtype=np.float64)
    arrays = {"q": rand(rng, *batch, sq, dh, **f64), "k": rand(rng, *batch, sk, dh, **f64),
              "v": rand(rng, *batch, sk, dv, **f64), "g": rand(rng, *batch, sq, dv, **f64)}
    if masked == "where":       # every row keeps its first two keys (fully masked is NaN, one kept is P ≡ 1)
        return arrays | {"mask": (rng.random((sq, sk)) > 0.4) | (np.arange(sk) < 2)}
    return arrays | ({"mask": rand(rng, sq, sk, **f64)} if masked == "additive" else {})


def _example(rank: int, masked: str, grad: str):
    if masked == "upcast-additive":
        return _upcast_example(rank, grad)

    def grads(q, k, v, g, mask=None):
        return explicit_attention_grads(q, k, v, g, SCALE, mask)[:3]
    return lambda rng: (grads, _inputs(rng, rank, masked))


def _upcast_example(rank: int, grad: str):
    """`grad` of 16-bit attention whose scores a float32 mask promotes, its softmax cast back
    (transformers' LLaMA: scores · scale + causal_mask, softmax(…, dtype=float32).to(dtype)), as
    reverse mode writes it; dV with dK beside it (its rule joins on their dS). One gradient
    rather than three keeps the example's e-graph, whose casts multiply its fusions, small."""
    def grads(q, k, v, g, mask):
        p = op.softmax(op.cast(q @ k.mT * SCALE, "float32") + mask, axis=-1)
        dp = op.cast(g @ v.mT, "float32")
        scaled = op.cast(p * (dp - op.sum(dp * p, axis=-1, keepdims=True)), "float16") * SCALE
        blocks = {"dq": lambda: scaled @ k.mT.mT, "dk": lambda: (q.mT @ scaled).mT,
                  "dv": lambda: op.cast(p, "float16").mT @ g}
        return tuple(blocks[name]() for name in ((grad,) if grad != "dv" else ("dv", "dk")))

    def example(rng: np.random.Generator):
        # 16-bit values, so float16 (bf16's roundings cancel to a few percent of dK where the fused
        # kernel rounds once). The fused side takes D = Σ dO·O of O rounded to float16, the other
        # Σ dP·P: V of one column, or of rows nearly alike, makes every dP − D a cancellation of
        # that rounding, so V gets 4 columns or more, and there are 3 keys and 2 queries at least
        batch = tuple(int(n) for n in rng.integers(1, 4, size=rank - 2))
        sq, sk, dh, dv = (int(rng.integers(lo, 7)) for lo in (2, 3, 1, 4))
        shapes = {"q": (sq, dh), "k": (sk, dh), "v": (sk, dv), "g": (sq, dv), "mask": (sq, sk)}
        return grads, {n: rand(rng, *(batch if n != "mask" else ()), *shape,
                               dtype=np.float32 if n == "mask" else np.float16) for n, shape in shapes.items()}
    return example


def _written_example(rank: int, window: bool):
    """dQ and dK of causal (or sliding-window) attention written by hand, as reverse mode gives
    them: where's own VJP wraps dS in where(keep, dS, 0)."""
    def grads(q, k, v, g):
        ones = op.ones((q.shape[-2], k.shape[-2]), "bool")
        keep = op.tril(ones) & ~op.tril(ones, -2) if window else op.tril(ones)
        p = op.softmax(op.where(keep, q @ k.mT * SCALE, -math.inf), axis=-1)
        dp = g @ v.mT
        scaled = op.where(keep, p * (dp - op.sum(dp * p, axis=-1, keepdims=True)), 0.0) * SCALE
        return scaled @ k.mT.mT, (q.mT @ scaled).mT
    def example(rng: np.random.Generator):
        # causal row 0 keeps one key (P ≡ 1, dS 0 on one side, rounding noise on the other): more
        # rows give the gradients their scale
        while (inputs := _inputs(rng, rank, "none"))["q"].shape[-2] < 3:
            pass
        if window:              # as many queries as keys at most: each keeps its own key and the one before
            rows = min(inputs["q"].shape[-2], inputs["k"].shape[-2])
            inputs |= {n: inputs[n][..., :rows, :] for n in ("q", "g")}
        return grads, inputs
    return example


def _written_scaled_ds(keep: Expr) -> Expr:
    """c dS under a causal mask (or band) written by hand: where's own VJP keeps dS where it holds,
    as where(keep, dS, 0). Every row keeps a key, so P and dS are finite and already 0 off the
    mask: the fused node's dS. (A mask that drops a whole row would make that row's dS NaN, which
    the where zeroes and the fused node would not: such masks keep their unfused backward.)"""
    return t.mul(t.where(keep, _ds("where", keep), const(value=0.0, dtype=E("cz"))), const())


def _rules():
    blocks = {"dq": ("0", "nq"), "dk": ("nq", "(+ nq nk)"), "dv": ("(+ nq nk)", "(+ nq (+ nk nv))")}
    formula = {"dq": "(c dS) K", "dk": "(Qᵀ (c dS))ᵀ", "dv": "Pᵀ dO"}
    for masked in MASKS:
        scaled_ds = t.mul(_ds(masked), const())
        lhs = {"dq": t.matmul(scaled_ds, t.transpose(kt, axes=pk), of=T),
               "dk": t.transpose(t.matmul(t.transpose(q, axes=pk), scaled_ds), axes=pk, of=T),
               "dv": t.matmul(t.transpose(_probabilities(masked, E("pj")), axes=pk), g, of=T)}
        for rank in RANKS if masked != "upcast-additive" else UPCAST_RANKS:
            for grad in ("dq", "dk", "dv"):
                # dV's pattern holds neither V nor dS: it fires where the dS of the same P exists,
                # the two joined on P's own class (joined on its leaves, the layers of a model, which
                # share the mask and the scale, met each other: a search growing with their square)
                join = (f"(= pj {_p(masked)})", f"(= dsx {_ds_of(masked, E('pj'))})") if grad == "dv" else ()
                join += {"where": ('(= (dt mask) "bool")',),
                         "upcast-additive": ('(= (dt mask) "float32")', '(!= d "float32")')}.get(masked, ())
                suffix = {"none": "", "additive": "-masked", "where": "-where-masked",
                          "upcast-additive": "-upcast-masked"}[masked]
                yield Rule(f"attention-{grad}-fused{suffix}-{rank}d",
                           f"{formula[grad]} = its block of flash_attention_bwd(Q, K, V, dO, row stats)",
                           lhs=lhs[grad], rhs=_block(masked, *blocks[grad]), when=_facts(rank) + join,
                           example=_example(rank, masked, grad))
    for kind, (keep, facts) in WRITTEN_MASKS.items():
        written = _written_scaled_ds(keep)
        lhs = {"dq": t.matmul(written, t.transpose(kt, axes=pk), of=T),
               "dk": t.transpose(t.matmul(t.transpose(q, axes=pk), written), axes=pk, of=T)}
        shown = {"causal": "where(tril)", "window": "where(tril ∧ ¬tril(−W))"}[kind]
        for rank in RANKS:
            for grad in ("dq", "dk"):             # dV reads P, not dS: the where-masked dV rule serves
                yield Rule(f"attention-{grad}-fused-{kind}-written-{rank}d",
                           f"{formula[grad]} under {shown} = its block of flash_attention_bwd(Q, K, V, dO, row stats)",
                           lhs=lhs[grad], rhs=_block("where", *blocks[grad], keep), when=_facts(rank) + facts,
                           example=_written_example(rank, kind == "window"))


def _softmax_vjp(p: Expr, g: Expr, shape: Expr, dtype: Expr | str) -> Expr:
    """P ∘ (g − Σ g ∘ P) along the last axis ax, as reverse mode writes softmax's VJP."""
    of = (shape, dtype)
    total = t.sum(t.mul(g, p, of=of), axes=E("(vec-of ax)"), keepdims=True, of=(E("(vec-set s ax 1)"), dtype))
    return t.mul(p, t.sub(g, total, of=of), of=of)


def _wider_vjp_example(rng: np.random.Generator):
    rows, cols = (int(n) for n in rng.integers(1, 7, size=2))
    x, g = (rand(rng, rows, cols, dtype=np.float16) for _ in range(2))       # (float16: see _upcast_example)

    def body(x, g):
        p = op.softmax(op.cast(x, "float32"), axis=-1)
        wide = op.cast(g, "float32")
        return op.cast(p * (wide - op.sum(wide * p, axis=-1, keepdims=True)), "float16")
    return body, {"x": x, "g": g}


def _wider_vjp_rule() -> Rule:
    """A softmax taken in float32 and cast back (transformers' softmax(…, dtype=float32).to(dtype))
    reads as the 16-bit softmax (softmax-in-wider-type); its gradient, dS computed in float32 and
    cast back, reads as the 16-bit dS the fused backward rules match, whose kernel computes it in
    float32 and rounds it so."""
    x, gx = E("x"), E("g")
    wide = t.softmax(t.cast(x, dtype="float32", of=(s, "float32")), axis=ax, of=(s, "float32"))
    return Rule("softmax-gradient-in-wider-type",
                "cast(P32 ∘ (cast(g, f32) − Σ cast(g, f32) ∘ P32), d) = P ∘ (g − Σ g ∘ P), "
                "P32 = softmax(cast(x, f32))",
                lhs=t.cast(_softmax_vjp(wide, t.cast(gx, dtype="float32"), s, "float32"), dtype=d, of=T),
                rhs=_softmax_vjp(t.softmax(x, axis=ax, of=T), gx, s, d),
                when=("(= (dt x) d)", "(= (dt g) d)", "(= (shp g) s)", '(!= d "float32")',
                      "(= ax (- (vec-length s) 1))"),
                example=_wider_vjp_example)


RULES = tuple(_rules()) + (_wider_vjp_rule(),)
