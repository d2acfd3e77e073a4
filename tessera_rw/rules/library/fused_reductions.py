"""A reduction absorbs the elementwise expression it reduces (part of the `epilogue` ruleset):
sum / mean / max / min / logsumexp of a `fused_elementwise` node becomes one `fused_reduction`, which computes
the expression as it reads its inputs, so nothing the size of the expression is written and read
back. A layer norm's backward reduces such expressions over each row (Σ dy·w, Σ dy·w·x̂) and over
the rows (Σ dy·x̂ for the weight's gradient); a loss reduces its elementwise terms.

A sum or mean of a `fused_normalization` over the axes it normalizes becomes a
`reduced_normalization`: each row is added up as it is normalized, so a cross-entropy,
sum(log_softmax(logits) * labels, -1), reads the logits once and writes one value per row.

Where the expression has other users the e-graph keeps both forms, and extraction weighs writing
it once against computing it again in the reduction.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_INPUTS
from tessera_rw.algebra.ops.fused_reduction import REDUCES
from tessera_rw.algebra.ops.reduced_norm import ROW_REDUCES
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.library.fusion import ALL_FUSION_RULE_NAMES, FUSION_RULES, expression_over, with_parameters
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
s, d, e_in, ax, kd = t.vars("s d e_in ax kd")
T = (s, d)


def _example(reduce: str, n: int):
    """reduce(tree(x0..x{n-1})) over one axis of random operands, a row vector among them."""
    def example(rng: np.random.Generator):
        rows, width = (int(v) for v in rng.integers(1, 6, size=2))
        names = [f"x{i}" for i in range(n)]
        inputs = {nm: rand(rng, rows, width) if i != 1 else rand(rng, rows, 1) for i, nm in enumerate(names)}
        axis = 1 if reduce == "logsumexp" else int(rng.integers(0, 2))   # one op over the trailing axis

        def body(*args):
            return getattr(op, reduce)(expression_over(list(args)), axis=axis, keepdims=bool(rows % 2))
        return with_parameters(body, names), inputs
    return example


def _rules():
    for n in range(1, MAX_FUSED_INPUTS + 1):
        xs = t.vars(" ".join(f"x{i}" for i in range(n)))
        for reduce in REDUCES:
            yield Rule(f"{reduce}-of-fused-{n}", f"{reduce}(f(…)) = fused_reduction(…; f, {reduce})",
                       lhs=t.term(reduce, t.fused_elementwise(*xs, expr=e_in), axes=ax, keepdims=kd, of=T),
                       rhs=t.fused_reduction(*xs, expr=e_in, reduce=reduce, axes=ax, keepdims=kd, of=T),
                       example=_example(reduce, n), needs=ALL_FUSION_RULE_NAMES)


REDUCTION_FUSION_RULES = tuple(_rules())


def _row_sum_example(reduce: str, n: int, rank: int = 2, every_axis: bool = False):
    """reduce(post(log_softmax(prologue(…)), …)) over the rows' axis (or, `every_axis`, over all),
    with n inputs in all: a prologue over max(1, n - 3) of them and an epilogue over the rest (for
    three, a layer norm with its weight and bias instead)."""
    params = 2 if n == 3 else 0
    before = max(1, n - 3 - params)

    def example(rng: np.random.Generator):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=rank))
        names = [f"x{i}" for i in range(n - params)] + ["w", "c"][:params]
        inputs = {nm: rand(rng, *shape) if i < n - params else rand(rng, shape[-1]) for i, nm in enumerate(names)}

        def body(*args):
            row = expression_over(list(args[:before]))
            normed = op.layernorm(row, *args[n - params:]) if params else op.log_softmax(row, axis=-1)
            after = list(args[before:n - params])
            rows = expression_over([normed] + after) if after else normed
            if every_axis:
                return getattr(op, reduce)(rows)
            return getattr(op, reduce)(rows, axis=-1, keepdims=n % 2 == 0)
        return with_parameters(body, names), inputs
    return example


# a fused_normalization's operands: up to MAX_FUSED_INPUTS prologue inputs, weight and bias among
# them, and the epilogue's other MAX_FUSED_INPUTS - 1
MAX_NORMALIZATION_OPERANDS = 2 * MAX_FUSED_INPUTS - 1
# what a rule over a fused_normalization needs to meet one in its example: every fusion rule
NORMALIZATION_NEEDS = tuple(rule.name for rule in FUSION_RULES)


def _row_sum_rules():
    """reduce(fused_normalization(…), its own axes) = reduced_normalization(…; reduce)."""
    ax, eps, hw, hb, norm, post = t.vars("ax eps hw hb norm post")
    for n in range(1, MAX_NORMALIZATION_OPERANDS + 1):
        ys = t.vars(" ".join(f"y{j}" for j in range(n)))
        for reduce in ROW_REDUCES:
            normed = t.fused_normalization(*ys, expr=e_in, norm=norm, axes=ax, eps=eps, has_weight=hw, has_bias=hb,
                                           post=post)
            yield Rule(f"{reduce}-of-normalization-{n}", f"{reduce}(norm(…), its axes) = reduced_normalization(…)",
                       lhs=t.term(reduce, normed, axes=ax, keepdims=kd, of=T),
                       rhs=t.reduced_normalization(*ys, expr=e_in, norm=norm, axes=ax, eps=eps, has_weight=hw,
                                                   has_bias=hb, post=post, reduce=reduce, keepdims=kd, of=T),
                       example=_row_sum_example(reduce, n), needs=NORMALIZATION_NEEDS)


REDUCTION_FUSION_RULES = REDUCTION_FUSION_RULES + tuple(_row_sum_rules())


def _whole_sum_rules():
    """reduce(fused_normalization(…) over its last axis, every axis) = reduce(reduced_normalization(…;
    reduce), the rest): a loss summed over the whole batch, −Σ log_softmax(z) · y / B, reads the
    logits once as the row-wise mean of the rows' sums does (a sum over every axis is the sum of the
    rows' sums, a mean the mean of the rows' means)."""
    eps, hw, hb, norm, post, sn = t.vars("eps hw hb norm post sn")
    for rank in (2, 3):
        every, rest = (f"(vec-of {' '.join(map(str, range(n)))})" for n in (rank, rank - 1))
        for n in range(1, MAX_NORMALIZATION_OPERANDS + 1):
            ys = t.vars(" ".join(f"y{j}" for j in range(n)))
            attrs = dict(expr=e_in, norm=norm, axes=Expr(f"(vec-of {rank - 1})"), eps=eps, has_weight=hw,
                         has_bias=hb, post=post)
            for reduce in ROW_REDUCES:
                rows = t.reduced_normalization(*ys, **attrs, reduce=reduce, keepdims=False,
                                               of=(Expr("(vec-pop sn)"), d))
                yield Rule(f"{reduce}-of-every-axis-of-normalization-{rank}d-{n}",
                           f"{reduce}(norm(…)) over every axis = {reduce} of reduced_normalization(…)",
                           lhs=t.term(reduce, t.fused_normalization(*ys, **attrs, of=(sn, d)), axes=Expr(every),
                                      keepdims=False, of=T),
                           rhs=t.term(reduce, rows, axes=Expr(rest), keepdims=False, of=T),
                           when=(f"(= (vec-length sn) {rank})",), example=_row_sum_example(reduce, n, rank, True),
                           needs=NORMALIZATION_NEEDS)


REDUCTION_FUSION_RULES = REDUCTION_FUSION_RULES + tuple(_whole_sum_rules())
