"""The saturation driver: run rulesets over an encoded graph under iteration, e-node and time limits.

egglog has no e-node limit of its own, so the driver runs one iteration at a time (types first,
then one pass of each active ruleset) and checks the limits between iterations. Explosive rulesets
(associativity, commutativity) are banned for exponentially growing stretches after an iteration
in which they matched more than their budget, as egg's BackoffScheduler does.

>>> from tessera_rw import op
>>> g = op.kernel(lambda x: x * 1.0).trace(op.tensor((2,), "float32"))
>>> rewrite(g, ()).report.stop_reason
<StopReason.saturated: 'saturated'>
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from egglog import bindings

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.ops import OPS
from tessera_rw.rules.egraph import EGraphView
from tessera_rw.rules.encode import Encoding, all_arities, encode
from tessera_rw.rules.relevance import can_fire
from tessera_rw.rules.rule import Ruleset
from tessera_rw.rules.schema import PRELUDE, declaration, type_rule

from tessera_rw.rules.tables import TABLE_FUNCTIONS, TABLES
from tessera_rw.support.collector import with_collector_paused


@dataclass(frozen=True)
class Limits:
    iterations: int = 16
    enodes: int = 50_000
    seconds: float = 10.0
    backoff_matches: int = 1_000     # an explosive ruleset matching more than this is banned a while


class StopReason(enum.Enum):
    saturated = "saturated"
    iteration_limit = "iteration_limit"
    node_limit = "node_limit"
    time_limit = "time_limit"


@dataclass(frozen=True)
class IterationStats:
    index: int
    enodes: int
    seconds: float
    matches: dict[str, int]
    banned: tuple[str, ...] = ()


@dataclass
class RewriteReport:
    """What --explain prints of a rewrite: rules fired, e-graph growth, why it stopped."""
    stop_reason: StopReason
    iterations: list[IterationStats]
    matches: dict[str, int] = field(default_factory=dict)       # "ruleset/rule" -> total matches
    seconds_per_rule: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0         # the whole rewrite, setup_seconds included
    assumed: dict[str, str] = field(default_factory=dict)      # "ruleset/rule" fired -> what it assumes of values
    setup_seconds: float = 0.0   # declaring the rulesets in a fresh e-graph: once per process and rulesets

    @property
    def enodes(self) -> int:
        return self.iterations[-1].enodes if self.iterations else 0

    def fired(self) -> list[tuple[str, str, int]]:
        """(rule, ruleset, matches) for every rule that matched, most matches first."""
        rows = [(name.split("/", 1)[1], name.split("/", 1)[0], n) for name, n in self.matches.items() if n]
        return sorted(rows, key=lambda r: (-r[2], r[1], r[0]))


@dataclass
class RewriteResult:
    graph: Graph
    encoding: Encoding
    view: EGraphView            # the saturated e-graph, as extraction reads it
    report: RewriteReport

    def output_classes(self) -> tuple[str, ...]:
        return tuple(self.view.root(o) for o in self.encoding.outputs)


def _base_constructors() -> frozenset[tuple[str, int]]:
    """(op, arity) of every registered op at the arities declared up front."""
    return frozenset((op, n) for op in OPS for n in all_arities(op))


def _declarations(constructors) -> list[str]:
    return [declaration(op, n) for op, n in sorted(constructors)] + [type_rule(op, n) for op, n in sorted(constructors)]


def _setup_program(rulesets: Sequence[Ruleset], constructors: frozenset[tuple[str, int]]) -> str:
    lines = [PRELUDE, TABLES, "(ruleset types)", *_declarations(constructors)]
    lines += [rs.egglog() for rs in rulesets]
    return "\n".join(lines)


class _PreparedEGraphs(threading.local):
    """E-graphs with the sorts, constructors and rulesets declared, one per tuple of rulesets (per
    thread): declaring them is most of a small graph's rewrite (about 0.14 s), so each rewrite
    pushes onto a prepared e-graph and pops back to it when done.

    A tuple of a few rules (one rule checked alone, or those that can fire on a small graph) is
    declared instead in a pushed layer over one e-graph holding the declarations only: a layer costs
    a push and a pop (about 12 ms), a fresh e-graph its declarations (about 60 ms), and a copy of
    the e-graph of every built-in rule, which each rewrite over it makes, about 85 ms."""

    def __init__(self):
        self.by_rulesets: dict[tuple[Ruleset, ...], _Prepared] = {}
        self.layered: _Prepared | None = None      # the declarations, and the layer last declared on them

    def take(self, rulesets: tuple[Ruleset, ...]) -> _Prepared:
        """The prepared e-graph of `rulesets`, out of the cache until `give_back`: a rewrite that
        fails halfway leaves it in an unknown state, and it is dropped instead."""
        prepared = self.by_rulesets.pop(rulesets, None)
        if prepared is None and sum(len(rs.rules) for rs in rulesets) <= LAYERED_RULES:
            layered, self.layered = self.layered, None
            prepared = _in_layer(layered, rulesets)
        return prepared or _declared(rulesets, _base_constructors())

    def give_back(self, rulesets: tuple[Ruleset, ...], prepared: _Prepared) -> None:
        if prepared.layer is not None:
            self.layered = prepared
            return
        if len(self.by_rulesets) >= _PREPARED_KEPT:
            self.by_rulesets.pop(next(iter(self.by_rulesets)))
        self.by_rulesets[rulesets] = prepared


@dataclass(frozen=True)
class _Prepared:
    egraph: bindings.EGraph
    constructors: frozenset[tuple[str, int]]   # declared in it: ops registered later are not
    layer: tuple[Ruleset, ...] | None = None   # the rulesets declared in a pushed layer, if so


def _declared(rulesets: Sequence[Ruleset], constructors: frozenset[tuple[str, int]]) -> _Prepared:
    """A new e-graph with `constructors` and `rulesets` declared."""
    egraph = bindings.EGraph()
    _run(egraph, _setup_program(rulesets, constructors))
    return _Prepared(egraph, constructors)


def _in_layer(layered: _Prepared | None, rulesets: tuple[Ruleset, ...]) -> _Prepared:
    """`layered` with `rulesets` in its pushed layer; a new e-graph of the declarations where there
    is none, or the ops registered have changed since (a plugin's, whose rules name them)."""
    constructors = _base_constructors()
    if layered is None or layered.constructors != constructors:
        layered = _declared((), constructors)
    if layered.layer == rulesets:
        return layered
    if layered.layer is not None:
        _run(layered.egraph, "(pop)")
    _run(layered.egraph, "(push)\n" + "\n".join(rs.egglog() for rs in rulesets))
    return _Prepared(layered.egraph, layered.constructors, rulesets)


LAYERED_RULES = 64        # rulesets of this many rules at most are declared in a layer (a rule and its helpers)
_PREPARED_KEPT = 4        # ruleset tuples kept prepared (the built-in packs, with and without plugins, ...)
_prepared = _PreparedEGraphs()


def _declare_extra_constructors(prepared: _Prepared, encoding: Encoding) -> None:
    """Declare the constructors the graph uses beyond the prepared ones: variadic ops at other
    arities, and ops registered since the e-graph was prepared."""
    extra = encoding.constructors - prepared.constructors
    if extra:
        _run(prepared.egraph, "\n".join(_declarations(extra)))


def setup_error(rulesets: Sequence[Ruleset]) -> str | None:
    """What egglog says against declaring `rulesets` (a rule naming an unknown function, a guard
    that does not parse), or None when they declare cleanly, as every rewrite will. A clean
    declaration is kept as these rulesets' prepared e-graph, so a rewrite with them starts there."""
    try:
        prepared = _declared(rulesets, _base_constructors())
    except Exception as e:       # egglog's EggSmolError, whatever the binding calls it
        return f"{type(e).__name__}: " + " ".join(str(e).split())
    _prepared.give_back(tuple(rulesets), prepared)
    return None


def _run(egraph: bindings.EGraph, program: str) -> list:
    """Run a program whose commands each sit on one line. Lines are parsed one by one: egglog's
    parser is quadratic in the length of the text it is given (a 48-layer model took 30 s whole)."""
    commands = [c for line in program.splitlines() if line.strip() for c in egraph.parse_program(line)]
    return egraph.run_program(*commands)


INSERT_CHUNK = 16  # unions per insertion rule: egglog type-checks a rule in time superlinear in its size


def insert(egraph: bindings.EGraph, encoding: Encoding) -> None:
    """Add the encoded graph: a few small one-shot rules, run once, then the type analyses."""
    u = encoding.unions
    rules = (f"(rule () ({' '.join(u[i:i + INSERT_CHUNK])}) :ruleset insert)" for i in range(0, len(u), INSERT_CHUNK))
    _run(egraph, "(ruleset insert)\n" + "\n".join(rules))
    _run(egraph, "(run-schedule (run insert) (saturate (run types)))")


def enode_count(egraph: bindings.EGraph) -> int:
    sizes = _run(egraph, "(print-size)")[0].sizes
    return sum(n for name, n in sizes if name not in TABLE_FUNCTIONS and name != "Id")


@with_collector_paused
def rewrite(graph: Graph, rulesets: Sequence[Ruleset], limits: Limits = Limits()) -> RewriteResult:
    """Saturate `graph` with `rulesets` under `limits`; the result holds a view of the saturated
    e-graph (taken before it is popped back to the prepared rulesets) and the report.

    Where only a few of the rules can fire on the graph (relevance.py), the e-graph holds those
    alone, in a layer (_PreparedEGraphs); else it holds them all, prepared once for many rewrites."""
    start = time.perf_counter()
    encoding = encode(graph)
    rulesets = tuple(rulesets)
    firing = can_fire(rulesets, encoding.constructors)
    if sum(len(rs.rules) for rs in firing) > LAYERED_RULES:
        firing = rulesets
    prepared = _prepared.take(firing)
    setup = time.perf_counter() - start        # the time limit is the saturation's, not this
    _run(prepared.egraph, "(push)")
    _declare_extra_constructors(prepared, encoding)
    view, report = _saturate(prepared.egraph, encoding, rulesets, firing, limits, start + setup)
    report.seconds += setup
    report.setup_seconds = setup
    _run(prepared.egraph, "(pop)")
    _prepared.give_back(firing, prepared)
    return RewriteResult(graph, encoding, view, report)


def _saturate(egraph: bindings.EGraph, encoding: Encoding, rulesets: tuple[Ruleset, ...],
              firing: tuple[Ruleset, ...], limits: Limits, start: float) -> tuple[EGraphView, RewriteReport]:
    """Saturate with the rules of `firing`; the report counts every rule of `rulesets`."""
    insert(egraph, encoding)
    iterations: list[IterationStats] = []
    totals: dict[str, int] = {f"{rs.name}/{r.name}": 0 for rs in rulesets for r in rs.rules}
    rule_seconds: dict[str, float] = {name: 0.0 for name in totals}
    units = [u for rs in firing for u in rs.units()]
    names = {u.name: [f"{rs.name}/{r.name}" for r in u.rules] for rs in firing for u in rs.units()}
    banned_until: dict[str, int] = {}
    ban_length: dict[str, int] = {u.name: 1 for u in units}
    stop = StopReason.iteration_limit
    for index in range(limits.iterations):
        if time.perf_counter() - start > limits.seconds:
            stop = StopReason.time_limit
            break
        active = [u for u in units if banned_until.get(u.name, -1) < index]
        banned = tuple(u.name for u in units if u not in active)
        schedule = " ".join(f"(run {u.name})" for u in active)
        tick = time.perf_counter()
        report = _run(egraph, f"(run-schedule {schedule} (saturate (run types)))")[-1].report if active else None
        matches = dict(report.num_matches_per_rule) if report else {}
        for name, n in matches.items():
            if name in totals:
                totals[name] += n
                rule_seconds[name] += report.search_and_apply_time_per_rule[name].total_seconds()
        for u in active:
            if (u.explosive and
                    sum(matches.get(n, 0) for n in names[u.name]) > limits.backoff_matches * ban_length[u.name]):
                banned_until[u.name] = index + ban_length[u.name]
                ban_length[u.name] *= 2
        enodes = enode_count(egraph)
        iterations.append(IterationStats(index, enodes, time.perf_counter() - tick,      # the type analyses' not
                                         {k: v for k, v in matches.items() if v and k in totals}, banned))
        if enodes > limits.enodes:
            stop = StopReason.node_limit
            break
        if (report is None or not report.updated) and not banned:
            stop = StopReason.saturated
            break
    view = EGraphView(egraph, encoding.literals)
    assumed = {f"{rs.name}/{r.name}": r.assumes for rs in rulesets for r in rs.rules
               if r.assumes and totals[f"{rs.name}/{r.name}"]}
    return view, RewriteReport(stop, iterations, totals, rule_seconds, time.perf_counter() - start, assumed)
