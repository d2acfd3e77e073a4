"""Extraction beside the exact optimum: the cheapest program an e-graph holds at a fusion depth,
found by an integer linear program (scipy's HiGHS), against the program extraction chose.

The program (the formulation of egg's LP extractor): a 0/1 variable per e-node of finite cost; each
root class computes one e-node; a chosen e-node needs one e-node chosen in each of its operand
classes; a class computes at most one. Minimized: the sum of the chosen e-nodes' costs, each class
paid once, as the DAG pass scores it.

Only the classes the roots reach enter the program, and of a class's e-nodes only those no other
does better than (as cheap, reading a subset of its operand classes). Acyclicity is stated only where
a cycle can close, inside a strongly connected component of the graph of class → operand class (an
edge between components lies on no cycle): two classes that compute each other (a transpose of a
transpose) may not both be chosen so, one row per pair, which is all a component of two classes
needs; a larger component also gets a level per class, a chosen e-node's class standing at least
one level above its operand's (big-M). On the gradient rules' examples this halves HiGHS's time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.rules.egraph import EGraphView, ENode
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.rule import Ruleset
from tessera_rw.rules.saturate import rewrite
from tessera_rw.rules.soundness import example_graph
from tessera_rw.tune.chosen_program import ChosenProgram
from tessera_rw.tune.extract import choose_per_depth


OBJECTIVE_UNIT = 1e-6      # µs: a view costs one unit


@dataclass(frozen=True)
class Optimum:
    cost: float
    proven: bool            # HiGHS proved it optimal within its time limit (else its best incumbent)
    seconds: float


@dataclass(frozen=True)
class OptimumGap:
    """Extraction's program at one depth against the ILP's."""
    model: str
    depth: str
    ours: float
    optimum: Optimum

    @property
    def gap(self) -> float:
        """How much dearer extraction's program is, as a fraction of the optimum (negative where
        the ILP ran out of time with a worse incumbent, or wrongly so where it claims a proof)."""
        return self.ours / self.optimum.cost - 1.0

    @property
    def matches(self) -> bool:
        """Extraction's program costs the proven optimum (to a relative 1e-9: float sums)."""
        return self.optimum.proven and abs(self.gap) < 1e-9


def program_cost(choice: dict[str, ENode], roots: Sequence[str], cost: Callable[[ENode], float]) -> float:
    """A choice's program cost: each class the roots reach paid once."""
    return sum(cost(choice[cid]) for cid in ChosenProgram(dict(choice), roots).post)


def _reachable(view: EGraphView, roots: Sequence[str], cost: Callable[[ENode], float]) -> list[ENode]:
    """The e-nodes of finite cost, not their own operand, in the classes `roots` reach through them."""
    seen, stack, enodes = set(roots), list(dict.fromkeys(roots)), []
    while stack:
        for enode in view.classes.get(stack.pop(), ()):
            if math.isfinite(cost(enode)) and enode.eclass not in enode.operands:
                enodes.append(enode)
                fresh = [cid for cid in dict.fromkeys(enode.operands) if cid not in seen]
                seen.update(fresh), stack.extend(fresh)
    return enodes


def _undominated(enodes: Sequence[ENode], cost: Callable[[ENode], float]) -> list[ENode]:
    """`enodes` less each one another e-node of its class does better than: as cheap, reading a
    subset of its operand classes (a program choosing it computes the other's operands already)."""
    kept: dict[str, list[frozenset[str]]] = {}
    undominated = []
    for enode in sorted(enodes, key=lambda e: (cost(e), len(set(e.operands)))):
        reads = frozenset(enode.operands)
        if not any(other <= reads for other in kept.setdefault(enode.eclass, [])):
            kept[enode.eclass].append(reads)
            undominated.append(enode)
    return undominated


def _cyclic_edges(enodes: Sequence[ENode]) -> list[tuple[int, str, str, int]]:
    """(e-node index, its class, an operand class, the size of their component) for each edge
    inside a strongly connected component of the graph of class → operand class."""
    index = {cid: i for i, cid in enumerate(dict.fromkeys(c for e in enodes for c in (e.eclass, *e.operands)))}
    edges = [(index[e.eclass], index[cid]) for e in enodes for cid in e.operands]
    rows, cols = zip(*edges) if edges else ((), ())
    graph = coo_array((np.ones(len(edges)), (rows, cols)), shape=(len(index), len(index)))
    _, component = connected_components(graph, directed=True, connection="strong")
    size = np.bincount(component)
    return [(i, e.eclass, cid, int(size[component[index[cid]]])) for i, e in enumerate(enodes)
            for cid in dict.fromkeys(e.operands) if component[index[e.eclass]] == component[index[cid]]]


def exact_optimum(view: EGraphView, roots: Sequence[str], cost: Callable[[ENode], float],
                  time_limit_s: float = 60.0) -> Optimum:
    """The cheapest acyclic choice from `view` computing `roots` under `cost`."""
    enodes = _undominated(_reachable(view, roots, cost), cost)
    cyclic = _cyclic_edges(enodes)
    leveled = dict.fromkeys(c for _, eclass, operand, size in cyclic if size > 2 for c in (eclass, operand))
    level = {cid: len(enodes) + i for i, cid in enumerate(leveled)}   # level variables follow the e-nodes
    in_class: dict[str, list[int]] = {}
    for i, enode in enumerate(enodes):
        in_class.setdefault(enode.eclass, []).append(i)
    rows, cols, vals, lower, upper = [], [], [], [], []

    def constrain(coefficients: dict[int, float], low: float, high: float) -> None:
        row = len(lower)
        for col, val in coefficients.items():
            rows.append(row), cols.append(col), vals.append(val)
        lower.append(low), upper.append(high)

    for root in dict.fromkeys(roots):
        constrain({i: 1.0 for i in in_class.get(root, ())}, 1.0, 1.0)
    for members in in_class.values():
        constrain({i: 1.0 for i in members}, 0.0, 1.0)
    for i, enode in enumerate(enodes):
        for operand in dict.fromkeys(enode.operands):
            constrain({**{j: -1.0 for j in in_class.get(operand, ())}, i: 1.0}, -np.inf, 0.0)
    reading: dict[tuple[str, str], list[int]] = {}     # (class, operand class) -> e-nodes
    for i, eclass, operand, _ in cyclic:
        reading.setdefault((eclass, operand), []).append(i)
    big_m = len(level) + 1.0
    for i, eclass, operand, size in cyclic:
        for j in reading.get((operand, eclass), ()):
            if i < j:
                constrain({i: 1.0, j: 1.0}, 0.0, 1.0)
        if size > 2:
            constrain({level[eclass]: 1.0, level[operand]: -1.0, i: -big_m}, 1.0 - big_m, np.inf)
    n = len(enodes) + len(level)
    matrix = coo_array((vals, (rows, cols)), shape=(len(lower), n)).tocsr()
    # in units of OBJECTIVE_UNIT µs, so HiGHS's absolute gap (1e-6, which scipy does not expose) is far
    # below a view's cost (1e-6 µs); its relative gap is set to 0
    objective = np.array([cost(e) / OBJECTIVE_UNIT for e in enodes] + [0.0] * len(level))
    integrality = np.array([1] * len(enodes) + [0] * len(level))
    bounds = Bounds(np.zeros(n), np.array([1.0] * len(enodes) + [float(len(level))] * len(level)))
    start = time.perf_counter()
    solved = milp(objective, constraints=LinearConstraint(matrix, lower, upper), integrality=integrality,
                  bounds=bounds, options={"time_limit": time_limit_s, "mip_rel_gap": 0.0})
    if solved.x is None:
        raise RuntimeError(f"HiGHS found no program within {time_limit_s} s: {solved.message}")
    return Optimum(float(solved.fun) * OBJECTIVE_UNIT, solved.status == 0, time.perf_counter() - start)


def optimum_gaps(model: str, graph: Graph, arch: ArchSpec, time_limit_s: float = 60.0) -> list[OptimumGap]:
    """Extraction's program at each fusion depth against the exact optimum at that depth."""
    result = rewrite(graph, BUILTIN_RULESETS)
    roots = result.output_classes()
    gaps, optima = [], {}       # depths that cost every e-node alike share one optimum
    for chosen in choose_per_depth(result, arch):
        costs = tuple(chosen.cost(e) for enodes in result.view.classes.values() for e in enodes)
        if costs not in optima:
            optima[costs] = exact_optimum(result.view, roots, chosen.cost, time_limit_s)
        gaps.append(OptimumGap(model, chosen.depth.label, program_cost(chosen.choice, roots, chosen.cost),
                               optima[costs]))
    return gaps


def rule_example_gaps(arch: ArchSpec, seed: int = 0,
                      rulesets: Sequence[Ruleset] = BUILTIN_RULESETS) -> list[OptimumGap]:
    """`optimum_gaps` on the example program of every rule in `rulesets` (each saturated with every
    built-in ruleset)."""
    gaps, of_program = [], {}    # one program (a rule family's examples) is compared once
    for ruleset in rulesets:
        for rule in ruleset.rules:
            if rule.example is not None:
                graph, _ = example_graph(rule, np.random.default_rng(seed))
                program = (graph.inputs, graph.outputs)         # nodes are interned: equal programs are equal
                if program not in of_program:
                    of_program[program] = optimum_gaps(rule.name, graph, arch)
                gaps += [replace(gap, model=rule.name) for gap in of_program[program]]
    return gaps
