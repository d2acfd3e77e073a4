"""logsumexp over the last axis as one row kernel (the online softmax statistics, the rows read
once), over another axis as three (the peak, the sum of exps with its guard in the prologue, log +
peak with the guard in the epilogue): each plan through the CPU emulator (every generated kernel,
compiled from its CUDA source) and the numpy executor against scipy in float64, on random rows with
the infinities and NaNs the guards are there for."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated

DTYPES = [pytest.param(ml_dtypes.bfloat16, id="bf16"), pytest.param(np.float32, id="f32")]


def assert_close(got, want, rtol: float) -> None:
    """Equal where the reference is infinite or NaN, within `rtol` of its scale elsewhere."""
    got, want = np.asarray(got).astype(np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    scale = max(float(np.abs(want[finite]).max(initial=0.0)), 1e-30)
    assert np.abs(got[finite] - want[finite]).max(initial=0.0) <= rtol * scale


def rows_with_infinities(rng, shape, dtype):
    x = rng.standard_normal(shape) * 3
    x[1] = -np.inf                       # a row of -inf: -inf, not NaN
    x[2, 5] = np.inf                     # a row holding +inf: +inf
    x[3, : shape[1] // 2] = -np.inf      # half masked: the other half's logsumexp
    x[4, 7] = np.nan                     # NaN stays NaN
    x[5] = -np.inf
    x[5, 3] = np.nan                     # though every other value is -inf (a max passes NaN over)
    x[6, 1] = np.inf
    x[6, 2] = np.nan                     # or one is +inf
    return x.astype(dtype)


def lse_rows(x):
    return op.logsumexp(x, axis=-1)


def lse_columns(x):
    return op.logsumexp(x, axis=0)


def lse_scaled_rows(x):
    return op.logsumexp(x * 0.5 + 1.0, axis=-1)


def check(fn, x, want, dtype) -> list[str]:
    kernel = op.kernel(fn)
    program = kernel.program(x)
    assert_close(kernel(x), want, 1e-2 if dtype is ml_dtypes.bfloat16 else 1e-6)
    if emulator.available():
        (got,) = run_plan_emulated(program.plan, {"x": x})
        assert_close(got, want, 1e-2 if dtype is ml_dtypes.bfloat16 else 1e-5)
    return [s.op for s in program.plan.steps]


def scipy_lse(x, axis=-1):
    with np.errstate(invalid="ignore"):
        return scipy.special.logsumexp(x.astype(np.float64), axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logsumexp_of_rows_is_one_row_kernel_and_gives_scipys_rows(dtype):
    x = rows_with_infinities(np.random.default_rng(3), (40, 300), dtype)
    assert check(lse_rows, x, scipy_lse(x), dtype) == ["logsumexp"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_logsumexp_of_long_rows_walks_them_once_and_gives_scipys_rows(dtype):
    x = rows_with_infinities(np.random.default_rng(4), (8, 40000), dtype)    # beyond the registers: looped
    assert check(lse_rows, x, scipy_lse(x), dtype) == ["logsumexp"]


def test_logsumexp_of_an_expression_computes_it_as_the_rows_are_read():
    x = (np.random.default_rng(5).standard_normal((33, 1000)) * 3).astype(np.float32)
    want = scipy_lse(x.astype(np.float64) * 0.5 + 1.0)
    assert check(lse_scaled_rows, x, want, np.float32) == ["fused_reduction"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_logsumexp_over_another_axis_is_three_kernels_and_gives_scipys_rows(dtype):
    x = rows_with_infinities(np.random.default_rng(3), (40, 300), dtype)
    steps = check(lse_columns, np.ascontiguousarray(x.T), scipy_lse(x), dtype)
    assert len(steps) == 3          # the peak, the guarded sum of exps, log + peak
    assert {"max", "fused_reduction", "fused_elementwise"} == set(steps)
