"""The host's compensated sum (the numpy executor's `kahan_sum`): what fp32 summation loses, kept;
numpy's axes, dtypes and special values."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.codegen.numerics import compensated_sum


def test_compensated_sum_keeps_what_fp32_summation_loses():
    rng = np.random.default_rng(0)
    tiny = rng.uniform(1e-4, 2e-4, 1 << 20).astype(np.float32)
    x = np.concatenate([np.float32([1e4]), tiny, np.float32([-1e4])])   # large first: the tiny ones round away
    exact = math.fsum(x.astype(np.float64))
    plain = float(np.cumsum(x, dtype=np.float32)[-1])                   # one fp32 accumulator, in order
    kept = float(compensated_sum(x))
    assert abs(kept - exact) <= np.spacing(np.float32(exact))
    assert abs(plain - exact) > 0.5 * exact
    cancel = np.array([1.0, 1e30, 1.0, -1e30] * 1000, dtype=np.float32)   # Kahan's own case; Neumaier keeps it
    assert float(compensated_sum(cancel)) == 2000.0 and float(cancel.sum()) == 0.0


def test_compensated_sum_on_large_mixed_data_is_as_good_as_float64_rounded():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(1 << 22) * 10.0 ** rng.integers(-4, 5, 1 << 22)).astype(np.float32)
    exact = math.fsum(x.astype(np.float64))
    assert abs(float(compensated_sum(x)) - exact) <= 4 * np.spacing(np.float32(abs(exact)))
    assert abs(float(np.cumsum(x, dtype=np.float32)[-1]) - exact) > 100 * np.spacing(np.float32(abs(exact)))


@pytest.mark.parametrize("axis", [None, 0, 1, 2, (0, 2), -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_compensated_sum_follows_numpy_axes(axis, keepdims):
    x = np.random.default_rng(2).standard_normal((3, 50, 7)).astype(np.float32)
    got, want = compensated_sum(x, axis, keepdims), x.astype(np.float64).sum(axis=axis, keepdims=keepdims)
    assert got.shape == np.shape(want) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_compensated_sum_dtypes_and_special_values():
    assert compensated_sum(np.ones(3000, ml_dtypes.bfloat16)).dtype == ml_dtypes.bfloat16
    assert float(compensated_sum(np.full(3000, 0.1, np.float16))) == pytest.approx(300.0, rel=1e-3)
    assert compensated_sum(np.float64([0.1] * 10)) == pytest.approx(1.0, abs=0)
    assert compensated_sum(np.arange(10, dtype=np.int32)) == 45 and compensated_sum(np.ones(5, bool)) == 5
    assert np.isinf(compensated_sum(np.float32([1.0, np.inf])))
    assert np.isnan(compensated_sum(np.float32([1.0, np.nan]))) and np.isnan(compensated_sum(np.float32([np.inf, -np.inf])))
    assert compensated_sum(np.zeros((0, 3), np.float32), 0).tolist() == [0.0, 0.0, 0.0]


def test_sums_computed_together_stay_compensated_on_the_host_and_in_their_kernel():
    from tessera_rw import numerics, op
    from tessera_rw.codegen import emulator
    from tessera_rw.codegen.emulator_plan import run_plan_emulated
    from tessera_rw.codegen.numerics import Numerics
    n = 1 << 16
    x = np.ones((4, n), np.float32)
    x[:, 0], x[:, -1] = 1e8, -1e8                  # exact: n − 2, which float32 summation loses
    y = np.ones((4, n), np.float32)
    pair = op.kernel(lambda x, y: (op.sum(x, axis=1), op.sum(y * y, axis=1)))
    with numerics.policy("kahan_sum"):
        assert [s.op for s in pair.program(x, y).plan.steps] == ["multi_reduction"]
        assert np.asarray(pair(x, y)[0]).tolist() == [n - 2] * 4
        if emulator.available():
            got = run_plan_emulated(pair.program(x, y).plan, {"x": x, "y": y}, numerics=Numerics.KAHAN_SUM)
            assert np.asarray(got[0]).tolist() == [n - 2] * 4
