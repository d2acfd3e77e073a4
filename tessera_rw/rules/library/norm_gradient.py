"""A layer norm's or RMS norm's input gradient as one fused node: part of the `gradient` ruleset.

Reverse mode writes dx of y = norm(x)·w + b as (algebra.ops.reduction.norm_input_grad)

    layernorm:  dx = r (gw − mean(gw) − x̂ mean(gw x̂)),  x̂ = (x − mean(x)) r,  r = rsqrt(mean((x − mean(x))²) + eps)
    rmsnorm:    dx = r (gw − x̂ mean(gw x̂)),             x̂ = x r,              r = rsqrt(mean(x²) + eps)

some ten ops and five passes over the row (g w without a weight is g). The rules read it as

    dx = norm_backward(x, g, [w]; norm, axes, eps, has_weight)

one row kernel that recomputes the statistics from x in registers; a residual branch's cotangent
added to dx (x + f(norm(x)), a pre-norm block) is added as dx is written. The left-hand sides are traced
from norm_input_grad itself, so what reverse mode builds (or a derivative written the same way) is
what they match. They take the last axis, the normalized row of a transformer's hidden states.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.ops.reduction import norm_input_grad
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, g, w, ax, eps, s, d = t.vars("x g w ax eps s d")
T = (s, d)
EPS = 1e-5
# x of shape s and dtype d normalized over its last axis with eps >= 0, g its cotangent, w (if any)
# the weight of the row
LAST = "(- (vec-length s) 1)"
FACTS = ("(= (shp x) s)", "(= (dt x) d)", "(= (shp g) s)", "(= (dt g) d)", f"(= ax (vec-of {LAST}))", "(>= eps 0.0)")
WEIGHT_FACTS = ("(= (dt w) d)", f"(= (shp w) (vec-of (vec-get s {LAST})))")


def _pattern(norm: str, weighted: bool) -> Expr:
    """norm_input_grad's dx over the axes `ax`, with eps the variable `eps`, as a term."""
    def mean(term: Expr) -> Expr:
        return t.mean(term, axes=ax, keepdims=True)

    gxhat = t.mul(g, w) if weighted else g
    if norm == "layernorm":
        centered = t.sub(x, mean(x))
        rstd = t.rsqrt(t.add(mean(t.mul(centered, centered)), t.constant(value=eps, dtype=d)))
        xhat = t.mul(centered, rstd)
        inner = t.sub(t.sub(gxhat, mean(gxhat)), t.mul(xhat, mean(t.mul(gxhat, xhat))))
    else:
        rstd = t.rsqrt(t.add(mean(t.mul(x, x)), t.constant(value=eps, dtype=d)))
        inner = t.sub(gxhat, t.mul(t.mul(x, rstd), mean(t.mul(gxhat, t.mul(x, rstd)))))
    return t.mul(rstd, inner, of=T)


def _example(norm: str, weighted: bool):
    def example(rng: np.random.Generator):
        rows, n = (int(v) for v in rng.integers(1, 9, size=2))
        inputs = {"x": rand(rng, rows, n + 1), "g": rand(rng, rows, n + 1)}
        if weighted:
            inputs["w"] = rand(rng, n + 1)
        def dx(x, g, w=None):
            return norm_input_grad(g * w if weighted else g, x, norm=norm, axes=(1,), eps=EPS)[0]
        return dx, inputs
    return example


def _rules():
    for norm in ("layernorm", "rmsnorm"):
        for weighted in (True, False):
            operands = (x, g, w) if weighted else (x, g)
            yield Rule(f"{norm}-input-grad{'' if weighted else '-unweighted'}",
                       f"{norm}'s dx from x and g in one pass per row = norm_backward(x, g{', w' if weighted else ''})",
                       lhs=_pattern(norm, weighted),
                       rhs=t.norm_backward(*operands, norm=norm, axes=ax, eps=eps, has_weight=weighted,
                                           has_residual=False, of=T),
                       when=FACTS + (WEIGHT_FACTS if weighted else ()),
                       example=_example(norm, weighted))


def _residual_example(first: bool, weighted: bool):
    """A pre-norm block's x: its cotangent is the norm's dx plus the residual branch's, r."""
    layer_norm = _example("layernorm", weighted)

    def example(rng: np.random.Generator):
        dx, inputs = layer_norm(rng)
        inputs["r"] = rand(rng, *inputs["x"].shape)
        def total(x, g, r, w=None):
            return r + dx(x, g, w) if first else dx(x, g, w) + r
        return total, inputs
    return example


def _residual_rules():
    """dx + r = norm_backward(…, r): the add happens as dx is written, not in a pass of its own."""
    for weighted in (True, False):
        operands = (x, g, w) if weighted else (x, g)
        flags = dict(norm=Expr("nm"), axes=ax, eps=eps, has_weight=weighted)
        fused = t.norm_backward(*operands, **flags, has_residual=False, of=T)
        for first in (False, True):
            yield Rule(f"residual-into-norm-input-grad{'' if weighted else '-unweighted'}{'-first' if first else ''}",
                       "r + norm_backward(x, g) = norm_backward(x, g, r)" if first else
                       "norm_backward(x, g) + r = norm_backward(x, g, r)",
                       lhs=t.add(Expr("r"), fused, of=T) if first else t.add(fused, Expr("r"), of=T),
                       rhs=t.norm_backward(*operands, Expr("r"), **flags, has_residual=True, of=T),
                       when=("(= (shp r) s)", "(= (dt r) d)"),
                       example=_residual_example(first, weighted),
                       needs=(f"layernorm-input-grad{'' if weighted else '-unweighted'}",))


RULES = tuple(_rules()) + tuple(_residual_rules())
