"""The backward's row statistics read off the forward: part of the `gradient` ruleset.

attention_row_stats(Q, K, O, dO) computes each query row's logsumexp again from Q Kᵀ, a product as
large as the forward's first. Where O is flash_attention(Q, K, V) of the same flags, the forward
can write the logsumexp beside O instead (FlashAttention-2's forward does):

    fwd   = flash_attention_lse(Q, K, V)        O flat, then per row lse's high parts, remainders
    O     = fwd[:no] as O's shape
    stats = attention_row_stats_from_lse(fwd, dO)      (hi + lo, Σ_d dO ∘ O) per row, in float32

Both rules fire only where the row statistics of that forward exist (the O rule joins on them),
so an inference graph never sees flash_attention_lse. Extraction pays for flash_attention_lse once
when it switches O and the statistics to it together (the DAG pass's paired switch), which beats
the forward plus the statistics' second product whenever the e-graph has both. The rules come in
ranks 2..4, with and without a mask operand; the flags are the forward's, whatever they are.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.api.dispatch import apply
from tessera_rw.algebra.ops.attention_backward import STATS
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule
from tessera_rw.rules.tables import numel

t = TermBuilder()
q, k, v, g, m, c, cz, hm, os, d, sd = t.vars("q k v g m c cz hm os d sd")
E = Expr
RANKS = (2, 3, 4)
SCALE = 0.3


def _facts(rank: int) -> tuple[str, ...]:
    """O of shape os (rank `rank`) and dtype d, dO of that dtype too; no O's size, nr its rows, sd
    the statistics' dtype."""
    return (f"(= (vec-length os) {rank})", "(= (dt g) d)", f"(= no {numel('os', rank)})", f"(= nr (/ no (vec-get os {rank - 1})))",
            "(= sd (accum-float d))")


def _operands(masked: bool) -> tuple[Expr, ...]:
    return (q, k, v, m) if masked else (q, k, v)


FLAGS = dict(scale=c, causal=cz, has_mask=hm, window=E("win"))       # the forward's, matched and passed on


def _forward(masked: bool) -> Expr:
    return t.flash_attention(*_operands(masked), **FLAGS, of=(os, d))


def _stats(masked: bool) -> Expr:
    mask = (m,) if masked else ()
    return t.attention_row_stats(q, k, _forward(masked), g, *mask, **FLAGS)


def _packed(masked: bool) -> Expr:
    return t.flash_attention_lse(*_operands(masked), **FLAGS, of=(E("(vec-of (+ no (* 2 nr)))"), d))


def _part(masked: bool, start: str, stop: str, shape: str) -> Expr:
    """Elements [start, stop) of the packed forward, as `shape`."""
    flat = t.slice(_packed(masked), starts=E(f"(vec-of {start})"), stops=E(f"(vec-of {stop})"),
                   steps=E("(vec-of 1)"), of=(E(f"(vec-of (- {stop} {start}))"), d))
    return t.reshape(flat, shape=E(shape), of=(E(shape), d))


def _read_off(masked: bool, rank: int) -> Expr:
    """(hi + lo, Σ dO ∘ O) per row, off the packed forward."""
    return t.attention_row_stats_from_lse(_packed(masked), g, of=(E(f"(vec-set os {rank - 1} {STATS})"), sd))


def _example(masked: bool, causal: bool, rank: int):
    def body(q, k, v, g, mask=None):
        flags = dict(scale=SCALE, causal=causal, has_mask=masked)
        extra = (mask,) if masked else ()
        out = op.flash_attention(q, k, v, mask=mask, scale=SCALE, causal=causal)
        return out, apply("attention_row_stats", (q, k, out, g, *extra), **flags)

    def example(rng: np.random.Generator):
        batch = tuple(int(n) for n in rng.integers(1, 4, size=rank - 2))
        sq, sk, dh, dv = (int(n) for n in rng.integers(1, 7, size=4))
        sk = max(sk, sq) if causal else sk        # every causal row keeps a key
        inputs = {"q": rand(rng, *batch, sq, dh), "k": rand(rng, *batch, sk, dh), "v": rand(rng, *batch, sk, dv),
                  "g": rand(rng, *batch, sq, dv)}
        return body, inputs | ({"mask": rand(rng, sq, sk)} if masked else {})
    return example


def _rules():
    for masked in (False, True):
        name = "-masked" if masked else ""
        for rank in RANKS:
            example = _example(masked, not masked, rank)
            yield Rule(f"attention-output-from-lse{name}-{rank}d",
                       "O = the first part of flash_attention_lse(Q, K, V), where O's row statistics are taken",
                       lhs=_forward(masked), rhs=_part(masked, "0", "no", "os"),
                       when=_facts(rank) + (f"(= st {_stats(masked)})",), example=example)
            yield Rule(f"attention-row-stats-from-lse{name}-{rank}d",
                       "attention_row_stats(Q, K, O, dO) = (hi + lo, Σ dO ∘ O) of flash_attention_lse(Q, K, V)",
                       lhs=_stats(masked), rhs=_read_off(masked, rank), when=_facts(rank), example=example)


RULES = tuple(_rules())
