"""flash_attention spelled out, for where no fused attention kernel takes it: part of the
`attention` ruleset.

    flash_attention(Q, K, V [, M], c, causal [, window]) = softmax(mask(c · Q Kᵀ)) V

where mask adds an additive M, keeps the scores where a bool M is true (−∞ elsewhere) and, under
`causal`, where tril(1) is, or under a window of W the band tril(1) ∧ ¬tril(1, −W). The fused
kernels take bf16 and fp16 with head dims of multiples of 16 that fit the arch's shared memory (not
256 on sm_80); float32 they never take. So every
op.flash_attention but float64's gets the unfused form beside it here, and extraction has a plan
whose every kernel exists on the GPU (matmul, softmax) to pick where the fused node has no kernel,
with epilogue fusion applying to it as to attention written by hand; where the fused kernel exists
the cost model prefers it. (float64 has no GPU kernels at all: it keeps the fused node, which the
numpy executor runs blockwise.)

The unfused form holds every score in memory at once, so it is offered only up to
UNFUSED_SCORES_LIMIT scores (256 MiB: B=4, H=16, S=1024 fits); larger attention keeps the fused
node alone, which the numpy executor runs block by block in a few MB and the GPU runs in bf16 /
fp16. (Below the limit the numpy executor runs the unfused plan, which holds the scores too.)
The rules are per rank (2..4), with K and V of Q's batch; GQA K/V (fewer heads than Q, 4-d) are
first repeated to Q's heads, as attention is written by hand (the `attention` ruleset's GQA rules
undo that).
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.rules.library.algebra import const, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule
from tessera_rw.rules.tables import numel, swapped_last

t = TermBuilder()
q, k, v, mask, c, s, d = t.vars("q k v mask c s d")
T = (s, d)
RANKS = (2, 3, 4)
NOT_FLOAT64 = '(!= d "float64")'     # float64 has no GPU kernels: it keeps the fused node
EXAMPLE_DTYPE = DType.float32        # the rules hold for any float; their examples, and GQA's, are float32
MASKS = ("none", "additive", "bool")
UNFUSED_SCORES_LIMIT = 1 << 26


def _facts(rank: int, masked: str) -> tuple[str, ...]:
    """Q, K, V of rank `rank`, one batch and dtype d (not float64); ss the scores' shape (.., Sq, Sk), pk
    Kᵀ's permutation (egglog looks tables up in a rule's query only)."""
    same_batch = [f"(= (vec-get {x}_s {i}) (vec-get q_s {i}))" for x in ("k", "v") for i in range(rank - 2)]
    mask_dtype = {"none": (), "additive": ("(= (dt mask) d)",), "bool": ('(= (dt mask) "bool")',)}[masked]
    return (*(f"(= {x}_s (shp {x}))" for x in ("q", "k", "v")),
            *(f"(= (vec-length {x}_s) {rank})" for x in ("q", "k", "v")),
            *(f"(= (dt {x}) d)" for x in ("q", "k", "v")), NOT_FLOAT64, *same_batch,
            f"(= ss (vec-set q_s {rank - 1} (vec-get k_s {rank - 2})))", f"(= pk (swap-last {rank}))",
            f"(<= {numel('ss', rank)} {UNFUSED_SCORES_LIMIT})", *mask_dtype)


def _unfused(rank: int, masked: str, causal: str) -> Expr:
    scores = (Expr("ss"), d)
    kt = t.transpose(k, axes=Expr("pk"), of=(Expr(swapped_last("k_s")), d))
    x = t.mul(t.matmul(q, kt, accum_dtype=None, of=scores), const(value=c, dtype=d), of=scores)
    neg_inf = const(value=float("-inf"), dtype=d)
    if masked == "additive":
        x = t.add(x, mask, of=scores)
    elif masked == "bool":
        x = t.where(mask, x, neg_inf, of=scores)
    if causal != "none":
        keys = Expr(f"(vec-of (vec-get q_s {rank - 2}) (vec-get k_s {rank - 2}))")
        ones = t.full(shape=keys, value=True, dtype="bool", of=(keys, "bool"))
        keep = t.tril(ones, k=0, of=(keys, "bool"))
        if causal == "window":
            keep = t.logical_and(keep, t.logical_not(t.tril(ones, k=Expr("(- 0 win)"), of=(keys, "bool")),
                                                     of=(keys, "bool")), of=(keys, "bool"))
        x = t.where(keep, x, neg_inf, of=scores)
    return t.matmul(t.softmax(x, axis=rank - 1, of=scores), v, accum_dtype=None, of=T)


def _repeated_heads(x: Expr) -> Expr:
    """x [B, Hkv, S, D] with each head repeated g times: [B, Hkv·g, S, D] (Q's heads)."""
    dims = [f"(vec-get {x.text}_s {i})" for i in range(4)]
    one, spread, whole = (Expr(f"(vec-of {' '.join(v)})") for v in (
        (dims[0], dims[1], "1", dims[2], dims[3]), (dims[0], dims[1], "g", dims[2], dims[3]),
        (dims[0], "(vec-get q_s 1)", dims[2], dims[3])))
    return t.reshape(t.broadcast_to(t.reshape(x, shape=one, of=(one, d)), shape=spread, of=(spread, d)),
                     shape=whole, of=(whole, d))


def _gqa_rules():
    """flash(Q, K, V) with K and V of fewer heads = flash(Q, repeat_heads(K), repeat_heads(V))."""
    scores = "(* (* (* (vec-get q_s 0) (vec-get q_s 1)) (vec-get q_s 2)) (vec-get k_s 2))"
    facts = ("(= q_s (shp q))", "(= k_s (shp k))", "(= v_s (shp v))",
             *(f"(= (vec-length {x}_s) 4)" for x in ("q", "k", "v")), "(= (vec-get v_s 1) (vec-get k_s 1))",
             "(= (vec-get v_s 2) (vec-get k_s 2))", "(= (vec-get k_s 0) (vec-get q_s 0))",
             "(= (vec-get v_s 0) (vec-get q_s 0))", "(< (vec-get k_s 1) (vec-get q_s 1))",
             "(= (% (vec-get q_s 1) (vec-get k_s 1)) 0)", "(= g (/ (vec-get q_s 1) (vec-get k_s 1)))",
             *(f"(= (dt {x}) d)" for x in ("q", "k", "v")), NOT_FLOAT64,
             f"(<= {scores} {UNFUSED_SCORES_LIMIT})")
    for masked in (False, True):
        extra = (mask,) if masked else ()
        flags = dict(scale=c, causal=Expr("causal"), has_mask=masked, window=Expr("win"), of=T)
        yield Rule(f"flash-attention-repeat-kv-heads{'-masked' if masked else ''}",
                   "flash(Q, K, V) = flash(Q, repeat_heads(K), repeat_heads(V)) (GQA)",
                   lhs=t.flash_attention(q, k, v, *extra, **flags),
                   rhs=t.flash_attention(q, _repeated_heads(k), _repeated_heads(v), *extra, **flags), when=facts,
                   example=_gqa_example(masked))


def _gqa_example(masked: bool):
    def example(rng: np.random.Generator):
        dtype = EXAMPLE_DTYPE
        b, hkv, sq, sk, dh, dv = (int(n) for n in rng.integers(1, 5, size=6))
        g = int(rng.integers(2, 4))
        arrays = {"q": rand(rng, b, hkv * g, sq, dh, dtype=dtype.numpy), "k": rand(rng, b, hkv, sk, dh, dtype=dtype.numpy),
                  "v": rand(rng, b, hkv, sk, dv, dtype=dtype.numpy)}
        if not masked:
            return (lambda q, k, v: op.flash_attention(q, k, v, scale=0.3)), arrays
        arrays["mask"] = rand(rng, sq, sk, dtype=dtype.numpy)
        return (lambda q, k, v, mask: op.flash_attention(q, k, v, mask=mask, scale=0.3)), arrays
    return example


def _example(rank: int, masked: str, causal: str):
    def example(rng: np.random.Generator):
        dtype = EXAMPLE_DTYPE
        batch = tuple(int(n) for n in rng.integers(1, 4, size=rank - 2))
        sq, sk, dh, dv = (int(n) for n in rng.integers(1, 7, size=4))
        sk = max(sk, sq) if causal == "window" else sk      # every query's window holds its own key
        flags = dict(scale=0.3, causal=causal != "none", window=int(rng.integers(1, 4)) if causal == "window" else None)
        arrays = {n: rand(rng, *batch, rows, cols, dtype=dtype.numpy)
                  for n, rows, cols in (("q", sq, dh), ("k", sk, dh), ("v", sk, dv))}
        if masked == "none":
            return (lambda q, k, v: op.flash_attention(q, k, v, **flags)), arrays
        # every row keeps its first key and its own, so no row is fully masked (that row is NaN on
        # both sides), under a window too
        values = rand(rng, sq, sk, dtype=dtype.numpy)
        kept = (values > 0) | (np.arange(sk) == 0) | (np.arange(sk) == np.arange(sq)[:, None])
        arrays["mask"] = values if masked == "additive" else kept
        return (lambda q, k, v, mask: op.flash_attention(q, k, v, mask=mask, **flags)), arrays
    return example


def _rules():
    for masked in MASKS:
        for causal in ("none", "causal", "window"):
            for rank in RANKS:
                extra = () if masked == "none" else (mask,)
                name = "-".join(["flash-attention-unfused", *(() if causal == "none" else (causal,)),
                                 *(() if masked == "none" else (f"{masked}-mask",)), f"{rank}d"])
                window = Expr("win") if causal == "window" else 0
                yield Rule(name, f"flash_attention(Q, K, V{', M' if extra else ''}) = softmax(c·Q Kᵀ"
                                 f"{' masked' if extra or causal != 'none' else ''}) V",
                           lhs=t.flash_attention(q, k, v, *extra, scale=c, causal=causal != "none",
                                                 has_mask=bool(extra), window=window, of=T),
                           rhs=_unfused(rank, masked, causal),
                           when=_facts(rank, masked) + (("(> win 0)",) if causal == "window" else ()),
                           example=_example(rank, masked, causal))


RULES = tuple(_rules()) + tuple(_gqa_rules())
