"""The numpy executor of plans: blockwise flash attention in bounded memory, the FFT convolution
plan, compensated sums, and whole kernels run through rewrite → extract → lower → execute."""

from __future__ import annotations

import tracemalloc
import warnings

import ml_dtypes
import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings, strategies as st

from tessera_rw import numerics, op
from tessera_rw.algebra.ops.attention import attention_reference
from tessera_rw.codegen.cpu_attention import flash_attention_blockwise

BF16 = np.dtype(ml_dtypes.bfloat16)


@settings(max_examples=40, deadline=None)
@given(sq=st.integers(1, 70), sk=st.integers(1, 70), d=st.sampled_from([8, 16]), causal=st.booleans(),
       mask=st.sampled_from(["none", "bool", "additive"]), heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
       block_q=st.integers(1, 32), block_k=st.integers(1, 32), seed=st.integers(0, 2**31 - 1))
def test_blockwise_attention_matches_the_materialized_reference(sq, sk, d, causal, mask, heads, block_q, block_k,
                                                                seed):
    rng = np.random.default_rng(seed)
    hq, hkv = heads
    q = rng.standard_normal((2, hq, sq, d)).astype(np.float32)
    k, v = (rng.standard_normal((2, hkv, sk, d)).astype(np.float32) for _ in range(2))
    masks = ()
    if mask == "bool":
        masks = (rng.random((sq, sk)) < 0.7,)
    elif mask == "additive":
        masks = (rng.standard_normal((1, hq, sq, sk)).astype(np.float32),)
    attrs = dict(scale=d ** -0.5, causal=causal, has_mask=bool(masks))
    want = attention_reference(q, k, v, *masks, **attrs)
    got = flash_attention_blockwise(q, k, v, *masks, **attrs, block_q=block_q, block_k=block_k)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)      # NaN rows (fully masked) agree too


def test_long_attention_runs_in_memory_bounded_by_the_blocks():
    s, d = 8192, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, s, d)).astype(np.float32) for _ in range(3))
    tracemalloc.start()
    out = flash_attention_blockwise(q, k, v, scale=d ** -0.5, causal=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak >> 20} MB; the scores alone would be {s * s * 4 >> 20} MB"
    rows = [0, 1, 4095, 8191]                     # spot rows against the exact softmax in float64
    for r in rows:
        w = (q[0, 0, r].astype(np.float64) @ k[0, 0, :r + 1].T.astype(np.float64)) * d ** -0.5
        p = np.exp(w - w.max())
        np.testing.assert_allclose(out[0, 0, r], (p / p.sum()) @ v[0, 0, :r + 1], rtol=1e-4, atol=1e-5)


def test_attention_kernel_runs_its_fused_plan_on_the_host():
    @op.kernel
    def attention(q, k, v):
        return op.softmax((q @ k.mT) * (q.shape[-1] ** -0.5), axis=-1) @ v

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 300, 64)).astype(BF16) for _ in range(3))
    program = attention.program(q, k, v)
    assert [s.op for s in program.plan.steps] == ["flash_attention"]
    got = attention(q, k, v)
    assert got.dtype == BF16 and got.shape == (2, 4, 300, 64)
    want = attention_reference(*(a.astype(np.float64) for a in (q, k, v)), scale=0.125, causal=False,
                               has_mask=False)
    np.testing.assert_allclose(got.astype(np.float64), want, atol=2e-2, rtol=2e-2)


def test_long_convolution_plan_runs_through_numpy_fft():
    @op.kernel
    def conv(x, w):
        return op.conv1d(x, w, padding="same")

    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8, 2048)).astype(np.float32)
    w = rng.standard_normal((8, 8, 1025)).astype(np.float32) / 70
    ops = [s.op for s in conv.program(x, w).plan.steps]
    assert "rfft" in ops and "irfft" in ops and "conv1d" not in ops
    got = conv(x, w)
    want = np.stack([sum(scipy.signal.correlate(x[n, c], w[o, c], mode="same") for c in range(8))
                     for n in range(2) for o in range(8)]).reshape(2, 8, 2048)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_kahan_sum_policy_keeps_what_plain_fp32_summation_loses():
    @op.kernel
    def total(x):
        return op.sum(x, axis=0), op.mean(x.reshape(4, -1), axis=1)

    x = np.tile(np.array([1.0, 1e8, 1.0, -1e8], np.float32), 4096)
    plain = total(x)
    with numerics.policy("kahan_sum"):
        compensated = total(x)
    assert float(plain[0]) != 8192.0
    assert float(compensated[0]) == 8192.0
    np.testing.assert_allclose(compensated[1], x.astype(np.float64).reshape(4, -1).mean(axis=1), rtol=1e-6)


def test_float64_runs_everywhere_on_the_host():
    @op.kernel
    def f(a, b):
        return op.gelu(a @ b + 1.0)

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((33, 17)), rng.standard_normal((17, 9))
    got = f(a, b)
    assert got.dtype == np.float64
    want = (a @ b + 1.0)
    want = 0.5 * want * (1 + scipy.special.erf(want / np.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_missing_and_misshapen_inputs_are_named():
    from tessera_rw.algebra.builder import make, make_input
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.errors import ArgumentError
    from tessera_rw.algebra.graph import Graph
    from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
    from tessera_rw.lower.lowering import lower

    x = make_input("x", (3,), DType.float32)
    plan = lower(Graph("f", (x,), (make("exp", x),)))
    with pytest.raises(ArgumentError, match="no value for input 'x'"):
        run_plan_on_cpu(plan, {})
    with pytest.raises(ArgumentError, match=r"input 'x' has shape \(4,\), the plan was built for \(3,\)"):
        run_plan_on_cpu(plan, {"x": np.zeros(4, np.float32)})


@pytest.mark.parametrize("transform, dtype", [("rfft", np.float32), ("rfft", BF16), ("irfft", np.complex64),
                                              ("fft", np.complex64), ("ifft", np.complex128), ("rfft", np.float64)])
@pytest.mark.parametrize("n, norm", [(None, "backward"), (24, "ortho"), (9, "forward")])
def test_the_fft_family_runs_through_scipy_as_numpy_defines_it(transform, dtype, n, norm):
    from tessera_rw.algebra.builder import make, make_input
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.evaluate import evaluate
    from tessera_rw.algebra.graph import Graph
    from tessera_rw.codegen.cpu_executor import HOST_KERNELS, run_plan_on_cpu
    from tessera_rw.lower.lowering import lower

    rng = np.random.default_rng(7)
    values = rng.standard_normal((3, 16, 5)) + (1j * rng.standard_normal((3, 16, 5)) if np.dtype(dtype).kind == "c"
                                                 else 0)
    x = values.astype(dtype)
    length = n or (30 if transform == "irfft" else 16)      # by default the signal's own length
    node = make(transform, make_input("x", x.shape, DType.parse(np.dtype(dtype).name)), n=length, axis=1, norm=norm)
    graph = Graph("t", node.args, (node,))
    assert transform in HOST_KERNELS
    (got,) = run_plan_on_cpu(lower(graph), {"x": x})
    (want,) = evaluate(graph, {"x": x})           # numpy.fft
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_inf_and_nan_inputs_give_ieee_values_and_no_numpy_warning():
    k = op.kernel(lambda x: op.log(x) * op.softmax(x, axis=-1))
    x = np.array([[0.0, -1.0, np.inf], [1.0, 2.0, 3.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = k(x)
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        want = np.log(x) * (e / e.sum(-1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()
