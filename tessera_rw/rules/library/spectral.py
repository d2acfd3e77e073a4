"""The `spectral` ruleset: a stride-1, undilated convolution is a product of spectra.

    conv1d(x, w) = crop(irfft(Σ_c rfft(pad x) · conj(rfft w)))

at a fast transform length (2^a 3^b 5^c 7^d, tables.fast_fft_length) at or above the padded
length, with the channel sum (and groups, depthwise included) done per frequency by
`spectral_contract`.
The rewrite only adds the FFT form to the convolution's e-class; the cost model chooses between
them (direct for short kernels, FFT for long ones).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.tables import fast_fft_length

t = TermBuilder()
x, w, g, pads, s, d = t.vars("x w g pads s d")
E = Expr
SIZES = ("(= sx (shp x))", "(= sw (shp w))", "(= (dt x) d)", "(= (dt w) d)",
         "(= n (vec-get sx 0))", "(= ch (vec-get sx 1))", "(= len (vec-get sx 2))",
         "(= o (vec-get sw 0))", "(= cg (vec-get sw 1))", "(= kw (vec-get sw 2))",
         "(= lo (vec-get pads 0))", "(= hi (vec-get pads 1))", "(= lp (+ len (+ lo hi)))",
         f"(= nt {fast_fft_length('lp')})", "(= nf (+ (/ nt 2) 1))", "(= lout (+ (- lp kw) 1))",
         "(= cd (spectrum d))", "(= rd (real-of cd))")


def _fft_conv1d() -> Expr:
    """The FFT form of conv1d(x, w), in the real type `rd` of its spectrum. The transforms run at
    `nt`, a fast length at or above the padded length `lp`: the valid outputs t < lp - kw + 1 read
    x only up to lp - 1, so the zeros beyond change none of them (no circular wrap reaches them)."""
    padded = t.pad(x, pads=E("(vec-of 0 0 0 0 lo (+ hi (- nt lp)))"), value=0.0, of=(E("(vec-of n ch nt)"), d))
    xf = t.rfft(padded, axis=2, n=E("nt"), norm="backward", of=(E("(vec-of n ch nf)"), E("cd")))
    wf = t.rfft(w, axis=2, n=E("nt"), norm="backward", of=(E("(vec-of o cg nf)"), E("cd")))
    yf = t.spectral_contract(xf, wf, groups=g, of=(E("(vec-of n o nf)"), E("cd")))
    y = t.irfft(yf, axis=2, n=E("nt"), norm="backward", of=(E("(vec-of n o nt)"), E("rd")))
    return t.slice(y, starts=E("(vec-of 0 0 0)"), stops=E("(vec-of n o lout)"), steps=E("(vec-of 1 1 1)"),
                   of=(s, E("rd")))


def conv1d_example(dtype):
    def example(rng: np.random.Generator):
        groups = int(rng.choice([1, 2]))
        cin, cout = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
        length, kernel = int(rng.integers(4, 24)), int(rng.integers(1, 9))
        padding = [0, "same", (int(rng.integers(0, 4)), int(rng.integers(0, 4)))][int(rng.integers(0, 3))]
        extra = sum(padding) if isinstance(padding, tuple) else 0
        if padding != "same" and kernel > length + extra:
            padding = "same"  # the kernel must fit the padded input
        inputs = {"x": rand(rng, int(rng.integers(1, 3)), cin, length, dtype=dtype),
                  "w": rand(rng, cout, cin // groups, kernel, dtype=dtype)}
        return (lambda x, w: op.conv1d(x, w, padding=padding, groups=groups)), inputs
    return example


STRIDE_1 = dict(stride=E("(vec-of 1)"), dilation=E("(vec-of 1)"))

RULES = (
    Rule("conv1d-as-fft", "x ⋆ w = irfft(Σ_c rfft(x) · conj(rfft(w)))",
         lhs=t.conv1d(x, w, groups=g, padding=pads, **STRIDE_1, of=(s, d)),
         rhs=_fft_conv1d(),
         when=SIZES + ("(= rd d)",),
         example=conv1d_example(np.float32)),
    Rule("conv1d-as-fft-low-precision", "x ⋆ w = cast(irfft(Σ_c rfft(x) · conj(rfft(w))), d)",
         lhs=t.conv1d(x, w, groups=g, padding=pads, **STRIDE_1, of=(s, d)),
         rhs=t.cast(_fft_conv1d(), dtype=d, of=(s, d)),
         when=SIZES + ("(!= rd d)",),
         example=conv1d_example(ml_dtypes.bfloat16)),
)


SIZES_2D = ("(= sx (shp x))", "(= sw (shp w))", "(= (dt x) d)", "(= (dt w) d)",
            "(= n (vec-get sx 0))", "(= ch (vec-get sx 1))", "(= o (vec-get sw 0))", "(= cg (vec-get sw 1))",
            "(= hp (+ (vec-get sx 2) (+ (vec-get pads 0) (vec-get pads 1))))",
            "(= wp (+ (vec-get sx 3) (+ (vec-get pads 2) (vec-get pads 3))))",
            f"(= ht {fast_fft_length('hp')})", f"(= wt {fast_fft_length('wp')})",
            "(= fw (+ (/ wt 2) 1))", "(= hout (+ (- hp (vec-get sw 2)) 1))", "(= wout (+ (- wp (vec-get sw 3)) 1))",
            "(= cd (spectrum d))", "(= rd (real-of cd))")


def _spectrum_2d(term: Expr, lead: str, height: str) -> Expr:
    """rfft over the last axis, then fft over the one before: the 2-d spectrum of a real image, at
    the fast lengths ht x wt."""
    rows = t.rfft(term, axis=3, n=E("wt"), norm="backward", of=(E(f"(vec-of {lead} {height} fw)"), E("cd")))
    return t.fft(rows, axis=2, n=E("ht"), norm="backward", of=(E(f"(vec-of {lead} ht fw)"), E("cd")))


def _fft_conv2d() -> Expr:
    pads_2d = "(vec-of 0 0 0 0 (vec-get pads 0) (+ (vec-get pads 1) (- ht hp)) (vec-get pads 2) (+ (vec-get pads 3) (- wt wp)))"
    padded = t.pad(x, pads=E(pads_2d), value=0.0, of=(E("(vec-of n ch ht wt)"), d))
    yf = t.spectral_contract(_spectrum_2d(padded, "n ch", "ht"), _spectrum_2d(w, "o cg", "(vec-get sw 2)"), groups=g,
                             of=(E("(vec-of n o ht fw)"), E("cd")))
    cols = t.ifft(yf, axis=2, n=E("ht"), norm="backward", of=(E("(vec-of n o ht fw)"), E("cd")))
    y = t.irfft(cols, axis=3, n=E("wt"), norm="backward", of=(E("(vec-of n o ht wt)"), E("rd")))
    return t.slice(y, starts=E("(vec-of 0 0 0 0)"), stops=E("(vec-of n o hout wout)"), steps=E("(vec-of 1 1 1 1)"),
                   of=(s, E("rd")))


def conv2d_example(rng: np.random.Generator):
    groups = int(rng.choice([1, 2]))
    cin, cout = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
    h, wd, kh, kw = (int(v) for v in (rng.integers(3, 12), rng.integers(3, 12), rng.integers(1, 4), rng.integers(1, 4)))
    padding = ["same", 0, ((1, 0), (2, 1))][int(rng.integers(0, 3))]
    inputs = {"x": rand(rng, 1, cin, h, wd), "w": rand(rng, cout, cin // groups, kh, kw)}
    return (lambda x, w: op.conv2d(x, w, padding=padding, groups=groups)), inputs


STRIDE_1_2D = dict(stride=E("(vec-of 1 1)"), dilation=E("(vec-of 1 1)"))
RULES = RULES + (
    Rule("conv2d-as-fft", "x ⋆ w = irfft2(Σ_c rfft2(x) · conj(rfft2(w)))",
         lhs=t.conv2d(x, w, groups=g, padding=pads, **STRIDE_1_2D, of=(s, d)),
         rhs=_fft_conv2d(),
         when=SIZES_2D + ("(= rd d)",),
         example=conv2d_example),
)
SPECTRAL = Ruleset("spectral", RULES, doc="stride-1 convolutions as products of spectra")
