"""Rules that could overflow a narrow float's range where the program as written does not stay out
of float16 and fp8: A B + A C keeps its two products there, B + C would leave 65504."""

from __future__ import annotations

import numpy as np

from tessera_rw import op


def _steps(kernel, *args):
    return [s.op for s in kernel.program(*args).plan.steps]


def test_a_float16_sum_of_products_is_not_distributed_and_stays_finite():
    f = op.kernel(lambda a, b, c: a @ b + a @ c)
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((64, 64)) * 1e-4).astype(np.float16)
    b = c = np.full((64, 64), 40000, np.float16)
    got = f(a, b, c)
    want = (a.astype(np.float32) @ b.astype(np.float32)) * 2
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=1e-2)
    assert "add" not in _steps(f, a, b, c)


def test_a_float32_sum_of_products_still_shares_its_product():
    f = op.kernel(lambda a, b, c: a @ b + a @ c)
    a, b, c = (np.ones((8, 8), np.float32) for _ in range(3))
    assert _steps(f, a, b, c).count("matmul") + _steps(f, a, b, c).count("gemm") == 1
