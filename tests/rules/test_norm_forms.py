"""A layer norm or RMS norm written out with means and a square root is the norm's row kernel, with
a weight and bias after it as its epilogue (in the dtypes the row kernels take: float64 rows run on
the host as written); over another axis than the last it stays as written. A 16-bit x normalized
in float32 and cast back before its weight (LLaMA's, T5's RMS norm) is the op of x."""

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op

RNG = np.random.default_rng(23)


def _layernorm(x, w, b, eps):
    centered = x - x.mean(-1, keepdims=True)
    return centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rmsnorm(x, w, b, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w + b


SPELLINGS = {
    "layernorm, / sqrt, ** 2": (lambda x, w, b: (x - op.mean(x, axis=-1, keepdims=True))
                                / op.sqrt(op.mean((x - op.mean(x, axis=-1, keepdims=True)) ** 2, axis=-1,
                                                  keepdims=True) + 1e-5) * w + b, _layernorm, 1e-5),
    "layernorm, · rsqrt, var once, weight first": (lambda x, w, b: (lambda c: w * (c * op.rsqrt(op.mean(
        c * c, axis=-1, keepdims=True) + 1e-6)) + b)(x - op.mean(x, axis=-1, keepdims=True)), _layernorm, 1e-6),
    "layernorm, op.var": (lambda x, w, b: (x - op.mean(x, axis=-1, keepdims=True))
                          / op.sqrt(op.var(x, axis=-1, keepdims=True) + 1e-5) * w + b, _layernorm, 1e-5),
    "rmsnorm, · rsqrt": (lambda x, w, b: x * op.rsqrt(op.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w + b,
                         _rmsnorm, 1e-6),
    "rmsnorm, / sqrt, ** 2": (lambda x, w, b: x / op.sqrt(op.mean(x ** 2, axis=-1, keepdims=True) + 1e-5) * w + b,
                              _rmsnorm, 1e-5),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_norm_written_out_is_one_row_kernel(spelling):
    fn, reference, eps = SPELLINGS[spelling]
    x, w, b = (RNG.standard_normal(shape).astype(np.float32) for shape in ((3, 5, 48), (48,), (48,)))
    k = op.kernel(fn)
    assert [s.op for s in k.program(x, w, b).plan.steps] == ["fused_normalization"]
    wide = [a.astype(np.float64) for a in (x, w, b)]
    np.testing.assert_allclose(k(x, w, b), reference(*wide, eps), rtol=1e-4, atol=1e-5)


def _hf_llama(x, w):
    h = op.cast(x, "float32")
    return w * op.cast(h * op.rsqrt(op.mean(h ** 2, axis=-1, keepdims=True) + 1e-6), x.dtype)


def _meta_llama(x, w):
    h = op.cast(x, "float32")
    return op.cast(h * op.rsqrt(op.mean(op.power(h, 2), axis=-1, keepdims=True) + 1e-6), x.dtype) * w


def _t5(x, w):                         # x times a float32 reciprocal: the product promoted
    variance = op.mean(op.power(op.cast(x, "float32"), 2), axis=-1, keepdims=True)
    return w * op.cast(x * op.rsqrt(variance + 1e-6), w.dtype)


def _fp32_layernorm(x, w):
    h = op.cast(x, "float32")
    c = h - op.mean(h, axis=-1, keepdims=True)
    return op.cast(c * op.rsqrt(op.mean(c * c, axis=-1, keepdims=True) + 1e-6), x.dtype) * w


@pytest.mark.parametrize("fn", [_hf_llama, _meta_llama, _t5, _fp32_layernorm], ids=lambda f: f.__name__[1:])
def test_a_16_bit_norm_computed_in_float32_and_cast_back_is_one_row_kernel(fn):
    x = RNG.standard_normal((4, 64)).astype(ml_dtypes.bfloat16)
    w = RNG.standard_normal(64).astype(ml_dtypes.bfloat16)
    k = op.kernel(fn)
    assert [s.op for s in k.program(x, w).plan.steps] in (["rmsnorm"], ["layernorm"])
    wide = x.astype(np.float64)
    centered = wide - wide.mean(-1, keepdims=True) if fn is _fp32_layernorm else wide
    want = centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-6) * w.astype(np.float64)
    np.testing.assert_allclose(np.asarray(k(x, w), np.float64), want, rtol=2e-2, atol=2e-2)


def test_a_float32_norm_of_16_bit_tensors_reads_them_as_they_are():
    """open_clip's LayerNormFp32: layer_norm(x.float(), w.float(), b.float()).type_as(x), one kernel."""
    x = RNG.standard_normal((4, 64)).astype(ml_dtypes.bfloat16)
    w, b = (RNG.standard_normal(64).astype(ml_dtypes.bfloat16) for _ in range(2))
    k = op.kernel(lambda x, w, b: op.cast(op.layernorm(op.cast(x, "float32"), op.cast(w, "float32"),
                                                       op.cast(b, "float32")), x.dtype))
    assert [s.op for s in k.program(x, w, b).plan.steps] == ["layernorm"]
    wide = [a.astype(np.float64) for a in (x, w, b)]
    np.testing.assert_allclose(np.asarray(k(x, w, b), np.float64), _layernorm(*wide, 1e-5), rtol=2e-2, atol=2e-2)


def test_a_norm_written_out_over_another_axis_or_without_a_weight_is_not_taken_for_the_op():
    x, w = RNG.standard_normal((6, 48)).astype(np.float32), RNG.standard_normal(48).astype(np.float32)
    columns = op.kernel(lambda x, w: x * op.rsqrt(op.mean(x * x, axis=0, keepdims=True) + 1e-6) * w)
    unweighted = op.kernel(lambda x, w: x * op.rsqrt(op.mean(x * x, axis=-1, keepdims=True) + 1e-6) + w)
    for k, axis in ((columns, 0), (unweighted, -1)):
        assert not {"rmsnorm", "fused_normalization"} & {s.op for s in k.program(x, w).plan.steps}
    np.testing.assert_allclose(columns(x, w), x / np.sqrt((x * x).mean(0, keepdims=True) + 1e-6) * w, rtol=1e-5)


def test_a_layer_norms_backward_keeps_its_packed_kernels():
    t = op.tensor((8192, 4096), "bf16")
    grad = op.grad(lambda x, w, b, dy: op.sum(op.layernorm(x, w, b) * dy), argnums=(0, 1, 2))
    v = op.tensor((4096,), "bf16")
    assert [s.op for s in grad.program(t, v, v, t).plan.steps] == ["norm_backward_grads", "sum"]
