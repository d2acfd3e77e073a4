"""conv1d checked against independent references (they live in conv_helpers.py).

- stride-1 cases: scipy.signal.correlate(mode="valid") on an explicitly padded input, summed over
  the input channels (a dilated kernel is given to scipy with zeros inserted between its taps);
- stride, dilation and groups: hand-written loops over every output element with bounds-checked
  (implicit zero) padding; no numpy padding, no einsum, no scipy.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tests.algebra.conv_helpers import (
    FLOATS, assert_close, bf16_close, loop_conv1d, loop_conv2d, rand, scipy_conv, torch_out_size,
)


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


# --------------------------------------------------------------------------- bfloat16

def test_conv1d_bfloat16():
    rng = np.random.default_rng(40)
    x = rand(rng, (2, 4, 12), np.float32).astype(ml_dtypes.bfloat16)
    w = rand(rng, (6, 2, 3), np.float32).astype(ml_dtypes.bfloat16)
    got = op.conv1d(x, w, stride=2, padding=(1, 2), dilation=2, groups=2)
    assert str(got.dtype) == "bfloat16"
    want32 = op.conv1d(x.astype(np.float32), w.astype(np.float32), stride=2, padding=(1, 2), dilation=2, groups=2)
    assert want32.dtype == np.float32
    assert got.shape == want32.shape == (2, 6, torch_out_size(12, 3, 2, 1, 2, 2))
    bf16_close(got, want32)
    bf16_close(got, loop_conv1d(x.astype(np.float32), w.astype(np.float32), 2, (1, 2), 2, 2))
