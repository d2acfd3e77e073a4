"""Chains of layout ops fold into one strided_copy where that saves a copy kernel: the folded graph
computes the same values (exactly: they are copies), and attention's q, k, v cut from one
projection take one copy each."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.lower.layout_chains import fold_layout_chains, reshaped_strides


def _step(draw, node):
    """One random layout op over `node`."""
    shape = node.shape
    kind = draw(st.sampled_from(["transpose", "slice", "reshape", "broadcast_to"]))
    if kind == "transpose":
        axes = tuple(draw(st.permutations(range(len(shape)))))
        return make("transpose", node, axes=axes)
    if kind == "slice":
        starts, stops, steps = [], [], []
        for n in shape:
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            starts.append(start), stops.append(stop), steps.append(draw(st.integers(1, 3)))
        return make("slice", node, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    if kind == "reshape":
        total = int(np.prod(shape))
        split = [d for d in range(1, total + 1) if total % d == 0]
        first = draw(st.sampled_from(split))
        return make("reshape", node, shape=(first, total // first))
    axis = draw(st.integers(0, len(shape) - 1))
    if shape[axis] != 1:
        return make("reshape", node, shape=shape[:axis] + (1,) + shape[axis:]) if len(shape) < 4 else node
    return make("broadcast_to", node, shape=shape[:axis] + (draw(st.integers(2, 3)),) + shape[axis + 1:])


@st.composite
def chains(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    x = make_input("x", shape, DType.float32)
    node = x
    for _ in range(draw(st.integers(1, 5))):
        node = _step(draw, node)
    if draw(st.booleans()):       # a concatenate of chains, the pieces read in place
        other = _step(draw, make("transpose", x, axes=tuple(range(len(shape)))[::-1]))
        if other.shape == node.shape:
            node = make("concatenate", node, other, node, axis=draw(st.integers(0, len(shape) - 1))) \
                if len(node.shape) == len(shape) else node
        else:
            node = make("concatenate", node, node, axis=len(node.shape) - 1)
        if draw(st.booleans()):   # ... copied into another layout: the pieces written there
            node = make("transpose", node, axes=tuple(draw(st.permutations(range(len(node.shape))))))
    return Graph("chain", (x,), (make("tanh", node),)), shape


@settings(max_examples=400, deadline=None)
@given(chains())
def test_a_folded_chain_computes_the_same_values(chain):
    graph, shape = chain
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7 + 1
    want = evaluate(graph, {"x": x})[0]
    folded = fold_layout_chains(graph)
    np.testing.assert_array_equal(evaluate(folded, {"x": x})[0], want)
    assert len(folded.nodes) <= len(graph.nodes)


def test_reshape_strides_follow_numpy_where_it_makes_no_copy():
    base = np.arange(4 * 6 * 5).reshape(4, 6, 5)[:, ::2, :].transpose(1, 0, 2)    # (3, 4, 5), strided
    strides = tuple(s // base.itemsize for s in base.strides)
    for new_shape in [(3, 20), (12, 5), (3, 4, 5, 1), (60,), (3, 2, 2, 5)]:
        got = reshaped_strides(base.shape, strides, new_shape)
        try:
            view = base.view()
            view.shape = new_shape                       # raises where numpy would have to copy
            want = tuple(s // base.itemsize for s in view.strides)
            assert [g for g, n in zip(got, new_shape) if n > 1] == [w for w, n in zip(want, new_shape) if n > 1]
        except AttributeError:
            assert got is None


def test_q_k_v_cut_from_one_projection_fold_to_one_copy_each_which_attention_reads_in_place():
    def attention(x, w):
        b, s, d = x.shape
        qkv = x @ w
        q, k, v = (op.transpose(op.reshape(qkv[:, :, i * d:(i + 1) * d], (b, s, 4, d // 4)), (0, 2, 1, 3))
                   for i in range(3))
        return op.flash_attention(q, k, v, causal=True)
    x, w = op.tensor((2, 128, 256), "bf16"), op.tensor((256, 768), "bf16")
    program = op.kernel(attention).program(x, w)
    folded = fold_layout_chains(program.graph).op_counts()
    assert folded["strided_copy"] == 3 and folded["slice"] == folded["transpose"] == 0
    assert [s.op for s in program.plan.steps] == ["gemm", "strided_attention"]     # attention_views.py
    rng = np.random.default_rng(1)
    xs, ws = rng.standard_normal((2, 16, 64)), rng.standard_normal((64, 192)) / 8
    np.testing.assert_allclose(op.kernel(attention)(xs, ws), attention(xs, ws), rtol=1e-10)


def test_the_gradient_of_q_k_v_cut_from_one_projection_launches_no_copy():
    def loss(x, w, g):
        b, s, d = x.shape
        qkv = op.reshape(x @ w, (b, s, 3, 4, d // 4))
        q, k, v = (op.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
        return op.sum(op.flash_attention(q, k, v, causal=True) * g)
    grad = op.grad(loss, argnums=1)
    x, w, g = op.tensor((2, 128, 256), "bf16"), op.tensor((256, 768), "bf16"), op.tensor((2, 4, 128, 64), "bf16")
    # the three pieces fold into one strided_concatenate, which the attention backward then writes
    # itself (lower/attention_writes.py)
    steps = [s.op for s in grad.program(x, w, g).plan.steps]
    assert "strided_attention_bwd" in steps and not {"strided_concatenate", "concatenate", "transpose"} & set(steps)
    rng = np.random.default_rng(2)
    xs, ws, gs = rng.standard_normal((2, 16, 64)), rng.standard_normal((64, 192)) / 8, rng.standard_normal((2, 4, 16, 16))
    want = op.grad(loss, argnums=1).trace(xs, ws, gs)
    np.testing.assert_allclose(grad(xs, ws, gs), evaluate(want, {"x": xs, "w": ws, "g": gs})[0], rtol=1e-10)


def heads_first_gradient(x, keep_concatenate: bool = False) -> Graph:
    """The cotangent of `qkv[i]` cut from heads [3, B, H, S, D], moved back to [B, S, 3, H, D]: a
    transpose of the concatenate of three pieces of x [3·B·H·S·D], read by a tanh (and the
    concatenate by an exp, where `keep_concatenate`)."""
    pieces = [make("reshape", make("slice", x, starts=(i * 96,), stops=((i + 1) * 96,), steps=(1,)),
                   shape=(1, 2, 2, 3, 8)) for i in range(3)]
    joined = make("concatenate", *pieces, axis=0)
    moved = make("transpose", joined, axes=(1, 3, 0, 2, 4))
    return Graph("g", (x,), (make("tanh", moved),) + ((make("exp", joined),) if keep_concatenate else ()))


def test_a_copy_of_a_concatenate_is_one_strided_concatenate_in_the_copy_s_layout():
    x = make_input("x", (3 * 96,), DType.float32)
    graph = heads_first_gradient(x)
    folded = fold_layout_chains(graph)
    (joined,) = [n for n in folded.nodes if n.op not in ("input", "tanh")]
    assert joined.op == "strided_concatenate" and joined.attr_map["axis"] == 2 and joined.shape == (2, 3, 3, 2, 8)
    value = np.arange(3 * 96, dtype=np.float32) / 7
    np.testing.assert_array_equal(evaluate(folded, {"x": value})[0], evaluate(graph, {"x": value})[0])
    kept = heads_first_gradient(x, keep_concatenate=True)           # the concatenate is read as it is too
    assert "concatenate" in [n.op for n in fold_layout_chains(kept).nodes]


def split_gradient(x, heads=(2, 2, 2)) -> Graph:
    """The cotangent of q, k and v split off one projection [B, S, 3·C]: each piece of x a head-major
    [B, H, S, D] moved back to [B, S, H, D] and merged to [B, S, H·D], the three concatenated."""
    pieces, at = [], 0
    for h in heads:
        piece = make("reshape", make("slice", x, starts=(at,), stops=(at + 2 * h * 3 * 8,), steps=(1,)),
                     shape=(2, h, 3, 8))
        pieces.append(make("reshape", make("transpose", piece, axes=(0, 2, 1, 3)), shape=(2, 3, h * 8)))
        at += 2 * h * 3 * 8
    return Graph("g", (x,), (make("tanh", make("concatenate", *pieces, axis=2)),))


@pytest.mark.parametrize("heads", [(2, 2, 2), (1, 3, 2)])
def test_a_concatenate_of_merged_pieces_joins_them_unmerged_then_reshapes(heads):
    x = make_input("x", (2 * 3 * 8 * sum(heads),), DType.float32)
    graph = split_gradient(x, heads)
    folded = fold_layout_chains(graph)
    assert [n.op for n in folded.nodes if n.op not in ("input", "tanh")] == ["strided_concatenate", "reshape"]
    value = np.arange(x.type.numel, dtype=np.float32) / 7
    np.testing.assert_array_equal(evaluate(folded, {"x": value})[0], evaluate(graph, {"x": value})[0])


def test_a_concatenate_of_one_folded_piece_is_a_strided_copy():
    x = make_input("x", (2, 8, 12), DType.float32)
    graph = Graph("one", (x,), (make("concatenate", make("transpose", x, axes=(1, 0, 2)), axis=0),))
    folded = fold_layout_chains(graph)
    assert [n.op for n in folded.nodes] == ["input", "strided_copy"]
    value = np.arange(2 * 8 * 12, dtype=np.float32).reshape(2, 8, 12)
    np.testing.assert_array_equal(evaluate(folded, {"x": value})[0], value.transpose(1, 0, 2))


def test_a_strided_copy_reaching_past_its_operand_is_refused():
    with pytest.raises(ShapeError, match="reaching element 12 of a tensor of 12"):
        OPS["strided_copy"].infer(TensorType((3, 4), DType.float32), shape=(2, 2), strides=(8, 4), offset=0)
