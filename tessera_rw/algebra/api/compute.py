"""Op functions for the heavy ops: matmul, conv1d/conv2d, the fft family, flash_attention."""

from __future__ import annotations

import math
import numbers

from tessera_rw.algebra.api.dispatch import apply, flag, op_context, tensor_operand, type_of
from tessera_rw.algebra.api.elementwise import cast
from tessera_rw.algebra.api.layout import int_tuple
from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.ops.spectral import NORMS
from tessera_rw.algebra.schedule_pin import parse_tile_shape
from tessera_rw.algebra.shapes import normalize_axis


def matmul(a, b, accum_dtype=None, tile_shape=None):
    """a @ b with numpy semantics; `accum_dtype="fp32"` sets the kernels' accumulator;
    `tile_shape=(bm, bn, bk)` (or (bm, bn)) pins the tile of the GEMM kernel computing this
    product, which is then not tuned (see algebra/schedule_pin.py).

    Operands of two float dtypes (fp8 × bf16, say) meet in their common dtype: the narrower one is
    cast up first, exactly (every fp8 value is a bf16 value, every bf16 one a float32), so the
    product runs as a GEMM of one dtype with the result dtype numpy's promotion gives."""
    with op_context("matmul", (a, b), ("a", "b")):
        accum = None if accum_dtype is None else DType.parse(accum_dtype)
        tile = None if tile_shape is None else parse_tile_shape(tile_shape)
        a, b = _common_dtype(a, b)
    return apply("matmul", (a, b), tile_shape=tile, accum_dtype=accum)


def _common_dtype(a, b):
    """(a, b) with the narrower of two float operand dtypes cast to their promotion."""
    ta, tb = type_of(a), type_of(b)
    if ta is None or tb is None or ta.dtype is tb.dtype or not (ta.dtype.is_float and tb.dtype.is_float):
        return a, b
    common = promote(ta.dtype, tb.dtype)
    return (a if ta.dtype is common else cast(a, common)), (b if tb.dtype is common else cast(b, common))


def _per_axis(value, spatial: int, what: str) -> tuple[int, ...]:
    values = (value,) * spatial if isinstance(value, numbers.Integral) else tuple(value)
    if len(values) != spatial or not all(isinstance(v, numbers.Integral) for v in values):
        raise AttributeValueError(f"{what} must be an int or {spatial} ints, got {value!r}")
    return tuple(int(v) for v in values)


def conv_padding(padding, kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Normalize conv padding to one (low, high) pair per spatial axis.

    int: both sides of every axis; "valid": none; "same": the output keeps the input's size
    (stride 1 only; an odd total puts the extra element on the high side, as torch does);
    conv1d (left, right); conv2d (ph, pw) or ((top, bottom), (left, right)).
    """
    spatial = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * spatial
        if padding == "same":
            if any(s != 1 for s in stride):
                raise AttributeValueError(f"padding='same' needs stride 1, got stride {stride}",
                                          hint="give explicit padding for strided convolutions")
            totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
            return tuple((t // 2, t - t // 2) for t in totals)
        raise AttributeValueError(f"padding must be an int, 'same', 'valid' or pairs, got {padding!r}")
    if isinstance(padding, numbers.Integral):
        return ((int(padding), int(padding)),) * spatial
    try:
        items = tuple(padding)
    except TypeError:
        raise AttributeValueError(f"padding must be an int, 'same', 'valid' or pairs, got {padding!r}") from None
    if spatial == 1 and len(items) == 2 and all(isinstance(v, numbers.Integral) for v in items):
        return ((int(items[0]), int(items[1])),)
    if len(items) == spatial and all(isinstance(v, numbers.Integral) for v in items):
        return tuple((int(v), int(v)) for v in items)
    if len(items) == spatial and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in items):
        return tuple(int_tuple(p, "padding") for p in items)
    raise AttributeValueError(f"padding {padding!r} does not fit a {spatial}-d convolution")


def _conv(name: str, spatial: int, x, w, stride, padding, dilation, groups):
    with op_context(name, (x, w), ("x", "w")):
        wt = type_of(w)
        strides = _per_axis(stride, spatial, "stride")
        dilations = _per_axis(dilation, spatial, "dilation")
        kernel = wt.shape[2:] if wt.ndim == spatial + 2 else (1,) * spatial
        pads = conv_padding(padding, kernel, strides, dilations)
        if not isinstance(groups, numbers.Integral) or groups < 1:
            raise AttributeValueError(f"groups must be an int >= 1, got {groups!r}")
    return apply(name, (x, w), stride=strides, padding=pads, dilation=dilations, groups=int(groups))


def conv1d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Cross-correlation of x (N, C, L) with w (O, C/groups, K), plus bias (O,) where given, as
    torch.nn.functional.conv1d."""
    return _biased(_conv("conv1d", 1, x, w, stride, padding, dilation, groups), bias, 1)


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Cross-correlation of x (N, C, H, W) with w (O, C/groups, KH, KW), plus bias (O,) where given,
    as torch's conv2d."""
    return _biased(_conv("conv2d", 2, x, w, stride, padding, dilation, groups), bias, 2)


def _biased(y, bias, spatial: int):
    """y plus a per-output-channel bias (O,) spread over the spatial axes (the convolution's
    epilogue takes it in)."""
    if bias is None:
        return y
    from tessera_rw.algebra.api.elementwise import add
    from tessera_rw.algebra.api.layout import reshape
    channels = type_of(y).shape[1]
    with op_context("conv bias", (tensor_operand(bias),), ("bias",)):
        if type_of(tensor_operand(bias)).shape != (channels,):
            raise AttributeValueError(f"a convolution's bias has one value per output channel, shape ({channels},), "
                                      f"got {type_of(tensor_operand(bias)).shape}",
                                      hint="stride, padding, dilation and groups follow bias, as in torch")
    return add(y, reshape(bias, (1, channels) + (1,) * spatial))


def _fft(name: str, x, n, axis, norm):
    x = tensor_operand(x)
    with op_context(name, (x,), ("x",)):
        t = type_of(x)
        ax = normalize_axis(axis, t.ndim)
        norm = "backward" if norm is None else norm
        if norm not in NORMS:
            raise AttributeValueError(f"norm must be one of {NORMS} or None, got {norm!r}")
        if n is None:
            n = 2 * (t.shape[ax] - 1) if name == "irfft" else t.shape[ax]
        if not isinstance(n, numbers.Integral) or n < 1:
            raise AttributeValueError(f"n must be an int >= 1, got {n!r}")
    return apply(name, (x,), n=int(n), axis=ax, norm=norm)


def fft(x, n=None, axis=-1, norm=None):
    """numpy.fft.fft: the complex transform along `axis`, cropped or zero-padded to `n`."""
    return _fft("fft", x, n, axis, norm)


def ifft(x, n=None, axis=-1, norm=None):
    """numpy.fft.ifft: the inverse complex transform."""
    return _fft("ifft", x, n, axis, norm)


def rfft(x, n=None, axis=-1, norm=None):
    """numpy.fft.rfft: a real signal's transform, n // 2 + 1 frequencies."""
    return _fft("rfft", x, n, axis, norm)


def irfft(x, n=None, axis=-1, norm=None):
    """numpy.fft.irfft: the real signal of n samples (default 2·(m − 1)) with this half spectrum."""
    return _fft("irfft", x, n, axis, norm)


# numpy.fft's spelling too: op.fft.rfft(x) is op.rfft(x), while op.fft(x) stays the complex transform.
fft.fft, fft.ifft, fft.rfft, fft.irfft = fft, ifft, rfft, irfft


def flash_attention(q, k, v, scale=None, mask=None, causal: bool = False, window: int | None = None):
    """softmax(scale · q kᵀ [+ mask]) v without the score matrix in memory.

    scale defaults to 1/sqrt(head_dim); a bool mask keeps where True, a float mask is added;
    causal keeps the lower triangle aligned top-left, query i seeing keys 0..i (SDPA's is_causal):
    with fewer queries than keys (decoding against a KV cache), give the bottom-right alignment as
    a mask instead, op.tril(op.ones((sq, sk), "bool"), k=sk - sq). window=W (with causal) is
    sliding-window attention: query i sees keys i − W + 1 … i, and key blocks outside the band are
    never loaded. K/V may have fewer heads than Q on axis -3 (GQA).
    """
    operands = (q, k, v) if mask is None else (q, k, v, mask)
    with op_context("flash_attention", operands, ("q", "k", "v", "mask")):
        head_dim = type_of(q).shape[-1] if type_of(q).ndim else 1
        scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
            raise AttributeValueError(f"scale must be a finite number, got {scale!r}")
        causal = flag("causal", causal)
        if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1):
            raise AttributeValueError(f"window must be an int >= 1 (the keys each query sees), got {window!r}")
    return apply("flash_attention", operands, scale=float(scale), causal=causal, has_mask=mask is not None,
                 window=int(window or 0))
