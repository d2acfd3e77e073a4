"""Attention's backward pass as one fused node, end to end: `op.grad` of a loss over attention (the
op, or softmax(QKᵀ)V written out) rewrites to attention_row_stats + flash_attention_bwd with dQ,
dK, dV as views of its packed result, the chosen plan takes the row statistics off a forward that
writes each row's logsumexp and stores nothing Sq×Sk, and the numpy executor
gives the gradients float64 numpy computes. The host kernels are checked against the materialized
references over random shapes, masks, GQA heads and block sizes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera_rw import op
from tessera_rw.algebra.errors import ShapeError
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.attention import attention_reference
from tessera_rw.algebra.ops.attention_backward import (attention_lse_reference, bwd_reference,
                                                      row_stats_reference, split_lse, stats_from_lse_reference)
from tessera_rw.codegen.cpu_attention import flash_attention_lse_blockwise
from tessera_rw.codegen.cpu_attention_backward import bwd_blockwise, row_stats_blockwise

B, H, S, D = 2, 4, 256, 64
SCALE = D ** -0.5


def fused_attention_loss(q, k, v, w):
    return op.sum(op.flash_attention(q, k, v, scale=SCALE, causal=True) * w)


def written_out_loss(q, k, v, w):
    return op.sum(op.softmax(q @ k.mT * SCALE, axis=-1) @ v * w)


def written_causal_loss(q, k, v, w):         # GPT-2's form: where(tril, s, -inf) by hand
    keep = op.tril(op.ones((q.shape[-2], k.shape[-2]), "bool"))
    return op.sum(op.softmax(op.where(keep, q @ k.mT * SCALE, -math.inf), axis=-1) @ v * w)


def masked_attention_loss(q, k, v, w, mask):
    return op.sum(op.flash_attention(q, k, v, scale=SCALE, mask=mask) * w)


def numpy_grads(q, k, v, w, causal: bool, scale: float = SCALE, mask=None) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV of Σ attention(q, k, v [, bool or additive mask]) ∘ w in float64, materialized."""
    q, k, v, w = (a.astype(np.float64) for a in (q, k, v, w))
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = w @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ w


def atomic_backward_pin(plan, arch) -> tuple[tuple[int, object], ...]:
    """(step, schedule) pinning the plan's attention backward to the form that sums dQ with atomics
    (a `fast` option the cost model ranks second), for a run under `fast`."""
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.numerics import Numerics
    from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
    step = next(i for i, s in enumerate(plan.steps) if s.op == "flash_attention_bwd")
    backward = KernelOp.from_node(plan.steps[step].node, Numerics.FAST)
    return ((step, next(s for s in FlashAttentionBwdTemplate().schedules(backward, arch) if s.dq == "atomic")),)


def bf16_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((B, H, S, D)).astype(ml_dtypes.bfloat16) for _ in range(4)]


CASES = [pytest.param(fused_attention_loss, True, id="op.flash_attention-causal"),
         pytest.param(written_out_loss, False, id="softmax-written-out"),
         pytest.param(written_causal_loss, True, id="causal-where-written-out")]


@pytest.mark.parametrize("loss, causal", CASES)
def test_the_chosen_backward_is_one_fused_node_storing_nothing_quadratic(loss, causal):
    grad = op.grad(loss, argnums=(0, 1, 2))
    program = grad.program(*(op.tensor((B, H, S, D), "bf16") for _ in range(4)))
    kernels = [(k.kind, k.fused) for k in program.candidate.kernels]
    assert ("flash_attention", ("backward",) + (("causal",) if causal else ())) in kernels, kernels
    # the forward writes each row's logsumexp, and the row statistics are read off it
    forward = ("scale",) + (("causal",) if causal else ()) + ("softmax", "logsumexp")
    assert ("flash_attention", forward) in kernels and ("flash_attention", ("row_stats",)) in kernels, kernels
    assert not any(k.kind in ("gemm", "softmax") for k in program.candidate.kernels), kernels
    steps = [s.op for s in program.plan.steps]
    assert steps.count("flash_attention_bwd") == 1 and "matmul" not in steps
    # dQ, dK, dV are three views of the one packed buffer, and no buffer holds a score per (query, key)
    assert len({ref.buffer for ref in program.plan.outputs}) == 1
    assert max(b.nbytes for b in program.plan.buffers) < B * H * S * S * 2


@pytest.mark.parametrize("loss, causal", CASES)
def test_gradients_match_float64_numpy_on_the_numpy_executor(loss, causal):
    q, k, v, w = bf16_inputs(np.random.default_rng(7))
    got = op.grad(loss, argnums=(0, 1, 2))(q, k, v, w)
    for g, want in zip(got, numpy_grads(q, k, v, w, causal)):
        assert g.dtype == ml_dtypes.bfloat16 and g.shape == want.shape
        scale = np.sqrt(np.mean(want ** 2))
        assert np.max(np.abs(g.astype(np.float64) - want)) < 2e-2 * (scale + np.abs(want).max())


def random_masks(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A bool mask per batch item shared by the heads (each row keeps its first key), and a float one
    shared by all."""
    keep = rng.random((B, 1, S, S)) < 0.7
    keep[..., 0] = True
    return {"bool": keep, "float": rng.standard_normal((S, S)).astype(ml_dtypes.bfloat16)}


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_masked_backward_is_fused_with_its_mask_and_matches_float64(kind):
    rng = np.random.default_rng(8)
    mask = random_masks(rng)[kind]
    grad = op.grad(masked_attention_loss, argnums=(0, 1, 2))
    tensors = [op.tensor((B, H, S, D), "bf16") for _ in range(4)]
    program = grad.program(*tensors, op.tensor(mask.shape, "bool" if kind == "bool" else "bf16"))
    kernels = [(k.kind, k.fused) for k in program.candidate.kernels]
    assert ("flash_attention", ("backward", "mask")) in kernels, kernels
    assert ("flash_attention", ("scale", "mask", "softmax", "logsumexp")) in kernels, kernels
    assert ("flash_attention", ("row_stats",)) in kernels, kernels
    assert max(b.nbytes for b in program.plan.buffers) <= max(mask.nbytes, B * H * S * D * 2 * 3)
    q, k, v, w = bf16_inputs(rng)
    for g, want in zip(grad(q, k, v, w, mask), numpy_grads(q, k, v, w, False, mask=mask)):
        scale = np.sqrt(np.mean(want ** 2))
        assert np.max(np.abs(g.astype(np.float64) - want)) < 2e-2 * (scale + np.abs(want).max())


def test_grouped_query_heads_sum_their_gradients_back():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 64, 64)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((1, 4, 64, 64)).astype(np.float32)
    dq, dk, dv = op.grad(fused_attention_loss, argnums=(0, 1, 2))(q, k, v, w)
    wq, wk, wv = numpy_grads(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), w, causal=True)
    np.testing.assert_allclose(dq, wq, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dk, wk.reshape(1, 2, 2, 64, 64).sum(2), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dv, wv.reshape(1, 2, 2, 64, 64).sum(2), rtol=1e-4, atol=1e-5)


def test_one_query_head_broadcasts_over_the_kv_heads_forward_and_back():
    rng = np.random.default_rng(4)
    q, w = rng.standard_normal((1, 1, 16, 8)), rng.standard_normal((1, 3, 16, 8))
    k, v = (rng.standard_normal((1, 3, 16, 8)) for _ in range(2))
    wide = np.broadcast_to(q, k.shape)
    got = op.kernel(lambda q, k, v: op.flash_attention(q, k, v, causal=True))(q, k, v)
    np.testing.assert_allclose(got, attention_reference(wide, k, v, scale=8 ** -0.5, causal=True, has_mask=False),
                               rtol=1e-10, atol=1e-12)
    dq, dk, dv = op.grad(fused_attention_loss, argnums=(0, 1, 2))(q, k, v, w)
    wq, wk, wv = numpy_grads(wide, k, v, w, causal=True)
    np.testing.assert_allclose(dq, wq.sum(1, keepdims=True), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dk, wk, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dv, wv, rtol=1e-6, atol=1e-8)


def test_the_backward_ops_name_what_does_not_fit():
    t = op.tensor((2, 8, 64), "bf16")
    with pytest.raises(ShapeError, match="do .* differs from the attention output"):
        OPS["flash_attention_bwd"].infer(t.type, t.type, t.type, op.tensor((2, 8, 32), "bf16").type,
                                         op.tensor((2, 8, 2), "float32").type, scale=1.0, causal=False,
                                         has_mask=False)
    with pytest.raises(ShapeError, match="stats .* should be float"):
        OPS["flash_attention_bwd"].infer(t.type, t.type, t.type, t.type, op.tensor((2, 8), "float32").type,
                                         scale=1.0, causal=False, has_mask=False)


# ---- the host kernels against the materialized references ----------------------------------------

@st.composite
def attention_problems(draw):
    batch = draw(st.sampled_from([(), (2,), (2, 3), (1, 4)]))
    kv_heads = batch
    if len(batch) == 2 and batch[-1] == 4 and draw(st.booleans()):
        kv_heads = (batch[0], draw(st.sampled_from([1, 2])))         # GQA / MQA
    sq, sk, d, dv = (draw(st.integers(1, 40)) for _ in range(4))
    mask_kind = draw(st.sampled_from(["none", "causal", "bool", "float"]))
    return batch, kv_heads, sq, sk, d, dv, mask_kind, draw(st.integers(1, 17)), draw(st.integers(1, 17))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=attention_problems(), seed=st.integers(0, 2 ** 16))
def test_blockwise_host_kernels_match_the_references(problem, seed):
    batch, kv_heads, sq, sk, d, dv, mask_kind, block_q, block_k = problem
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (sq, d))
    k, v = rng.standard_normal(kv_heads + (sk, d)), rng.standard_normal(kv_heads + (sk, dv))
    do = rng.standard_normal(batch + (sq, dv))
    mask = ()
    if mask_kind == "bool":
        mask = (rng.random((sq, sk)) < 0.8,)
        mask[0][:, 0] = True                                   # no row masked whole
    elif mask_kind == "float":
        mask = (rng.standard_normal((sq, sk)),)
    flags = dict(scale=1 / math.sqrt(d), causal=mask_kind == "causal", has_mask=bool(mask))
    if flags["causal"] and sk < sq:
        return                                                 # rows past the keys are masked whole
    o = attention_reference(q, k, v, *mask, **flags)
    stats = row_stats_blockwise(q, k, o, do, *mask, **flags, block_q=block_q, block_k=block_k)
    np.testing.assert_allclose(stats, row_stats_reference(q, k, o, do, *mask, **flags), rtol=1e-10, atol=1e-10)
    grads = bwd_blockwise(q, k, v, do, stats, *mask, **flags, block_q=block_q, block_k=block_k)
    np.testing.assert_allclose(grads, bwd_reference(q, k, v, do, stats, *mask, **flags), rtol=1e-9, atol=1e-10)
    # the forward that writes each row's logsumexp, and the statistics read off it
    fwd = flash_attention_lse_blockwise(q, k, v, *mask, **flags, block_q=block_q, block_k=block_k)
    np.testing.assert_allclose(fwd, attention_lse_reference(q, k, v, *mask, **flags), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(stats_from_lse_reference(fwd, np.broadcast_to(do, o.shape)), stats,
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_the_logsumexp_split_in_two_16_bit_values_keeps_16_bits_or_more(dtype):
    rng = np.random.default_rng(3)
    lse = np.concatenate([rng.uniform(-30, 30, 2000), rng.uniform(-1e-3, 1e-3, 100), [0.0, -np.inf]])
    hi, lo = split_lse(lse, np.dtype(dtype))
    assert hi.dtype == lo.dtype == np.dtype(dtype)
    normal = np.abs(lse) >= 2.0 ** -14          # fp16's normal range: a bf16 value there is exact in it
    assert np.array_equal(hi[normal].astype(np.float64), lse[normal].astype(ml_dtypes.bfloat16).astype(np.float64))
    kept = hi.astype(np.float64) + lo.astype(np.float64)
    finite = np.isfinite(lse)
    assert np.all(np.abs(kept[finite] - lse[finite]) <= 2.0 ** -16 * np.abs(lse[finite]) + 2.0 ** -24)
    assert kept[-1] == -np.inf and lo[-1] == 0


def test_an_fp16_high_part_saturates_instead_of_overflowing():
    # a padded row under a finfo(float16).min mask: lse ≈ −65497 rounds to −65536 in bfloat16
    lse = np.array([-65497.0, 65490.0, -np.inf])
    hi, lo = split_lse(lse, np.dtype(np.float16))
    assert np.isfinite(hi[:2]).all() and hi[2] == -np.inf
    assert np.allclose(hi[:2].astype(np.float64) + lo[:2].astype(np.float64), lse[:2], rtol=0, atol=0.1)


def test_a_fully_masked_row_gives_nan_like_the_forward():
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((3, 4)) for _ in range(4))
    mask = np.ones((3, 3), bool)
    mask[1] = False
    flags = dict(scale=0.5, causal=False, has_mask=True)
    o = attention_reference(q, k, v, mask, **flags)
    stats = row_stats_blockwise(q, k, o, do, mask, **flags)
    assert stats[1, 0] == -np.inf and np.isnan(o[1]).all()
    dq = bwd_blockwise(q, k, v, do, stats, mask, **flags)[:12].reshape(3, 4)
    assert np.isnan(dq[1]).all() and np.isfinite(dq[[0, 2]]).all()
