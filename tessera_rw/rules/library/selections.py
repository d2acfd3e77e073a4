"""Selections, `where(m, a, b)`, in fewer ops: part of the `algebra` ruleset.

Reverse mode writes a selection's cotangent as two selections, one per side, each scaled where the
forward scaled it: a smoothed loss's gradient is where(m, g, 0) + where(m, 0, g) · r over a class
mask m. As one selection of two constants, where(m, g, g·r), it is an expression of the mask's own
inputs that a reduction or a row kernel computes as it reads, never a tensor of the logits' size.
A selection broadcasts its values itself, so one spread to the condition's shape beforehand (the
VJP of a sum spreads its cotangent) need not be.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
m, y, z, s, d, s1, cd = t.vars("m y z s d s1 cd")
T = (s, d)


def const(value: str | float) -> Expr:
    """A scalar constant of the selection's dtype holding `value` (a pattern variable or a number)."""
    return t.constant(value=Expr(value) if isinstance(value, str) else value, dtype=cd, of=((), cd))


def _where_broadcast_example(position: int):
    """where(x > 0, …) with its value at `position` (1 or 2) a scalar or a row spread to x's shape."""
    def example(rng: np.random.Generator):
        x = rand(rng, 0, 0)
        y = rand(rng, *x.shape[int(rng.integers(1, 3)):])
        spread = (lambda x, y: op.broadcast_to(y, x.shape))

        def body(x, y, z):
            chosen = (spread(x, y), z) if position == 1 else (z, spread(x, y))
            return op.where(x > 0, *chosen)
        return body, {"x": x, "y": y, "z": rand(rng, *x.shape)}
    return example


def _where_broadcast_rules():
    """A selection broadcasts its values itself: one spread to the condition's shape beforehand (the
    VJP of a sum spreads its cotangent, and a selection of it is a loss's gradient) need not be."""
    yield Rule("broadcast-into-where-value", "where(m, broadcast_to(y, shape(m)), z) = where(m, y, z)",
               lhs=t.where(m, t.broadcast_to(y, shape=s1), z, of=T), rhs=t.where(m, y, z, of=T),
               when=("(= (shp m) s1)",), example=_where_broadcast_example(1))
    yield Rule("broadcast-into-where-otherwise", "where(m, y, broadcast_to(z, shape(m))) = where(m, y, z)",
               lhs=t.where(m, y, t.broadcast_to(z, shape=s1), of=T), rhs=t.where(m, y, z, of=T),
               when=("(= (shp m) s1)",), example=_where_broadcast_example(2))


def _scaled_example(rng: np.random.Generator):
    x = rand(rng, 0, 0)
    return (lambda x: op.where(x > 0.0, 0.25, -1.5) * 3.0 + x), {"x": x}


def _complementary_example(rng: np.random.Generator):
    x = rand(rng, 0, 0)
    selected = (lambda x, g: op.where(x > 0.0, g, 0.0) + op.where(x > 0.0, 0.0, g * 2.0))
    return selected, {"x": x, "g": rand(rng, *x.shape)}


RULES = (
    *_where_broadcast_rules(),
    Rule("selection-of-constants-scaled", "where(m, a, b) · r = where(m, a·r, b·r) for scalar constants a, b, r",
         lhs=t.mul(t.where(m, const("ca"), const("cb"), of=T), const("r"), of=T),
         rhs=t.where(m, const("(* ca r)"), const("(* cb r)"), of=T),
         when=("(= cd d)",), example=_scaled_example),
    Rule("complementary-selections-added", "where(m, y, 0) + where(m, 0, z) = where(m, y, z)",
         lhs=t.add(t.where(m, y, const(0.0), of=T), t.where(m, const(0.0), z, of=T), of=T),
         rhs=t.where(m, y, z, of=T),
         when=("(= cd d)", "(= (dt y) d)", "(= (dt z) d)"), example=_complementary_example),
)
