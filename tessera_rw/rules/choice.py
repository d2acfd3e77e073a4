"""Choosing one e-node per e-class: the cheapest terms under a per-e-node cost, and single-node
variations of a choice.

The cost model and DAG-aware extraction live in `tune`; the smallest choice serves decoding and
the soundness checker.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Iterator

from tessera_rw.rules.egraph import EGraphView, ENode


def smallest_choice(view: EGraphView) -> dict[str, ENode]:
    """Per class the e-node of least tree size."""
    return cheapest_choice(view, lambda enode: 1.0)


def cheapest_choice(view: EGraphView, cost: Callable[[ENode], float]) -> dict[str, ENode]:
    """Per class the e-node of least tree cost (its own cost plus its operands' tree costs):
    Knuth's generalization of Dijkstra to e-graphs, settling classes cheapest first, O(e-nodes · log
    classes). Cycles are harmless: a class is settled once, by an e-node whose operands were settled
    before it. An e-node of infinite cost is never chosen; a class with no finite e-node is absent
    from the result. Ties keep the earlier e-node.

    Totals are summed exactly, in integer units of 2⁻⁶⁴: a tree cost counts a shared operand once
    per path to it, so a deep residual stack's totals grow as 2^depth (10⁴⁵ µs at 48 layers) and a
    float sum would round away the difference between two e-nodes of one class."""
    users: dict[str, list[ENode]] = {}
    waiting: dict[str, int] = {}
    heap: list[tuple[int, int, str, ENode]] = []
    order = 0
    for enodes in view.classes.values():
        for enode in enodes:
            waiting[enode.id] = len(set(enode.operands))
            for c in set(enode.operands):
                users.setdefault(c, []).append(enode)
            if not enode.operands and math.isfinite(own := cost(enode)):
                heap.append((_exact(own), order, enode.eclass, enode))
                order += 1
    heapq.heapify(heap)
    size: dict[str, int] = {}
    best: dict[str, ENode] = {}
    while heap:
        total, _, cid, enode = heapq.heappop(heap)
        if cid in size:
            continue
        size[cid], best[cid] = total, enode
        for user in users.get(cid, ()):
            waiting[user.id] -= 1
            if waiting[user.id] == 0 and user.eclass not in size:
                own = cost(user)
                if math.isfinite(own):
                    heapq.heappush(heap, (_exact(own) + sum(size[c] for c in user.operands), order, user.eclass, user))
                    order += 1
    return best


FIXED_POINT_BITS = 64


def _exact(cost: float) -> int:
    """A finite cost in integer units of 2⁻⁶⁴ (exact for any cost that is a multiple of them;
    nearer zero, rounded down)."""
    numerator, denominator = cost.as_integer_ratio()
    return (numerator << FIXED_POINT_BITS) // denominator


def variants(view: EGraphView, base: dict[str, ENode]) -> Iterator[tuple[ENode, dict[str, ENode]]]:
    """Every choice that differs from `base` in exactly one class, with the e-node that differs."""
    for cid, enodes in view.classes.items():
        for enode in enodes:
            if enode is not base.get(cid):
                yield enode, base | {cid: enode}
