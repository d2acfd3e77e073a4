"""A norm's row statistics read off its input gradient's kernel: part of the `gradient` ruleset.

A layer norm's weight gradient Σ g x̂ needs x̂ = (x − μ) r again, so reverse mode's graph recomputes
the row statistics from x: μ = mean(x) and var = mean((x − μ)²) (an RMS norm's mean(x²)), two
more passes over x. norm_backward computes them anyway, in registers, for dx. Where they are
taken, it can write them beside dx instead:

    packed = norm_backward_stats(x, g, [w], [r])   dx flat, then per row μ, var, var + eps
    dx     = packed[:n] as x's shape                  (an RMS norm: mean(x²), mean(x²) + eps)
    μ      = packed[a : a + rows] as (rows…, 1)       a = n rounded up to a multiple of SECTION
    var    = packed[a + b : a + b + rows]             b = rows rounded up likewise
    var + eps at a + 2 b

A statistic is there both with and without eps because fusion may have put the add into the
weight gradient's kernel or left it out. The dx rule joins on the first statistic being in the
e-graph, and each statistic's rule on the norm_backward of that x being there. Reverse mode's own
spelling of dx holds mean(x), so every norm backward gets the packed node proposed; extraction
takes it only where something beyond dx reads a statistic: it switches dx and the statistics to
it together (the DAG pass's paired and group switches), which pays for the packed kernel once
and drops the statistics' own passes. Ranks 2 and 3 (tokens × hidden, batch × tokens × hidden),
with and without a weight and a residual, the last axis normalized.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.api.dispatch import apply
from tessera_rw.algebra.ops.norm_backward import SECTION
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule
from tessera_rw.rules.tables import numel

t = TermBuilder()
x, g, w, r, ax, eps, s, d = t.vars("x g w r ax eps s d")
E = Expr
RANKS = (2, 3)
EPS = 1e-5
STATISTICS = {"layernorm": ("mean", "variance", "variance-eps"), "rmsnorm": ("mean-square", "mean-square-eps")}


def aligned(v: str) -> str:
    """`v` rounded up to a multiple of SECTION, as egglog arithmetic (norm_backward._aligned)."""
    return f"(* (/ (+ {v} {SECTION - 1}) {SECTION}) {SECTION})"


def facts(rank: int) -> tuple[str, ...]:
    """x of shape s (rank `rank`) and dtype d, normalized over its last axis; n its size, nr its rows."""
    last = rank - 1
    return ("(= (shp x) s)", "(= (dt x) d)", f"(= (vec-length s) {rank})", f"(= ax (vec-of {last}))",
            "(>= eps 0.0)", f"(= n {numel('s', rank)})", f"(= nr (/ n (vec-get s {last})))")


def operands(weighted: bool, residual: bool) -> tuple[Expr, ...]:
    return (x, g) + ((w,) if weighted else ()) + ((r,) if residual else ())


def flags(norm: str, weighted: bool, residual: bool) -> dict:
    return dict(norm=norm, axes=ax, eps=eps, has_weight=weighted, has_residual=residual)


def input_grad(norm: str, weighted: bool, residual: bool) -> Expr:
    return t.norm_backward(*operands(weighted, residual), **flags(norm, weighted, residual), of=(s, d))


def _packed(norm: str, weighted: bool, residual: bool) -> Expr:
    size = E(f"(vec-of (+ sa (+ (* {len(STATISTICS[norm]) - 1} ra) nr)))")
    return t.norm_backward_stats(*operands(weighted, residual), **flags(norm, weighted, residual), of=(size, d))


def statistics(norm: str) -> tuple[Expr, ...]:
    """The statistics as reverse mode spells them (reduction.norm_input_grad), in packed order."""
    def mean(term: Expr) -> Expr:
        return t.mean(term, axes=ax, keepdims=True)

    def plus_eps(term: Expr) -> Expr:
        return t.add(term, t.constant(value=eps, dtype=d))
    if norm == "layernorm":
        centered = t.sub(x, mean(x))
        variance = mean(t.mul(centered, centered))
        return mean(x), variance, plus_eps(variance)
    square = mean(t.mul(x, x))
    return square, plus_eps(square)


def part(packed: Expr, start: str, stop: str, shape: str) -> Expr:
    """Elements [start, stop) of `packed`, as `shape`."""
    flat = t.slice(packed, starts=E(f"(vec-of {start})"), stops=E(f"(vec-of {stop})"), steps=E("(vec-of 1)"),
                   of=(E(f"(vec-of (- {stop} {start}))"), d))
    return t.reshape(flat, shape=E(shape), of=(E(shape), d))


def _example(norm: str, weighted: bool, residual: bool, rank: int):
    def body(x, g, w=None, r=None):
        axes = (x.ndim - 1,)
        extra = ((w,) if weighted else ()) + ((r,) if residual else ())
        dx = apply("norm_backward", (x, g, *extra), norm=norm, axes=axes, eps=EPS, has_weight=weighted,
                   has_residual=residual)

        def mean(term):
            return op.mean(term, axis=axes, keepdims=True)
        if norm == "layernorm":
            centered = x - mean(x)
            return dx, mean(x), mean(centered * centered), mean(centered * centered) + EPS
        return dx, mean(x * x), mean(x * x) + EPS

    def example(rng: np.random.Generator):
        shape = tuple(int(n) for n in rng.integers(1, 6, size=rank - 1)) + (int(rng.integers(2, 9)),)
        inputs = {"x": rand(rng, *shape), "g": rand(rng, *shape)}
        if weighted:
            inputs["w"] = rand(rng, shape[-1])
        if residual:
            inputs["r"] = rand(rng, *shape)
        return body, inputs
    return example


def _rules():
    for norm, names in STATISTICS.items():
        for weighted in (True, False):
            for residual in (False, True):
                variant = ("" if weighted else "-unweighted") + ("-residual" if residual else "")
                dx, packed, stats = input_grad(norm, weighted, residual), _packed(norm, weighted, residual), \
                    statistics(norm)
                for rank in RANKS:
                    known = facts(rank) + (f"(= sa {aligned('n')})", f"(= ra {aligned('nr')})")
                    example = _example(norm, weighted, residual, rank)
                    yield Rule(f"{norm}-input-grad-with-stats{variant}-{rank}d",
                               "dx = the first part of norm_backward_stats(x, g, …), where x's row statistics "
                               "are taken", lhs=dx, rhs=part(packed, "0", "n", "s"),
                               when=known + (f"(= st {stats[0]})",), example=example)
                    for i, (name, stat) in enumerate(zip(names, stats)):
                        yield Rule(f"{norm}-{name}-from-input-grad{variant}-{rank}d",
                                   f"{name} of x's rows = part {i + 1} of norm_backward_stats(x, g, …), where "
                                   "norm_backward(x, g, …) is taken", lhs=stat,
                                   rhs=part(packed, f"(+ sa (* {i} ra))", f"(+ (+ sa (* {i} ra)) nr)",
                                             f"(vec-set s {rank - 1} 1)"),
                                   when=known + (f"(= dx {dx})",), example=example)


RULES = tuple(_rules())
