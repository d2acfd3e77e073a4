"""The tree-cost choice of one e-node per class, on hand-built e-graphs."""

from __future__ import annotations

import math

from tessera_rw.rules.choice import cheapest_choice
from tessera_rw.rules.egraph import ENode
from tests.hand_built_egraphs import enode, view_of


def _residual_stack(depth: int) -> list[ENode]:
    """x0 = input; xᵢ = add(xᵢ₋₁, xᵢ₋₁): xᵢ's tree cost doubles with each level."""
    enodes = [enode("x0", "input")]
    enodes += [enode(f"x{i}", "add", f"x{i - 1}", f"x{i - 1}") for i in range(1, depth + 1)]
    return enodes


def test_a_small_difference_above_a_deep_residual_stack_still_decides():
    # At depth 80 the stack's tree cost is 2^80 µs: a float sum would round both of the top class's
    # e-nodes to the same total and keep the first, the dearer one.
    top = [enode("y", "dear", "x80"), enode("y", "cheap", "x80")]
    costs = {"input": 0.0, "add": 1.0, "dear": 1.0, "cheap": 0.999}
    choice = cheapest_choice(view_of(*_residual_stack(80), *top), lambda e: costs[e.op])
    assert choice["y"].op == "cheap"


def test_ties_keep_the_earlier_enode_and_infinite_costs_are_never_chosen():
    enodes = [enode("x", "input"), enode("y", "first", "x"), enode("y", "second", "x"),
              enode("z", "never", "x")]
    costs = {"input": 0.0, "first": 2.0, "second": 2.0, "never": math.inf}
    choice = cheapest_choice(view_of(*enodes), lambda e: costs[e.op])
    assert choice["y"].op == "first"
    assert "z" not in choice


def test_tiny_costs_still_order_the_choice():
    enodes = [enode("x", "input"), enode("y", "a", "x"), enode("y", "b", "x")]
    costs = {"input": 0.0, "a": 2e-6, "b": 1e-6}
    assert cheapest_choice(view_of(*enodes), lambda e: costs[e.op])["y"].op == "b"
