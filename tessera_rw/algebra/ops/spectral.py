"""The fft family along one axis, as numpy.fft: fft, ifft, rfft, irfft with n, axis and norm.

Real signals' spectra are complex64 (complex128 for float64); complex multiply is `mul` on complex
operands.
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion, fit_length, unbroadcast
from tessera_rw.algebra.dtypes import DType, complex_of, real_of
from tessera_rw.algebra.errors import AttributeValueError, AxisError, DTypeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs

NORMS = ("backward", "ortho", "forward")


def _check(x: TensorType, n: int, axis: int, norm: str) -> None:
    if not 0 <= axis < x.ndim:
        raise AxisError(f"axis {axis} does not fit a tensor of rank {x.ndim}")
    if n < 1:
        raise AttributeValueError(f"n must be >= 1, got {n}")
    if norm not in NORMS:
        raise AttributeValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if not (x.dtype.is_float or x.dtype.is_complex):
        raise DTypeError(f"takes a floating-point or complex operand, got {x.dtype}", hint="cast first")


def _with_axis(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return shape[:axis] + (size,) + shape[axis + 1:]


def _infer_complex_fft(x: TensorType, n: int, axis: int, norm: str) -> TensorType:
    _check(x, n, axis, norm)
    return TensorType(_with_axis(x.shape, axis, n), complex_of(x.dtype))


def _infer_rfft(x: TensorType, n: int, axis: int, norm: str) -> TensorType:
    _check(x, n, axis, norm)
    if x.dtype.is_complex:
        raise DTypeError("rfft takes a real signal", hint="use fft for complex signals")
    return TensorType(_with_axis(x.shape, axis, n // 2 + 1), complex_of(x.dtype))


def _infer_irfft(x: TensorType, n: int, axis: int, norm: str) -> TensorType:
    _check(x, n, axis, norm)
    return TensorType(_with_axis(x.shape, axis, n), real_of(complex_of(x.dtype)))


def _fft_flops(real: bool):
    def flops(out: TensorType, x: TensorType, n: int, axis: int, norm: str) -> int:
        transforms = math.prod(x.shape) // max(x.shape[axis], 1)
        per = 5 * n * max(math.log2(n), 1)
        return int(transforms * per / (2 if real else 1))
    return flops


def _numpy(fn):
    return lambda x, n, axis, norm: fn(x, n=n, axis=axis, norm=norm)


# ---- VJPs ------------------------------------------------------------------------------------
#
# A transform is a linear map A (after cutting or zero-extending x to n); its VJP is Aᴴ g, then
# undoing the cut. The adjoint of the DFT is the unnormalized inverse DFT and the scale is real,
# so Aᴴ is the opposite transform under the norm with the same scale on the other side.

ADJOINT_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _half_spectrum_weights(n: int, dtype: DType, ndim: int, axis: int, interior: float) -> np.ndarray:
    """Per-bin weights of an n-point half spectrum along `axis`: `interior` for the bins that stand
    for a pair of conjugate bins of the full spectrum, 1 for the unpaired DC (and Nyquist) bins."""
    w = np.full(n // 2 + 1, interior, dtype=real_of(dtype).numpy)
    w[0] = 1
    if n % 2 == 0:
        w[-1] = 1
    return w.reshape((-1,) + (1,) * (ndim - 1 - axis))


def _complex_fft_vjp(adjoint: str):
    """fft's adjoint is ifft's direction, and the reverse."""
    def vjp(g, y, x, n, axis, norm):
        back = getattr(api, adjoint)(g, n=n, axis=axis, norm=ADJOINT_NORM[norm])
        return (unbroadcast(fit_length(back, axis, x.shape[axis]), x),)
    return vjp


def _rfft_vjp(g, y, x, n, axis, norm):
    # y keeps the bins 0..n/2 of a real signal's spectrum, so Re(Aᴴ g) sums each interior bin once
    # where irfft counts it twice (for its conjugate partner): halve them first
    half = g * _half_spectrum_weights(n, g.dtype, g.ndim, axis, 0.5)
    return (unbroadcast(fit_length(api.irfft(half, n=n, axis=axis, norm=ADJOINT_NORM[norm]), axis, x.shape[axis]), x),)


def _irfft_vjp(g, y, x, n, axis, norm):
    # irfft reads each interior bin twice (itself and its conjugate) and the imaginary part of the
    # DC and Nyquist bins not at all; the spectrum of a real g has those imaginary parts 0
    spectrum = api.rfft(g, n=n, axis=axis, norm=ADJOINT_NORM[norm])
    spectrum = spectrum * _half_spectrum_weights(n, spectrum.dtype, spectrum.ndim, axis, 2.0)
    return (unbroadcast(fit_length(spectrum, axis, x.shape[axis]), x),)


DEFS = (
    OpDef("fft", ("x",), OpKind.SPECTRAL, _infer_complex_fft, _numpy(np.fft.fft), _fft_flops(False),
          vjp=_complex_fft_vjp("ifft")),
    OpDef("ifft", ("x",), OpKind.SPECTRAL, _infer_complex_fft, _numpy(np.fft.ifft), _fft_flops(False),
          vjp=_complex_fft_vjp("fft")),
    OpDef("rfft", ("x",), OpKind.SPECTRAL, _infer_rfft, _numpy(np.fft.rfft), _fft_flops(True), vjp=_rfft_vjp),
    OpDef("irfft", ("x",), OpKind.SPECTRAL, _infer_irfft, _numpy(np.fft.irfft), _fft_flops(True), vjp=_irfft_vjp),
)




# ---- the frequency-domain half of a spectral convolution ----------------------------------

def _infer_contract(x: TensorType, w: TensorType, groups: int) -> TensorType:
    if not (x.dtype.is_complex and w.dtype.is_complex):
        raise DTypeError(f"takes two spectra (complex), got {x.dtype} and {w.dtype}", hint="rfft both first")
    if x.ndim < 3 or x.ndim != w.ndim:
        raise AttributeValueError(f"expects x (N, C, *freq) and w (O, C/groups, *freq) of one rank, "
                                  f"got ranks {x.ndim} and {w.ndim}")
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups or w.shape[1] * groups != x.shape[1]:
        raise AttributeValueError(f"groups={groups} does not fit {x.shape[1]} input channels and w {w.shape[:2]}")
    if x.shape[2:] != w.shape[2:]:
        raise AttributeValueError(f"the spectra have different frequency shapes {x.shape[2:]} and {w.shape[2:]}")
    return TensorType((x.shape[0], w.shape[0]) + x.shape[2:], x.dtype if x.dtype == w.dtype else DType.complex128)


def spectral_contract_reference(x: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    """y[n, o, f] = Σ_c x[n, c, f] · conj(w[o, c, f]) within each group: a cross-correlation's
    channel sum, done per frequency."""
    n, c = x.shape[:2]
    o = w.shape[0]
    xg = x.reshape((n, groups, c // groups) + x.shape[2:])
    wg = np.conj(w).reshape((groups, o // groups) + w.shape[1:])
    return np.einsum("ngc...,goc...->ngo...", xg, wg).reshape((n, o) + x.shape[2:])


def _contract_flops(out: TensorType, x: TensorType, w: TensorType, groups: int) -> int:
    return 8 * out.numel * w.shape[1]  # a complex multiply-add is 8 real FLOPs


CONTRACT = OpDef("spectral_contract", ("x", "w"), OpKind.SPECTRAL, _infer_contract,
                 spectral_contract_reference, _contract_flops, vjp=before_fusion("spectral_contract"))
DEFS = DEFS + (CONTRACT,)
