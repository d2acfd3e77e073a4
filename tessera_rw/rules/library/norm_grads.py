"""A norm's weight and bias gradients summed in its input gradient's kernel: part of the
`gradient` ruleset.

Reverse mode writes a layer norm's weight and bias gradients as column sums over the rows,

    dW = Σ_rows g x̂        db = Σ_rows g

two more passes over x and g (x̂ = (x − μ) r needs the row statistics again: norm_stats.py reads
them off the input gradient's kernel, which still leaves one pass over x and g for dW and one
over g for db). The kernel computing dx has x̂ and g in registers, row by row: with `parts`
blocks each walking every parts-th row, it can keep each column's running sums too:

    packed = norm_backward_grads(x, g, w, [r]; parts)
    dx     = packed[:n] as x's shape
    dW     = Σ of the 2·parts rows packed[wa : wa + 2·parts·D]   (each part's value and its rounding,
    db     = Σ of the 2·parts rows packed[ba : ba + 2·parts·D]    rows of D; wa, ba aligned after n)

so x and g are read once for all three gradients, and dW and db each sum 2·parts·D values instead
of x's n; where both are taken, one reduce over the (2, 2·parts, D) view of the partials writes
them side by side (rows 0 and 1 of its result), one kernel instead of two. parts = min(rows,
PARTS): enough blocks to fill a GPU's SMs twice over, few enough that the partial sums stay small
beside x. The rules join on the input gradient (norm_backward of that x and g) being in the
e-graph, and dx's rule on dW being taken there; extraction switches the three to the packed node
together where that pays. It may not: short rows give a block little to load between its
block-wide sums, and few rows make the partial sums outweigh the pass they save (the cost model
prices both). Weighted norms of rank 2 and 3, with and without a residual, the last axis
normalized.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.api.dispatch import apply
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.library.norm_stats import (EPS, RANKS, aligned, facts, flags, input_grad, operands, part,
                                                 statistics)
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, g, d = t.vars("x g d")
E = Expr
PARTS = 256


def _parts_facts(rank: int) -> tuple[str, ...]:
    """facts(rank), with L the normalized length, p the parts, and the layout (grads_layout): Σ g x̂'s
    partials at wa, Σ g's at ba, each 2·p·L long."""
    return facts(rank) + ("(> nr 0)", f"(= L (vec-get s {rank - 1}))", f"(= p (min nr {PARTS}))",
                          f"(= wa {aligned('n')})",
                          f"(= ba (+ wa {aligned('(* 2 (* p L))')}))")


def _packed(norm: str, residual: bool) -> Expr:
    size = E("(vec-of (+ ba (* 2 (* p L))))")
    return t.norm_backward_grads(*operands(True, residual), **flags(norm, True, residual), parts=E("p"),
                                 of=(size, d))


def _xhat(norm: str) -> Expr:
    """x̂ as reverse mode spells it (reduction.norm_input_grad)."""
    if norm == "layernorm":
        mean, _, var_eps = statistics(norm)
        return t.mul(t.sub(x, mean), t.rsqrt(var_eps))
    _, square_eps = statistics(norm)
    return t.mul(x, t.rsqrt(square_eps))


def _over_rows(term: Expr, rank: int) -> Expr:
    """Σ over every axis but the last, as reverse mode sums a broadcast weight's cotangent."""
    lead = " ".join(str(i) for i in range(rank - 1))
    return t.sum(term, axes=E(f"(vec-of {lead})"), keepdims=False, of=(None, d))


def _partials_summed(packed: Expr, start: str) -> Expr:
    """The sum of the 2·p rows of partials at `start` in packed."""
    return t.sum(part(packed, start, f"(+ {start} (* 2 (* p L)))", "(vec-of (* 2 p) L)"), axes=E("(vec-of 0)"),
                 keepdims=False, of=(E("(vec-of L)"), d))


def _both_summed(packed: Expr, first: int) -> Expr:
    """Block `first` (0: Σ g x̂, 1: Σ g) of one sum over the partial rows of both: a (2, L) reduce
    of the (2, 2·p, L) view of packed's partials (next to each other where 2·p·L needs no gap),
    flat, then its `first` row."""
    partials = part(packed, "wa", "(+ ba (* 2 (* p L)))", "(vec-of 2 (* 2 p) L)")
    both = t.sum(partials, axes=E("(vec-of 1)"), keepdims=False, of=(E("(vec-of 2 L)"), d))
    flat = t.reshape(both, shape=E("(vec-of (* 2 L))"), of=(E("(vec-of (* 2 L))"), d))
    return part(flat, f"(* {first} L)", f"(* {first + 1} L)", "(vec-of L)")


def _example(norm: str, residual: bool, rank: int, width: int | None = None):
    """dx, dW and db of a random x of rank `rank` (rows of `width`, else 2 to 8)."""
    def body(x, g, w, r=None):
        axes = (x.ndim - 1,)
        dx = apply("norm_backward", (x, g, w, *((r,) if residual else ())), norm=norm, axes=axes, eps=EPS,
                   has_weight=True, has_residual=residual)

        def mean(term):
            return op.mean(term, axis=axes, keepdims=True)
        if norm == "layernorm":
            centered = x - mean(x)
            xhat = centered * op.rsqrt(mean(centered * centered) + EPS)
        else:
            xhat = x * op.rsqrt(mean(x * x) + EPS)
        lead = tuple(range(x.ndim - 1))
        return dx, op.sum(g * xhat, axis=lead), op.sum(g, axis=lead)

    def example(rng: np.random.Generator):
        shape = tuple(int(n) for n in rng.integers(1, 6, size=rank - 1)) + (width or int(rng.integers(2, 9)),)
        inputs = {"x": rand(rng, *shape), "g": rand(rng, *shape), "w": rand(rng, shape[-1])}
        if residual:
            inputs["r"] = rand(rng, *shape)
        return body, inputs
    return example


def _rules():
    for norm in ("layernorm", "rmsnorm"):
        for residual in (False, True):
            variant = "-residual" if residual else ""
            dx, packed = input_grad(norm, True, residual), _packed(norm, residual)
            for rank in RANKS:
                known, example = _parts_facts(rank), _example(norm, residual, rank)
                weight_grad = _over_rows(t.mul(g, _xhat(norm)), rank)
                yield Rule(f"{norm}-weight-grad-from-input-grad{variant}-{rank}d",
                           "Σ_rows g x̂ = the sum of norm_backward_grads(x, g, …)'s weight partials, where "
                           "norm_backward(x, g, …) is taken", lhs=weight_grad, rhs=_partials_summed(packed, "wa"),
                           when=known + (f"(= dx {dx})",), example=example)
                yield Rule(f"{norm}-bias-grad-from-input-grad{variant}-{rank}d",
                           "Σ_rows g = the sum of norm_backward_grads(x, g, …)'s bias partials, where "
                           "norm_backward(x, g, …) is taken", lhs=_over_rows(g, rank),
                           rhs=_partials_summed(packed, "ba"), when=known + (f"(= dx {dx})",), example=example)
                for first, (name, lhs) in enumerate((("weight", weight_grad), ("bias", _over_rows(g, rank)))):
                    yield Rule(f"{norm}-{name}-grad-from-both-sums{variant}-{rank}d",
                               f"Σ_rows {'g x̂' if first == 0 else 'g'} = row {first} of one sum over "
                               "norm_backward_grads(x, g, …)'s weight and bias partials, where "
                               "norm_backward(x, g, …) is taken", lhs=lhs, rhs=_both_summed(packed, first),
                               when=known + ("(= ba (+ wa (* 2 (* p L))))", f"(= dx {dx})"),
                               # rows of 8: the two blocks of partials meet with no gap between them
                               example=_example(norm, residual, rank, width=8))
                yield Rule(f"{norm}-input-grad-with-weight-grads{variant}-{rank}d",
                           "dx = the first part of norm_backward_grads(x, g, …), where Σ_rows g x̂ is taken",
                           lhs=dx, rhs=part(packed, "0", "n", "s"), when=known + (f"(= dw {weight_grad})",),
                           example=example)


RULES = tuple(_rules())
