"""Generated kernels at the edges of their shapes and values, through the CPU emulator against the
numpy executor and numpy: a normalized row an epilogue broadcasts, rows of one column in a kernel
that walks its rows, and NaN through a fused activation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy import special

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def both(kernel, **inputs) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The kernel's outputs from its generated CUDA (emulated) and from the numpy executor."""
    plan = kernel.program(*inputs.values()).plan
    return run_plan_emulated(plan, inputs), run_plan_on_cpu(plan, inputs)


@pytest.mark.parametrize("norm", ["softmax", "log_softmax"])
def test_a_row_of_one_an_epilogue_broadcasts_is_normalized_over_its_own_length(norm):
    # softmax over a size-1 axis is 1 (log_softmax 0) whatever y is; added to x it is broadcast
    # along that axis, so the sum's rows are wider than the normalized ones
    kernel = op.kernel(lambda x, y: getattr(op, norm)(y * 2.0, axis=-1) + x)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 1)).astype(np.float32)
    plan = kernel.program(x, y).plan
    assert all(s.node.shape == (3, 1) for s in plan.steps if s.node.op == "fused_normalization")
    (emulated,), (host,) = both(kernel, x=x, y=y)
    want = x + (1.0 if norm == "softmax" else 0.0)
    np.testing.assert_allclose(emulated, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(host, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
def test_the_norm_backward_with_its_weight_gradients_takes_rows_of_one_column(dtype):
    grad = op.grad(lambda x, w, b: op.sum(op.layernorm(x, weight=w, bias=b)), argnums=(0, 1, 2))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((33, 1)).astype(dtype)
    w, b = np.full(1, 1.5, dtype), np.full(1, 0.25, dtype)
    plan = grad.program(x, w, b).plan
    assert "norm_backward_grads" in [s.node.op for s in plan.steps]
    emulated, host = both(grad, x=x, w=w, b=b)
    # a row of one is its own mean: x̂ = 0 and the output is b, so dx = 0, dw = Σ x̂ = 0, db = 33
    want = (np.zeros((33, 1)), np.zeros(1), np.array([33.0]))
    for got, ref in zip(host, want):
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-2, atol=1e-2)
    for got, ref in zip(emulated, host):
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=2e-2, atol=1e-2)


def test_a_relu_fused_into_a_gemm_keeps_nan_as_the_relu_kernel_does():
    kernel = op.kernel(lambda x, w: op.relu(x @ w))
    x = np.ones((2, 16), ml_dtypes.bfloat16)
    x[0, 3], x[1, 5] = np.nan, np.inf
    w = np.ones((16, 8), ml_dtypes.bfloat16)
    w[5, :] = 0.0                                    # inf · 0: NaN in the second row as well
    x[:, 0] = -40.0                                  # the other products sum below zero
    assert [s.node.op for s in kernel.program(x, w).plan.steps] == ["gemm"]
    (emulated,), (host,) = both(kernel, x=x, w=w)
    assert np.isnan(host.astype(np.float32)).all() and np.isnan(emulated.astype(np.float32)).all()
    finite = op.kernel(lambda x, w: op.relu(x @ w))
    x[0, 3], x[1, 5] = 1.0, 1.0
    (emulated,), (host,) = both(finite, x=x, w=w)
    assert (emulated.astype(np.float32) == 0).all() and (host.astype(np.float32) == 0).all()


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("name, fn, dtype, want", [
    ("pad -inf", lambda x: op.pad(x, ((1, 1), (1, 1)), constant_values=-INF) * 2.0, np.float32,
     lambda x: np.pad(x, 1, constant_values=-np.inf) * 2),
    ("pad nan bf16", lambda x: op.pad(x, ((0, 0), (0, 3)), constant_values=NAN) * 2.0, ml_dtypes.bfloat16,
     lambda x: np.pad(x, ((0, 0), (0, 3)), constant_values=np.nan) * 2),
    ("pad -inf f64", lambda x: op.pad(x, ((1, 1), (1, 1)), constant_values=-INF) * 2.0, np.float64,
     lambda x: np.pad(x, 1, constant_values=-np.inf) * 2),
    ("full nan", lambda x: x + op.full((4, 5), NAN), np.float32, lambda x: x + np.nan),
    ("full -inf f64", lambda x: x + op.full((4, 5), -INF, dtype="float64"), np.float64, lambda x: x - np.inf),
    ("additive causal mask", lambda x: op.softmax(x @ x.mT + op.triu(op.full((5, 5), -INF), 1), axis=-1), np.float32,
     lambda x: _softmax(x @ x.T + np.triu(np.full((5, 5), -np.inf), 1))),
])
def test_non_finite_constants_are_written_into_kernels_by_their_bits(name, fn, dtype, want):
    x = np.random.default_rng(3).standard_normal((4, 5) if "mask" not in name else (5, 8)).astype(dtype)
    (emulated,), (host,) = both(op.kernel(fn), x=x)
    expected = want(x.astype(np.float64))
    for got in (emulated, host):
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-2, atol=1e-6)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float64], ids=["fp32", "bf16", "f64"])
def test_constants_in_a_merged_expression_are_literals_of_its_kernel(dtype):
    # the gelu derivative: one kernel whose expression holds its constants and reads x once; a
    # -inf floor written into it as well
    kernel = op.kernel(lambda x: op.maximum(op.grad(lambda t: op.sum(op.gelu(t)))(x), -INF))
    x = np.random.default_rng(5).standard_normal((6, 40)).astype(dtype)
    plan = kernel.program(x).plan
    assert [s.op for s in plan.steps] == ["fused_elementwise"] and len(plan.steps[0].inputs) == 1
    assert "-inf:" in plan.steps[0].node.attr_map["expr"]
    (emulated,), (host,) = both(kernel, x=x)
    wide = x.astype(np.float64)
    want = special.ndtr(wide) + wide * np.exp(-0.5 * wide ** 2) / np.sqrt(2 * np.pi)
    tolerance = 2e-2 if dtype is ml_dtypes.bfloat16 else 1e-5
    for got in (emulated, host):
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tolerance, atol=tolerance)
