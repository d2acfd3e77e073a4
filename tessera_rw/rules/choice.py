"""Choosing one e-node per e-class: the smallest terms, and single-node variations of a choice.

The cost-model extraction lives in `tune`; these choices serve decoding and the soundness checker.
"""

from __future__ import annotations

from typing import Iterator

from tessera_rw.rules.egraph import EGraphView, ENode


def smallest_choice(view: EGraphView) -> dict[str, ENode]:
    """Per class the e-node of least tree size (Bellman-Ford style fixpoint; ties keep the first)."""
    size: dict[str, float] = {}
    best: dict[str, ENode] = {}
    changed = True
    while changed:
        changed = False
        for cid, enodes in view.classes.items():
            for enode in enodes:
                if all(c in size for c in enode.operands):
                    total = 1 + sum(size[c] for c in enode.operands)
                    if total < size.get(cid, float("inf")):
                        size[cid], best[cid] = total, enode
                        changed = True
    return best


def variants(view: EGraphView, base: dict[str, ENode]) -> Iterator[tuple[ENode, dict[str, ENode]]]:
    """Every choice that differs from `base` in exactly one class, with the e-node that differs."""
    for cid, enodes in view.classes.items():
        for enode in enodes:
            if enode is not base.get(cid):
                yield enode, base | {cid: enode}
