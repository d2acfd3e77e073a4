"""Reductions over the same axes that stream the same tensor, none needing another, are one
multi_reduction kernel, each result a view of its block; what cannot be grouped is left alone."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.lower.reduction_groups import reduced_together

F32 = DType.float32
NCHW = (8, 16, 6, 5)
AXES = (0, 2, 3)


def reduced(*args, expr, axes=AXES, reduce="sum", keepdims=False):
    return make("fused_reduction", *args, expr=expr, reduce=reduce, axes=axes, keepdims=keepdims)


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op not in ("input", "constant")]


def same_values(before: Graph, after: Graph, seed: int) -> None:
    rng = np.random.default_rng(seed)
    feeds = {n.attr("name"): rng.standard_normal(n.shape).astype(np.float32) for n in before.inputs}
    for got, want in zip(evaluate(after, feeds), evaluate(before, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sums_of_one_tensor_are_one_kernel_and_their_results_views_of_it():
    x, g = make_input("x", NCHW, F32), make_input("g", (1, 16, 1, 1), F32)
    graph = Graph("g", (x, g), (make("sum", x, axes=AXES, keepdims=False), reduced(x, g, expr="mul($0,$1)"),
                                reduced(x, expr="mul($0,$0)", keepdims=False)))
    grouped = reduced_together(graph)
    assert ops(grouped).count("multi_reduction") == 1 and "fused_reduction" not in ops(grouped)
    (multi,) = [n for n in grouped.nodes if n.op == "multi_reduction"]
    assert multi.shape == (3, 16) and multi.attr_map["exprs"] == "$0;mul($0,$1);mul($0,$0)"
    same_values(graph, grouped, 1)


def test_a_reduction_needing_another_however_far_back_stays_apart():
    x = make_input("x", NCHW, F32)
    mean = reduced(x, expr="$0", reduce="mean", keepdims=True)
    spread = make("fused_elementwise", make("fused_elementwise", mean, expr="exp($0)"), expr="neg($0)")
    graph = Graph("g", (x,), (mean, reduced(x, spread, expr="mul($0,$1)", keepdims=True)))
    assert reduced_together(graph) is graph


@pytest.mark.parametrize("second", [
    dict(axes=(0,)),                          # other axes
    dict(reduce="max"),                       # another kind
    dict(keepdims=True),                      # another result shape
], ids=["axes", "kind", "keepdims"])
def test_reductions_differing_in_what_they_compute_stay_apart(second):
    x = make_input("x", NCHW, F32)
    graph = Graph("g", (x,), (reduced(x, expr="$0"), reduced(x, expr="mul($0,$0)", **second)))
    assert reduced_together(graph) is graph


def test_reductions_reading_nothing_in_common_share_a_launch_and_each_joins_the_group_sharing_most():
    x, y = make_input("x", NCHW, F32), make_input("y", NCHW, F32)
    graph = Graph("g", (x, y), (reduced(x, expr="$0"), reduced(y, expr="$0")))
    grouped = reduced_together(graph)
    assert ops(grouped).count("multi_reduction") == 1
    same_values(graph, grouped, 3)
    # y's square could join x's sum or the sum reading y that needs x's: it joins the one reading y
    total_x = reduced(x, expr="$0")
    spread = make("fused_elementwise", make("reshape", total_x, shape=(1, 16, 1, 1)), expr="exp($0)")
    weighted_y = reduced(y, spread, expr="mul($0,$1)")
    graph = Graph("g", (x, y), (total_x, weighted_y, reduced(y, expr="mul($0,$0)")))
    (multi,) = [n for n in reduced_together(graph).nodes if n.op == "multi_reduction"]
    assert multi.args[0] is y and "mul($0,$0)" in multi.attr_map["exprs"]
    same_values(graph, reduced_together(graph), 4)


def test_column_reduces_stay_apart():
    x = make_input("x", (64, 32), F32)
    columns = Graph("g", (x,), (reduced(x, expr="$0", axes=(0,)), reduced(x, expr="mul($0,$0)", axes=(0,))))
    assert reduced_together(columns) is columns


def test_a_loss_total_and_count_are_one_kernel_each_a_view_of_its_padded_row():
    rows, kept = make_input("rows", (7, 64), F32), make_input("kept", (7, 64), F32)
    total = reduced(rows, kept, expr="mul($0,$1)", axes=(0, 1))
    count = reduced(kept, expr="$0", axes=(0, 1))
    graph = Graph("g", (rows, kept), (total, count, reduced(rows, expr="$0", axes=(1,))))   # 7 row sums: 28 bytes
    grouped = reduced_together(graph)
    (multi,) = [n for n in grouped.nodes if n.op == "multi_reduction"]
    assert multi.shape == (2, 4)                    # each scalar at the start of a 16-byte row
    same_values(graph, grouped, 2)


def test_the_op_refuses_expressions_of_different_values():
    x = make_input("x", (4, 8), F32)
    with pytest.raises(ShapeError, match="multi_reduction"):
        make("multi_reduction", x, exprs="$0;cast_bfloat16($0)", reduce="sum", axes=(1,), keepdims=False, width=4)


def test_a_group_reading_what_another_group_feeds_reads_its_views_and_nothing_is_computed_twice():
    x = make_input("x", NCHW, F32)
    total, squares = reduced(x, expr="$0"), reduced(x, expr="mul($0,$0)")       # the first group
    y = make("fused_elementwise", x, make("reshape", total, shape=(1, 16, 1, 1)), expr="mul($0,$1)")
    graph = Graph("g", (x,), (squares, reduced(y, expr="$0"), reduced(y, expr="mul($0,$0)")))
    grouped = reduced_together(graph)
    assert sorted(ops(grouped)).count("multi_reduction") == 2 and "fused_reduction" not in ops(grouped)
    assert ops(grouped).count("fused_elementwise") == 1                          # y once, from the first group's view
    same_values(graph, grouped, 5)


def test_groups_that_would_need_one_another_are_not_made():
    """r2 needs r1 and r3 needs r4: {r1, r3} and {r2, r4} would each wait for the other."""
    x, y = make_input("x", NCHW, F32), make_input("y", NCHW, F32)
    r1 = reduced(x, expr="$0", keepdims=True)
    r2 = reduced(y, r1, expr="mul($0,$1)", keepdims=True)
    r4 = reduced(y, expr="mul($0,$0)", keepdims=True)
    r3 = reduced(x, r4, expr="mul($0,$1)", keepdims=True)
    graph = Graph("g", (x, y), (r1, r2, r4, r3))
    grouped = reduced_together(graph)
    assert ops(grouped).count("multi_reduction") == 1 and ops(grouped).count("fused_reduction") == 2
    same_values(graph, grouped, 6)
