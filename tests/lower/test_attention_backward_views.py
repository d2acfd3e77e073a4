"""The attention backward reading q, k, v and dO where they were written (lower/attention_views.py):
a training step's copies of q, k and v, read by the forward with logsumexps and by the backward,
and its copy of dO, read by the row statistics and the backward, go where attention kernels alone
read them; the program computes what it did (numpy reference here, the generated kernels in the
emulator, float64 gradients end to end)."""

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
from tessera_rw.lower.lowering import view_offset
from tests.lower.test_attention_views import heads, lowered_computes_the_same

F32 = DType.float32
STRIDED = ("strided_attention_lse", "strided_attention_row_stats_from_lse", "strided_attention_bwd")


def merged(y, h: int, d: int):
    """y [b, s, h·d] as [b, h, s, d]: a cotangent arriving with the heads side by side."""
    b, s, _ = y.shape
    return make("transpose", make("reshape", y, shape=(b, s, h, d)), axes=(0, 2, 1, 3))


def backward(q, k, v, do, scale: float, causal: bool, mask=None):
    """The forward with logsumexps, the row statistics read off it, and the gradients packed."""
    flags = dict(scale=scale, causal=causal, has_mask=mask is not None)
    masks = (mask,) if mask is not None else ()
    fwd = make("flash_attention_lse", q, k, v, *masks, **flags)
    stats = make("attention_row_stats_from_lse", fwd, do)
    return fwd, make("flash_attention_bwd", q, k, v, do, stats, *masks, **flags)


def joined(grads, layout: str, b: int, h: int, s: int, d: int):
    """flash_attention_bwd's packed dQ | dK | dV as the gradient of a projection packing q, k and v
    as `layout` says ('qkv': (3, h, d) per token, 'hqkv': (h, 3, d)): each transposed back from
    heads, the three concatenated."""
    n, axis = b * h * s * d, 2 if layout == "qkv" else 3
    parts = []
    for i in range(3):
        part = make("reshape", make("slice", grads, starts=(i * n,), stops=((i + 1) * n,), steps=(1,)),
                    shape=(b, h, s, d))
        part = make("transpose", part, axes=(0, 2, 1, 3))
        parts.append(make("reshape", part, shape=(b, s, 1, h, d) if axis == 2 else (b, s, h, 1, d)))
    return make("concatenate", *parts, axis=axis)


def repeated(t, times: int):
    """t [b, kv, s, d] with each head repeated `times` times in a row: [b, kv·times, s, d] (GQA)."""
    b, kv, s, d = t.shape
    spread = make("broadcast_to", make("reshape", t, shape=(b, kv, 1, s, d)), shape=(b, kv, times, s, d))
    return make("reshape", spread, shape=(b, kv * times, s, d))


def merged_o(fwd, b: int, h: int, s: int, d: int):
    """The attention output O [b, s, h, d] out of flash_attention_lse's result: heads side by side."""
    o = make("reshape", make("slice", fwd, starts=(0,), stops=(b * h * s * d,), steps=(1,)), shape=(b, h, s, d))
    return make("transpose", o, axes=(0, 2, 1, 3))


def reads_moved(node) -> bool:
    """Whether `node` reads a gradient moved back from heads (whose copy goes, the backward writing
    it so), rather than one read as it is (which keeps the moved one's copy)."""
    chain = node.args[0]
    return chain.op == "transpose" and chain.args[0].op == "reshape" and chain.args[0].args[0].op == "slice" \
        and chain.args[0].args[0].args[0].op == "flash_attention_bwd"


def reads_o(node) -> bool:
    """Whether `node` reads merged_o's copy: the forward under its chain of first operands."""
    while node.args:
        node = node.args[0]
        if node.op == "flash_attention_lse":
            return True
    return False


@st.composite
def backward_programs(draw):
    """A training step's attention: q, k, v cut from a packed projection (either packing) or dense
    inputs, K and V of fewer heads repeated for the query heads or not, dO with the heads merged or
    dense, a mask or none; the gradients packed, joined as the projection's, or each moved back
    from heads (for projections of their own: one of them now and then read as it is too); the
    forward kept as an output or not, O copied with the heads side by side or not, and now and then
    another reader of q's or dO's copy, which keeps it."""
    b, s, h = draw(st.integers(1, 2)), draw(st.integers(3, 12)), draw(st.integers(1, 4))
    d = draw(st.sampled_from((4, 8)))
    x, y = make_input("x", (b, s, 3 * h * d), F32), make_input("y", (b, s, h * d), F32)
    dense = make_input("dense", (b, h, s, d), F32)
    layout = draw(st.sampled_from(("qkv", "hqkv")))
    q, k, v = (heads(x, i, layout, h, d) if draw(st.booleans()) else dense for i in range(3))
    if h > 1 and draw(st.booleans()):          # K and V of fewer heads, repeated for the query heads (GQA)
        kv = draw(st.sampled_from([n for n in (1, 2) if h % n == 0 and n < h]))
        k, v = (repeated(make("slice", t, starts=(0, 0, 0, 0), stops=(b, kv, s, d), steps=(1,) * 4), h // kv)
                for t in (k, v))
    do = merged(y, h, d) if draw(st.booleans()) else dense
    mask = make_input("mask", (s, s), F32) if draw(st.booleans()) else None      # an additive one
    fwd, grads = backward(q, k, v, do, d ** -0.5, draw(st.booleans()), mask)
    packed = draw(st.sampled_from(("packed", "joined", "moved")))
    outputs = (joined(grads, layout, b, h, s, d),) if packed == "joined" else (grads,)
    if packed == "moved":
        runs = [make("reshape", make("slice", grads, starts=(i * b * h * s * d,), stops=((i + 1) * b * h * s * d,),
                                     steps=(1,)), shape=(b, h, s, d)) for i in range(3)]
        outputs = tuple(make("exp", make("transpose", r, axes=(0, 2, 1, 3))) for r in runs)
        if draw(st.booleans()):
            outputs += (make("exp", runs[draw(st.integers(0, 2))]),)
    outputs += (fwd,) if draw(st.booleans()) else ()
    if draw(st.booleans()):                    # O, heads side by side, read by the output projection
        outputs += (make("exp", merged_o(fwd, b, h, s, d)),)
    if draw(st.booleans()):
        outputs += (make("exp", draw(st.sampled_from((q, do)))),)
    return Graph("g", (x, y, dense) + ((mask,) if mask is not None else ()), outputs)


@settings(max_examples=80, deadline=None)
@given(backward_programs(), st.integers(0, 2**31 - 1))
def test_reading_backward_views_in_place_computes_what_the_program_did(graph, seed):
    read = lowered_computes_the_same(graph, seed, tol=1e-5)
    # an exp of q's or dO's copy keeps it, and O's copy stays where the forward is an output itself
    fwd_out = any(n.op == "flash_attention_lse" for n in graph.outputs)
    kept = {n for n in graph.nodes if n.op == "exp" and (not reads_o(n) or fwd_out) and not reads_moved(n)}
    copies = [n for n in read.nodes if n.op in ("strided_copy", "transpose", "concatenate", "strided_concatenate")
              and view_offset(n.op, n.args[0].type, n.attr_map) is None]      # a transpose of one head is a view
    assert len(copies) <= len(kept)            # a copy stays only where something else reads it


def test_the_training_step_s_copies_of_q_k_v_and_do_are_gone():
    x, y = make_input("x", (2, 10, 48), F32), make_input("y", (2, 10, 16), F32)
    q, k, v = (heads(x, i, "qkv", 2, 8) for i in range(3))
    fwd, grads = backward(q, k, v, merged(y, 2, 8), 0.5, True)
    read = read_attention_views(fold_layout_chains(Graph("g", (x, y), (grads, fwd))))
    assert [n.op for n in read.nodes if n.op != "input"] == list(STRIDED)
    lse, stats, bwd = (n for n in read.nodes if n.op != "input")
    assert lse.args == (x, x, x) and stats.args == (lse, y) and bwd.args == (x, x, x, y, stats)
    assert bwd.attr_map["offsets"] == (0, 16, 32, 0)
    assert bwd.attr_map["strides"][12:] == (160, 8, 16, 1)                 # dO's rows, heads side by side


def test_a_cotangent_repeated_over_heads_is_no_gqa_operand():
    x, y = make_input("x", (2, 10, 96), F32), make_input("y", (2, 2, 10, 8), F32)
    q, k, v = (heads(x, i, "qkv", 4, 8) for i in range(3))
    fwd, grads = backward(q, k, v, repeated(y, 2), 0.5, False)       # dO the same for pairs of heads
    read = lowered_computes_the_same(Graph("g", (x, y), (grads,)), seed=4)
    stats = next(n for n in read.nodes if "row_stats" in n.op)
    assert stats.shape == (2, 4, 10, 2)


def test_a_copy_read_by_another_kernel_stays_for_all_its_readers():
    x, y = make_input("x", (2, 10, 48), F32), make_input("y", (2, 10, 16), F32)
    q, k, v = (heads(x, i, "qkv", 2, 8) for i in range(3))
    fwd, grads = backward(q, k, v, merged(y, 2, 8), 0.5, False)
    read = read_attention_views(fold_layout_chains(Graph("g", (x, y), (grads, make("exp", q)))))
    (copy,) = [n for n in read.nodes if n.op == "strided_copy"]
    assert all(n.args[0] is copy for n in read.nodes if n.op in ("strided_attention_lse", "strided_attention_bwd"))


LOSS_HEADS, LOSS_D = 2, 64


def attention_loss(x, w_qkv, w_out, target):
    """Σ target ∘ (causal self-attention of 2 heads of 64 from one q|k|v projection) · w_out."""
    b, s, width = x.shape
    qkv = op.reshape(x @ w_qkv, (b, s, 3, LOSS_HEADS, LOSS_D))
    q, k, v = (op.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
    o = op.flash_attention(q, k, v, causal=True)
    return op.sum(op.reshape(op.transpose(o, (0, 2, 1, 3)), (b, s, width)) @ w_out * target)


def attention_loss_grads(x, w_qkv, w_out, target):
    """d loss / d w_qkv and d w_out in float64 numpy, materialized."""
    x, w_qkv, w_out, target = (np.asarray(a, np.float64) for a in (x, w_qkv, w_out, target))
    b, s, width = x.shape
    q, k, v = (x @ w_qkv).reshape(b, s, 3, LOSS_HEADS, LOSS_D).transpose(2, 0, 3, 1, 4)
    scores = q @ np.swapaxes(k, -1, -2) * LOSS_D ** -0.5 + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, width)
    do = (target @ w_out.T).reshape(b, s, LOSS_HEADS, LOSS_D).transpose(0, 2, 1, 3)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) * LOSS_D ** -0.5
    dqkv = np.stack([ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do])
    dqkv = dqkv.transpose(1, 3, 0, 2, 4).reshape(b, s, 3 * width)
    return np.einsum("bsi,bsj->ij", x, dqkv), np.einsum("bsi,bsj->ij", o, target)


def loss_inputs(seed: int) -> dict[str, np.ndarray]:
    """x and target of unit scale, weights scaled by their fan-in: q, k and v of unit scale, so the
    scores spread over several units and the softmax is far from uniform (with every score near 0,
    wrong keys would go unnoticed)."""
    rng = np.random.default_rng(seed)
    width = LOSS_HEADS * LOSS_D
    shapes = {"x": (1, 96, width), "w_qkv": (width, 3 * width), "w_out": (width, width), "target": (1, 96, width)}
    return {n: (rng.standard_normal(s) / (np.sqrt(s[0]) if n.startswith("w") else 1)).astype(ml_dtypes.bfloat16)
            for n, s in shapes.items()}


def heads_first_loss(x, w_qkv, w_out, target):
    """attention_loss with q, k and v indexed off heads moved first (`qkv[i]` of [3, B, H, S, D])."""
    b, s, width = x.shape
    qkv = op.transpose(op.reshape(x @ w_qkv, (b, s, 3, LOSS_HEADS, LOSS_D)), (2, 0, 3, 1, 4))
    o = op.flash_attention(qkv[0], qkv[1], qkv[2], causal=True)
    return op.sum(op.reshape(op.transpose(o, (0, 2, 1, 3)), (b, s, width)) @ w_out * target)


def split_loss(x, w_qkv, w_out, target):
    """attention_loss with q, k and v split off the projection's last axis, then given heads (as
    nanoGPT writes it)."""
    b, s, width = x.shape
    qkv = x @ w_qkv
    q, k, v = (op.transpose(op.reshape(qkv[:, :, i * width:(i + 1) * width], (b, s, LOSS_HEADS, LOSS_D)),
                            (0, 2, 1, 3)) for i in range(3))
    o = op.flash_attention(q, k, v, causal=True)
    return op.sum(op.reshape(op.transpose(o, (0, 2, 1, 3)), (b, s, width)) @ w_out * target)


GRADS = {name: op.grad(loss, argnums=(1, 2)) for name, loss in
         (("slices", attention_loss), ("heads first", heads_first_loss), ("split", split_loss))}


def check_grads(got, inputs) -> None:
    for g, want in zip(got, attention_loss_grads(**inputs)):
        np.testing.assert_allclose(np.asarray(g, np.float64), want, atol=1.5e-2 * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize("style", GRADS)
def test_a_training_step_s_attention_launches_no_copy(style):
    inputs = loss_inputs(0)
    program = GRADS[style].program(**inputs)
    ops = [s.op for s in program.plan.steps]
    assert set(STRIDED) <= set(ops) and ops.count("gemm") == 4 and len(ops) == 7, ops
    bwd = next(k for k in program.candidate.kernels if k.op.op == "strided_attention_bwd")
    assert {"strided_read", "strided_write"} <= set(bwd.fused)
    check_grads(GRADS[style](**inputs), inputs)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("style", GRADS)
def test_the_training_step_s_attention_plan_matches_numpy_in_the_emulator(style):
    inputs = loss_inputs(1)
    program = GRADS[style].program(**inputs)
    assert "strided_attention_bwd" in [s.op for s in program.plan.steps]
    check_grads(run_plan_emulated(program.plan, inputs), inputs)


GQA_HEADS, KV_HEADS = 4, 2


def gqa_loss(x, w_q, w_kv, w_out, target):
    """Σ target ∘ attention · w_out with each K/V head shared by two query heads, repeated for them
    by reshape and broadcast (as Llama's repeat_kv writes it)."""
    b, s, width = x.shape
    q = op.transpose(op.reshape(x @ w_q, (b, s, GQA_HEADS, LOSS_D)), (0, 2, 1, 3))
    kv = op.reshape(x @ w_kv, (b, s, 2, KV_HEADS, LOSS_D))
    k, v = (op.transpose(kv[:, :, i], (0, 2, 1, 3)) for i in range(2))
    k, v = (op.reshape(op.broadcast_to(op.reshape(t, (b, KV_HEADS, 1, s, LOSS_D)),
                                       (b, KV_HEADS, GQA_HEADS // KV_HEADS, s, LOSS_D)), (b, GQA_HEADS, s, LOSS_D))
            for t in (k, v))
    o = op.flash_attention(q, k, v, causal=True)
    return op.sum(op.reshape(op.transpose(o, (0, 2, 1, 3)), (b, s, width)) @ w_out * target)


GQA_GRADS = op.grad(gqa_loss, argnums=(1, 2, 3))


def gqa_inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    width = GQA_HEADS * LOSS_D
    shapes = {"x": (1, 80, width), "w_q": (width, width), "w_kv": (width, 2 * KV_HEADS * LOSS_D),
              "w_out": (width, width), "target": (1, 80, width)}
    return {n: (rng.standard_normal(s) / (np.sqrt(s[0]) if n.startswith("w") else 1)).astype(ml_dtypes.bfloat16)
            for n, s in shapes.items()}


def check_gqa_grads(got, inputs) -> None:
    """Against the written-out gradient (every score materialized, K and V repeated) in float64."""
    wide = {n: np.asarray(a, np.float64) for n, a in inputs.items()}
    for g, want in zip(got, evaluate(GQA_GRADS.trace(**wide), wide)):
        np.testing.assert_allclose(np.asarray(g, np.float64), want, atol=1.5e-2 * np.abs(want).max(), rtol=0)


def test_gqa_attention_s_backward_reads_the_shared_heads_without_repeating_them():
    inputs = gqa_inputs(2)
    program = GQA_GRADS.program(**inputs)
    ops = [s.op for s in program.plan.steps]
    assert set(STRIDED) <= set(ops) and "strided_copy" not in ops, ops          # K, V repeated by no copy
    assert "transpose" not in ops                # dQ written with the heads side by side for w_q's gradient
    bwd = next(s.node for s in program.plan.steps if s.op == "strided_attention_bwd")
    assert bwd.attr_map["shapes"][4:8] == (1, KV_HEADS, 80, LOSS_D)              # K: its own heads
    check_gqa_grads(GQA_GRADS(**inputs), inputs)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_gqa_plan_matches_the_written_out_gradient_in_the_emulator():
    inputs = gqa_inputs(3)
    check_gqa_grads(run_plan_emulated(GQA_GRADS.program(**inputs).plan, inputs), inputs)
