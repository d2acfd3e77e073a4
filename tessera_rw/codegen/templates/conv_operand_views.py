"""The implicit GEMM's reads of a strided_conv's x and w views: its dense index math, restrided.

The dense kernel finds x[img, c, ih, iw] at ((img·C + c)·H + ih)·W + iw and w's k column (k = c·TAPS
+ tap) at o·K + k. A view (a transposed or sliced operand read where it lies, lower/conv_views.py)
has its own strides and offset: x's element is offset + img·sn + c·sc + ih·sh + iw·sw, and w's k
column is decoded into (c, tap) once per k tile (TAPS is a constant: a multiply and a shift). An
output written with its leading axes swapped (dW = resultᵀ of a weight gradient) puts output
(image, channel, position) at (channel·N + image)·P + position. A bias gradient beside it reads
image N of x as all ones, whatever the position (its GEMM rows sum w over K), and writes channel
o's sum, at image N's first position, after the O·N·P values of dW.
Offsets inside a view are 32-bit (the lowering keeps views of fewer than 2^31 elements).

>>> text = "const T* xrow = x + ((long long)img * C + g * CG) * (H * W); v = xrow[c * (H * W) + ih * W + iw];"
>>> restrided(text, ((36, 288, 6, 1), 0), None, 3)       # xᵀ of an x of 8 channels of 6 x 6
'const T* xrow = x + (long long)img * 36 + (long long)(g * CG) * 288; v = xrow[c * 288 + ih * 6 + iw];'
"""

from __future__ import annotations

import re

View = tuple[tuple[int, int, int, int], int]          # strides of (N or O, C, H or KH, W or KW), offset

_X_BASE = "x + ((long long)img * C + g * CG) * (H * W)"
_X_READ = "xrow[c * (H * W) + ih * W + iw]"
_W_BASE = "w + (long long)(g * OG + n0 + ob) * K + kb"
_W_COLUMN = "const bool k_ok = k0 + kb < K;"
_W_READ = "wrow[j * OSTEP * K + k0]"
_Y_BASE = "y + ((long long)im * O + g * OG) * P + p"
_Y_WRITE = "yrow[(long long)o * P]"
_X_GUARD = "if (row_ok && k < K && (unsigned)ih"
_ONE = {"bf16": "(T)0x3F80u", "f16": "(T)0x3C00u", None: "1.0f"}    # 1 in the kernel's T


def restrided(text: str, x_view: View | None, w_view: View | None, kernel_width: int, swapped_images: int = 0,
              ones_in: str | None | bool = False) -> str:
    """The dense kernel `text` reading x and w through their views (None: dense, as written);
    `kernel_width` taps make a kernel row. With `swapped_images` (N), it writes its (N, O, OH, OW)
    output as (O, N, OH, OW); with `ones_in` (the kernel's dtype suffix, 'bf16', 'f16' or None for
    float, as implicit_gemm_source names it), it also sums the bias gradient from image N of ones."""
    if x_view is not None:
        (sn, sc, sh, sw), offset = x_view
        text = _replaced(text, _X_BASE, f"x{_plus(offset)} + (long long)img * {sn} + (long long)(g * CG) * {sc}")
        text = _replaced(text, _X_READ, f"xrow[{_terms(('c', sc), ('ih', sh), ('iw', sw))}]")
    if w_view is not None:
        (so, sc, skh, skw), offset = w_view
        tap = _terms(("wt", skw)) if skh == skw * kernel_width else _terms(("(wt / KW)", skh), ("(wt % KW)", skw))
        text = _replaced(text, _W_BASE, f"w{_plus(offset)} + (long long)(g * OG + n0 + ob) * {so}")
        column = (f"{_W_COLUMN}\n        const int wc = (k0 + kb) / TAPS, wt = (k0 + kb) - wc * TAPS;"
                  f"\n        const T* wk = wrow + {_terms(('wc', sc))} + {tap};")
        text = _replaced(text, _W_COLUMN, column)
        text = _replaced(text, _W_READ, f"wk[j * OSTEP * {so}]")
    if swapped_images:
        text = _replaced(text, _Y_BASE, f"y + (long long)(g * OG) * {swapped_images} * P + (long long)im * P + p")
        text = _replaced(text, _Y_WRITE, f"yrow[(long long)o * {swapped_images} * P]")
    if ones_in is not False:
        text = _summing_ones(text, swapped_images, _ONE[ones_in])
    return text


def _summing_ones(text: str, images: int, one: str) -> str:
    """`text` (writing dW swapped) reading image `images` of x as ones and writing its first
    position's row, each output channel's sum of w, after dW."""
    assert images, "a bias gradient is summed beside a weight gradient written swapped"
    text = _replaced(text, _X_GUARD, f"if (img == {images}) {{ if (row_ok && k < K) v = {one}; }}\n"
                                     f"            else {_X_GUARD}")
    write = re.compile(rf"^( *)if \(o < OG\) yrow\[\(long long\)o \* {images} \* P\] = (.+);$", re.M)
    assert write.search(text), "the convolution kernel no longer writes dW as a bias gradient expects"
    tail = f"(long long)O * {images} * P"
    return write.sub(lambda m: f"{m[1]}if (o < OG) {{ if (im < {images}) yrow[(long long)o * {images} * P] = {m[2]}; "
                               f"else if (p == 0) y[{tail} + g * OG + o] = {m[2]}; }}", text)


def _replaced(text: str, old: str, new: str) -> str:
    assert old in text, f"the convolution kernel no longer spells {old!r}"
    return text.replace(old, new)


def _plus(offset: int) -> str:
    return f" + {offset}" if offset else ""


def _terms(*pairs: tuple[str, int]) -> str:
    """'a * 3 + b' for (('a', 3), ('b', 1)), dropping zero strides; '0' where all are."""
    return " + ".join(var if st == 1 else f"{var} * {st}" for var, st in pairs if st) or "0"
