"""References and comparisons shared by the convolution tests (test_conv1d_reference.py,
test_conv2d_reference_and_errors.py).

- scipy_conv: stride 1, groups 1, via scipy.signal.correlate(mode="valid") on an explicitly padded
  input, summed over the input channels (a dilated kernel gets zeros inserted between its taps);
- loop_conv1d / loop_conv2d: hand-written loops over every output element with bounds-checked
  (implicit zero) padding; no numpy padding, no einsum, no scipy.
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.signal

FLOATS = [np.float64, np.float32]


def _tols(dtype):
    return (1e-10, 1e-10) if np.dtype(dtype) == np.float64 else (1e-5, 1e-5)


def assert_close(got, want, dtype):
    """Relative comparison, with an absolute floor proportional to the reference's scale."""
    rtol, atol = _tols(dtype)
    want = np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol * scale)


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def torch_out_size(size, k, stride, lo, hi, dilation):
    return (size + lo + hi - dilation * (k - 1) - 1) // stride + 1


# --------------------------------------------------------------------------- references

def dilate_kernel(k: np.ndarray, dilation) -> np.ndarray:
    """Insert dilation-1 zeros between taps on each of the trailing axes (the spatial ones)."""
    spatial = len(dilation)
    shape = k.shape[:-spatial] + tuple(d * (s - 1) + 1 for s, d in zip(k.shape[-spatial:], dilation))
    out = np.zeros(shape, k.dtype)
    out[(...,) + tuple(slice(None, None, d) for d in dilation)] = k
    return out


def scipy_conv(x, w, pads, dilation=None):
    """Stride 1, groups 1: correlate each (sample, out channel) over all input channels at once."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    spatial = x.ndim - 2
    if dilation is not None:
        w = dilate_kernel(w, dilation)
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(tuple(p) for p in pads))
    n, o = x.shape[0], w.shape[0]
    outs = []
    for i in range(n):
        row = []
        for j in range(o):
            # (C, *spatial) "valid" with (C, *kernel) -> (1, *out): that sums the channels.
            r = scipy.signal.correlate(xp[i], w[j], mode="valid", method="direct")
            assert r.shape[0] == 1
            row.append(r[0])
        outs.append(row)
    out = np.array(outs)
    assert out.shape[:2] == (n, o) and out.ndim == spatial + 2
    return out


def loop_conv1d(x, w, stride=1, pad=(0, 0), dilation=1, groups=1):
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n_, c_, length = x.shape
    o_, cg, k_ = w.shape
    lo, hi = pad
    out_len = torch_out_size(length, k_, stride, lo, hi, dilation)
    opg = o_ // groups
    out = np.zeros((n_, o_, out_len))
    for n in range(n_):
        for o in range(o_):
            g = o // opg
            for i in range(out_len):
                acc = 0.0
                for c in range(cg):
                    cin = g * cg + c
                    for k in range(k_):
                        pos = i * stride - lo + k * dilation
                        if 0 <= pos < length:
                            acc += x[n, cin, pos] * w[o, c, k]
                out[n, o, i] = acc
    return out


def loop_conv2d(x, w, stride=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), groups=1):
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    (top, bottom), (left, right) = pads
    sh, sw = stride
    dh, dw = dilation
    oh = torch_out_size(h_, kh, sh, top, bottom, dh)
    ow = torch_out_size(w_, kw, sw, left, right, dw)
    opg = o_ // groups
    out = np.zeros((n_, o_, oh, ow))
    for n, o, i, j in itertools.product(range(n_), range(o_), range(oh), range(ow)):
        g = o // opg
        acc = 0.0
        for c, a, b in itertools.product(range(cg), range(kh), range(kw)):
            r = i * sh - top + a * dh
            s = j * sw - left + b * dw
            if 0 <= r < h_ and 0 <= s < w_:
                acc += x[n, g * cg + c, r, s] * w[o, c, a, b]
        out[n, o, i, j] = acc
    return out


def bf16_close(got, want):
    want = np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2, atol=1e-2 * scale)
