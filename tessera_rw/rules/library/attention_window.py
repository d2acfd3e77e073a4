"""Sliding-window attention: a causal band given as a mask becomes flash_attention's `window` (part
of the `attention` ruleset).

    flash_attention(Q, K, V, tril(1) ∧ ¬tril(1, −W)) = flash_attention(Q, K, V, causal, window=W)
    flash_attention(Q, K, V, ¬tril(1, −W) ∧ tril(1)) = the same
    flash_attention(Q, K, V, ¬tril(1, −W), causal)   = the same                     (W ≥ 1)

The band keeps query i's keys i − W + 1 … i, aligned top-left as `causal` is (Mistral's sliding
window, after the window-fill rules made its finite fill −∞). The windowed kernel loads only the
key blocks that meet the band: the (Sq × Sk) mask, its five building kernels and every key block
outside the window are gone.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
q, kt, v, c, s, d, fs, k2 = t.vars("q kt v c s d fs k2")
T = (s, d)
ONES = t.full(shape=fs, value=True, dtype="bool")
CAUSAL = t.tril(ONES, k=0)
OUTSIDE = t.logical_not(t.tril(ONES, k=k2))           # keys more than W behind the query dropped
FORMS = {"band": (t.logical_and(CAUSAL, OUTSIDE), False), "band-swapped": (t.logical_and(OUTSIDE, CAUSAL), False),
         "causal-band": (OUTSIDE, True)}


def _example(form: str):
    """A flash attention masked by a random-width band in `form`, as many queries as keys or fewer
    (every query keeps its own key, so no row is empty)."""
    def example(rng: np.random.Generator):
        sq = int(rng.integers(1, 7))
        sk, width = sq + int(rng.integers(0, 3)), int(rng.integers(1, sq + 1))
        inputs = {"q": rand(rng, 2, sq, 3), "k": rand(rng, 2, sk, 3), "v": rand(rng, 2, sk, 4)}

        def body(q, k, v):
            ones = op.ones((sq, sk), "bool")
            tri, outside = op.tril(ones), ~op.tril(ones, -width)
            mask = {"band": tri & outside, "band-swapped": outside & tri, "causal-band": outside}[form]
            return op.flash_attention(q, k, v, mask=mask, scale=0.3, causal=form == "causal-band")
        return body, inputs
    return example


def _rules():
    for form, (mask, causal) in FORMS.items():
        shown = {"band": "tril(1) ∧ ¬tril(1, −W)", "band-swapped": "¬tril(1, −W) ∧ tril(1)",
                 "causal-band": "¬tril(1, −W), causal"}[form]
        yield Rule(f"window-from-{form}-mask", f"flash_attention(…, {shown}) = flash_attention(…, causal, window=W)",
                   lhs=t.flash_attention(q, kt, v, mask, scale=c, causal=causal, has_mask=True, window=0, of=T),
                   rhs=t.flash_attention(q, kt, v, scale=c, causal=True, has_mask=False, window=Expr("(- 0 k2)"),
                                         of=T),
                   when=("(= (vec-length fs) 2)", "(< k2 0)"), example=_example(form))


RULES = tuple(_rules())
