"""conv1d / conv2d checked against independent references.

- stride-1 cases: scipy.signal.correlate(mode="valid") on an explicitly padded input, summed over
  the input channels (a dilated kernel is given to scipy with zeros inserted between its taps);
- stride, dilation and groups: hand-written loops over every output element with bounds-checked
  (implicit zero) padding; no numpy padding, no einsum, no scipy.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import scipy.signal

from tessera_rw import AttributeValueError, ShapeError, TesseraError, op

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


def test_loop_references_agree_with_scipy():
    """Sanity check the two references against each other (stride 1, groups 1, dilation 2)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 11))
    w = rng.standard_normal((4, 3, 3))
    np.testing.assert_allclose(loop_conv1d(x, w, pad=(2, 1), dilation=2),
                               scipy_conv(x, w, [(2, 1)], dilation=(2,)), rtol=1e-12, atol=1e-12)
    x2 = rng.standard_normal((1, 2, 6, 7))
    w2 = rng.standard_normal((3, 2, 2, 3))
    np.testing.assert_allclose(loop_conv2d(x2, w2, pads=((1, 0), (0, 2)), dilation=(2, 1)),
                               scipy_conv(x2, w2, [(1, 0), (0, 2)], dilation=(2, 1)), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- conv1d, stride 1

CONV1D_PADDINGS = [
    (0, (0, 0)),
    (2, (2, 2)),
    ("valid", (0, 0)),
    ((1, 3), (1, 3)),
    ((0, 2), (0, 2)),
    ((3, 0), (3, 0)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("padding, pads", CONV1D_PADDINGS, ids=[repr(p[0]) for p in CONV1D_PADDINGS])
def test_conv1d_padding_forms_vs_scipy(dtype, padding, pads):
    rng = np.random.default_rng(1)
    x = rand(rng, (2, 3, 10), dtype)
    w = rand(rng, (4, 3, 3), dtype)
    got = op.conv1d(x, w, padding=padding)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (2, 4, torch_out_size(10, 3, 1, *pads, 1))
    assert_close(got, scipy_conv(x, w, [pads]), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("k, dilation", [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (2, 2), (3, 2), (4, 3), (2, 3)])
def test_conv1d_same_vs_scipy(dtype, k, dilation):
    """'same' keeps the length; an odd total padding puts the extra element on the right (as torch)."""
    rng = np.random.default_rng(2 + k + 10 * dilation)
    length = 9
    x = rand(rng, (2, 3, length), dtype)
    w = rand(rng, (2, 3, k), dtype)
    got = op.conv1d(x, w, padding="same", dilation=dilation)
    assert got.shape == (2, 2, length)
    total = dilation * (k - 1)
    pads = (total // 2, total - total // 2)  # torch: left = total // 2, right gets the rest
    assert_close(got, scipy_conv(x, w, [pads], dilation=(dilation,)), dtype)


def test_conv1d_same_even_kernel_extra_on_right_explicit():
    """An explicit, hand-computed case: K=2 'same' pads (0, 1), so y[i] = w0 x[i] + w1 x[i+1]."""
    x = np.array([[[1.0, 2.0, 4.0, 8.0]]])
    w = np.array([[[3.0, 5.0]]])
    got = op.conv1d(x, w, padding="same")
    np.testing.assert_array_equal(got, [[[1 * 3 + 2 * 5, 2 * 3 + 4 * 5, 4 * 3 + 8 * 5, 8 * 3]]])


# --------------------------------------------------------------------------- conv1d, loops

CONV1D_LOOP_CASES = [
    # stride, padding given, (lo, hi), dilation, groups, C, O, K, L
    (2, 0, (0, 0), 1, 1, 3, 4, 3, 11),
    (3, 1, (1, 1), 1, 1, 2, 3, 3, 13),
    (2, (2, 1), (2, 1), 1, 1, 3, 2, 4, 10),
    (1, 0, (0, 0), 2, 1, 3, 2, 3, 12),
    (2, (1, 3), (1, 3), 3, 1, 2, 2, 3, 14),
    (1, 1, (1, 1), 1, 3, 6, 3, 3, 9),    # groups=3, one output channel per group
    (1, 0, (0, 0), 1, 2, 4, 6, 2, 8),    # groups=2, three output channels per group
    (2, (0, 2), (0, 2), 2, 2, 4, 4, 3, 12),
    (1, 1, (1, 1), 1, 4, 4, 4, 3, 9),    # depthwise, multiplier 1
    (2, 2, (2, 2), 2, 3, 3, 6, 3, 11),   # depthwise, multiplier 2, strided and dilated
    ("valid", "valid", (0, 0), 1, 5, 5, 5, 4, 7),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("stride, padding, pads, dilation, groups, c, o, k, length", CONV1D_LOOP_CASES)
def test_conv1d_stride_dilation_groups_vs_loops(dtype, stride, padding, pads, dilation, groups, c, o, k, length):
    stride_i = 1 if stride == "valid" else stride
    rng = np.random.default_rng(100 + c * 7 + o * 3 + k + length)
    x = rand(rng, (2, c, length), dtype)
    w = rand(rng, (o, c // groups, k), dtype)
    got = op.conv1d(x, w, stride=stride_i, padding=padding, dilation=dilation, groups=groups)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (2, o, torch_out_size(length, k, stride_i, *pads, dilation))
    assert_close(got, loop_conv1d(x, w, stride_i, pads, dilation, groups), dtype)


def test_conv1d_tuple_stride_and_dilation():
    """One int per spatial axis given as a 1-tuple must act like the int."""
    rng = np.random.default_rng(5)
    x = rand(rng, (1, 2, 15), np.float64)
    w = rand(rng, (3, 2, 3), np.float64)
    got = op.conv1d(x, w, stride=(2,), dilation=(2,), padding=(1, 0))
    assert_close(got, loop_conv1d(x, w, 2, (1, 0), 2, 1), np.float64)


def test_conv1d_groups_is_block_diagonal():
    """groups=g equals g independent convolutions on channel slices, concatenated."""
    rng = np.random.default_rng(6)
    x = rand(rng, (2, 6, 10), np.float64)
    w = rand(rng, (4, 3, 3), np.float64)
    got = op.conv1d(x, w, padding=1, groups=2)
    parts = [op.conv1d(x[:, 3 * g:3 * g + 3], w[2 * g:2 * g + 2], padding=1) for g in range(2)]
    assert_close(got, np.concatenate(parts, axis=1), np.float64)


# --------------------------------------------------------------------------- conv2d, stride 1

CONV2D_PADDINGS = [
    (0, ((0, 0), (0, 0))),
    (1, ((1, 1), (1, 1))),
    ("valid", ((0, 0), (0, 0))),
    ((2, 0), ((2, 2), (0, 0))),
    ((1, 2), ((1, 1), (2, 2))),
    (((0, 2), (1, 0)), ((0, 2), (1, 0))),
    (((2, 1), (0, 3)), ((2, 1), (0, 3))),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("padding, pads", CONV2D_PADDINGS, ids=[repr(p[0]) for p in CONV2D_PADDINGS])
def test_conv2d_padding_forms_vs_scipy(dtype, padding, pads):
    rng = np.random.default_rng(11)
    x = rand(rng, (2, 3, 7, 6), dtype)
    w = rand(rng, (4, 3, 3, 2), dtype)
    got = op.conv2d(x, w, padding=padding)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (2, 4, torch_out_size(7, 3, 1, *pads[0], 1), torch_out_size(6, 2, 1, *pads[1], 1))
    assert_close(got, scipy_conv(x, w, pads), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kh, kw, dilation", [
    (3, 3, 1), (2, 2, 1), (4, 3, 1), (1, 2, 1), (3, 3, 2), (2, 3, (2, 1)), (2, 4, (1, 3)), (5, 2, (1, 2)),
])
def test_conv2d_same_vs_scipy(dtype, kh, kw, dilation):
    rng = np.random.default_rng(20 + kh * 5 + kw)
    h, wd = 8, 7
    x = rand(rng, (2, 2, h, wd), dtype)
    w = rand(rng, (3, 2, kh, kw), dtype)
    got = op.conv2d(x, w, padding="same", dilation=dilation)
    assert got.shape == (2, 3, h, wd)
    dil = (dilation, dilation) if isinstance(dilation, int) else dilation
    pads = []
    for k, d in zip((kh, kw), dil):
        total = d * (k - 1)
        pads.append((total // 2, total - total // 2))
    assert_close(got, scipy_conv(x, w, pads, dilation=dil), dtype)


# --------------------------------------------------------------------------- conv2d, loops

CONV2D_LOOP_CASES = [
    # stride, padding given, pads, dilation, groups, C, O, (KH, KW), (H, W)
    (2, 0, ((0, 0), (0, 0)), 1, 1, 2, 3, (3, 3), (7, 8)),
    ((2, 1), 1, ((1, 1), (1, 1)), 1, 1, 2, 2, (3, 2), (7, 6)),
    ((1, 3), ((1, 0), (2, 1)), ((1, 0), (2, 1)), 1, 1, 2, 2, (2, 3), (6, 9)),
    (1, 0, ((0, 0), (0, 0)), 2, 1, 2, 2, (2, 2), (6, 7)),
    (1, (1, 2), ((1, 1), (2, 2)), (1, 2), 1, 2, 3, (3, 2), (5, 6)),
    ((2, 2), ((0, 1), (1, 0)), ((0, 1), (1, 0)), (2, 1), 1, 2, 2, (2, 3), (8, 7)),
    (1, 1, ((1, 1), (1, 1)), 1, 2, 4, 4, (3, 3), (5, 5)),     # groups=2
    (2, 1, ((1, 1), (1, 1)), 1, 3, 3, 3, (3, 3), (7, 6)),     # depthwise, strided
    (1, 2, ((2, 2), (2, 2)), 2, 2, 2, 4, (3, 2), (5, 6)),     # depthwise x2, dilated
    (1, "valid", ((0, 0), (0, 0)), 1, 4, 4, 4, (2, 2), (4, 5)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("stride, padding, pads, dilation, groups, c, o, k, hw", CONV2D_LOOP_CASES)
def test_conv2d_stride_dilation_groups_vs_loops(dtype, stride, padding, pads, dilation, groups, c, o, k, hw):
    rng = np.random.default_rng(300 + c * 7 + o * 3 + k[0] * 11 + hw[1])
    x = rand(rng, (2, c) + hw, dtype)
    w = rand(rng, (o, c // groups) + k, dtype)
    got = op.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    s = (stride, stride) if isinstance(stride, int) else stride
    d = (dilation, dilation) if isinstance(dilation, int) else dilation
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (2, o) + tuple(torch_out_size(hw[i], k[i], s[i], *pads[i], d[i]) for i in range(2))
    assert_close(got, loop_conv2d(x, w, s, pads, d, groups), dtype)


# --------------------------------------------------------------------------- bfloat16

def _bf16_close(got, want):
    want = np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-2, atol=1e-2 * scale)


def test_conv1d_bfloat16():
    rng = np.random.default_rng(40)
    x = rand(rng, (2, 4, 12), np.float32).astype(ml_dtypes.bfloat16)
    w = rand(rng, (6, 2, 3), np.float32).astype(ml_dtypes.bfloat16)
    got = op.conv1d(x, w, stride=2, padding=(1, 2), dilation=2, groups=2)
    assert str(got.dtype) == "bfloat16"
    want32 = op.conv1d(x.astype(np.float32), w.astype(np.float32), stride=2, padding=(1, 2), dilation=2, groups=2)
    assert want32.dtype == np.float32
    assert got.shape == want32.shape == (2, 6, torch_out_size(12, 3, 2, 1, 2, 2))
    _bf16_close(got, want32)
    _bf16_close(got, loop_conv1d(x.astype(np.float32), w.astype(np.float32), 2, (1, 2), 2, 2))


def test_conv2d_bfloat16_same():
    rng = np.random.default_rng(41)
    x = rand(rng, (1, 3, 6, 5), np.float32).astype(ml_dtypes.bfloat16)
    w = rand(rng, (2, 3, 2, 3), np.float32).astype(ml_dtypes.bfloat16)
    got = op.conv2d(x, w, padding="same")
    assert str(got.dtype) == "bfloat16"
    assert got.shape == (1, 2, 6, 5)
    ref = scipy_conv(x.astype(np.float32), w.astype(np.float32), [(0, 1), (1, 1)])
    _bf16_close(got, ref)
    # and the bf16 result is the float32 result rounded (not something coarser): tight check.
    want32 = op.conv2d(x.astype(np.float32), w.astype(np.float32), padding="same")
    np.testing.assert_allclose(np.asarray(got, np.float64), want32.astype(ml_dtypes.bfloat16).astype(np.float64),
                               rtol=2 ** -7, atol=1e-6)


# --------------------------------------------------------------------------- placeholders

def test_conv_placeholders_shape_and_dtype():
    t = op.conv2d(op.tensor((2, 4, 9, 8), "float32"), op.tensor((6, 2, 3, 2), "float32"),
                  stride=(2, 3), padding=((1, 0), (2, 1)), dilation=(1, 2), groups=2)
    assert t.shape == (2, 6, torch_out_size(9, 3, 2, 1, 0, 1), torch_out_size(8, 2, 3, 2, 1, 2))
    assert str(t.dtype) == "float32"
    t1 = op.conv1d(op.tensor((3, 2, 10), "bfloat16"), op.tensor((4, 2, 4), "bfloat16"), padding="same")
    assert t1.shape == (3, 4, 10)
    assert str(t1.dtype) == "bfloat16"


# --------------------------------------------------------------------------- errors

def _check_message(err: TesseraError, name: str, *fragments: str) -> None:
    msg = str(err)
    assert msg.startswith(f"{name}: "), msg
    for f in fragments:
        assert f in msg, (f, msg)


def test_conv1d_channels_do_not_match_groups():
    x = np.ones((2, 3, 10), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    with pytest.raises((ShapeError, AttributeValueError)) as info:
        op.conv1d(x, w, groups=2)
    _check_message(info.value, "conv1d", "  operands: x: f32[2,3,10], w: f32[4,3,3]")


def test_conv1d_weight_channels_wrong_for_groups():
    x = np.ones((2, 4, 10), np.float32)
    w = np.ones((4, 4, 3), np.float32)  # groups=2 needs w.shape[1] == 2
    with pytest.raises((ShapeError, AttributeValueError)) as info:
        op.conv1d(x, w, groups=2)
    _check_message(info.value, "conv1d", "x: f32[2,4,10]", "w: f32[4,4,3]")


def test_conv1d_in_channels_mismatch():
    x = np.ones((2, 3, 10), np.float32)
    w = np.ones((4, 2, 3), np.float32)
    with pytest.raises(ShapeError) as info:
        op.conv1d(x, w)
    _check_message(info.value, "conv1d", "x: f32[2,3,10]", "w: f32[4,2,3]")


def test_conv2d_channels_do_not_match_groups():
    x = np.ones((1, 6, 5, 5), np.float64)
    w = np.ones((4, 2, 3, 3), np.float64)
    with pytest.raises((ShapeError, AttributeValueError)) as info:
        op.conv2d(x, w, groups=4)
    _check_message(info.value, "conv2d", "x: f64[1,6,5,5]", "w: f64[4,2,3,3]")


def test_conv1d_same_with_stride_2():
    x = np.ones((2, 3, 10), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    with pytest.raises(AttributeValueError) as info:
        op.conv1d(x, w, stride=2, padding="same")
    _check_message(info.value, "conv1d", "  operands: x: f32[2,3,10], w: f32[4,3,3]")


def test_conv2d_same_with_stride_on_one_axis():
    x = np.ones((1, 2, 8, 8), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(AttributeValueError) as info:
        op.conv2d(x, w, stride=(1, 2), padding="same")
    _check_message(info.value, "conv2d", "x: f32[1,2,8,8]", "w: f32[3,2,3,3]")


def test_conv1d_kernel_larger_than_input():
    x = np.ones((2, 3, 4), np.float32)
    w = np.ones((4, 3, 7), np.float32)
    with pytest.raises(ShapeError) as info:
        op.conv1d(x, w)
    _check_message(info.value, "conv1d", "x: f32[2,3,4]", "w: f32[4,3,7]")


def test_conv1d_dilated_kernel_larger_than_input():
    x = np.ones((1, 1, 6), np.float32)
    w = np.ones((1, 1, 3), np.float32)  # dilated extent 2*(3-1)+1 = 5 fits, 3*(3-1)+1 = 7 does not
    assert op.conv1d(x, w, dilation=2).shape == (1, 1, 2)
    with pytest.raises(ShapeError) as info:
        op.conv1d(x, w, dilation=3)
    _check_message(info.value, "conv1d", "x: f32[1,1,6]")


def test_conv2d_kernel_larger_than_input():
    x = np.ones((1, 2, 5, 4), np.float32)
    w = np.ones((3, 2, 3, 5), np.float32)
    with pytest.raises(ShapeError) as info:
        op.conv2d(x, w)
    _check_message(info.value, "conv2d", "x: f32[1,2,5,4]", "w: f32[3,2,3,5]")


def test_conv1d_wrong_rank():
    x = np.ones((3, 10), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    with pytest.raises(ShapeError) as info:
        op.conv1d(x, w)
    _check_message(info.value, "conv1d", "x: f32[3,10]", "w: f32[4,3,3]")


def test_conv2d_wrong_rank():
    x = np.ones((2, 3, 10), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    with pytest.raises(ShapeError) as info:
        op.conv2d(x, w)
    _check_message(info.value, "conv2d", "  operands: x: f32[2,3,10], w: f32[4,3,3]")


@pytest.mark.parametrize("kwargs", [dict(stride=0), dict(dilation=0), dict(padding=-1), dict(groups=0),
                                    dict(padding="full")])
def test_conv1d_bad_attributes(kwargs):
    x = np.ones((2, 3, 10), np.float32)
    w = np.ones((4, 3, 3), np.float32)
    with pytest.raises(AttributeValueError) as info:
        op.conv1d(x, w, **kwargs)
    _check_message(info.value, "conv1d", "x: f32[2,3,10]")
