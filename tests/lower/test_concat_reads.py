"""Concatenates computed where an elementwise kernel reads them (lower/concat_reads.py): rotary
embeddings are one kernel; a concatenate something else reads, or one read through a broadcast,
stays; the program computes what it did, under the numpy reference (random programs) and with the
generated kernel in the CPU emulator."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.lower.concat_reads import read_concatenates_in_place
from tessera_rw.lower.layout_chains import fold_layout_chains
from tessera_rw.lower.view_reads import read_views_in_place

F32 = DType.float32


@op.kernel
def rope(x, cos, sin):
    d = x.shape[-1] // 2
    return x * cos + op.concatenate([-x[..., d:], x[..., :d]], axis=-1) * sin


def rope_reference(x, cos, sin):
    x, cos, sin = (np.asarray(a, np.float64) for a in (x, cos, sin))
    d = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., d:], x[..., :d]], -1) * sin


def lowered(graph: Graph) -> Graph:
    return read_concatenates_in_place(read_views_in_place(fold_layout_chains(graph)))


def kernels(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op not in ("input", "constant")]


def test_rotary_embeddings_are_one_kernel_reading_x_where_it_lies():
    x, table = op.tensor((4, 32, 2048, 128), "bf16"), op.tensor((2048, 128), "bf16")
    program = rope.program(x, table, table)
    (step,) = program.plan.steps
    assert step.op == "concatenated_elementwise" and {i.buffer for i in step.inputs} == {0, 1, 2}
    (kernel,) = program.candidate.kernels
    assert {"concatenate", "neg"} <= set(kernel.fused) and kernel.schedule.endswith("vec=8")
    # x fills two operands (each half reads both of its halves), and is read from HBM once
    assert step.node.attr_map["shared"] == (0, 1, 2, 0)
    assert kernel.hbm_bytes == 2 * x.type.nbytes + 2 * table.type.nbytes
    rng = np.random.default_rng(4)
    small = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 16, 64), (16, 64), (16, 64))]
    np.testing.assert_allclose(rope(*small), rope_reference(*small), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("dtype, shape", [(ml_dtypes.bfloat16, (2, 4, 32, 64)), (np.float32, (3, 5, 7, 30))],
                         ids=["bf16", "f32-ragged"])
def test_the_rotary_kernel_matches_numpy_in_the_emulator(dtype, shape):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(dtype)
    cos, sin = (rng.standard_normal(shape[-2:]).astype(dtype) for _ in range(2))
    program = rope.program(x, cos, sin)
    assert [s.op for s in program.plan.steps] == ["concatenated_elementwise"]
    (got,) = run_plan_emulated(program.plan, {"x": x, "cos": cos, "sin": sin})
    want = rope_reference(x, cos, sin)
    bound = 3e-2 if dtype is ml_dtypes.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=bound * np.abs(want).max(), rtol=0)


@op.kernel
def rope_grad(x, cos, sin, g):
    return op.grad(lambda t: op.sum(rope(t, cos, sin) * g))(x)


def test_the_rotary_gradient_recomputes_the_product_each_half_reads():
    x = op.tensor((4, 32, 2048, 128), "bf16")
    program = rope_grad.program(x, op.tensor((2048, 128), "bf16"), op.tensor((2048, 128), "bf16"), x)
    assert [s.op for s in program.plan.steps] == ["concatenated_elementwise"]      # not g·sin, then the join
    rng = np.random.default_rng(6)
    x, cos, sin, g = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 16, 64), (16, 64), (16, 64),
                                                                          (2, 3, 16, 64)))
    gs = g * sin
    np.testing.assert_allclose(rope_grad(x, cos, sin, g), g * cos + np.concatenate([gs[..., 32:], -gs[..., :32]], -1),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_rotary_gradient_kernel_matches_numpy_in_the_emulator():
    rng = np.random.default_rng(7)
    x, g = (rng.standard_normal((2, 4, 32, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    cos, sin = (rng.standard_normal((32, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    program = rope_grad.program(x, cos, sin, g)
    assert [s.op for s in program.plan.steps] == ["concatenated_elementwise"]
    (got,) = run_plan_emulated(program.plan, {"x": x, "cos": cos, "sin": sin, "g": g})
    gs = np.asarray(g, np.float64) * np.asarray(sin, np.float64)
    want = np.asarray(g, np.float64) * np.asarray(cos, np.float64) + np.concatenate([gs[..., 32:], -gs[..., :32]], -1)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=3e-2 * np.abs(want).max(), rtol=0)


def test_a_stack_of_computed_values_is_computed_where_it_is_read():
    @op.kernel
    def stacked(x, y):
        return op.stack([op.exp(x), y * 2.0], axis=1) + 1.0

    program = stacked.program(op.tensor((64, 32), "f32"), op.tensor((64, 32), "f32"))
    (step,) = program.plan.steps
    assert step.op == "concatenated_elementwise" and len(step.inputs) == 2      # x and y; the constants inlined
    x, y = np.random.default_rng(8).standard_normal((2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(stacked(x, y), np.stack([np.exp(x), 2 * y], axis=1) + 1, rtol=1e-6)


def test_a_concatenate_something_else_reads_or_reads_broadcast_stays():
    x, y = make_input("x", (4, 6), F32), make_input("y", (4, 6), F32)
    joined = make("concatenate", make("fused_elementwise", x, expr="exp($0)"), y, axis=1)       # [4, 12]
    shared = Graph("g", (x, y), (make("fused_elementwise", joined, expr="tanh($0)"), joined))
    assert read_concatenates_in_place(shared) is shared
    row = make("concatenate", make_input("r", (1, 3), F32), make_input("s", (1, 3), F32), axis=1)   # [1, 6]
    broadcast = Graph("g", (x,), (make("fused_elementwise", x, row, expr="add($0,$1)"),))
    assert read_concatenates_in_place(broadcast) is broadcast


@st.composite
def concatenated_programs(draw):
    """An elementwise node over y and a concatenate (along a random axis) of pieces that are slices
    of x or of an elementwise node of x (recomputed in the pieces where nothing else reads it), or
    elementwise nodes of such slices, each read by the concatenate alone or also returned."""
    x = make_input("x", (4, 6, 8), F32)
    axis = draw(st.integers(0, 2))
    pieces, outputs = [], []
    base = x
    if draw(st.booleans()):
        base = make("fused_elementwise", x, expr="mul(tanh($0),3.0:float32)")
        outputs += [base] if draw(st.booleans()) and draw(st.booleans()) else []
    for _ in range(draw(st.integers(2, 3))):
        width = draw(st.integers(1, 2))
        start = draw(st.integers(0, x.shape[axis] - width))
        starts = tuple(start if a == axis else 0 for a in range(3))
        stops = tuple(start + width if a == axis else n for a, n in enumerate(x.shape))
        piece = make("slice", base, starts=starts, stops=stops, steps=(1, 1, 1))
        kind = draw(st.sampled_from(["slice", "fused", "plain"]))
        if kind == "fused":
            scale = draw(st.sampled_from(["0.5", "-2.0"]))
            piece = make("fused_elementwise", piece, expr=f"mul(exp($0),{scale}:float32)")
        elif kind == "plain":
            piece = make("neg", piece)
        if draw(st.booleans()) and draw(st.booleans()):
            outputs.append(piece)
        pieces.append(piece)
    joined = make("concatenate", *pieces, axis=axis)
    other = make_input("y", joined.shape, F32)
    y = make("fused_elementwise", other, joined, expr=draw(st.sampled_from(["add($0,$1)", "mul(tanh($1),$0)"])))
    return Graph("g", (x, other), (y, *outputs))


@settings(max_examples=60, deadline=None)
@given(concatenated_programs(), st.integers(0, 2**31 - 1))
def test_computing_a_concatenate_in_place_computes_what_the_program_did(graph, seed):
    rng = np.random.default_rng(seed)
    feeds = {n.attr("name"): rng.standard_normal(n.shape).astype(np.float32) for n in graph.inputs}
    after = lowered(graph)
    assert len(kernels(after)) <= len(kernels(graph))
    for got, want in zip(evaluate(after, feeds), evaluate(graph, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
