"""Arithmetic ops against independent float64 references (math module, explicit formulas, loops)."""

import math

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op

RNG = np.random.default_rng(7)
BF16 = ml_dtypes.bfloat16


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)


def pointwise(fn, x):
    return np.vectorize(fn, otypes=[np.float64])(np.asarray(x, np.float64))


UNARY = {
    "exp": math.exp, "tanh": math.tanh, "sin": math.sin, "cos": math.cos, "erf": math.erf,
    "sigmoid": lambda v: 1 / (1 + math.exp(-v)), "relu": lambda v: max(v, 0.0),
    "silu": lambda v: v / (1 + math.exp(-v)), "negative": lambda v: -v, "abs": abs,
    "gelu": lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    x = rand(64)
    np.testing.assert_allclose(getattr(op, name)(x), pointwise(UNARY[name], x), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name, fn", [("log", math.log), ("sqrt", math.sqrt),
                                      ("rsqrt", lambda v: 1 / math.sqrt(v)), ("reciprocal", lambda v: 1 / v)])
def test_unary_positive_domain(name, fn):
    x = np.abs(rand(64)) + 0.1
    np.testing.assert_allclose(getattr(op, name)(x), pointwise(fn, x), rtol=2e-6)


def test_gelu_tanh_approximation():
    x = rand(64).astype(np.float64)
    c = math.sqrt(2 / math.pi)
    want = pointwise(lambda v: 0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v ** 3))), x)
    np.testing.assert_allclose(op.gelu(x, approximate="tanh"), want, rtol=1e-12)


@pytest.mark.parametrize("name, fn", [
    ("add", lambda a, b: a + b), ("subtract", lambda a, b: a - b), ("multiply", lambda a, b: a * b),
    ("divide", lambda a, b: a / b), ("maximum", max), ("minimum", min), ("power", lambda a, b: abs(a) ** b),
])
def test_binary_with_broadcasting(name, fn):
    a, b = rand(3, 1, 4), rand(5, 1)
    if name == "power":
        a = np.abs(a)
    want = np.vectorize(fn, otypes=[np.float64])(*np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64)))
    np.testing.assert_allclose(getattr(op, name)(a, b), want, rtol=2e-6)


def test_comparisons_and_logic():
    a, b = rand(4, 5), rand(5)
    for name, fn in [("less", np.less), ("greater_equal", np.greater_equal), ("equal", np.equal)]:
        np.testing.assert_array_equal(getattr(op, name)(a, b), fn(a, b))
    m, n = a > 0, b > 0
    np.testing.assert_array_equal(op.logical_and(m, n), m & n)
    np.testing.assert_array_equal(op.logical_not(m), ~m)


def test_reductions_against_loops():
    x = rand(3, 4, 5).astype(np.float64)
    loop_sum = np.zeros((3, 5))
    for i in range(3):
        for k in range(5):
            loop_sum[i, k] = math.fsum(x[i, :, k])
    np.testing.assert_allclose(op.sum(x, axis=1), loop_sum, rtol=1e-14)
    np.testing.assert_allclose(op.mean(x, axis=(0, 2), keepdims=True).ravel(),
                               [math.fsum(x[:, j, :].ravel()) / 15 for j in range(4)], rtol=1e-14)
    assert op.max(x) == max(x.ravel()) and op.min(x, axis=-1).shape == (3, 4)


def softmax64(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
    x = rand(4, 6, 5) * 4
    want = softmax64(x.astype(np.float64), axis)
    assert rel_err(op.softmax(x, axis=axis), want) < 1e-6
    assert rel_err(op.log_softmax(x, axis=axis), np.log(want)) < 1e-6


@pytest.mark.parametrize("with_weight, with_bias", [(False, False), (True, False), (True, True), (False, True)])
def test_layernorm_and_rmsnorm(with_weight, with_bias):
    x = rand(3, 5, 8) * 3 + 1
    w, b = (rand(8) if with_weight else None), (rand(8) if with_bias else None)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    ln = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    for want, got in ((ln, op.layernorm(x, w, b)), (rms, op.rmsnorm(x, w, b))):
        if w is not None:
            want = want * w
        if b is not None:
            want = want + b
        assert rel_err(got, want) < 2e-6


def test_layernorm_over_two_trailing_axes():
    x = rand(2, 3, 4).astype(np.float64)
    w = rand(3, 4).astype(np.float64)
    flat = x.reshape(2, 12)
    want = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-5)).reshape(2, 3, 4) * w
    np.testing.assert_allclose(op.layernorm(x, w, axis=(-2, -1)), want, rtol=1e-12)


def test_matmul_batched_broadcast_against_loops():
    a, b = rand(2, 1, 3, 4).astype(np.float64), rand(5, 4, 6).astype(np.float64)
    out = op.matmul(a, b)
    assert out.shape == (2, 5, 3, 6)
    for i in range(2):
        for j in range(5):
            for m in range(3):
                for n in range(6):
                    assert math.isclose(out[i, j, m, n], math.fsum(a[i, 0, m, :] * b[j, :, n]), rel_tol=1e-12)
    v, m = rand(4).astype(np.float64), rand(4, 3).astype(np.float64)
    np.testing.assert_allclose(op.matmul(v, m), [math.fsum(v * m[:, j]) for j in range(3)], rtol=1e-12)
    np.testing.assert_allclose(op.matmul(m.T, v), [math.fsum(m[:, j] * v) for j in range(3)], rtol=1e-12)
    assert op.matmul(v, v).shape == ()


def test_bf16_matmul_accumulates_in_fp32_and_rounds_once():
    a, b = rand(16, 256).astype(BF16), rand(256, 8).astype(BF16)
    got = op.matmul(a, b)
    assert got.dtype == BF16
    np.testing.assert_array_equal(got, (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16))


def test_fp8_inputs_give_bf16_with_accum_dtype():
    a = rand(8, 32).astype(ml_dtypes.float8_e4m3fn)
    b = rand(32, 4).astype(BF16)
    out = op.matmul(a, b, accum_dtype="fp32")
    assert out.dtype == BF16
    np.testing.assert_array_equal(out, (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16))


def test_elementwise_bf16_rounds_each_result():
    x = rand(100).astype(BF16)
    np.testing.assert_array_equal(op.exp(x), np.exp(x.astype(np.float32)).astype(BF16))


def test_cast_and_where():
    x = rand(10)
    np.testing.assert_array_equal(op.cast(x, "bf16"), x.astype(BF16))
    np.testing.assert_array_equal(op.cast(x, "int32"), x.astype(np.int32))
    np.testing.assert_array_equal(op.where(x > 0, x, -np.inf), np.where(x > 0, x, -np.inf))


def attention64(q, k, v, scale, mask=None, causal=False):
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = np.einsum("...qd,...kd->...qk", q, k) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    return np.einsum("...qk,...kd->...qd", softmax64(s, -1), v)


@pytest.mark.parametrize("case", ["plain", "causal", "additive", "bool", "gqa", "mqa", "3d", "cross"])
def test_flash_attention_op(case):
    b, h, s, d = 2, 4, 12, 8
    q, k, v = rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)
    kw = {}
    if case == "causal":
        kw["causal"] = True
    elif case == "additive":
        kw["mask"] = rand(1, 1, s, s)
    elif case == "bool":
        kw["mask"] = RNG.random((b, 1, s, s)) > 0.3
        kw["mask"][..., 0] = True
    elif case == "gqa":
        k, v = rand(b, 2, s, d), rand(b, 2, s, d)
    elif case == "mqa":
        k, v = rand(b, 1, s, d), rand(b, 1, s, d)
    elif case == "3d":
        q, k, v = rand(3, s, d), rand(3, s, d), rand(3, s, d)
    elif case == "cross":
        k, v = rand(b, h, 20, d), rand(b, h, 20, 5)
    got = op.flash_attention(q, k, v, **kw)
    assert rel_err(got, attention64(q, k, v, d ** -0.5, **kw)) < 1e-5


def test_design_attention_example_matches_float64():
    @op.kernel
    def attention(q, k, v):
        s = (q @ k.mT) * (q.shape[-1] ** -0.5)
        return op.softmax(s, axis=-1) @ v

    q, k, v = rand(2, 4, 64, 32), rand(2, 4, 64, 32), rand(2, 4, 64, 32)
    assert rel_err(attention(q, k, v), attention64(q, k, v, 32 ** -0.5)) < 1e-5


def test_python_scalars_are_not_rounded_to_the_tensor_dtype_first():
    x = np.full(4, 100, BF16)
    np.testing.assert_array_equal(op.multiply(x, 1.006), (np.float32(100) * np.float32(1.006)).astype(BF16))
    e4m3 = np.full(2, 0.25, ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(op.multiply(e4m3, 1000.0), np.full(2, 250, ml_dtypes.float8_e4m3fn))


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sin", "cos"])
@pytest.mark.parametrize("dtype", [np.bool_, np.int32])
def test_bool_and_integer_inputs_of_float_ops_compute_in_float32(name, dtype):
    x = np.array([1, 2, 3], dtype) if dtype is np.int32 else np.array([True, True])
    spelled = {"rsqrt": lambda v: 1 / np.sqrt(v), "reciprocal": lambda v: 1 / v}
    want = (spelled[name] if name in spelled else getattr(np, name))(x.astype(np.float64))
    for got in (getattr(op, name)(x), op.kernel(getattr(op, name))(x)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-7)


def test_relu_of_integers_keeps_their_type_as_maximum_does():
    x = np.array([[3, -2], [0, -7]], np.int32)
    for got in (op.relu(x), op.kernel(op.relu)(x), op.kernel(lambda x: op.relu(x) * 2)(x) // 2):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_integer_inputs_of_float_ops():
    np.testing.assert_allclose(op.gelu(np.array([1, -2], np.int32)),
                               [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in (1, -2)], rtol=1e-6)
    assert op.sum(np.full(3, 2 ** 30, np.int32)) == 3 * 2 ** 30
