"""What a rule's author is told: a mistyped pattern op, a right-hand side left untyped, an example
that fails, and each rule's verdict (ok, unsound, unchecked)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.soundness import check_rule

t = TermBuilder()
x, s, d = t.vars("x s d")
EXAMPLE = lambda rng: (lambda x: x * op.sigmoid(x), {"x": rng.standard_normal((3, 4)).astype(np.float32)})  # noqa: E731


def test_a_misspelled_or_numpy_named_pattern_op_is_told_the_graph_name():
    with pytest.raises(AttributeError, match="pattern op 'sigmod' is not an op; did you mean 'sigmoid'"):
        t.sigmod(x)
    with pytest.raises(AttributeError, match="patterns use the graph's op names, here 'mul'"):
        t.multiply(x, x)
    with pytest.raises(AttributeError, match=r"'qqq_fused' is not an op: `tessera-rewrite rules --ops` lists the ops; "
                                             r"a plugin's own op .* TermBuilder\(extra_ops=\(its OpDef,\)\)"):
        t.qqq_fused(x)


def test_a_right_hand_side_term_without_its_type_is_refused_naming_the_rule():
    with pytest.raises(TesseraError, match="rule 'silu-fold': its right-hand side leaves 2 value.s. unset") as e:
        Rule("silu-fold", "x σ(x) = silu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=t.silu(x))
    assert "of=(shape, dtype)" in e.value.hint
    other = TermBuilder()                    # a right side from a second builder is caught too
    with pytest.raises(TesseraError, match="right-hand side leaves 2 value"):
        Rule("silu-fold", "x σ(x) = silu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=other.silu(x))


@pytest.mark.parametrize("rule, verdict, says", [
    (Rule("silu-fold", "x σ(x) = silu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=t.silu(x, of=(s, d)),
          example=EXAMPLE), "ok", ""),
    (Rule("relu-fold", "x σ(x) = relu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=t.relu(x, of=(s, d)),
          example=EXAMPLE), "unsound", "changes the result"),
    (Rule("no-example", "x σ(x) = silu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=t.silu(x, of=(s, d))),
     "unchecked", "no example"),
    (Rule("broken-example", "x σ(x) = silu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=t.silu(x, of=(s, d)),
          example=lambda rng: 1 / 0), "unchecked", "its example failed: ZeroDivisionError"),
    (Rule("exp-fold", "x σ(x) = silu(x)", lhs=t.exp(x, of=(s, d)), rhs=t.silu(x, of=(s, d)), example=EXAMPLE),
     "unchecked", "does not match its own example"),
])
def test_each_rule_gets_its_verdict_and_a_broken_one_stops_no_other(rule, verdict, says):
    result = check_rule(rule, Ruleset("authored", (rule,)), np.random.default_rng(0))
    assert result.verdict.value == verdict and says in result.detail
