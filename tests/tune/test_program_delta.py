"""The cost change of re-choosing e-classes in an extracted program (extract._Program.delta): one
switch, two that share what they bring in, cycles, and a deep program where the answer is local."""

from __future__ import annotations

import math

from tessera_rw.rules.egraph import ENode
from tessera_rw.tune.extract import _Program, share_more

COST = {"input": 0.0, "matmul": 10.0, "sum": 3.0, "matmul_bias_grad": 11.0, "slice": 0.0, "relu": 1.0,
        "gelu": 2.0}


def node(eclass: str, op: str, *operands: str) -> ENode:
    return ENode(f"{eclass}:{op}", op, eclass, operands, (), (4, 4), "float32")


def cost(enode: ENode) -> float:
    return COST[enode.op]


# dW = matmul(x) and db = sum(x); each could instead be a slice of one packed product, outside the program
X, DW, DB = node("x", "input"), node("dw", "matmul", "x"), node("db", "sum", "x")
PACKED = node("p", "matmul_bias_grad", "x")
DW_VIEW, DB_VIEW = node("dw", "slice", "p"), node("db", "slice", "p")
CHOICE = {"x": X, "dw": DW, "db": DB, "p": PACKED}


class EGraph:
    """The e-classes as an EGraphView lists them: each with what it can be computed as."""
    classes = {"x": [X], "dw": [DW, DW_VIEW], "db": [DB, DB_VIEW], "p": [PACKED]}


def test_one_switch_pays_for_what_it_brings_in_and_saves_what_it_drops():
    program = _Program(CHOICE, ("dw", "db"))
    assert program.delta({"dw": DW_VIEW}, cost) == 11.0 - 10.0
    assert program.delta({"db": DB_VIEW}, cost) == 11.0 - 3.0


def test_two_switches_pay_once_for_the_class_both_bring_in():
    program = _Program(CHOICE, ("dw", "db"))
    assert program.delta({"dw": DW_VIEW, "db": DB_VIEW}, cost) == 11.0 - 10.0 - 3.0
    chosen = share_more(EGraph(), CHOICE, ("dw", "db"), cost)
    assert chosen["dw"] is DW_VIEW and chosen["db"] is DB_VIEW


def test_a_switch_that_reads_its_own_class_or_a_user_of_it_is_a_cycle():
    a, b = node("a", "relu", "x"), node("b", "relu", "a")
    program = _Program({"x": X, "a": a, "b": b}, ("b",))
    assert program.delta({"a": node("a", "gelu", "b")}, cost) == math.inf
    assert program.delta({"a": node("a", "gelu", "a")}, cost) == math.inf


def test_in_a_deep_chain_a_switch_costs_only_its_own_change():
    """Layer i reads layer i-1; switching the top layer to another op over the same input drops
    nothing below it, however deep the chain."""
    choice = {"x": X}
    previous = "x"
    for i in range(2000):
        choice[f"h{i}"] = node(f"h{i}", "relu", previous)
        previous = f"h{i}"
    program = _Program(choice, (previous,))
    assert program.delta({previous: node(previous, "gelu", "h1998")}, cost) == 2.0 - 1.0
    # reading the input directly instead drops every layer below
    assert program.delta({previous: node(previous, "gelu", "x")}, cost) == 2.0 - 1.0 - 1999 * 1.0
