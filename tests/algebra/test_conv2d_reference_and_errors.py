"""conv2d checked against independent references (see conv_helpers.py), conv on placeholders, and
the errors conv1d / conv2d raise on bad shapes and attributes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import AttributeValueError, ShapeError, TesseraError, op
from tests.algebra.conv_helpers import (
    FLOATS, assert_close, bf16_close, loop_conv2d, rand, scipy_conv, torch_out_size,
)


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

def test_conv2d_bfloat16_same():
    rng = np.random.default_rng(41)
    x = rand(rng, (1, 3, 6, 5), np.float32).astype(ml_dtypes.bfloat16)
    w = rand(rng, (2, 3, 2, 3), np.float32).astype(ml_dtypes.bfloat16)
    got = op.conv2d(x, w, padding="same")
    assert str(got.dtype) == "bfloat16"
    assert got.shape == (1, 2, 6, 5)
    ref = scipy_conv(x.astype(np.float32), w.astype(np.float32), [(0, 1), (1, 1)])
    bf16_close(got, ref)
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
    _check_message(info.value, "conv1d", "x: f32[1,1,6]", "kernel (3,) dilated by (3,) to (7,) is wider than the "
                   "padded input (6,)")


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
