"""torch's max_pool2d / avg_pool2d, forward and backward, ported one window at a time as its CPU
kernels walk them: an independent spelling of the pools to check ours against (no torch here).
Planes are the last two axes of x; every window is visited in Python, so keep inputs small."""

from __future__ import annotations

import math

import numpy as np


def _out_size(size, k, s, p, d, ceil_mode):
    """torch's pooling_output_shape, as written there."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1                  # div_rtn: rounded towards -inf
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def torch_max_pool(x, k, s, p, d, ceil_mode):
    """(values, flat indices into each plane), as torch's max_pool2d_with_indices walks them; a
    dilated window whose positions all miss x (torch's index then points past it) is -inf, and
    index -1 (no element gets its gradient)."""
    *lead, h, w = x.shape
    oh, ow = (_out_size(h, k[0], s[0], p[0], d[0], ceil_mode), _out_size(w, k[1], s[1], p[1], d[1], ceil_mode))
    planes = x.reshape(-1, h, w)
    out, idx = np.zeros((len(planes), oh, ow)), np.zeros((len(planes), oh, ow), np.int64)
    for n, plane in enumerate(planes):
        for i in range(oh):
            for j in range(ow):
                hs, ws = i * s[0] - p[0], j * s[1] - p[1]
                he, we = min(hs + (k[0] - 1) * d[0] + 1, h), min(ws + (k[1] - 1) * d[1] + 1, w)
                while hs < 0:
                    hs += d[0]
                while ws < 0:
                    ws += d[1]
                best, at = -math.inf, hs * w + ws if hs < he and ws < we else -1
                for y in range(hs, he, d[0]):
                    for z in range(ws, we, d[1]):
                        v = plane[y, z]
                        if v > best or math.isnan(v):
                            best, at = v, y * w + z
                out[n, i, j], idx[n, i, j] = best, at
    return out.reshape(*lead, oh, ow), idx.reshape(*lead, oh, ow)


def torch_max_pool_grad(x, g, idx):
    dx = np.zeros(x.shape).reshape(-1, x.shape[-2] * x.shape[-1])
    for n, (gs, at) in enumerate(zip(g.reshape(len(dx), -1), idx.reshape(len(dx), -1))):
        for v, a in zip(gs, at):
            if a >= 0:
                dx[n, a] += v
    return dx.reshape(x.shape)


def _avg_windows(h, w, k, s, p, ceil_mode, count_include_pad, divisor):
    """Each window's (rows, cols, divisor), as torch's avg_pool2d computes them."""
    oh, ow = _out_size(h, k[0], s[0], p[0], 1, ceil_mode), _out_size(w, k[1], s[1], p[1], 1, ceil_mode)
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            yield i, j, range(hs, he), range(ws, we), divisor or (size if count_include_pad else (he - hs) * (we - ws))


def torch_avg_pool(x, k, s, p, ceil_mode, count_include_pad, divisor):
    *lead, h, w = x.shape
    planes = x.reshape(-1, h, w)
    windows = list(_avg_windows(h, w, k, s, p, ceil_mode, count_include_pad, divisor))
    oh, ow = windows[-1][0] + 1, windows[-1][1] + 1
    out = np.zeros((len(planes), oh, ow))
    for i, j, rows, cols, div in windows:
        out[:, i, j] = planes[:, rows.start:rows.stop, cols.start:cols.stop].sum(axis=(1, 2)) / div
    return out.reshape(*lead, oh, ow)


def torch_avg_pool_grad(g, h, w, k, s, p, ceil_mode, count_include_pad, divisor):
    *lead, oh, ow = g.shape
    gs = g.reshape(-1, oh, ow)
    dx = np.zeros((len(gs), h, w))
    for i, j, rows, cols, div in _avg_windows(h, w, k, s, p, ceil_mode, count_include_pad, divisor):
        dx[:, rows.start:rows.stop, cols.start:cols.stop] += gs[:, i, j, None, None] / div
    return dx.reshape(*lead, h, w)


def torch_adaptive_avg_pool(x, out):
    """torch's adaptive_avg_pool2d: output (i, j) averages rows floor(i·H/oh) .. ceil((i+1)·H/oh) - 1
    and the columns alike."""
    *lead, h, w = x.shape
    oh, ow = out
    y = np.zeros((*lead, oh, ow))
    for i in range(oh):
        for j in range(ow):
            rows = slice(i * h // oh, -(-(i + 1) * h // oh))
            cols = slice(j * w // ow, -(-(j + 1) * w // ow))
            y[..., i, j] = x[..., rows, cols].mean(axis=(-2, -1))
    return y
