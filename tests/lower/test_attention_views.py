"""Attention reading q, k and v where the projection wrote them and writing O where the next one reads
it (lower/attention_views.py): the copies around a flash_attention go where nothing else reads them
and the rows stay contiguous and aligned; the program computes what it did (numpy reference here,
the generated kernels in the emulator)."""

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
from tessera_rw.lower.attention_views import read_attention_views
from tessera_rw.lower.layout_chains import fold_layout_chains

BF16, F32 = DType.bfloat16, DType.float32


@op.kernel
def multi_head(x, w_qkv, w_out):
    """Causal self-attention of 2 heads of 16 from one q|k|v projection, the heads merged again."""
    b, s, width = x.shape
    qkv = op.transpose(op.reshape(x @ w_qkv, (b, s, 3, 2, 16)), (2, 0, 3, 1, 4))
    o = op.flash_attention(qkv[0], qkv[1], qkv[2], causal=True)
    return op.reshape(op.transpose(o, (0, 2, 1, 3)), (b, s, width)) @ w_out


def multi_head_reference(x, w_qkv, w_out):
    b, s, width = x.shape
    qkv = (np.asarray(x, np.float64) @ np.asarray(w_qkv, np.float64)).reshape(b, s, 3, 2, 16).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv
    scores = q @ np.swapaxes(k, -1, -2) / 4.0 + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    return o.transpose(0, 2, 1, 3).reshape(b, s, width) @ np.asarray(w_out, np.float64)


def multi_head_inputs(rng, dtype):
    """x of unit scale, weights scaled by their fan-in: scores of a few units, a softmax far from
    uniform (were every score near 0, wrong keys would go unnoticed)."""
    shapes = {"x": (2, 40, 32), "w_qkv": (32, 96), "w_out": (32, 32)}
    return {n: (rng.standard_normal(s) / (np.sqrt(s[0]) if n.startswith("w") else 1)).astype(dtype)
            for n, s in shapes.items()}


def test_multi_head_attention_reads_the_projection_and_writes_merged_heads_in_place():
    inputs = multi_head_inputs(np.random.default_rng(0), ml_dtypes.bfloat16)
    program = multi_head.program(**inputs)
    assert [s.op for s in program.plan.steps] == ["gemm", "strided_attention", "gemm"]
    (attention,) = [k for k in program.candidate.kernels if k.op.op == "strided_attention"]
    assert {"strided_read", "strided_write"} <= set(attention.fused)
    assert "bf16[2,40,96][view 2x2x40x16 strides (3840,16,96,1) +32]" in str(program.plan)
    want = multi_head_reference(**inputs)
    got = np.asarray(multi_head(**inputs), np.float64)
    np.testing.assert_allclose(got, want, atol=3e-2 * np.abs(want).max(), rtol=0)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_multi_head_plan_matches_numpy_in_the_emulator():
    inputs = multi_head_inputs(np.random.default_rng(1), ml_dtypes.bfloat16)
    program = multi_head.program(**inputs)
    assert "strided_attention" in [s.op for s in program.plan.steps]
    (got,) = run_plan_emulated(program.plan, inputs)
    want = multi_head_reference(**inputs)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=3e-2 * np.abs(want).max(), rtol=0)


def heads(x, index: int, layout: str, h: int, d: int):
    """Operand `index` (0: q, 1: k, 2: v) of a packed projection x [b, s, 3·h·d] as [b, h, s, d]:
    'qkv' packs (3, h, d) per token, 'hqkv' (h, 3, d)."""
    b, s, _ = x.shape
    split = (b, s, 3, h, d) if layout == "qkv" else (b, s, h, 3, d)
    cut = [0, 0, 0, 0, 0]
    cut[2 if layout == "qkv" else 3] = index
    stops = list(split)
    stops[2 if layout == "qkv" else 3] = index + 1
    part = make("slice", make("reshape", x, shape=split), starts=tuple(cut), stops=tuple(stops), steps=(1,) * 5)
    part = make("reshape", part, shape=(b, s, h, d))
    return make("transpose", part, axes=(0, 2, 1, 3))


@st.composite
def attention_programs(draw):
    """A flash_attention over heads cut from a packed projection (either packing, some operands
    dense inputs instead), its output transposed back or not, kept as a second output or not."""
    b, s, h = draw(st.integers(1, 2)), draw(st.integers(3, 12)), draw(st.integers(1, 3))
    d = draw(st.sampled_from((4, 8)))
    x = make_input("x", (b, s, 3 * h * d), F32)
    dense = make_input("dense", (b, h, s, d), F32)
    layout = draw(st.sampled_from(("qkv", "hqkv")))
    operands = [heads(x, i, layout, h, d) if draw(st.booleans()) else dense for i in range(3)]
    mask = (make_input("mask", (s, s), F32),) if draw(st.booleans()) else ()
    o = make("flash_attention", *operands, *mask, scale=d ** -0.5, causal=draw(st.booleans()), has_mask=bool(mask))
    merged = make("transpose", o, axes=(0, 2, 1, 3)) if draw(st.booleans()) else o
    outputs = (merged, o) if merged is not o and draw(st.booleans()) else (merged,)
    if draw(st.booleans()):                    # another reader of q's copy keeps it
        outputs += (make("exp", operands[0]),)
    return Graph("g", (x, dense, *mask), outputs)


def lowered_computes_the_same(graph: Graph, seed: int, tol: float = 1e-6) -> Graph:
    """`graph` with its layout chains folded and attention views read in place, checked to compute
    what `graph` does on random float32 inputs."""
    rng = np.random.default_rng(seed)
    feeds = {n.attr("name"): rng.standard_normal(n.shape).astype(np.float32) for n in graph.inputs}
    read = read_attention_views(fold_layout_chains(graph))
    for got, want in zip(evaluate(read, feeds), evaluate(graph, feeds)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return read


@settings(max_examples=80, deadline=None)
@given(attention_programs(), st.integers(0, 2**31 - 1))
def test_reading_attention_views_in_place_computes_what_the_program_did(graph, seed):
    read = lowered_computes_the_same(graph, seed)
    assert read.op_counts()["transpose"] <= graph.op_counts()["transpose"]


def attention_over(x, layout="qkv", h=2, d=8, merge=(0, 2, 1, 3)):
    q, k, v = (heads(x, i, layout, h, d) for i in range(3))
    o = make("flash_attention", q, k, v, scale=0.5, causal=False, has_mask=False)
    return o, (make("transpose", o, axes=merge) if merge else o)


def strided(graph: Graph):
    return [n for n in read_attention_views(graph).nodes if n.op == "strided_attention"]


def test_the_views_are_read_where_the_projection_wrote_them_and_o_written_as_merged():
    x = make_input("x", (2, 10, 48), F32)
    _, merged = attention_over(x, layout="hqkv")
    (node,) = strided(Graph("g", (x,), (merged,)))
    a = node.attr_map
    assert node.args == (x, x, x) and node.shape == (2, 10, 2, 8)
    assert a["strides"][:4] == (480, 24, 48, 1) and a["offsets"] == (0, 8, 16)     # (h, 3, d) per token
    assert a["out_strides"] == (160, 8, 16, 1)


def test_an_output_copy_that_moves_the_head_dim_is_left_to_its_kernel():
    x = make_input("x", (2, 10, 48), F32)
    o, moved = attention_over(x, merge=(0, 1, 3, 2))
    (node,) = strided(Graph("g", (x,), (moved,)))
    assert node.attr_map["out_strides"] == (160, 80, 8, 1) and node.shape == o.shape    # written dense


def test_an_attention_output_that_is_a_program_output_is_written_dense():
    x = make_input("x", (2, 10, 48), F32)
    o, merged = attention_over(x)
    nodes = read_attention_views(Graph("g", (x,), (merged, o))).nodes
    assert [n.op for n in nodes].count("transpose") == 1
    (node,) = [n for n in nodes if n.op == "strided_attention"]
    assert node.shape == o.shape


def test_rows_that_start_off_16_bytes_keep_their_copies():
    x = make_input("x", (2, 10, 3 * 2 * 12), BF16)       # bf16 heads of 12: every other one starts 24 bytes in
    _, merged = attention_over(x, h=2, d=12)
    graph = Graph("g", (x,), (merged,))
    assert read_attention_views(graph) is graph


def test_an_attention_of_dense_operands_is_left_alone():
    q = make_input("q", (2, 2, 10, 8), F32)
    o = make("flash_attention", q, q, q, scale=0.5, causal=False, has_mask=False)
    graph = Graph("g", (q,), (o,))
    assert read_attention_views(graph) is graph


def test_a_query_without_heads_against_kv_heads_broadcasts_when_its_views_are_padded():
    q, k = make_input("q", (6, 8), F32), make_input("k", (3, 6, 8), F32)
    o = make("flash_attention", q, k, k, scale=0.5, causal=False, has_mask=False)
    graph = Graph("g", (q, k), (make("transpose", o, axes=(1, 0, 2)),))
    read = read_attention_views(graph)
    assert [n.op for n in read.nodes if n.op != "input"] == ["strided_attention"]   # q read as [1, 6, 8]
    rng = np.random.default_rng(5)
    feeds = {"q": rng.standard_normal((6, 8)).astype(np.float32),
             "k": rng.standard_normal((3, 6, 8)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(read, feeds)[0], evaluate(graph, feeds)[0], rtol=1e-6, atol=1e-6)


def test_attention_of_an_attention_s_merged_heads_reads_them_as_written():
    x, y = make_input("x", (2, 10, 48), F32), make_input("y", (2, 2, 3 * 10 * 8), F32)
    _, merged = attention_over(x)                  # [2, 10, 2, 8]: the first attention writes it in place
    again = make("flash_attention", merged, heads(y, 1, "qkv", 10, 8), heads(y, 2, "qkv", 10, 8), scale=0.5,
                 causal=False, has_mask=False)     # ... and the second reads it as a dense q
    graph = Graph("g", (x, y), (again,))
    read = read_attention_views(fold_layout_chains(graph))
    assert [n.op for n in read.nodes if n.op != "input"] == ["strided_attention", "strided_attention"]
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 10, 48)).astype(np.float32),
             "y": rng.standard_normal((2, 2, 240)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(read, feeds)[0], evaluate(graph, feeds)[0], rtol=1e-6, atol=1e-6)


def test_an_empty_attention_is_left_alone():
    x = make_input("x", (2, 0, 2, 8), F32)
    q = make("transpose", x, axes=(0, 2, 1, 3))
    o = make("flash_attention", q, q, q, scale=0.5, causal=False, has_mask=False)
    graph = Graph("g", (x,), (make("transpose", o, axes=(0, 2, 1, 3)),))
    assert read_attention_views(graph) is graph


def test_rows_further_apart_than_the_kernels_index_keep_their_copies():
    x = make_input("x", (2, 4097, 3 * 16 * 128), BF16)          # sequence-first: rows 4097 · 6144 apart
    parts = (make("slice", x, starts=(0, 0, i * 2048), stops=(2, 4097, (i + 1) * 2048), steps=(1, 1, 1))
             for i in range(3))
    q, k, v = (make("transpose", make("reshape", p, shape=(2, 4097, 16, 128)), axes=(1, 2, 0, 3)) for p in parts)
    o = make("flash_attention", q, k, v, scale=0.125, causal=True, has_mask=False)
    assert [n.op for n in read_attention_views(fold_layout_chains(Graph("g", (x,), (o,)))).nodes
            if n.op != "input"].count("strided_attention") == 0
