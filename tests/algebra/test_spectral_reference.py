"""fft / ifft / rfft / irfft checked against numpy.fft in float64 / complex128.

The input is drawn once, rounded to the dtype under test, and numpy gets the same (rounded) values
widened to float64 / complex128, so the only differences are the op's own rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tessera_rw import AttributeValueError, AxisError, DTypeError, TesseraError, op

NORMS = [None, "backward", "ortho", "forward"]
COMPLEX_OF = {np.float32: np.complex64, np.float64: np.complex128}


def _tol(dtype):
    return 1e-11 if np.dtype(dtype) in (np.float64, np.complex128) else 2e-5


def assert_close(got, want, dtype):
    want = np.asarray(want)
    scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
    tol = _tol(dtype)
    np.testing.assert_allclose(np.asarray(got).astype(want.dtype), want, rtol=tol, atol=tol * scale)


def real_signal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def complex_signal(rng, shape, dtype):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def wide(x):
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


# --------------------------------------------------------------------------- fft / ifft

FFT_CASES = [
    # shape, n, axis
    ((16,), None, -1),
    ((16,), 10, -1),      # crop
    ((16,), 25, -1),      # zero pad, odd
    ((16,), 32, 0),
    ((3, 12), None, -1),
    ((3, 12), 7, 1),
    ((9, 4), None, 0),
    ((9, 4), 13, 0),
    ((9, 4), 5, -2),
    ((2, 5, 6), 8, 1),
    ((2, 5, 6), 3, -3),
    ((2, 5, 6), 1, -1),
]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, n, axis", FFT_CASES)
@pytest.mark.parametrize("fn", ["fft", "ifft"])
def test_fft_ifft_real_input_vs_numpy(fn, shape, n, axis, dtype, norm):
    rng = np.random.default_rng(hash((fn, shape, n, axis)) % 2 ** 32)
    x = real_signal(rng, shape, dtype)
    got = getattr(op, fn)(x, n=n, axis=axis, norm=norm)
    want = getattr(np.fft, fn)(wide(x), n=n, axis=axis, norm=norm)
    assert got.dtype == COMPLEX_OF[dtype]
    assert got.shape == want.shape
    assert_close(got, want, dtype)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("shape, n, axis", FFT_CASES)
@pytest.mark.parametrize("fn", ["fft", "ifft"])
def test_fft_ifft_complex_input_vs_numpy(fn, shape, n, axis, dtype, norm):
    rng = np.random.default_rng(hash((fn, shape, n, axis, 1)) % 2 ** 32)
    x = complex_signal(rng, shape, dtype)
    got = getattr(op, fn)(x, n=n, axis=axis, norm=norm)
    want = getattr(np.fft, fn)(wide(x), n=n, axis=axis, norm=norm)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape
    assert_close(got, want, dtype)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_ifft_inverts_fft(dtype, norm):
    rng = np.random.default_rng(7)
    x = complex_signal(rng, (3, 20), dtype)
    back = op.ifft(op.fft(x, axis=1, norm=norm), axis=1, norm=norm)
    assert back.dtype == np.dtype(dtype)
    assert_close(back, wide(x), dtype)


def test_fft_norm_scalings_relate():
    """backward, ortho and forward differ by 1, 1/sqrt(n) and 1/n."""
    rng = np.random.default_rng(8)
    x = real_signal(rng, (24,), np.float64)
    b = op.fft(x)
    np.testing.assert_allclose(op.fft(x, norm="ortho"), b / np.sqrt(24), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.fft(x, norm="forward"), b / 24, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.fft(x, norm=None), b, rtol=0, atol=0)
    # explicit DFT sum, independent of numpy.fft
    k = np.arange(24)
    dft = np.exp(-2j * np.pi * np.outer(k, k) / 24) @ x
    np.testing.assert_allclose(b, dft, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- rfft

RFFT_CASES = [
    ((16,), None, -1),
    ((15,), None, -1),
    ((16,), 9, -1),       # crop to odd
    ((16,), 10, 0),       # crop to even
    ((16,), 33, -1),      # zero pad, odd
    ((5, 12), None, 1),
    ((5, 12), 20, -1),
    ((11, 3), None, 0),
    ((11, 3), 6, -2),
    ((2, 7, 4), None, 1),
    ((2, 7, 4), 2, -3),
    ((4, 3, 1), 1, 2),
]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, n, axis", RFFT_CASES)
def test_rfft_vs_numpy(shape, n, axis, dtype, norm):
    rng = np.random.default_rng(hash((shape, n, axis)) % 2 ** 32)
    x = real_signal(rng, shape, dtype)
    got = op.rfft(x, n=n, axis=axis, norm=norm)
    want = np.fft.rfft(wide(x), n=n, axis=axis, norm=norm)
    assert got.dtype == COMPLEX_OF[dtype]
    assert got.shape == want.shape
    m = shape[axis] if n is None else n
    assert got.shape[axis] == m // 2 + 1
    assert_close(got, want, dtype)


# --------------------------------------------------------------------------- irfft

IRFFT_CASES = [
    # spectrum shape, n, axis
    ((9,), None, -1),      # default n = 2*(9-1) = 16
    ((9,), 17, -1),        # odd n uses the same 9 bins
    ((9,), 10, -1),        # crop the spectrum
    ((9,), 30, 0),         # zero pad the spectrum
    ((4, 6), None, 1),
    ((4, 6), None, 0),     # default n along axis 0 = 6
    ((4, 6), 5, -1),
    ((5, 3, 2), None, -3),
    ((5, 3, 2), 7, 1),
    ((2, 2), None, -1),    # n = 2
]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("shape, n, axis", IRFFT_CASES)
def test_irfft_vs_numpy(shape, n, axis, dtype, norm):
    rng = np.random.default_rng(hash((shape, n, axis, 2)) % 2 ** 32)
    x = complex_signal(rng, shape, dtype)
    got = op.irfft(x, n=n, axis=axis, norm=norm)
    want = np.fft.irfft(wide(x), n=n, axis=axis, norm=norm)
    assert got.dtype == (np.float32 if dtype == np.complex64 else np.float64)
    assert got.shape == want.shape
    expected_n = 2 * (shape[axis] - 1) if n is None else n
    assert got.shape[axis] == expected_n
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_irfft_of_real_input(dtype):
    """A real array given to irfft is a spectrum with zero imaginary part; the result is real."""
    rng = np.random.default_rng(9)
    x = real_signal(rng, (3, 5), dtype)
    got = op.irfft(x)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (3, 8)
    assert_close(got, np.fft.irfft(wide(x)), dtype)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("length, axis", [(16, -1), (15, -1), (7, 0), (1, 0), (2, -1), (10, 1)])
def test_rfft_irfft_round_trip(length, axis, dtype, norm):
    rng = np.random.default_rng(length * 10 + axis)
    shape = [3, 4]
    shape[axis] = length
    x = real_signal(rng, tuple(shape), dtype)
    spec = op.rfft(x, axis=axis, norm=norm)
    back = op.irfft(spec, n=length, axis=axis, norm=norm)
    assert back.dtype == np.dtype(dtype)
    assert back.shape == x.shape
    assert_close(back, x.astype(np.float64), dtype)


# --------------------------------------------------------------------------- convolution theorem

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("la, lb, extra", [(8, 5, 0), (13, 4, 3), (1, 6, 0), (7, 7, 10)])
def test_convolution_theorem(la, lb, extra, dtype):
    rng = np.random.default_rng(la * 31 + lb)
    a = real_signal(rng, (la,), dtype)
    b = real_signal(rng, (lb,), dtype)
    n = la + lb - 1 + extra
    prod = op.complex_mul(op.rfft(a, n=n), op.rfft(b, n=n))
    assert prod.dtype == COMPLEX_OF[dtype]
    np.testing.assert_allclose(prod, np.fft.rfft(wide(a), n=n) * np.fft.rfft(wide(b), n=n),
                               rtol=_tol(dtype), atol=_tol(dtype) * la * lb)
    got = op.irfft(prod, n=n)
    assert got.dtype == np.dtype(dtype)
    want = np.convolve(wide(a), wide(b))  # full linear convolution, length la + lb - 1
    assert got.shape == (n,)
    assert_close(got[:la + lb - 1], want, dtype)
    np.testing.assert_allclose(got[la + lb - 1:], 0.0, atol=_tol(dtype) * float(np.max(np.abs(want))))


def test_convolution_theorem_batched_axis0():
    """Along axis 0 of a 2-d batch: each column is convolved with the same filter."""
    rng = np.random.default_rng(12)
    a = real_signal(rng, (9, 3), np.float64)
    b = real_signal(rng, (4, 1), np.float64)
    n = 12
    spec = op.complex_mul(op.rfft(a, n=n, axis=0), np.broadcast_to(op.rfft(b, n=n, axis=0), (7, 3)).copy())
    got = op.irfft(spec, n=n, axis=0)
    want = np.stack([np.convolve(a[:, j], b[:, 0]) for j in range(3)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_mul_vs_numpy(dtype):
    rng = np.random.default_rng(13)
    a = complex_signal(rng, (4, 6), dtype)
    b = complex_signal(rng, (4, 6), dtype)
    got = op.complex_mul(a, b)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, wide(a) * wide(b), dtype)


# --------------------------------------------------------------------------- placeholders

def test_placeholder_dtypes():
    assert str(op.rfft(op.tensor((8,), "float32")).dtype) == "complex64"
    assert str(op.rfft(op.tensor((8,), "float64")).dtype) == "complex128"
    assert str(op.fft(op.tensor((8,), "float32")).dtype) == "complex64"
    assert str(op.ifft(op.tensor((8,), "complex128")).dtype) == "complex128"
    t = op.irfft(op.tensor((4, 9), "complex64"))
    assert str(t.dtype) == "float32" and t.shape == (4, 16)
    t = op.irfft(op.tensor((9, 4), "complex128"), axis=0, n=11)
    assert str(t.dtype) == "float64" and t.shape == (11, 4)


@st.composite
def shape_and_axis(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 17), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1))
    return shape, axis


@settings(max_examples=50, deadline=None)
@given(shape_and_axis(), st.one_of(st.none(), st.integers(1, 20)))
def test_placeholder_shapes_match_numpy(sa, n):
    shape, a = sa
    assert op.rfft(op.tensor(shape, "float32"), axis=a).shape == \
        np.fft.rfft(np.zeros(shape, np.float32), axis=a).shape
    assert op.rfft(op.tensor(shape, "float32"), n=n, axis=a).shape == \
        np.fft.rfft(np.zeros(shape, np.float32), n=n, axis=a).shape
    assert op.fft(op.tensor(shape, "float32"), n=n, axis=a).shape == \
        np.fft.fft(np.zeros(shape, np.float32), n=n, axis=a).shape
    if n is not None or shape[a] >= 2:
        assert op.irfft(op.tensor(shape, "complex64"), n=n, axis=a).shape == \
            np.fft.irfft(np.zeros(shape, np.complex64), n=n, axis=a).shape


@settings(max_examples=30, deadline=None)
@given(shape_and_axis())
def test_eager_rfft_matches_numpy_random_shapes(sa):
    shape, a = sa
    x = np.random.default_rng(sum(shape) + 17 * (a + 3)).standard_normal(shape).astype(np.float32)
    got = op.rfft(x, axis=a)
    assert got.dtype == np.complex64
    assert_close(got, np.fft.rfft(x.astype(np.float64), axis=a), np.float32)


# --------------------------------------------------------------------------- errors

def _check_message(err: TesseraError, name: str, *fragments: str) -> None:
    msg = str(err)
    assert msg.startswith(f"{name}: "), msg
    for f in fragments:
        assert f in msg, (f, msg)


@pytest.mark.parametrize("dtype, short", [(np.complex64, "c64"), (np.complex128, "c128")])
def test_rfft_of_complex_input(dtype, short):
    with pytest.raises(DTypeError) as info:
        op.rfft(np.ones((2, 8), dtype))
    _check_message(info.value, "rfft", f"x: {short}[2,8]")


def test_rfft_of_complex_placeholder():
    with pytest.raises(DTypeError):
        op.rfft(op.tensor((8,), "complex64"))


@pytest.mark.parametrize("fn", ["fft", "ifft", "rfft", "irfft"])
@pytest.mark.parametrize("norm", ["sideways", "BACKWARD", "", 1])
def test_bad_norm(fn, norm):
    x = np.ones((4, 6), np.float32)
    with pytest.raises(AttributeValueError) as info:
        getattr(op, fn)(x, norm=norm)
    _check_message(info.value, fn, "x: f32[4,6]")


@pytest.mark.parametrize("fn", ["fft", "ifft", "rfft", "irfft"])
@pytest.mark.parametrize("axis", [2, -3, 5])
def test_bad_axis(fn, axis):
    x = np.ones((4, 6), np.float32)
    with pytest.raises(AxisError) as info:
        getattr(op, fn)(x, axis=axis)
    _check_message(info.value, fn, "x: f32[4,6]")


@pytest.mark.parametrize("fn", ["fft", "ifft", "rfft", "irfft"])
@pytest.mark.parametrize("n", [0, -3])
def test_bad_n(fn, n):
    x = np.ones((4, 6), np.float32)
    with pytest.raises(AttributeValueError) as info:
        getattr(op, fn)(x, n=n)
    _check_message(info.value, fn, "x: f32[4,6]")


def test_irfft_default_n_zero_for_single_bin():
    """A one-bin spectrum gives a default n of 2*(1-1) = 0: rejected (numpy raises too)."""
    with pytest.raises(AttributeValueError) as info:
        op.irfft(np.ones((3, 1), np.complex64))
    _check_message(info.value, "irfft", "x: c64[3,1]")
    with pytest.raises(ValueError):
        np.fft.irfft(np.ones((3, 1), np.complex64))


def test_the_transforms_answer_to_numpys_fft_namespace_spelling():
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    for name in ("fft", "ifft", "rfft"):
        np.testing.assert_allclose(getattr(op.fft, name)(x), getattr(np.fft, name)(x), rtol=1e-4, atol=1e-4)
    spectrum = np.fft.rfft(x)
    np.testing.assert_allclose(op.fft.irfft(spectrum.astype(np.complex64)), np.fft.irfft(spectrum), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(op.fft(x), np.fft.fft(x), rtol=1e-4, atol=1e-4)      # still the complex transform
