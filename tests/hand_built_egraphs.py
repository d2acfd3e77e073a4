"""Hand-built e-graphs for tests of choice and extraction: e-nodes named `<class>:<op>`, and a view
holding only the classes (all that choosing needs)."""

from __future__ import annotations

from types import SimpleNamespace

from tessera_rw.rules.egraph import ENode


def enode(eclass: str, op: str, *operands: str) -> ENode:
    return ENode(f"{eclass}:{op}", op, eclass, operands, (), (4,), "float32")


def view_of(*enodes: ENode) -> SimpleNamespace:
    classes: dict[str, list[ENode]] = {}
    for e in enodes:
        classes.setdefault(e.eclass, []).append(e)
    return SimpleNamespace(classes=classes)
