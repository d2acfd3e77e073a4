"""A sum's terms c·(x − mean(x)) over the mean's own axes, c constant along them, add up to zero and
are left out; every other term, and every sum that is only such a term, stays."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.lower.centered_sums import without_centered_terms

F32, BF16 = DType.float32, DType.bfloat16
SHAPE, AXES = (6, 4, 5), (0, 2)


def summed(*args, expr, axes=AXES):
    return make("fused_reduction", *args, expr=expr, reduce="sum", axes=axes, keepdims=False)


def inputs(dtype=F32):
    x, g = make_input("x", SHAPE, dtype), make_input("g", SHAPE, F32)
    return x, g, make_input("c", (1, 4, 1), F32)


def exprs(graph: Graph) -> list[str]:
    return [n.attr_map["expr"] for n in graph.nodes if n.op == "fused_reduction"]


def test_the_deviation_from_the_mean_is_left_out_of_the_sum():
    x, g, c = inputs()
    mu = make("mean", x, axes=AXES, keepdims=True)
    total = summed(g, c, x, mu, expr="sub(mul($0,$1),div(mul($1,sub($2,$3)),$1))")
    graph = Graph("g", (x, g, c), (total,))
    smaller = without_centered_terms(graph)
    assert exprs(smaller) == ["mul($0,$1)"] and smaller.outputs[0].args == (g, c)
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32) + 3, "g": rng.standard_normal(SHAPE).astype(np.float32),
             "c": rng.random((1, 4, 1)).astype(np.float32) + 0.5}
    (got,), (want,) = evaluate(smaller, feeds), evaluate(graph, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["factor varies", "other axes", "bf16 mean", "alone", "constants left"])
def test_a_term_that_need_not_sum_to_zero_stays(case):
    x, g, c = inputs(BF16 if case == "bf16 mean" else F32)
    mu = make("mean", x, axes=(0,) if case == "other axes" else AXES, keepdims=True)
    if case == "factor varies":
        total = summed(g, x, mu, expr="add($0,mul($0,sub($1,$2)))")      # g changes along the axes
    elif case == "alone":
        total = summed(c, x, mu, expr="mul($0,sub($1,$2))")                # nothing else to sum: it stays
    elif case == "constants left":                     # c summed over the axes is n·c, not c: it stays
        total = summed(c, x, mu, expr="add($0,mul($0,sub($1,$2)))")
    else:
        total = summed(g, c, x, mu, expr="add($0,mul($1,sub($2,$3)))")
    graph = Graph("g", (x, g, c), (total,))
    assert without_centered_terms(graph) is graph


def test_the_float32_mean_of_a_16_bit_tensor_is_recognised_through_its_cast():
    x, g, c = inputs(BF16)
    mu = make("fused_reduction", x, expr="cast_float32($0)", reduce="mean", axes=AXES, keepdims=True)
    total = summed(g, c, x, mu, expr="add($0,mul($1,sub(cast_float32($2),$3)))")
    assert exprs(without_centered_terms(Graph("g", (x, g, c), (total,)))) == ["$0"]
