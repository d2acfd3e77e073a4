"""A rewrite declares only the rules that can fire on its graph where they are few
(tessera_rw/rules/relevance.py): the e-graph it saturates to, and the matches it reports, are those
of a rewrite with every rule declared."""

import pytest

from tessera_rw import op
from tessera_rw.rules import saturate
from tessera_rw.rules.encode import encode
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.relevance import can_fire
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.saturate import LAYERED_RULES, rewrite

t = TermBuilder()
x, s, d = t.vars("x s d")
EXP_LOG = Rule("exp-log", "exp(log x) = x", lhs=t.exp(t.log(x, of=(s, d)), of=(s, d)), rhs=x)
LOG_EXP = Rule("log-exp-back", "x = log(exp x)", lhs=t.tanh(x, of=(s, d)),
               rhs=t.tanh(t.log(t.exp(x, of=(s, d)), of=(s, d)), of=(s, d)))
NEG_NEG = Rule("neg-neg", "--x = x", lhs=t.neg(t.neg(x, of=(s, d)), of=(s, d)), rhs=x)


def names(rulesets):
    return [r.name for rs in rulesets for r in rs.rules]


def test_a_rule_fires_where_the_graph_or_a_rule_that_fires_builds_each_op_it_matches():
    rules = Ruleset("r", (EXP_LOG, LOG_EXP, NEG_NEG))
    assert names(can_fire((rules,), {("exp", 1)})) == []
    assert names(can_fire((rules,), {("exp", 1), ("log", 1)})) == ["exp-log"]
    # tanh's rule builds log and exp, which exp-log matches: listed after it, found all the same
    assert names(can_fire((rules,), {("tanh", 1)})) == ["exp-log", "log-exp-back"]
    assert can_fire((rules, Ruleset("none", (NEG_NEG,))), {("tanh", 1)})[-1].name == "r"    # an empty one goes


def test_a_ruleset_with_facts_of_its_own_keeps_every_rule():
    rules = Ruleset("declares", (NEG_NEG,), facts="(function scale (T) f64 :merge new)")
    assert names(can_fire((rules,), {("exp", 1)})) == ["neg-neg"]


GRAPHS = {
    "a transpose": (lambda a: op.transpose(a), [(4, 6)]),
    "a scaled exp": (lambda a: op.exp(a) * 2.0 + 1.0, [(4, 6)]),
    "a relu of a product": (lambda a, b: op.relu(a @ b), [(8, 16), (16, 32)]),
    "a sum of squares": (lambda a: op.sum(a * a, axis=-1), [(8, 16)]),
    "a leaky relu": (lambda a: op.where(a > 0, a, a * 0.1), [(8, 16)]),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_a_rewrite_over_the_rules_that_can_fire_is_the_rewrite_over_them_all(name, monkeypatch):
    fn, shapes = GRAPHS[name]
    graph = op.kernel(fn).trace(*(op.tensor(shape, "bfloat16") for shape in shapes))
    assert 0 < sum(len(rs.rules) for rs in can_fire(BUILTIN_RULESETS, encode(graph).constructors)) <= LAYERED_RULES
    few = rewrite(graph, BUILTIN_RULESETS)
    monkeypatch.setattr(saturate, "LAYERED_RULES", -1)         # every rule declared, as before
    every = rewrite(graph, BUILTIN_RULESETS)
    assert sorted(few.report.matches.items()) == sorted(every.report.matches.items())
    assert len(few.report.matches) == sum(len(rs.rules) for rs in BUILTIN_RULESETS)
    assert few.report.stop_reason == every.report.stop_reason

    def enodes(result):
        return sorted((e.op, e.attrs, len(e.operands)) for es in result.view.classes.values() for e in es)
    assert len(few.view.classes) == len(every.view.classes) and enodes(few) == enodes(every)
