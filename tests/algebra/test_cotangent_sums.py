"""Cotangents of one value used several times add up; those of slices that split it (q, k and v of
one projection) are one concatenate of the pieces, not full-size pads summed."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tests.finite_differences import numeric_gradient

rng = np.random.default_rng(5)


SPLITS = {
    "thirds along the last axis": lambda x: (x[..., :4], x[..., 4:8], x[..., 8:]),
    "a fused qkv axis": lambda x: tuple(x.reshape(2, 3, 3, 4)[:, :, i] for i in range(3)),
    "out of order": lambda x: (x[..., 8:], x[..., :4], x[..., 4:8]),
    "with a gap": lambda x: (x[..., :3], x[..., 8:]),
    "overlapping": lambda x: (x[..., :6], x[..., 4:]),
}


@pytest.mark.parametrize("split", list(SPLITS))
def test_the_gradient_through_slices_matches_finite_differences(split):
    parts = SPLITS[split]
    weights = [rng.standard_normal(p.shape) for p in parts(np.zeros((2, 3, 12)))]

    def loss(x):
        return sum(op.sum(op.tanh(p) * w) for p, w in zip(parts(x), weights))
    x = rng.standard_normal((2, 3, 12))
    got = op.grad(loss)(x)
    np.testing.assert_allclose(got, numeric_gradient(op.kernel(loss), x), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("split", ["thirds along the last axis", "a fused qkv axis", "out of order"])
def test_slices_that_tile_a_value_get_one_concatenate_and_no_pads(split):
    parts = SPLITS[split]
    grad = op.grad(lambda x: sum(op.sum(op.tanh(p) * (i + 1.0)) for i, p in enumerate(parts(x))))
    ops = [n.op for n in grad.trace(rng.standard_normal((2, 3, 12))).nodes]
    assert ops.count("concatenate") == 1 and "pad" not in ops and "add" not in ops
