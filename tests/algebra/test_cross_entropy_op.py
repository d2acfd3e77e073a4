"""op.cross_entropy: torch's F.cross_entropy (class indices or probabilities, the classes on axis 1,
label smoothing, ignore_index, the three reductions) against a float64 numpy statement of it, eagerly,
traced and differentiated; a bf16 one is one row kernel over the logits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy.special import log_softmax, softmax

from tessera_rw import ArgumentError, ShapeError, TesseraError, op

RNG = np.random.default_rng(21)


def torch_statement(z, target, reduction="mean", smoothing=0.0, ignore=None):
    """F.cross_entropy's documented arithmetic, classes on axis 1 (axis 0 of 1-d logits)."""
    axis = 1 if z.ndim > 1 else 0
    logp = np.moveaxis(log_softmax(z.astype(np.float64), axis=axis), axis, -1)
    classes = logp.shape[-1]
    if np.issubdtype(target.dtype, np.integer):
        valid = np.ones(target.shape, bool) if ignore is None else target != ignore
        q = np.eye(classes)[np.where(valid, target, 0)] * valid[..., None]
    else:
        valid, q = np.ones(logp.shape[:-1], bool), np.moveaxis(target.astype(np.float64), axis, -1)
    q = q * (1 - smoothing) + smoothing / classes * (valid[..., None] if ignore is not None else 1)
    rows = -(q * logp).sum(-1) * valid
    return {"none": rows, "sum": rows.sum(), "mean": rows.sum() / valid.sum()}[reduction]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing, ignore", [(0.0, None), (0.1, None), (0.0, -100), (0.2, 3)])
@pytest.mark.parametrize("shape", [(12, 7), (7,), (4, 6, 5)], ids=["rows", "one", "spatial"])
def test_it_is_torchs_cross_entropy_over_class_indices(shape, smoothing, ignore, reduction):
    z = RNG.standard_normal(shape).astype(np.float32) * 2
    target = RNG.integers(0, shape[1 if len(shape) > 1 else 0], size=shape[:1] + shape[2:] if len(shape) > 1 else ())
    target = np.asarray(target, np.int64)
    if ignore is not None and target.ndim:
        target.flat[::3] = ignore
    want = torch_statement(z, target, reduction, smoothing, ignore)
    fn = lambda z, t: op.cross_entropy(z, t, reduction=reduction, label_smoothing=smoothing,   # noqa: E731
                                       ignore_index=ignore)
    np.testing.assert_allclose(fn(z, target), want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(op.kernel(fn)(z, target), want, rtol=2e-5, atol=1e-6)


def test_it_takes_class_probabilities_smoothed():
    z = RNG.standard_normal((9, 5)).astype(np.float32)
    p = softmax(RNG.standard_normal((9, 5)), axis=1).astype(np.float32)
    for smoothing in (0.0, 0.3):
        got = op.kernel(lambda z, p: op.cross_entropy(z, p, label_smoothing=smoothing))(z, p)
        np.testing.assert_allclose(got, torch_statement(z, p, smoothing=smoothing), rtol=2e-5)


def test_its_gradient_is_softmax_less_the_smoothed_target_over_the_rows():
    z = RNG.standard_normal((10, 6)).astype(np.float32)
    target = RNG.integers(0, 6, size=10).astype(np.int32)
    grad = op.grad(lambda z, t: op.cross_entropy(z, t, label_smoothing=0.1))(z, target)
    want = (softmax(z.astype(np.float64), axis=1) - (np.eye(6)[target] * 0.9 + 0.1 / 6)) / 10
    np.testing.assert_allclose(grad, want, atol=1e-6)


@pytest.mark.parametrize("smoothing, ignore", [(0.0, None), (0.1, None), (0.0, -100)])
def test_a_bf16_loss_is_one_row_kernel_reading_the_logits_once(smoothing, ignore):
    z = op.tensor((4096, 32000), "bf16")
    target = op.tensor((4096,), "int32")
    loss = op.kernel(lambda z, t: op.cross_entropy(z, t, label_smoothing=smoothing, ignore_index=ignore))
    report = loss.explain(z, target)
    kernels = report.candidates[report.chosen].kernels
    assert sum("row_sum" in k.fused for k in kernels) == 1
    assert sum(k.hbm_bytes for k in kernels) < 4096 * 32000 * 2 * 1.01


@pytest.mark.parametrize("smoothing, ignore", [(0.0, None), (0.1, -100), (0.0, -100)])
def test_a_bf16_gradient_reads_the_logits_once_and_writes_them_once(smoothing, ignore):
    z, target = op.tensor((4096, 32000), "bf16"), op.tensor((4096,), "int32")
    grad = op.grad(lambda z, t: op.cross_entropy(z, t, label_smoothing=smoothing, ignore_index=ignore))
    report = grad.explain(z, target)
    kernels = report.candidates[report.chosen].kernels
    assert sum(k.hbm_bytes for k in kernels) < 2 * 4096 * 32000 * 2 * 1.01


def test_bad_arguments_say_what_to_do():
    z = np.ones((4, 5), np.float32)
    with pytest.raises(ShapeError, match=r"cross_entropy(.|\n)*class indices has shape \(4,\)"):
        op.cross_entropy(z, np.zeros((4, 5), np.int32))
    with pytest.raises(TesseraError, match="reduction must be one of"):
        op.cross_entropy(z, np.zeros(4, np.int32), reduction="avg")
    with pytest.raises(TesseraError, match=r"label_smoothing must be a number in \[0, 1\]"):
        op.cross_entropy(z, np.zeros(4, np.int32), label_smoothing=1.5)
    with pytest.raises(ArgumentError, match="axis= for torch's dim="):
        op.cross_entropy(z, np.zeros(4, np.int32), dim=1)
    with pytest.raises(TesseraError, match="logits must be floating point"):
        op.cross_entropy(z.astype(np.int32), np.zeros(4, np.int32))
    assert ml_dtypes.bfloat16      # the bf16 case above runs on placeholders


def test_the_rows_kept_are_counted_in_float32_beyond_float16s_range():
    z = RNG.standard_normal((70000, 4)).astype(np.float16)
    target = RNG.integers(0, 4, size=70000)
    target[::7] = -100
    want = torch_statement(z, target, ignore=-100)
    for got in (op.cross_entropy(z, target, ignore_index=-100),
                op.kernel(lambda z, t: op.cross_entropy(z, t, ignore_index=-100))(z, target)):
        assert got.dtype == np.float16 and abs(float(got) - want) < 2e-3 * want


def test_a_stray_index_makes_the_loss_nan_and_an_ignored_one_does_not():
    z = RNG.standard_normal((6, 5)).astype(np.float32)
    padded = np.array([0, 1, 2, 3, 4, -100])
    want = torch_statement(z, padded, ignore=-100)
    for fn in (op.cross_entropy, op.kernel(lambda z, t, ignore_index: op.cross_entropy(z, t, ignore_index=ignore_index))):
        np.testing.assert_allclose(fn(z, padded, ignore_index=-100), want, rtol=2e-5)
    np.testing.assert_allclose(op.cross_entropy(z, padded), want, rtol=2e-5)     # -100 by default, as torch's
    for stray, ignore in ((padded, None), (np.array([0, 1, 2, 3, 4, 7]), -100), (np.array([0, 1, 2, 3, 4, -1]), -100)):
        for reduction in ("mean", "sum", "none"):
            loss = op.kernel(lambda z, t: op.cross_entropy(z, t, reduction=reduction, ignore_index=ignore))(z, stray)
            assert np.isnan(loss).any() and (reduction != "none" or np.isfinite(loss[:5]).all())
    grad = op.grad(lambda z: op.cross_entropy(z, np.array([0, 1, 2, 3, 4, 7]), reduction="sum"))(z)
    assert np.isfinite(grad).all()         # the NaN is the loss's: the rows in range keep their gradient


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "f16"])
def test_the_loss_keeps_the_logits_dtype(dtype):
    z = RNG.standard_normal((6, 5)).astype(dtype)
    target = np.array([0, 1, 2, 3, 4, 0])
    for reduction in ("none", "mean", "sum"):
        for fn in (op.cross_entropy, op.kernel(lambda z, t, reduction: op.cross_entropy(z, t, reduction=reduction))):
            assert fn(z, target, reduction=reduction).dtype == dtype
