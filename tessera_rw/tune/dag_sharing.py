"""DAG-aware improvement of a tree-optimal extraction: a class switches to an e-node that reads
what the program computes anyway whenever the whole program gets cheaper, so a shared
subexpression is paid once (dW and db from one packed GEMM, a norm's statistics shared by its
gradient kernels), and a kernel whose readers can all read something else is freed (a relu′ mask
reading relu(z), which the forward writes, instead of z). Each change is scored by the cost of the whole program (`ChosenProgram.delta`).
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Callable, Sequence

from tessera_rw.rules.choice import cheapest_choice
from tessera_rw.rules.egraph import CycleError, EGraphView, ENode
from tessera_rw.tune.chosen_program import ChosenProgram

# A view or input costs nothing, but a term with fewer of them reads better: this tie-breaker (µs)
# is far below any kernel's cost.
VIEW_COST = 1e-6
DAG_SWEEPS = 3
REPAIRS = 2           # groups that strand a packed node, repaired per sweep (_paired_switch)
# Classes that want one new class, beyond which only the pairs among the PAIRED_USERS whose switch
# alone costs least are tried (a causal mask every layer of a 48-layer model could read: 144
# classes, 10,296 pairs)
PAIRED_USERS = 12


def share_more(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str],
               cost: Callable[[ENode], float]) -> dict[str, ENode]:
    """Improve a tree-optimal choice for sharing: switch a class to an e-node that reads classes the
    program computes anyway whenever the whole program gets cheaper; then try pairs of classes that
    only pay off switched together (dW and db both read from one packed GEMM), and where none
    does, groups that pay off once the classes they leave reading a packed node move off it too
    (_repaired), or else every reader of one kernel moved off it at once (_freeing_switch); last, switch again with the classes outside the program priced beside it
    (_switch_beside)."""
    choice = _single_switches(view, choice, roots, cost)
    for _ in range(DAG_SWEEPS):
        paired = _paired_switch(view, choice, roots, cost) or _freeing_switch(view, choice, roots, cost)
        if paired is None:
            break
        choice = _single_switches(view, paired, roots, cost)
    return _switch_beside(view, choice, roots, cost)


def _switch_beside(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str],
                   cost: Callable[[ENode], float]) -> dict[str, ENode]:
    """Single switches with the classes outside the program re-chosen first as if what the program
    computes were free, so a switch brings a class in at its price beside the program (hᵀ read in
    place needs h = gelu(pre) with pre already computed, not h's tree-cheapest form, a GEMM
    recomputing pre). Each switch makes the program cheaper, so this only improves on `choice`."""
    for _ in range(DAG_SWEEPS):
        program = ChosenProgram(choice, roots).post
        switched = _single_switches(view, _priced_beside(view, choice, roots, cost), roots, cost)
        if all(switched[c] is choice[c] for c in program) and ChosenProgram(switched, roots).post == program:
            return switched
        choice = switched
    return choice


def _priced_beside(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str],
                   cost: Callable[[ENode], float]) -> dict[str, ENode]:
    """`choice` with every class outside its program re-chosen at tree cost, the program's own
    e-nodes costing nothing."""
    program = set(ChosenProgram(choice, roots).post)
    beside = cheapest_choice(view, lambda e: 0.0 if e.eclass in program and choice[e.eclass] is e else cost(e))
    return {cid: (enode if cid in program else beside.get(cid, enode)) for cid, enode in choice.items()}


def _single_switches(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str],
                     cost: Callable[[ENode], float], only: frozenset[str] | None = None) -> dict[str, ENode]:
    """`choice` with each class of the program (of `only` where given) switched to the e-node that
    makes the whole program cheapest, sweep after sweep until none does."""
    choice = dict(choice)
    for _ in range(DAG_SWEEPS):
        program = ChosenProgram(choice, roots)   # each sweep in a fresh DFS order: operands before users
        memo: dict[str, frozenset[str]] = {}
        improved = False
        for cid in list(program.post):
            if only is not None and cid not in only:
                continue
            if cid not in program.post:
                continue  # dropped by an earlier switch in this sweep
            current = choice[cid]
            for enode in view.classes[cid]:
                if enode is current or not math.isfinite(cost(enode)) or any(c not in choice for c in enode.operands):
                    continue
                if not _reads_paid_for(choice, program, enode, current, memo):
                    continue  # reads nothing already paid for: the tree choice stands
                if program.delta({cid: enode}, cost) < -1e-9:
                    program.switch(cid, enode)     # changes `choice`, which the program shares
                    current = enode
                    memo = {}
                    improved = True
        if not improved:
            break
    return choice


def _reads_paid_for(choice: dict[str, ENode], program: ChosenProgram, enode: ENode, current: ENode,
                    memo: dict[str, frozenset[str]]) -> bool:
    """Whether `enode`, or a class it would bring into the program, reads a class the program
    computes anyway (besides what `current` reads): a view of a shared packed result qualifies."""
    if any(c in program.post and c not in current.operands for c in enode.operands):
        return True
    new = set().union(*(_outside(choice, program, o, memo) for o in enode.operands))
    return any(x in program.post for c in new for x in choice[c].operands)


def _paired_switch(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str],
                   cost: Callable[[ENode], float]) -> dict[str, ENode] | None:
    """`choice` with pairs of switches (or groups: every class that could read it) that bring in the
    same new class and together make the program cheaper (each alone costs more: the new class is
    paid once for all) adopted: the best first, then each other that still pays off on what the
    earlier ones left (a deep model's layers each have their own). Where none does, the first of
    the REPAIRS groups that would pay had they freed the kernels they leave behind, repaired
    (_repaired), that makes the program cheaper; None when nothing does."""
    program = ChosenProgram(choice, roots)
    memo: dict[str, frozenset[str]] = {}
    wanting: dict[str, list[tuple[str, ENode]]] = {}
    for cid in program.post:
        current = choice[cid]
        for enode in view.classes[cid]:
            if enode is current or not math.isfinite(cost(enode)) or any(c not in choice for c in enode.operands):
                continue
            brought_in = set().union(*(_outside(choice, program, o, memo) for o in enode.operands))
            for new in sorted(brought_in):      # in a fixed order: equal pairs tie alike in every process
                if cost(choice[new]) > VIEW_COST:   # sharing a view or a constant saves nothing
                    wanting.setdefault(new, []).append((cid, enode))
    improving: list[tuple[float, int, dict[str, ENode]]] = []
    stranding: list[tuple[float, int, dict[str, ENode], frozenset[str]]] = []
    behind: dict[str, frozenset[str]] = {}
    tried: set[tuple[str, ...]] = set()
    for users in wanting.values():
        paired = users if len(users) <= PAIRED_USERS else \
            sorted(users, key=lambda u: (program.delta(dict([u]), cost), u[1].id))[:PAIRED_USERS]
        for switches in _groups(users, paired):
            key = tuple(sorted(e.id for e in switches.values()))
            if key in tried:
                continue
            tried.add(key)
            total = program.delta(switches, cost)
            if total < -1e-9:
                improving.append((total, len(improving), switches))
            else:
                left = frozenset().union(*(_left_behind(choice, program, cid, cost, behind) for cid in switches))
                if total - math.fsum(cost(choice[c]) for c in sorted(left)) < -1e-9:
                    stranding.append((total, len(stranding), switches, left))
    adopted = False
    for _, _, switches in sorted(improving, key=lambda t: t[:2]):
        if adopted:
            if program.choice is not choice:           # rebuilt once per adoption
                program = ChosenProgram(choice, roots)
            if any(cid not in program.post or choice[cid] is e for cid, e in switches.items()) \
                    or program.delta(switches, cost) >= -1e-9:
                continue
        trial = {**choice, **switches}
        try:
            ChosenProgram(trial, roots)
        except CycleError:
            continue
        choice, adopted = trial, True
    if adopted:
        return choice
    # the most promising few stranding groups: each repair re-runs the single switches
    before = math.fsum(cost(choice[c]) for c in program.post)
    return next(filter(None, (_repaired(view, choice, roots, cost, switches, left, before)
                              for _, _, switches, left in sorted(stranding, key=lambda t: t[:2])[:REPAIRS])), None)


def _freeing_switch(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str],
                    cost: Callable[[ENode], float]) -> dict[str, ENode] | None:
    """`choice` with every reader of one kernel switched, each to its cheapest e-node that does not
    read it, where freeing the kernel makes the program cheaper (each switch alone costs more or
    saves nothing while another reader keeps the kernel: relu(x) from the forward's epilogue read by
    the backward's relu′ mask instead of x, x's kernel then gone); None when no kernel frees so."""
    program = ChosenProgram(choice, roots)
    readers: dict[str, list[str]] = {}
    memo: dict[str, frozenset[str]] = {}
    for cid in program.post:
        for kernel in _left_behind(choice, program, cid, cost, memo):
            readers.setdefault(kernel, []).append(cid)
    for kernel, users in sorted(readers.items()):
        if kernel in roots or len(users) < 2:     # a sole reader's switch is a single switch
            continue
        switches = {}
        for cid in users:
            away = [(program.delta({cid: e}, cost), e.id, e) for e in view.classes[cid]
                    if e is not choice[cid] and math.isfinite(cost(e)) and all(c in choice for c in e.operands)
                    and kernel not in _read_through_views(choice, e, cost)]
            best = min(away, default=(math.inf,))
            if not math.isfinite(best[0]):
                break
            switches[cid] = best[2]
        else:
            if program.delta(switches, cost) >= -1e-9:
                continue
            trial = {**choice, **switches}
            try:
                ChosenProgram(trial, roots)          # a cycle through two switches shows here
            except CycleError:
                continue
            return trial
    return None


def _read_through_views(choice: dict[str, ENode], enode: ENode, cost: Callable[[ENode], float]) -> set[str]:
    """The classes `enode` reads, directly or through views and constants (as `choice` computes them)."""
    found, stack = set(), list(enode.operands)
    while stack:
        c = stack.pop()
        if c not in found:
            found.add(c)
            if cost(choice[c]) <= VIEW_COST:
                stack.extend(choice[c].operands)
    return found


def _left_behind(choice: dict[str, ENode], program: ChosenProgram, cid: str, cost: Callable[[ENode], float],
                 memo: dict[str, frozenset[str]]) -> frozenset[str]:
    """The kernels (classes costing more than a view) class `cid` reads now, through views: what
    switching it would leave behind, its price saved if nothing else read it."""
    if cid not in memo:
        found: set[str] = set()
        stack, seen = list(choice[cid].operands), set()
        while stack:
            c = stack.pop()
            if c in seen or c not in program.post:
                continue
            seen.add(c)
            if cost(choice[c]) > VIEW_COST:
                found.add(c)
            else:
                stack.extend(choice[c].operands)
        memo[cid] = frozenset(found)
    return memo[cid]


def _repaired(view: EGraphView, choice: dict[str, ENode], roots: Sequence[str], cost: Callable[[ENode], float],
              switches: dict[str, ENode], stranded: frozenset[str], before: float) -> dict[str, ENode] | None:
    """`choice` with `switches`, then the single switches of the classes still reading a `stranded`
    kernel through views, where the whole is cheaper: a group moving dx and dW off one packed node
    onto another pays only once db, the packed node's last reader, moves off it too, freeing it
    (each switch alone, and the group, cost more). `before`: what `choice`'s program costs."""
    trial = {**choice, **switches}
    try:
        program = ChosenProgram(trial, roots)
    except CycleError:
        return None
    memo: dict[str, frozenset[str]] = {}
    readers = frozenset(c for c in program.post if c not in switches
                        and _left_behind(trial, program, c, cost, memo) & stranded)
    if not readers:
        return None
    repaired = _single_switches(view, trial, roots, cost, only=readers)
    after = math.fsum(cost(repaired[c]) for c in ChosenProgram(repaired, roots).post)
    return repaired if after < before - 1e-9 else None


def _groups(users: list[tuple[str, ENode]], paired: list[tuple[str, ENode]]) -> list[dict[str, ENode]]:
    """The switches to try together among `users` (class, e-node) of one new class: each pair of
    `paired` (all of them, or the few most promising of many), and where more classes want it, all
    of them at once (the first e-node per class) and, of a few, all but each one (a switch may
    leave another member's class unread: a variance read only by var + eps). A packed result whose
    views must all move together (a norm's dx with the residual added and its row statistics) pays
    off only as a group."""
    found = [dict([a, b]) for a, b in combinations(paired, 2) if a[0] != b[0]]
    every = dict(reversed(users))
    if len(every) > 2:
        found.append(every)
        if 3 < len(every) <= PAIRED_USERS:
            found += [{c: e for c, e in every.items() if c != left} for left in every]
    return found


def _outside(choice: dict[str, ENode], program: ChosenProgram, cid: str, memo: dict[str, frozenset[str]]) -> frozenset[str]:
    """The classes outside the program that computing `cid` as `choice` has it needs, `cid` included."""
    if cid not in memo:
        found, stack = set(), [cid]
        while stack:
            c = stack.pop()
            if c in found or c in program.post:
                continue
            found.add(c)
            stack.extend(choice[c].operands)
        memo[cid] = frozenset(found)
    return memo[cid]
