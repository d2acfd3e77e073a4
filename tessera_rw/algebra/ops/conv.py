"""conv1d / conv2d (cross-correlation, as torch): x (N, C, *spatial), w (O, C/groups, *kernel).

Attributes are normalized: `stride` and `dilation` hold one int per spatial axis, `padding` one
(low, high) pair per spatial axis.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import crop, dilate, unbroadcast
from tessera_rw.algebra.dtypes import promote
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.shapes import fmt_shape
from tessera_rw.algebra.tensor import api  # the op functions, resolved when a VJP runs


def conv_output_size(size: int, kernel: int, stride: int, pad: tuple[int, int], dilation: int) -> int:
    return (size + pad[0] + pad[1] - dilation * (kernel - 1) - 1) // stride + 1


def _conv_infer(spatial: int):
    def infer(x: TensorType, w: TensorType, stride, padding, dilation, groups) -> TensorType:
        rank = spatial + 2
        if x.ndim != rank or w.ndim != rank:
            raise ShapeError(f"expects x of rank {rank} (N, C, {'H, W' if spatial == 2 else 'L'}) and w of "
                             f"rank {rank} (O, C/groups, kernel), got {fmt_shape(x.shape)} and {fmt_shape(w.shape)}")
        if not (x.dtype.is_float and w.dtype.is_float):
            raise DTypeError(f"takes floating-point operands, got {x.dtype} and {w.dtype}")
        if groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
            raise AttributeValueError(f"groups={groups} must divide the {x.shape[1]} input and "
                                      f"{w.shape[0]} output channels")
        if w.shape[1] * groups != x.shape[1]:
            raise ShapeError(f"w has {w.shape[1]} input channels per group; x has {x.shape[1]} channels "
                             f"in {groups} group(s), so w.shape[1] must be {x.shape[1] // groups}")
        if min(stride) < 1 or min(dilation) < 1 or min(min(p) for p in padding) < 0:
            raise AttributeValueError(f"stride {stride} and dilation {dilation} must be >= 1, padding {padding} >= 0")
        out = tuple(conv_output_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i])
                    for i in range(spatial))
        if min(out) < 1:
            dilated = tuple(dilation[i] * (w.shape[2 + i] - 1) + 1 for i in range(spatial))
            padded = tuple(x.shape[2 + i] + sum(padding[i]) for i in range(spatial))
            spans = f"{fmt_shape(w.shape[2:])} dilated by {dilation} to {fmt_shape(dilated)}" \
                if max(dilation) > 1 else fmt_shape(w.shape[2:])
            raise ShapeError(f"the kernel {spans} is wider than the padded input {fmt_shape(padded)} "
                             f"({fmt_shape(x.shape[2:])} padded by {padding})",
                             hint="pad more, or use a smaller kernel or dilation")
        return TensorType((x.shape[0], w.shape[0]) + out, promote(x.dtype, w.dtype))
    return infer


# The patches of all kernel offsets at once (n · c · out · kernel elements) up to this many; past it,
# one contraction per kernel offset keeps memory at the output's size (a long filter's patches
# would be its length times the sequence).
PATCH_ELEMENTS = 1 << 25


def conv_reference(x: np.ndarray, w: np.ndarray, stride, padding, dilation, groups) -> np.ndarray:
    """Direct convolution: every output's patch against the kernel in one contraction (a strided
    view of the padded input, so the copy is einsum's), or one contraction per kernel offset where
    the patches would be large."""
    spatial = x.ndim - 2
    n, c = x.shape[:2]
    o, kernel = w.shape[0], w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(padding))
    out_sizes = tuple(conv_output_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i])
                      for i in range(spatial))
    xg = xp.reshape((n, groups, c // groups) + xp.shape[2:])
    wg = w.reshape((groups, o // groups) + w.shape[1:])
    if 0 < n * c * math.prod(out_sizes) * math.prod(kernel) <= PATCH_ELEMENTS:
        out = _contract_patches(xg, wg, out_sizes, stride, dilation)
    else:
        out = _contract_per_offset(xg, wg, out_sizes, stride, dilation)
    return out.reshape((n, o) + out_sizes)


def _contract_patches(xg: np.ndarray, wg: np.ndarray, out_sizes: tuple[int, ...], stride, dilation) -> np.ndarray:
    """(n, g, o/g, *out): each group's patches as rows (n · out, c/g · kernel) times its kernels."""
    spatial, (n, groups), (o_g, kernel) = len(out_sizes), xg.shape[:2], (wg.shape[1], wg.shape[3:])
    reach = tuple(dilation[i] * (kernel[i] - 1) + 1 for i in range(spatial))
    view = np.lib.stride_tricks.sliding_window_view(xg, reach, axis=tuple(range(3, 3 + spatial)))
    positions = tuple(slice(None, (out_sizes[i] - 1) * stride[i] + 1, stride[i]) for i in range(spatial))
    taps = tuple(slice(None, None, dilation[i]) for i in range(spatial))
    patches = view[(slice(None),) * 3 + positions + taps]                  # (n, g, c/g, *out, *kernel)
    order = (1, 0, *range(3, 3 + spatial), 2, *range(3 + spatial, 3 + 2 * spatial))
    rows = np.ascontiguousarray(patches.transpose(order)).reshape(groups, n * math.prod(out_sizes), -1)
    out = np.matmul(rows, wg.reshape(groups, o_g, -1).swapaxes(-1, -2))     # (g, n · out, o/g)
    out = out.reshape((groups, n) + out_sizes + (o_g,))
    return out.transpose((1, 0, 2 + spatial) + tuple(range(2, 2 + spatial)))


def _contract_per_offset(xg: np.ndarray, wg: np.ndarray, out_sizes: tuple[int, ...], stride, dilation) -> np.ndarray:
    spatial, (n, groups), o_g = len(out_sizes), xg.shape[:2], wg.shape[1]
    out = np.zeros((n, groups, o_g) + out_sizes, dtype=np.result_type(xg, wg))
    for offset in itertools.product(*(range(k) for k in wg.shape[3:])):
        window = tuple(slice(offset[i] * dilation[i], offset[i] * dilation[i] + (out_sizes[i] - 1) * stride[i] + 1,
                             stride[i]) for i in range(spatial))
        patch = xg[(slice(None), slice(None), slice(None)) + window]          # (n, g, c/g, *out)
        taps = wg[(slice(None), slice(None), slice(None)) + offset]          # (g, o/g, c/g)
        out += np.einsum("ngc...,goc->ngo...", patch, taps)
    return out


def _conv_flops(out: TensorType, x: TensorType, w: TensorType, **attrs) -> int:
    return 2 * out.numel * w.shape[1] * math.prod(w.shape[2:])


# ---- VJP: both cotangents are convolutions themselves ----------------------------------------

def _conv(x, w, **attrs):
    return (api.conv1d if x.ndim == 3 else api.conv2d)(x, w, **attrs)


def _transposed_kernel(w, groups: int):
    """w (O, C/groups, *kernel) with its channel axes swapped per group: (C, O/groups, *kernel)."""
    spatial = w.ndim - 2
    o, cg = w.shape[:2]
    kernel = w.shape[2:]
    wt = api.reshape(w, (groups, o // groups, cg) + kernel)
    wt = api.transpose(wt, (0, 2, 1) + tuple(range(3, 3 + spatial)))
    return api.reshape(wt, (groups * cg, o // groups) + kernel)


def _input_cotangent(g, x, w, stride, padding, dilation, groups):
    """The transposed convolution: g spread out by the stride (zeros between), correlated with the
    kernel flipped and its channel axes swapped per group. Padded by the kernel's reach it would
    cover the whole padded input; the reach less the forward padding covers just the input, and
    where that goes negative (padding wider than the kernel) the surplus is cut off afterwards. A
    strided convolution without dilation takes it by phases instead (_phased_input_cotangent)."""
    if max(stride) > 1 and max(dilation) == 1:
        return _phased_input_cotangent(g, x, w, stride, padding, groups)
    spatial = x.ndim - 2
    kernel = w.shape[2:]
    wt = api.flip(_transposed_kernel(w, groups), axis=tuple(range(2, 2 + spatial)))   # one copy, any rank
    pads, cuts = [], []
    for i in range(spatial):
        g = dilate(g, 2 + i, stride[i])
        reach = dilation[i] * (kernel[i] - 1)
        covered = x.shape[2 + i] + sum(padding[i])
        uncovered = (covered - reach - 1) % stride[i]    # trailing input the last window never reached
        lo, hi = reach - padding[i][0], reach - padding[i][1] + uncovered
        pads.append((max(0, lo), max(0, hi)))
        cuts.append(max(0, -lo))
    dx = _conv(g, wt, padding=tuple(pads), dilation=dilation, groups=groups)
    for i, cut in enumerate(cuts):
        dx = crop(dx, 2 + i, cut, cut + x.shape[2 + i])
    return dx


def _phased_input_cotangent(g, x, w, stride, padding, groups):
    """The transposed convolution of a strided one, a phase at a time: the input positions
    u = s·q + r of one phase r (per axis) take g[q + o − j]·w[k + s·j] over j alone, k = (r + p) mod s
    and o = (r + p) div s for the padding p before it: a stride-1 correlation of g with the kernel's
    taps k, k + s, … flipped. The s^d phases (4 for a stride-2 conv2d) do the convolution's own
    multiply-adds, where correlating g spread out by zeros would do s^d times as many and copy g
    three times first; one elementwise kernel weaves them together, each read once. A phase no tap
    reaches (a 1×1 kernel's odd positions) is zeros."""
    spatial = x.ndim - 2
    kernel, wt = w.shape[2:], _transposed_kernel(w, groups)
    rows = [-(-x.shape[2 + i] // stride[i]) for i in range(spatial)]        # positions of a phase, rounded up
    phases = {}
    for phase in itertools.product(*(range(s) for s in stride)):
        first = [(phase[i] + padding[i][0]) % stride[i] for i in range(spatial)]         # the phase's first tap
        skip = [(phase[i] + padding[i][0]) // stride[i] for i in range(spatial)]         # ... and g's first row
        taps = [len(range(first[i], kernel[i], stride[i])) for i in range(spatial)]
        if 0 in taps:
            phases[phase] = api.zeros((x.shape[0], x.shape[1], *rows), g.dtype)
            continue
        sub = api.getitem(wt, (slice(None), slice(None)) + tuple(slice(k, None, s) for k, s in zip(first, stride)))
        part, pads = g, []
        for i in range(spatial):
            before = taps[i] - 1 - skip[i]
            if before < 0:                                  # the padding is wider than the kernel's reach
                part, before = crop(part, 2 + i, -before, part.shape[2 + i]), 0
            pads.append((before, max(0, rows[i] + taps[i] - 1 - before - part.shape[2 + i])))
        part = _conv(part, api.flip(sub, axis=tuple(range(2, 2 + spatial))), padding=tuple(pads), groups=groups)
        for i in range(spatial):
            part = crop(part, 2 + i, 0, rows[i]) if part.shape[2 + i] > rows[i] else part
        phases[phase] = part
    return _woven(phases, x.shape, stride, rows)


def _woven(phases: dict, shape: tuple[int, ...], stride, rows: list[int]):
    """The phases' results (by phase, each (N, C, *rows)) as one tensor of `shape`: position
    q·s + r along each axis from phase r's position q, selected per position (a NaN or inf in one
    phase stays where it is)."""
    spatial = len(stride)
    split = shape[:2] + tuple(v for i in range(spatial) for v in (rows[i], stride[i]))
    spread = shape[:2] + tuple(v for i in range(spatial) for v in (rows[i], 1))
    *others, last = phases.items()
    woven = api.reshape(last[1], spread)
    for phase, part in reversed(others):
        mask = np.zeros((1, 1) + tuple(v for i in range(spatial) for v in (1, stride[i])), bool)
        mask[(0, 0) + tuple(v for i in range(spatial) for v in (0, phase[i]))] = True
        woven = api.where(mask, api.reshape(part, spread), woven)
    woven = api.reshape(api.broadcast_to(woven, split), shape[:2] + tuple(r * s for r, s in zip(rows, stride)))
    for i in range(spatial):
        woven = crop(woven, 2 + i, 0, shape[2 + i]) if woven.shape[2 + i] > shape[2 + i] else woven
    return woven


def _weight_cotangent(g, x, w, stride, padding, dilation, groups):
    """dw[o, c, κ] = Σₙ,ₜ g[n, o, t] · x_padded[n, c, t·stride + κ·dilation]: a convolution of x with
    g in which the batch plays the channels (per group) and stride and dilation trade places."""
    spatial = x.ndim - 2
    n, c = x.shape[:2]
    o = w.shape[0]
    rest = tuple(range(3, 3 + spatial))
    xs = api.reshape(x, (n, groups, c // groups) + x.shape[2:])
    xs = api.reshape(api.transpose(xs, (2, 1, 0) + rest), (c // groups, groups * n) + x.shape[2:])
    gs = api.reshape(g, (n, groups, o // groups) + g.shape[2:])
    gs = api.reshape(api.transpose(gs, (1, 2, 0) + rest), (o, n) + g.shape[2:])
    # the padding past the last tap's reach trimmed (a strided forward whose windows leave the
    # padded input's end unread would otherwise give more taps, computed and then cut off)
    trimmed = []
    for i, k in enumerate(w.shape[2:]):
        # the correlation's own output size: stride and dilation trade places in it, as below
        taps = conv_output_size(x.shape[2 + i], g.shape[2 + i], dilation[i], padding[i], stride[i])
        lo, hi = padding[i]
        trimmed.append((lo, hi - min(hi, (taps - k) * dilation[i])))
    dw = _conv(xs, gs, stride=dilation, padding=tuple(trimmed), dilation=stride, groups=groups)
    dw = api.transpose(dw, (1, 0) + tuple(range(2, 2 + spatial)))      # (o, c/groups, *reach)
    for i, k in enumerate(w.shape[2:]):
        dw = crop(dw, 2 + i, 0, k) if dw.shape[2 + i] > k else dw
    return dw


def _conv_vjp(g, y, x, w, stride, padding, dilation, groups):
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    return unbroadcast(_input_cotangent(g, x, w, **attrs), x), unbroadcast(_weight_cotangent(g, x, w, **attrs), w)


DEFS = (
    OpDef("conv1d", ("x", "w"), OpKind.CONV, _conv_infer(1), conv_reference, _conv_flops, vjp=_conv_vjp),
    OpDef("conv2d", ("x", "w"), OpKind.CONV, _conv_infer(2), conv_reference, _conv_flops, vjp=_conv_vjp),
)
