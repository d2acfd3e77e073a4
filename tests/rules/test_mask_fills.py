"""A mask filled with finfo.min becomes an additive mask only where the fill absorbs the scores:
in float16 (lowest −65504, added in float32) the scores would survive the sum, and a row with every
key masked would no longer be uniform."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw import op


def _masked_softmax(fill: float):
    return op.kernel(lambda x, m: op.softmax(op.where(m, x, fill), axis=-1))


def _rules_fired(kernel, *specs) -> set[str]:
    return {r.name for r in kernel.explain(*specs).rules if r.matches}


def test_float16_lowest_fill_keeps_a_fully_masked_row_uniform():
    f = _masked_softmax(float(np.finfo(np.float16).min))
    x = np.array([[-7.0, -12.7, -6.2, 0.4], [1, 2, 3, 4]], np.float16)
    m = np.array([[False] * 4, [True, False, True, True]])
    got = np.asarray(f(x, m), np.float64)
    np.testing.assert_allclose(got[0], 0.25, atol=1e-3)
    want = np.exp(x[1].astype(np.float64) - 4) * m[1]
    np.testing.assert_allclose(got[1], want / want.sum(), atol=2e-3)
    assert "where-lowest-is-additive-mask" not in _rules_fired(f, op.tensor((2, 4), "fp16"), op.tensor((2, 4), "bool"))


def test_float32_and_bfloat16_lowest_fills_still_become_additive_masks():
    for dtype in (np.float32, ml_dtypes.bfloat16):
        f = _masked_softmax(float(ml_dtypes.finfo(dtype).min))
        fired = _rules_fired(f, op.tensor((2, 4), np.dtype(dtype)), op.tensor((2, 4), "bool"))
        assert "where-lowest-is-additive-mask" in fired, dtype
