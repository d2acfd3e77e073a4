"""Sliding-window attention: op.flash_attention(causal=True, window=W), each query seeing its last W
keys. The op checks its window, computes what numpy's band computes, differentiates to the band's
gradients, and the band written as a mask (Mistral's form) rewrites to it; the kernel's cost counts
only the key blocks that meet each query block's band."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.ops.attention import causal_keep, causal_pairs
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.attention_rows import query_rows_mask
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen import emulator
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
from tessera_rw.rules.library import ALGEBRA, ATTENTION
from tessera_rw.rules.saturate import rewrite
from tests.attention_grads import float64_attention_grads
from tests.codegen.emulated_attention_ops import windowed as windowed_op
from tests.codegen.schedule_check import check_schedules
from tests.finite_differences import numeric_gradient

RNG = np.random.default_rng(11)


def band_reference(q, k, v, window: int, scale: float) -> np.ndarray:
    """softmax over each query's last `window` keys (and no later one), in float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    sq, sk = q.shape[-2], k.shape[-2]
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    s = np.where((j <= i) & (j > i - window), q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ v


@pytest.mark.parametrize("window", [1, 3, 7, 40])
def test_the_op_keeps_each_querys_last_window_keys(window):
    q, k, v = (RNG.standard_normal((2, 3, 9, 8)).astype(np.float32) for _ in range(3))
    got = op.flash_attention(q, k, v, scale=0.5, causal=True, window=window)
    np.testing.assert_allclose(got, band_reference(q, k, v, window, 0.5), rtol=1e-5, atol=1e-5)


def test_keys_kept_and_counted_agree():
    for sq, sk, window in ((9, 9, 3), (5, 12, 4), (12, 5, 2), (64, 64, 64), (64, 64, 100)):
        assert causal_keep(sq, sk, window).sum() == causal_pairs(sq, sk, window)


@pytest.mark.parametrize("window, causal, words", [
    (4, False, "needs causal=True"), (0, True, "int >= 1"), (-2, True, "int >= 1"), (True, True, "int >= 1"),
    (2.0, True, "int >= 1")])
def test_a_window_it_cannot_take_is_refused_saying_why(window, causal, words):
    q = np.ones((4, 8), np.float32)
    with pytest.raises(AttributeValueError, match=words) as raised:
        op.flash_attention(q, q, q, causal=causal, window=window)
    assert "flash_attention" in str(raised.value)


def test_gradients_are_the_bands_by_finite_differences():
    q, k, v, w = (RNG.standard_normal((1, 2, 6, 4)) for _ in range(4))

    def loss(q, k, v, w):
        return op.sum(op.flash_attention(q, k, v, scale=0.7, causal=True, window=3) * w)
    got = op.grad(loss, argnums=(0, 1, 2))(q, k, v, w)
    arrays = [q, k, v]
    for i, g in enumerate(got):
        def f(x, i=i):
            args = arrays[:i] + [x] + arrays[i + 1:]
            return float(np.sum(band_reference(*args, 3, 0.7) * w))
        np.testing.assert_allclose(g, numeric_gradient(f, arrays[i]), rtol=1e-5, atol=1e-6)


S = 64


def mistral(q, k, v):            # transformers' Mistral: a band of the last 16 keys, bf16's finfo.min outside
    ones = op.ones((S, S), dtype="bool")
    keep = op.tril(ones) & ~op.tril(ones, -16)
    s = op.where(keep, q @ k.mT * 0.125, float(ml_dtypes.finfo(ml_dtypes.bfloat16).min))
    return op.cast(op.softmax(op.cast(s, "float32"), axis=-1), "bfloat16") @ v


def band_swapped(q, k, v):
    ones = op.ones((S, S), dtype="bool")
    return op.softmax(op.where(~op.tril(ones, -16) & op.tril(ones), q @ k.mT * 0.125, -math.inf), axis=-1) @ v


def band_of_leading_ones(q, k, v):
    ones = op.ones((S, S), dtype="bool")
    keep = op.reshape(op.tril(ones) & ~op.tril(ones, -16), (1, 1, S, S))
    return op.softmax(op.where(keep, q @ k.mT * 0.125, -math.inf), axis=-1) @ v


def band_past_the_diagonal(q, k, v):  # keeps key i + 1 too: not causal, stays a mask
    ones = op.ones((S, S), dtype="bool")
    return op.softmax(op.where(op.tril(ones, 1) & ~op.tril(ones, -16), q @ k.mT * 0.125, -math.inf), axis=-1) @ v


def _windows(fn) -> set:
    inputs = {n: RNG.standard_normal((2, 4, S, 32)).astype(ml_dtypes.bfloat16) for n in "qkv"}
    result = rewrite(op.kernel(fn).trace(**inputs), [ALGEBRA, ATTENTION])
    root = result.output_classes()[0]
    return {(a["causal"], a["has_mask"], a["window"]) for n in result.view.classes[root] if n.op == "flash_attention"
            for a in (dict(n.attrs),)}


@pytest.mark.parametrize("fn", [mistral, band_swapped, band_of_leading_ones], ids=lambda f: f.__name__)
def test_a_band_written_as_a_mask_becomes_the_window(fn):
    assert (True, False, 16) in _windows(fn)


def test_a_band_reaching_past_the_diagonal_stays_a_mask():
    windows = _windows(band_past_the_diagonal)
    assert windows and all(not window for _, _, window in windows)


def test_the_mistral_form_compiles_to_one_kernel_reading_no_mask():
    shape = (2, 4, S, 32)
    program = op.kernel(mistral).program(*(op.tensor(shape, "bf16") for _ in range(3)))
    assert [s.op for s in program.plan.steps] == ["flash_attention"]
    assert program.plan.steps[0].node.attr_map["window"] == 16


def windowed(s: int, window: int) -> KernelOp:
    q = TensorType((2, 8, s, 64), DType.bfloat16)
    return KernelOp.of("flash_attention", (q, q, q), q, scale=0.125, causal=True, has_mask=False, window=window)


def test_the_kernel_computes_only_the_key_blocks_that_meet_the_band():
    template, arch = FlashAttentionTemplate(), arch_named("h100")
    causal, narrow = windowed(4096, 0), windowed(4096, 512)
    s = template.schedules(narrow, arch)[0]
    ratio = template.resources(narrow, s, arch).flops / template.resources(causal, s, arch).flops
    # each query block walks its band's 512 keys plus at most a block of queries and one of keys
    assert causal_pairs(4096, 4096, 512) / causal_pairs(4096, 4096) < ratio
    assert ratio < (512 + s.bm + s.bn) * 4096 / causal_pairs(4096, 4096)
    assert "window" in template.fused(narrow) and "win512" in template.emit(narrow, s, arch).name


def test_a_row_subset_check_spells_the_window_out_as_its_mask():
    attrs = dict(causal=True, has_mask=False, window=3, scale=1.0)
    rows = np.array([0, 4, 9])
    mask = query_rows_mask(attrs, None, 12, rows)
    np.testing.assert_array_equal(mask, causal_keep(12, 12, 3)[rows])
    assert attrs["causal"] is False and attrs["window"] == 0 and attrs["has_mask"] is True



def op_loss(q, k, v, w):
    return op.sum(op.flash_attention(q, k, v, scale=0.125, causal=True, window=48) * w)


def written_loss(q, k, v, w):         # the band by hand: reverse mode spells out every product and mask
    ones = op.ones((q.shape[-2], k.shape[-2]), dtype="bool")
    keep = op.tril(ones) & ~op.tril(ones, -48)
    return op.sum(op.softmax(op.where(keep, q @ k.mT * 0.125, -math.inf), axis=-1) @ v * w)


@pytest.mark.parametrize("loss", [op_loss, written_loss], ids=lambda f: f.__name__)
def test_training_takes_three_windowed_kernels_and_matches_float64(loss):
    shape = (1, 2, 256, 64)
    grad = op.grad(loss, argnums=(0, 1, 2))
    program = grad.program(*(op.tensor(shape, "bf16") for _ in range(4)))
    steps = program.plan.steps
    assert [s.op for s in steps] == ["flash_attention_lse", "attention_row_stats_from_lse", "flash_attention_bwd"]
    assert all(s.node.attr_map["window"] == 48 and not s.node.attr_map["has_mask"] for s in (steps[0], steps[2]))
    q, k, v, w = (RNG.standard_normal(shape).astype(ml_dtypes.bfloat16) for _ in range(4))
    wanted = float64_attention_grads(q, k, v, w, 0.125, causal_keep(shape[-2], shape[-2], 48))
    for got, want in zip(grad(q, k, v, w), wanted):
        assert np.max(np.abs(got.astype(np.float64) - want)) < 2e-2 * (np.sqrt(np.mean(want ** 2)) + np.abs(want).max())


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_sm_80s_mma_sync_kernels_walk_the_band_too():
    """The emulated ops run at sm_90's defaults (wgmma); the mma.sync forward and backward, at an
    A100's first default each."""
    a100 = arch_named("a100")
    backward = FlashAttentionBwdTemplate()
    for template, kernel in ((FlashAttentionTemplate(), windowed(200, 70)),
                             (backward, windowed_op(backward.sample(1, 2, 200, 64, DType.float16, True), 50))):
        check_schedules(template, kernel, template.schedules(kernel, a100)[:1], a100,
                        lambda o, arrays, s, arch: emulator.run_emulated(o, arrays, schedule=s, arch=arch))
