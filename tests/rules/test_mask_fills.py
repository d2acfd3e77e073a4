"""Masks written with where keep where's meaning: a score at a masked position is discarded whatever
it is (NaN included), fused or not; a finfo.min fill leaves a fully masked row uniform."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op


def _masked_softmax(fill: float):
    return op.kernel(lambda x, m: op.softmax(op.where(m, x, fill), axis=-1))


def _masked_attention(fill: float):
    return op.kernel(lambda q, k, v, m: op.softmax(op.where(m, q @ k.mT * 0.25, fill), axis=-1) @ v)


def test_float16_lowest_fill_keeps_a_fully_masked_row_uniform():
    f = _masked_softmax(float(np.finfo(np.float16).min))
    x = np.array([[-7.0, -12.7, -6.2, 0.4], [1, 2, 3, 4]], np.float16)
    m = np.array([[False] * 4, [True, False, True, True]])
    got = np.asarray(f(x, m), np.float64)
    np.testing.assert_allclose(got[0], 0.25, atol=1e-3)
    want = np.exp(x[1].astype(np.float64) - 4) * m[1]
    np.testing.assert_allclose(got[1], want / want.sum(), atol=2e-3)


def test_a_lowest_fill_outside_a_causal_mask_keeps_its_where():
    for dtype in (ml_dtypes.bfloat16, np.float16, np.float32):
        f = _masked_attention(float(ml_dtypes.finfo(dtype).min))
        spec = op.tensor((1, 2, 64, 64), np.dtype(dtype))
        report = f.explain(spec, spec, spec, op.tensor((64, 64), "bool"))
        assert not any(r.name.startswith("flash-attention") for r in report.rules if r.matches), dtype


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")     # numpy meets the NaN keys
@pytest.mark.parametrize("fill, dtype", [(-math.inf, "float32"), (-math.inf, "bfloat16"), (-1e9, "float32"),
                                         (-1e9, "bfloat16"), (float(np.finfo(np.float32).min), "float32"),
                                         (float(ml_dtypes.finfo(ml_dtypes.bfloat16).min), "bfloat16")])
def test_a_nan_or_inf_score_at_a_masked_position_is_discarded(fill, dtype):
    """Padded key rows hold garbage (np.empty): where discards their scores, fused or not."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float32) for _ in range(3))
    m = np.ones((64, 64), bool)
    m[:, 48:] = False                       # keys 48.. are padding
    k[..., 48:, :] = np.nan
    k[..., 50, :] = np.inf
    v[..., 48:, :] = 0.0                    # P·V: a discarded key's weight is 0, its value must be finite
    cast = (lambda a: a.astype(ml_dtypes.bfloat16)) if dtype == "bfloat16" else (lambda a: a)
    got = np.asarray(_masked_attention(fill)(cast(q), cast(k), cast(v), m), np.float64)
    s = q.astype(np.float64) @ k[..., :48, :].astype(np.float64).swapaxes(-1, -2) * 0.25
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v[..., :48, :]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=3e-2 if dtype == "bfloat16" else 1e-5)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    x[:, 6:] = np.nan
    keep = np.ones((4, 8), bool)
    keep[:, 6:] = False
    assert np.isfinite(_masked_softmax(fill)(x, keep)).all()
