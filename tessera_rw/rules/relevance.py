"""The rules that can fire on a graph: a rule's left side (and the terms its `when` facts join
on) matches only where the e-graph holds a term of each op it names, and the e-graph holds the graph's ops and those the right sides of rules
that can fire build. Rules outside that closure never match, so a rewrite may leave them out of the
e-graph it saturates: a small graph then saturates over a few rules, whose e-graph is cheap to
declare and to copy, not the hundreds whose copying is most of its rewrite.

>>> from tessera_rw.rules.pattern import TermBuilder
>>> t = TermBuilder()
>>> x, s, d = t.vars("x s d")
>>> neg = Rule("neg-neg", "--x = x", lhs=t.neg(t.neg(x, of=(s, d)), of=(s, d)), rhs=x)
>>> exp_log = Rule("exp-log", "exp(log x) = x", lhs=t.exp(t.log(x, of=(s, d)), of=(s, d)), rhs=x)
>>> [r.name for rs in can_fire((Ruleset("r", (neg, exp_log)),), {("neg", 1)}) for r in rs.rules]
['neg-neg']
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import lru_cache
from typing import Iterable

from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.schema import constructor_name

_HEAD = re.compile(r"\(([A-Z][\w-]*)")      # a term's head: a rule's capitalized heads are op constructors


@lru_cache(maxsize=8192)
def _ops_of(rule: Rule) -> tuple[frozenset[str], frozenset[str]]:
    """(the op constructors its left side and its `when` terms name, those its right side builds)."""
    matched = " ".join((rule.lhs.text, *rule.when))
    return frozenset(_HEAD.findall(matched)), frozenset(_HEAD.findall(rule.rhs.text))


def can_fire(rulesets: Iterable[Ruleset], ops: Iterable[tuple[str, int]]) -> tuple[Ruleset, ...]:
    """`rulesets` with only the rules that can fire on a graph of `ops` ((op, arity) pairs); a
    ruleset left with none is dropped. A ruleset declaring egglog facts of its own keeps all its
    rules: what those facts build is not read here."""
    rulesets = tuple(rulesets)
    present = {constructor_name(op, arity) for op, arity in ops}
    firing = {id(r) for rs in rulesets if rs.facts.strip() for r in rs.rules}
    pending = [r for rs in rulesets for r in rs.rules if id(r) not in firing]
    while ready := [r for r in pending if _ops_of(r)[0] <= present]:
        for rule in ready:
            firing.add(id(rule))
            present |= _ops_of(rule)[1]
        pending = [r for r in pending if id(r) not in firing]
    kept = (replace(rs, rules=tuple(r for r in rs.rules if id(r) in firing)) for rs in rulesets)
    return tuple(rs for rs in kept if rs.rules)
