"""A reduction taken with and without keepdims is one kernel: part of the `algebra` ruleset.

`op.mean(x, -1)` beside `op.mean(x, -1, keepdims=True)` (a mean returned beside a variance that
centres x on it, a batch norm's statistics) reads x twice as written; the one without kept
dimensions is the other reshaped, a view. The rule fires only where both are in the program, so a
lone reduction adds nothing to the e-graph.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, axes, s, d, kept = t.vars("x axes s d kept")
T = (s, d)
REDUCES = ("sum", "mean", "max", "min", "logsumexp")


def _example(reduce: str):
    def example(rng: np.random.Generator):
        value = rand(rng, 0, 0) * 2.0
        axis = 1 if reduce == "logsumexp" else int(rng.integers(0, 2))   # its one op's axis: the last

        def both(x):
            fn = getattr(op, reduce)
            return fn(x, axis=axis) * 2.0, fn(x, axis=axis, keepdims=True) - x
        return both, {"x": value}
    return example


def _rule(reduce: str) -> Rule:
    twin = t.term(reduce, x, axes=axes, keepdims=True, of=(None, d))
    return Rule(f"{reduce}-without-kept-dims", f"{reduce}(x, axes) = reshape({reduce}(x, axes, keepdims))",
                lhs=t.term(reduce, x, axes=axes, keepdims=False, of=T),
                rhs=t.reshape(kept, shape=s, of=T),
                when=(f"(= kept {twin})",),
                example=_example(reduce))


RULES = tuple(_rule(reduce) for reduce in REDUCES)
