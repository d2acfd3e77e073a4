"""Rules and rulesets: small declarative units, each with a one-line comment of its algebra.

A Rule is a rewrite `lhs -> rhs` (egglog text built with `pattern.TermBuilder`) under optional
side conditions; `example` builds a small program the rule applies to, which the soundness
checker evaluates before and after rewriting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.rules.pattern import Expr

WILDCARD = re.compile(r"\bw\d+\b")      # what TermBuilder fills an attribute or type left out with
REWRITTEN = "rewritten__"                # the variable a rule with `apart` terms binds its left side to

# An example: from a random generator, a function to trace and its inputs (numpy arrays by name).
Example = Callable[[np.random.Generator], tuple[Callable, dict[str, np.ndarray]]]


@dataclass(frozen=True)
class Rule:
    name: str
    algebra: str                    # the identity, e.g. "(sA)B = s(AB)"
    lhs: Expr
    rhs: Expr
    when: tuple[str, ...] = ()      # egglog facts, e.g. "(= ax (- (vec-length s) 1))"
    example: Example | None = None
    needs: tuple[str, ...] = ()     # rules of the same ruleset that build what this one matches
    explosive: bool = False         # matches grow with the e-graph (associativity): backed off
    assumes: str = ""               # what the values (not the types) must satisfy: explain says it when it fires
    apart: tuple[Expr, ...] = ()    # terms of the left side that must lie in another e-class than it

    def __post_init__(self):
        bound = set(WILDCARD.findall(self.lhs.text)) | {w for fact in self.when for w in WILDCARD.findall(fact)}
        if unset := sorted(set(WILDCARD.findall(self.rhs.text)) - bound, key=lambda w: int(w[1:])):
            raise TesseraError(f"rule {self.name!r}: its right-hand side leaves {len(unset)} value(s) unset "
                               f"(egglog would see the unbound {', '.join(unset)})",
                               hint="give every right-hand-side term its type, of=(shape, dtype), and every "
                                    "attribute of its op; the left-hand side may leave them open")

    def egglog(self, ruleset: str, run_as: str | None = None) -> str:
        """The egglog rewrite, reported as "ruleset/rule" and run in egglog ruleset `run_as`."""
        name = f':ruleset {run_as or ruleset} :name "{ruleset}/{self.name}"'
        if self.apart:    # a rule, to name the rewritten term's class
            apart = (f"(!= {REWRITTEN} {a})" for a in self.apart)
            query = " ".join((f"(= {REWRITTEN} {self.lhs})", *self.when, *apart))
            return f"(rule ({query}) ((union {REWRITTEN} {self.rhs})) {name})"
        when = f" :when ({' '.join(self.when)})" if self.when else ""
        return f"(rewrite {self.lhs} {self.rhs}{when} {name})"


@dataclass(frozen=True)
class Ruleset:
    """A named group of rules run together. `explosive` rulesets (associativity, commutativity)
    are backed off by the saturation driver when they match too much."""
    name: str
    rules: tuple[Rule, ...]
    explosive: bool = False
    doc: str = ""
    facts: str = ""                 # egglog declarations / tables the rules rely on
    origin: str = "tessera_rw"      # the distribution that provides it

    def __post_init__(self):
        if not self.name.isidentifier():
            raise TesseraError(f"ruleset name {self.name!r} must be an identifier")
        names = [r.name for r in self.rules]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise TesseraError(f"ruleset {self.name!r} has repeated rule names {dupes}")

    def units(self) -> tuple[RunUnit, ...]:
        """What the driver schedules: the ruleset, with its explosive rules split off to back off alone."""
        if self.explosive:
            return (RunUnit(self.name, self.rules, True),)
        calm = tuple(r for r in self.rules if not r.explosive)
        wild = tuple(r for r in self.rules if r.explosive)
        return (RunUnit(self.name, calm, False),) + ((RunUnit(f"{self.name}__explosive", wild, True),) if wild else ())

    def egglog(self) -> str:
        lines = [self.facts]
        for unit in self.units():
            lines += [f"(ruleset {unit.name})"] + [r.egglog(self.name, unit.name) for r in unit.rules]
        return "\n".join(lines)


@dataclass(frozen=True)
class RunUnit:
    name: str                       # the egglog ruleset
    rules: tuple[Rule, ...]
    explosive: bool
