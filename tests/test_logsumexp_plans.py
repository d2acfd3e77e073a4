"""What a row's logsumexp becomes with its neighbours: x − logsumexp(x) is one log_softmax kernel
(the logsumexp kept or spread back over the row), its gradient one softmax kernel, a logsumexp of
an expression one kernel reading x once; a log_softmax over a middle axis is written with max, sum
and log instead of transposing x there and back; each plan run on the numpy executor (and the CPU
emulator) against float64."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated

RNG = np.random.default_rng(21)
X = (RNG.standard_normal((64, 3000)) * 3).astype(np.float32)
X64 = X.astype(np.float64)
LOG_SOFTMAX = scipy.special.log_softmax(X64, axis=-1)


def kept(x):
    return x - op.logsumexp(x, axis=-1, keepdims=True)


def spread(x):
    return x - op.logsumexp(x, axis=-1)[:, None]


def expanded(x):
    return x - op.expand_dims(op.logsumexp(x, axis=-1), -1)


def steps(kernel, *args) -> list[tuple[str, str]]:
    """(op, norm or reduce) of each plan step."""
    plan = kernel.program(*args).plan
    return [(s.op, str(s.node.attr_map.get("norm") or s.node.attr_map.get("reduce") or "")) for s in plan.steps]


@pytest.mark.parametrize("fn", [kept, spread, expanded])
def test_x_minus_its_logsumexp_is_one_log_softmax_kernel(fn):
    kernel = op.kernel(fn)
    assert steps(kernel, X) == [("log_softmax", "")]
    np.testing.assert_allclose(kernel(X), LOG_SOFTMAX, rtol=1e-5, atol=1e-5)


def test_exp_of_x_minus_its_logsumexp_and_the_gradient_are_one_softmax_kernel():
    softmax = np.exp(LOG_SOFTMAX)
    probs = op.kernel(lambda x: op.exp(kept(x)))
    assert steps(probs, X) == [("softmax", "")]
    np.testing.assert_allclose(probs(X), softmax, rtol=1e-5, atol=1e-8)
    grad = op.grad(lambda x: op.sum(op.logsumexp(x, axis=-1)))
    assert steps(grad, X) == [("softmax", "")]
    np.testing.assert_allclose(grad(X), softmax, rtol=1e-5, atol=1e-8)


def test_a_logsumexp_of_an_expression_is_one_kernel_reading_x_once():
    scale = (RNG.random((64, 1)) + 0.5).astype(np.float32)
    kernel = op.kernel(lambda x, s: op.logsumexp(x * s - 1.0, axis=-1))
    assert steps(kernel, X, scale) == [("fused_reduction", "logsumexp")]
    np.testing.assert_allclose(kernel(X, scale), scipy.special.logsumexp(X64 * scale - 1.0, axis=-1), rtol=1e-6)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (ml_dtypes.bfloat16, 1e-2)], ids=["f32", "bf16"])
def test_log_softmax_over_a_middle_axis_is_two_column_reductions_and_a_pass_not_two_transposes(dtype, rtol):
    x = (RNG.standard_normal((8, 256, 1024)) * 3).astype(dtype)     # large enough to be memory-bound
    kernel = op.kernel(lambda x: op.log_softmax(x, axis=1))
    plan = kernel.program(x).plan
    assert "transpose" not in [s.op for s in plan.steps] and len(plan.steps) == 3
    want = scipy.special.log_softmax(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(kernel(x).astype(np.float64), want, rtol=rtol, atol=rtol * 10)
    if emulator.available():
        (got,) = run_plan_emulated(plan, {"x": x})
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * 10)
