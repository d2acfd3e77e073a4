"""Slices read in place (lower/view_reads.py): an elementwise kernel reads the strided views it is
given instead of copies of them, where nothing else reads the copy and the view runs along the
result's inner axis; the program computes what it did (numpy reference here, the generated kernels
in the emulator: tests/codegen/emulated_ops.py and the examples)."""

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
from tessera_rw.lower.layout_chains import fold_layout_chains
from tessera_rw.lower.view_reads import read_views_in_place

F32 = DType.float32


def fused(*args, expr):
    return make("fused_elementwise", *args, expr=expr)


def cut(x, starts, stops, steps=None):
    return make("slice", x, starts=starts, stops=stops, steps=steps or (1,) * len(starts))


def kernels(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op not in ("input", "constant")]


def test_a_gated_unit_reads_both_halves_of_its_projection_in_place():
    @op.kernel
    def swiglu(x, w):
        h = x @ w
        d = h.shape[-1] // 2
        return op.silu(h[:, :d]) * h[:, d:]

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 96)).astype(np.float32)
    program = swiglu.program(x, w)
    assert [s.op for s in program.plan.steps] in (["gemm", "strided_elementwise"], ["matmul", "strided_elementwise"])
    assert "strided_read" in program.candidate.kernels[1].fused
    assert "f32[64,96][:,0:48], " in str(program.plan) and "f32[64,96][:,48:96])" in str(program.plan)
    h = x.astype(np.float64) @ w
    want = h[:, :48] / (1 + np.exp(-h[:, :48])) * h[:, 48:]
    np.testing.assert_allclose(swiglu(x, w), want, rtol=1e-4, atol=1e-4)


def test_the_views_strides_are_in_the_result_s_rank_and_repeat_what_broadcasts():
    x, col = make_input("x", (4, 10), F32), make_input("c", (6, 4), F32)
    y = fused(cut(x, (0, 2), (4, 8)), cut(col, (1, 3), (5, 4)), expr="add($0,$1)")   # [4, 6] + [4, 1]
    (node,) = [n for n in read_views_in_place(Graph("g", (x, col), (y,))).nodes if n.op != "input"]
    assert node.op == "strided_elementwise" and node.args == (x, col)
    assert node.attr_map["strides"] == (10, 1, 4, 0) and node.attr_map["offsets"] == (2, 7)


def test_a_copy_something_else_reads_or_that_is_an_output_stays():
    x = make_input("x", (4, 16), F32)
    half = cut(x, (0, 0), (4, 8))
    shared = Graph("g", (x,), (fused(half, expr="exp($0)"), fused(half, expr="tanh($0)")))
    assert kernels(read_views_in_place(shared)).count("slice") == 1
    also_out = Graph("g", (x,), (half, fused(half, expr="exp($0)")))
    assert read_views_in_place(also_out) is also_out


def test_a_transpose_of_the_inner_axis_keeps_its_copy_kernel():
    # read in place, each lane would load a different row: uncoalesced; the copy's tile is not
    x = make_input("x", (64, 32), F32)
    graph = Graph("g", (x,), (fused(make("transpose", x, axes=(1, 0)), expr="exp($0)"),))
    assert read_views_in_place(graph) is graph


def test_a_folded_chain_is_read_in_place_too():
    # q of a fused q|k|v projection with its heads brought forward: one strided_copy, then read in place
    x = make_input("x", (2, 8, 96), F32)
    q = make("transpose", make("reshape", cut(x, (0, 0, 32), (2, 8, 64)), shape=(2, 8, 2, 16)), axes=(0, 2, 1, 3))
    graph = Graph("g", (x,), (fused(q, expr="mul($0,$0)"),))
    folded = fold_layout_chains(graph)
    assert kernels(folded) == ["strided_copy", "fused_elementwise"]
    assert kernels(read_views_in_place(folded)) == ["strided_elementwise"]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 96)).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(read_views_in_place(folded), feeds)[0], evaluate(graph, feeds)[0])


@st.composite
def sliced_programs(draw):
    """A fused node over views of one input: slices with random starts, steps, broadcasts and
    transposes that keep the inner axis, some read twice or also returned."""
    x = make_input("x", (6, 9, 12), F32)
    reads = []
    for _ in range(draw(st.integers(1, 4))):
        lo = [draw(st.integers(0, n - 2)) for n in (6, 9, 12)]
        steps = [draw(st.integers(1, 2)) for _ in range(2)] + [1]
        view = cut(x, tuple(lo[:2]) + (lo[2],), tuple(lo[a] + 1 + (a < 2) for a in range(2)) + (lo[2] + 2,),
                   tuple(steps))                                       # [2, 3, 2] before any step
        view = make("slice", view, starts=(0, 0, 0), stops=view.shape[:2] + (2,), steps=(1, 1, 1))
        if draw(st.booleans()):
            view = make("transpose", view, axes=(1, 0, 2))
            view = make("transpose", view, axes=(1, 0, 2))
        if draw(st.booleans()):
            view = cut(view, (0, 0, 0), (1,) + view.shape[1:])          # broadcast along the first axis
        reads.append(view)
    expr = "$0"
    for i in range(1, len(reads)):
        expr = f"{draw(st.sampled_from(('add', 'mul', 'sub', 'maximum')))}({expr},${i})"
    y = fused(*reads, expr=f"tanh({expr})")
    outputs = (y, reads[0]) if draw(st.booleans()) else (y,)
    return Graph("g", (x,), outputs)


@settings(max_examples=60, deadline=None)
@given(sliced_programs(), st.integers(0, 2**31 - 1))
def test_reading_views_in_place_computes_what_the_program_did(graph, seed):
    feeds = {"x": np.random.default_rng(seed).standard_normal((6, 9, 12)).astype(np.float32)}
    read = read_views_in_place(fold_layout_chains(graph))
    assert len(kernels(read)) <= len(kernels(graph))
    for got, want in zip(evaluate(read, feeds), evaluate(graph, feeds)):
        np.testing.assert_array_equal(got, want)


@op.kernel
def qk_norm_attention(x, w_qkv, q_norm, k_norm):
    """Attention with its queries and keys RMS-normalized per head (QK-norm), from one projection."""
    b, s, _ = x.shape
    qkv = (x @ w_qkv).reshape((b, s, 3, 2, 16))
    q, k, v = (op.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
    return op.flash_attention(op.rmsnorm(q, q_norm), op.rmsnorm(k, k_norm), v)


def qk_norm_reference(x, w_qkv, q_norm, k_norm):
    b, s, _ = x.shape
    qkv = (np.asarray(x, np.float64) @ np.asarray(w_qkv, np.float64)).reshape(b, s, 3, 2, 16).transpose(2, 0, 3, 1, 4)

    def rms(t, w):
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + 1e-6) * np.asarray(w, np.float64)
    q, k, v = rms(qkv[0], q_norm), rms(qkv[1], k_norm), qkv[2]
    scores = q @ np.swapaxes(k, -1, -2) / 4.0
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def qk_norm_inputs(rng, dtype=np.float32):
    shapes = {"x": (2, 24, 40), "w_qkv": (40, 96), "q_norm": (16,), "k_norm": (16,)}
    return {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}


def test_qk_norm_normalizes_the_heads_where_the_projection_wrote_them():
    inputs = qk_norm_inputs(np.random.default_rng(9))
    program = qk_norm_attention.program(**inputs)
    steps = [s.op for s in program.plan.steps]
    assert steps.count("strided_normalization") == 2 and steps.count("strided_copy") <= 1      # only v's
    depths = [c.fusion_depth for c in program.candidates]       # lowering leaves each its depth as extracted
    assert len(set(depths)) == len(depths)
    assert "f32[2,24,96][" in str(program.plan)
    np.testing.assert_allclose(qk_norm_attention(**inputs), qk_norm_reference(**inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_qk_norm_plan_matches_numpy_in_the_emulator():
    inputs = qk_norm_inputs(np.random.default_rng(10), ml_dtypes.bfloat16)
    program = qk_norm_attention.program(**inputs)
    assert [s.op for s in program.plan.steps].count("strided_normalization") == 2
    (got,) = run_plan_emulated(program.plan, inputs)
    want = qk_norm_reference(**inputs)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=3e-2 * np.abs(want).max(), rtol=0)
