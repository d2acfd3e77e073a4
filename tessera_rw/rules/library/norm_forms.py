"""Normalizations written out are the normalization ops: part of the `algebra` ruleset.

A layer norm or RMS norm spelled with means and a reciprocal square root over the last axis, and
scaled by a weight of the row's length (on either side),

    (x − mean(x)) · rsqrt(mean((x − mean(x))²) + eps) · w      (or / sqrt(…))   = layernorm(x, w, eps)
    x · rsqrt(mean(x²) + eps) · w                               (or / sqrt(…))   = rmsnorm(x, w, eps)

is the op itself, one row kernel that keeps the statistics in registers, where the written form is
a reduction for each statistic and a pass for the rest (a bias after it joins the row kernel as its
epilogue). x² may be written x ** 2 or x · x (the algebra ruleset's pow-two rule makes them one).

The weight is what tells a model's norm from the same terms in a gradient: reverse mode writes a
norm's x̂ = (x − μ) · rsqrt(…) too, and there it is a factor of products (Σ g·x̂, x̂ · mean(g·x̂)) that
the norm backward's packed kernels take; matched alone, it led extraction away from them.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.library.norm_stats import statistics
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, w, ax, eps, s, d = t.vars("x w ax eps s d")     # named as norm_stats names them
T = (s, d)
LAST = "(- (vec-length s) 1)"
FACTS = ("(= (shp x) s)", "(= (dt x) d)", f"(= ax (vec-of {LAST}))", "(>= eps 0.0)")
WEIGHT_FACTS = ("(= (dt w) d)", f"(= (shp w) (vec-of (vec-get s {LAST})))")
EPS = 1e-5


def _written(norm: str, spelling: str) -> Expr:
    """x̂ as written out: the statistics as norm_stats spells them (reverse mode's own terms)."""
    stats = statistics(norm)
    scaled, plus_eps = (t.sub(x, stats[0]) if norm == "layernorm" else x), stats[-1]
    if spelling == "rsqrt":
        return t.mul(scaled, t.rsqrt(plus_eps))
    return t.div(scaled, t.sqrt(plus_eps))


def _example(norm: str, spelling: str, weight_first: bool):
    """The norm written out over the last axis of a random x times a weight, the square spelled ** 2
    or x · x."""
    def example(rng: np.random.Generator):
        squared = (lambda v: v ** 2) if rng.integers(0, 2) else (lambda v: v * v)

        def body(x, w):
            scaled = x - op.mean(x, axis=-1, keepdims=True) if norm == "layernorm" else x
            square = op.mean(squared(scaled), axis=-1, keepdims=True) + EPS
            normed = scaled * op.rsqrt(square) if spelling == "rsqrt" else scaled / op.sqrt(square)
            return w * normed if weight_first else normed * w
        shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 3)))) + (int(rng.integers(2, 9)),)
        return body, {"x": rand(rng, *shape), "w": rand(rng, shape[-1])}
    return example


def _rules():
    for norm in ("layernorm", "rmsnorm"):
        for spelling in ("rsqrt", "sqrt"):
            for weight_first in (False, True):
                written = _written(norm, spelling)
                text = (f"{'(x − mean(x))' if norm == 'layernorm' else 'x'} "
                        f"{'· rsqrt(…)' if spelling == 'rsqrt' else '/ sqrt(…)'} of the mean square + eps")
                text = f"w · {text}" if weight_first else f"{text} · w"
                yield Rule(f"{norm}-written-out{'' if spelling == 'rsqrt' else '-over-sqrt'}"
                           f"{'-weight-first' if weight_first else ''}",
                           f"{text} = {norm}(x, w, eps)",
                           lhs=t.mul(w, written, of=T) if weight_first else t.mul(written, w, of=T),
                           rhs=t.term(norm, x, w, axes=ax, eps=eps, has_weight=True, has_bias=False, of=T),
                           when=FACTS + WEIGHT_FACTS, example=_example(norm, spelling, weight_first),
                           needs=("pow-two",))


RULES = tuple(_rules())
