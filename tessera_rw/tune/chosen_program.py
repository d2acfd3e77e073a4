"""The program a choice of e-nodes computes, as extraction's DAG pass re-chooses it class by class.

`ChosenProgram` holds the classes the choice reaches from the roots, a topological order of them
(operands below their users) and how many chosen e-nodes reference each. `delta` prices a switch
by walking only the part of the program that changes; `switch` applies one and updates the order
and the counts in place, touching only the classes it brings in, drops or must move below the
switched class, so a deep program (a 48-layer model makes hundreds of switches) is not walked
again from its roots after each one.

>>> from tessera_rw.rules.egraph import ENode
>>> def node(eclass, op, *operands):
...     return ENode(f"{eclass}:{op}", op, eclass, operands, (), (4,), "float32")
>>> choice = {"x": node("x", "input"), "a": node("a", "exp", "x"), "b": node("b", "log", "a")}
>>> program = ChosenProgram(choice, ("b",))
>>> program.delta({"b": node("b", "log", "x")}, lambda e: {"input": 0.0, "exp": 1.0, "log": 1.0}[e.op])
-1.0
>>> program.switch("b", node("b", "log", "x"))
>>> sorted(program.post)
['b', 'x']
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from typing import Callable, Mapping, Sequence

from tessera_rw.rules.egraph import CycleError, ENode

# Below this gap between two neighbours of the order, new positions are not placed between them:
# the whole order is numbered afresh instead (floats halve their gap with each nested placement).
MIN_GAP = 1e-6


class ChosenProgram:
    """The classes `choice` reaches from `roots`: their topological positions (`post`: operands
    below users; first built as a DFS post-order) and how many chosen e-nodes (or roots) reference
    each (`refs`). `choice` is shared, and `switch` changes it."""

    def __init__(self, choice: dict[str, ENode], roots: Sequence[str]):
        self.choice = choice
        self.roots = tuple(roots)
        self._number_afresh()

    def _number_afresh(self) -> None:
        """Count the references and number the classes in DFS post-order, from the roots."""
        self.refs: dict[str, int] = {}
        self.post: dict[str, float] = {}
        for root in dict.fromkeys(self.roots):
            self.refs[root] = self.refs.get(root, 0) + 1
            if root not in self.post:
                order: list[str] = []
                self._visit(root, order)
                self.post.update((cid, float(i)) for i, cid in enumerate(order, start=len(self.post)))
        self._positions = sorted(self.post.values())    # the positions in use, for placing between them

    def _visit(self, root: str, order: list[str]) -> None:
        """Append to `order`, operands first, `root` (not yet in the program) and the classes below
        it not referenced yet, counting the references each makes."""
        path = {root}
        stack = [(root, iter(dict.fromkeys(self.choice[root].operands)))]
        while stack:
            cid, operands = stack[-1]
            for x in operands:
                if x in path:
                    raise CycleError(f"the chosen e-nodes form a cycle through e-class {x}")
                first = x not in self.refs
                self.refs[x] = self.refs.get(x, 0) + 1
                if first:
                    path.add(x)
                    stack.append((x, iter(dict.fromkeys(self.choice[x].operands))))
                    break
            else:
                stack.pop()
                path.discard(cid)
                order.append(cid)

    def _reaches(self, start: str, target: str) -> bool:
        """Whether `start` depends on `target` in the current program (the order prunes the search)."""
        floor = self.post[target]
        stack, seen = [start], {start}
        while stack:
            cid = stack.pop()
            if cid == target:
                return True
            for x in self.choice[cid].operands:
                if x not in seen and self.post.get(x, -1) >= floor:
                    seen.add(x)
                    stack.append(x)
        return False

    def delta(self, switches: Mapping[str, ENode], cost: Callable[[ENode], float]) -> float:
        """How much the program's cost changes if each class of `switches` computes its e-node
        instead (a class several of them bring in is paid once); inf on a cycle through one switch,
        or where one switch drops another's class. A cycle through two shows when the program is
        rebuilt.

        The new e-nodes' needs are found first, walking only the classes outside the program, so the
        classes the old e-nodes leave behind are searched only down to what stays read: in a deep
        program whose layers hang off one another, neither walk runs to the inputs."""
        change = sum(cost(enode) - cost(self.choice[cid]) for cid, enode in switches.items())
        kept: set[str] = set()          # program classes the new e-nodes read
        paid: set[str] = set()          # classes outside the program they bring in
        for cid, enode in switches.items():
            seen: set[str] = set()
            stack = list(dict.fromkeys(enode.operands))
            while stack:
                x = stack.pop()
                if x in seen:
                    continue
                seen.add(x)
                if x == cid:
                    return math.inf
                if x in self.post:
                    if self.post[x] > self.post[cid] and self._reaches(x, cid):
                        return math.inf
                    kept.add(x)
                    continue
                if x not in paid:
                    paid.add(x)
                    change += cost(self.choice[x])
                stack.extend(self.choice[x].operands)
        removed: set[str] = set()
        dropped: dict[str, int] = {}
        stack = [x for cid in switches for x in dict.fromkeys(self.choice[cid].operands) if x not in kept]
        while stack:  # classes only the old e-nodes kept alive
            x = stack.pop()
            dropped[x] = dropped.get(x, 0) + 1
            if dropped[x] == self.refs[x]:
                removed.add(x)
                stack.extend(o for o in dict.fromkeys(self.choice[x].operands) if o not in kept)
        if any(cid in removed for cid in switches):
            return math.inf
        return change - math.fsum(cost(self.choice[x]) for x in removed)    # exact: the set's order is the hash's

    def switch(self, cid: str, enode: ENode) -> None:
        """Make class `cid` (in the program) compute `enode`, which `delta` found acyclic: count the
        references it makes and brings in, release the old e-node's (dropping what only it kept),
        and place what it now reads below `cid` in the order."""
        old, self.choice[cid] = self.choice[cid], enode
        added: list[str] = []          # classes it brings into the program, operands first
        for x in dict.fromkeys(enode.operands):
            first = x not in self.refs
            self.refs[x] = self.refs.get(x, 0) + 1
            if first:
                self._visit(x, added)
        self._release(old.operands)
        self._place_below(cid, added)

    def _release(self, operands: Sequence[str]) -> None:
        stack = list(dict.fromkeys(operands))
        while stack:
            x = stack.pop()
            self.refs[x] -= 1
            if self.refs[x] == 0:
                del self.refs[x]
                del self._positions[bisect_left(self._positions, self.post.pop(x))]
                stack.extend(dict.fromkeys(self.choice[x].operands))

    def _place_below(self, cid: str, added: list[str]) -> None:
        """Give the classes `added` positions below `cid`, after the program classes they or `cid`
        read that stand above it, which move there too with what they read above it: none of those
        reaches `cid` (delta checked), so the order stays topological."""
        floor = self.post[cid]
        moved: set[str] = set()
        stack = [x for c in (cid, *added) for x in self.choice[c].operands if self.post.get(x, -math.inf) > floor]
        while stack:
            x = stack.pop()
            if x not in moved:
                moved.add(x)
                stack.extend(o for o in self.choice[x].operands if self.post.get(o, -math.inf) > floor)
        if not moved and not added:
            return
        for x in moved:
            del self._positions[bisect_left(self._positions, self.post[x])]
        ordered = sorted(moved, key=self.post.__getitem__) + added
        at = bisect_left(self._positions, floor)
        lower = self._positions[at - 1] if at else floor - 1.0
        step = (floor - lower) / (len(ordered) + 1)
        if step < MIN_GAP:
            self._number_afresh()
            return
        for i, x in enumerate(ordered, start=1):
            self.post[x] = lower + step * i
            insort(self._positions, self.post[x])
