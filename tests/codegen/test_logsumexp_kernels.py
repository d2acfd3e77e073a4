"""logsumexp as three kernels (the peak, the sum of exps with its guard in the prologue, log + peak
with the guard in the epilogue): the plan through the CPU emulator (every generated kernel, compiled
from its CUDA source) and the numpy executor against scipy in float64, on random rows with the
infinities and NaNs the guard is there for."""

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
    return x.astype(dtype)


def lse_rows(x):
    return op.logsumexp(x, axis=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logsumexp_is_three_kernels_and_gives_scipys_rows(dtype):
    x = rows_with_infinities(np.random.default_rng(3), (40, 300), dtype)
    kernel = op.kernel(lse_rows)
    program = kernel.program(x)
    assert len(program.plan.steps) == 3          # the peak, the guarded sum of exps, log + peak
    assert {"max", "fused_reduction", "fused_elementwise"} == {s.op for s in program.plan.steps}
    with np.errstate(invalid="ignore"):
        want = scipy.special.logsumexp(x.astype(np.float64), axis=-1)
    assert_close(kernel(x), want, 1e-2 if dtype is ml_dtypes.bfloat16 else 1e-6)
    if emulator.available():
        (got,) = run_plan_emulated(program.plan, {"x": x})
        assert_close(got, want, 1e-2 if dtype is ml_dtypes.bfloat16 else 1e-5)
