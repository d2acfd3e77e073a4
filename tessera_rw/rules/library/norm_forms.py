"""Normalizations written out are the normalization ops: part of the `algebra` ruleset.

A layer norm or RMS norm spelled with means and a reciprocal square root, over the last axis,

    (x − mean(x)) · rsqrt(mean((x − mean(x))²) + eps)      (or / sqrt(…))   = layernorm(x, eps)
    x · rsqrt(mean(x²) + eps)                               (or / sqrt(…))   = rmsnorm(x, eps)

is the op itself, one row kernel that keeps the statistics in registers, where the written form is
a reduction for each statistic and a pass for the rest (a weight and bias after it join the row
kernel as its epilogue). x² may be written x ** 2 or x · x (the algebra ruleset's pow-two rule
makes them one).
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, ax, eps, s, d = t.vars("x ax eps s d")
T = (s, d)
LAST = "(- (vec-length s) 1)"
FACTS = ("(= (shp x) s)", "(= (dt x) d)", f"(= ax (vec-of {LAST}))", "(>= eps 0.0)")
EPS = 1e-5


def _mean(term: Expr) -> Expr:
    return t.mean(term, axes=ax, keepdims=True)


def _statistic(norm: str) -> tuple[Expr, Expr]:
    """(what the norm scales, the mean square it divides by the root of): (x − μ, its variance) or
    (x, the mean of x²)."""
    if norm == "layernorm":
        centered = t.sub(x, _mean(x))
        return centered, _mean(t.mul(centered, centered))
    return x, _mean(t.mul(x, x))


def _written(norm: str, spelling: str) -> Expr:
    scaled, square = _statistic(norm)
    plus_eps = t.add(square, t.constant(value=eps, dtype=d))
    if spelling == "rsqrt":
        return t.mul(scaled, t.rsqrt(plus_eps), of=T)
    return t.div(scaled, t.sqrt(plus_eps), of=T)


def _example(norm: str, spelling: str):
    """The norm written out over the last axis of a random x, the square spelled ** 2 or x · x."""
    def example(rng: np.random.Generator):
        squared = (lambda v: v ** 2) if rng.integers(0, 2) else (lambda v: v * v)

        def body(x):
            scaled = x - op.mean(x, axis=-1, keepdims=True) if norm == "layernorm" else x
            square = op.mean(squared(scaled), axis=-1, keepdims=True) + EPS
            return scaled * op.rsqrt(square) if spelling == "rsqrt" else scaled / op.sqrt(square)
        shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 3)))) + (int(rng.integers(2, 9)),)
        return body, {"x": rand(rng, *shape)}
    return example


def _rules():
    for norm in ("layernorm", "rmsnorm"):
        for spelling in ("rsqrt", "sqrt"):
            written = "· rsqrt(…)" if spelling == "rsqrt" else "/ sqrt(…)"
            scaled = "(x − mean(x))" if norm == "layernorm" else "x"
            yield Rule(f"{norm}-written-out{'' if spelling == 'rsqrt' else '-over-sqrt'}",
                       f"{scaled} {written} of the mean square + eps = {norm}(x, eps)",
                       lhs=_written(norm, spelling),
                       rhs=t.term(norm, x, axes=ax, eps=eps, has_weight=False, has_bias=False, of=T),
                       when=FACTS, example=_example(norm, spelling), needs=("pow-two",))


RULES = tuple(_rules())
