"""Lookup tables rules use in side conditions, and egglog text helpers for shape arithmetic.

- `(swap-last n)`: the permutation of n axes that swaps the last two (`.mT`);
- `(lowest d)`: the most negative finite value of dtype `d` (what masked_fill(finfo.min) writes);
- `(spectrum d)` / `(real-of c)`: the complex type of a real signal's spectrum, and back;
- `(identity-perm n)`: the permutation of n axes that moves nothing;
- `(accum-float d)`: the float type a kernel accumulates float dtype `d` in (float64 or float32);
- `(k-major-mma d)`: true for the 8-bit floats, whose tensor-core products read both operands with k
  contiguous (A as [M, K], B as [N, K]).
"""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType, complex_of, real_of
from tessera_rw.algebra.ops.attention_backward import stats_dtype
from tessera_rw.rules.schema import egg_f64, egg_string

MAX_RANK = 8


def _swap_last(n: int) -> str:
    perm = list(range(n - 2)) + [n - 1, n - 2]
    return f"(set (swap-last {n}) (vec-of {' '.join(map(str, perm))}))"


TABLES = "\n".join(
    ["(function swap-last (i64) Dims :merge old)", "(function lowest (String) f64 :merge old)",
     "(function spectrum (String) String :merge old)", "(function real-of (String) String :merge old)",
     "(function identity-perm (i64) Dims :merge old)", "(function accum-float (String) String :merge old)",
     "(function k-major-mma (String) bool :merge old)"]
    + [_swap_last(n) for n in range(2, MAX_RANK + 1)]
    + [f"(set (identity-perm {n}) (vec-of {' '.join(map(str, range(n)))}))" for n in range(1, MAX_RANK + 1)]
    + [f"(set (lowest {egg_string(d.value)}) {egg_f64(d.lowest)})" for d in DType if d.is_float]
    + [f"(set (spectrum {egg_string(d.value)}) {egg_string(complex_of(d).value)})" for d in DType if d.is_float]
    + [f"(set (real-of {egg_string(d.value)}) {egg_string(real_of(d).value)})" for d in DType if d.is_complex]
    + [f"(set (accum-float {egg_string(d.value)}) {egg_string(stats_dtype(d).value)})" for d in DType if d.is_float]
    + [f"(set (k-major-mma {egg_string(d.value)}) true)" for d in DType if d.is_float and d.itemsize == 1])
TABLE_FUNCTIONS = frozenset({"shp", "dt", "swap-last", "lowest", "spectrum", "real-of", "identity-perm",
                             "accum-float", "k-major-mma"})


# Odd factors of the transform lengths the spectral rules pick: a power of two times one of these
# is 2^a 3^b 5^c 7^d, which cuFFT and pocketfft transform by their fast radices (a length like
# 16383 = 3 · 43 · 127 takes cuFFT's Bluestein path, several times slower), and the smallest such
# length at or above n is at most 11% longer than n (3.6% on average).
FFT_ODD_FACTORS = (1, 3, 5, 7, 9, 15, 21, 25, 27, 35, 45)


def fast_fft_length(n: str) -> str:
    """egglog text of the smallest c·2^k >= n (c in FFT_ODD_FACTORS): a fast transform length.
    The power of two at or above m is 1 << floor(log2(2m - 1))."""
    def above(c: int) -> str:
        m = f"(/ (+ {n} {c - 1}) {c})"
        return f"(* {c} (<< 1 (log2 (- (* 2 {m}) 1))))"
    text = above(FFT_ODD_FACTORS[0])
    for c in FFT_ODD_FACTORS[1:]:
        text = f"(min {text} {above(c)})"
    return text


def fast_fft_length_of(n: int) -> int:
    """The value fast_fft_length computes, in Python.

    >>> fast_fft_length_of(16383), fast_fft_length_of(12287), fast_fft_length_of(1)
    (16384, 12288, 1)
    """
    return min(c * (1 << (2 * -(-n // c) - 1).bit_length() - 1) for c in FFT_ODD_FACTORS)


def rank(shape: str) -> str:
    return f"(vec-length {shape})"


def swapped_last(shape: str) -> str:
    """egglog text of `shape` with its last two dims swapped."""
    n = rank(shape)
    return (f"(vec-set (vec-set {shape} (- {n} 1) (vec-get {shape} (- {n} 2))) "
            f"(- {n} 2) (vec-get {shape} (- {n} 1)))")


def numel(shape: str, rank: int) -> str:
    """egglog text of the product of `shape`'s dims, for a shape of rank `rank` (egglog cannot
    fold a vector, so rules that need a size come one per rank)."""
    product = f"(vec-get {shape} 0)"
    for i in range(1, rank):
        product = f"(* {product} (vec-get {shape} {i}))"
    return product


def with_dim(shape: str, axis: str, size: str) -> str:
    return f"(vec-set {shape} {axis} {size})"
