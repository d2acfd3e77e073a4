"""Sliding-window attention: a causal band given as a mask becomes the attention ops' `window`
(part of the `attention` ruleset), for the forward and the backward ops alike.

    op(…, tril(1) ∧ ¬tril(1, −W)) = op(…, causal, window=W)        (W ≥ 1)
    op(…, ¬tril(1, −W) ∧ tril(1)) = the same
    op(…, ¬tril(1, −W), causal)   = the same

The band keeps query i's keys i − W + 1 … i, aligned top-left as `causal` is (Mistral's sliding
window, after the window-fill rules made its finite fill −∞; a windowed op.flash_attention's
gradient, whose reverse mode spells the band out). The windowed kernels load only the key blocks
that meet the band: the (Sq × Sk) mask, its five building kernels and every key block outside the
window are gone.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
c, s, d, fs, k2 = t.vars("c s d fs k2")
T = (s, d)
ONES = t.full(shape=fs, value=True, dtype="bool")
CAUSAL = t.tril(ONES, k=0)
OUTSIDE = t.logical_not(t.tril(ONES, k=k2))           # keys more than W behind the query dropped
FORMS = {"band": (t.logical_and(CAUSAL, OUTSIDE), False), "band-swapped": (t.logical_and(OUTSIDE, CAUSAL), False),
         "causal-band": (OUTSIDE, True)}
SHOWN = {"band": "tril(1) ∧ ¬tril(1, −W)", "band-swapped": "¬tril(1, −W) ∧ tril(1)",
         "causal-band": "¬tril(1, −W), causal"}


def _band(form: str, sq: int, sk: int, width: int):
    ones = op.ones((sq, sk), "bool")
    tri, outside = op.tril(ones), ~op.tril(ones, -width)
    return {"band": tri & outside, "band-swapped": outside & tri, "causal-band": outside}[form]


def _example(form: str, family: Callable):
    """`family(rng, mask_of, causal)`'s forward and backward attention masked by a random-width band
    in `form`, with as many queries as keys or fewer (every query keeps its own key, so no row is
    empty)."""
    def example(rng: np.random.Generator):
        width = int(rng.integers(1, 8))
        body, inputs = family(rng, lambda mask: _band(form, *mask.shape[-2:], width), form == "causal-band")
        sk = inputs["k"].shape[-2]
        rows = {"q": np.s_[..., :sk, :], "g": np.s_[..., :sk, :], "mask": np.s_[..., :sk, :]}
        return body, {name: x[rows[name]] if name in rows else x for name, x in inputs.items()}
    return example


def window_rules(family: dict[str, tuple[Expr, ...]], family_example: Callable):
    """The rules for each op of `family` (its name: the operands before its mask), their examples
    the programs `family_example(rng, mask_of, causal)` builds."""
    for name, operands in family.items():
        term = getattr(t, name)
        suffix = "" if name == "flash_attention" else f"-{name.replace('_', '-')}"
        for form, (mask, causal) in FORMS.items():
            yield Rule(f"window-from-{form}-mask{suffix}",
                       f"{name}(…, {SHOWN[form]}) = {name}(…, causal, window=W)",
                       lhs=term(*operands, mask, scale=c, causal=causal, has_mask=True, window=0, of=T),
                       rhs=term(*operands, scale=c, causal=True, has_mask=False, window=Expr("(- 0 k2)"), of=T),
                       when=("(= (vec-length fs) 2)", "(< k2 0)"), example=_example(form, family_example))
