"""A reduction absorbs the elementwise expression it reduces (part of the `epilogue` ruleset):
sum / mean / max / min of a `fused_elementwise` node becomes one `fused_reduction`, which computes
the expression as it reads its inputs, so nothing the size of the expression is written and read
back. A layer norm's backward reduces such expressions over each row (Σ dy·w, Σ dy·w·x̂) and over
the rows (Σ dy·x̂ for the weight's gradient); a loss reduces its elementwise terms.

Where the expression has other users the e-graph keeps both forms, and extraction weighs writing
it once against computing it again in the reduction.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_INPUTS
from tessera_rw.algebra.ops.fused_reduction import REDUCES
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.library.fusion import ALL_FUSION_RULE_NAMES, expression_over, with_parameters
from tessera_rw.rules.pattern import TermBuilder
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
        axis = int(rng.integers(0, 2))

        def body(*args):
            return getattr(op, reduce)(expression_over(list(args)), axis=axis, keepdims=bool(axis))
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
