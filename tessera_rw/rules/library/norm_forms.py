"""Normalizations written out are the normalization ops: part of the `algebra` ruleset.

A layer norm or RMS norm spelled with means and a reciprocal square root over the last axis, and
scaled by a weight of the row's length (on either side),

    (x − mean(x)) · rsqrt(mean((x − mean(x))²) + eps) · w      (or / sqrt(…))   = layernorm(x, w, eps)
    x · rsqrt(mean(x²) + eps) · w                               (or / sqrt(…))   = rmsnorm(x, w, eps)

is the op itself, one row kernel that keeps the statistics in registers, where the written form is
a reduction for each statistic and a pass for the rest (a bias after it joins the row kernel as its
epilogue). x² may be written x ** 2 or x · x (the algebra ruleset's pow-two rule makes them one).

The weight is what tells a model's norm from the same terms in a gradient: reverse mode writes a
norm's x̂ = (x − μ) · rsqrt(…) too, and there it is a factor of products (Σ g·x̂, x̂ · mean(g·x̂)) that
the norm backward's packed kernels take; matched alone, it led extraction away from them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.library.norm_stats import statistics
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, w, ax, eps, s, d = t.vars("x w ax eps s d")     # named as norm_stats names them
T = (s, d)
LAST = "(- (vec-length s) 1)"
FACTS = ("(= (shp x) s)", "(= (dt x) d)", f"(= ax (vec-of {LAST}))", "(>= eps 0.0)")
WEIGHT_FACTS = ("(= (dt w) d)", f"(= (shp w) (vec-of (vec-get s {LAST})))")
EPS = 1e-5


def _written(norm: str, spelling: str) -> Expr:
    """x̂ as written out: the statistics as norm_stats spells them (reverse mode's own terms)."""
    stats = statistics(norm)
    scaled, plus_eps = (t.sub(x, stats[0]) if norm == "layernorm" else x), stats[-1]
    if spelling == "rsqrt":
        return t.mul(scaled, t.rsqrt(plus_eps))
    return t.div(scaled, t.sqrt(plus_eps))


def _example(norm: str, spelling: str, weight_first: bool):
    """The norm written out over the last axis of a random x times a weight, the square spelled ** 2
    or x · x."""
    def example(rng: np.random.Generator):
        squared = (lambda v: v ** 2) if rng.integers(0, 2) else (lambda v: v * v)

        def body(x, w):
            scaled = x - op.mean(x, axis=-1, keepdims=True) if norm == "layernorm" else x
            square = op.mean(squared(scaled), axis=-1, keepdims=True) + EPS
            normed = scaled * op.rsqrt(square) if spelling == "rsqrt" else scaled / op.sqrt(square)
            return w * normed if weight_first else normed * w
        shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 3)))) + (int(rng.integers(2, 9)),)
        return body, {"x": rand(rng, *shape), "w": rand(rng, shape[-1])}
    return example


def _rules():
    for norm in ("layernorm", "rmsnorm"):
        for spelling in ("rsqrt", "sqrt"):
            for weight_first in (False, True):
                written = _written(norm, spelling)
                text = (f"{'(x − mean(x))' if norm == 'layernorm' else 'x'} "
                        f"{'· rsqrt(…)' if spelling == 'rsqrt' else '/ sqrt(…)'} of the mean square + eps")
                text = f"w · {text}" if weight_first else f"{text} · w"
                yield Rule(f"{norm}-written-out{'' if spelling == 'rsqrt' else '-over-sqrt'}"
                           f"{'-weight-first' if weight_first else ''}",
                           f"{text} = {norm}(x, w, eps)",
                           lhs=t.mul(w, written, of=T) if weight_first else t.mul(written, w, of=T),
                           rhs=t.term(norm, x, w, axes=ax, eps=eps, has_weight=True, has_bias=False, of=T),
                           when=FACTS + WEIGHT_FACTS, example=_example(norm, spelling, weight_first),
                           needs=("pow-two",))


def _upcast_example(norm: str, weight_first: bool, promoted: bool):
    """The norm over the last axis of a bf16 x computed in float32 and cast back before the bf16
    weight: HF's LlamaRMSNorm (w · cast(x̂)), Meta's (cast(x̂) · w), T5's (x itself, not its upcast,
    times the float32 reciprocal: the product promoted)."""
    def example(rng: np.random.Generator):
        def body(x, w):
            wide = op.cast(x, "float32")
            scaled = wide - op.mean(wide, axis=-1, keepdims=True) if norm == "layernorm" else wide
            factor = op.rsqrt(op.mean(scaled * scaled, axis=-1, keepdims=True) + EPS)
            normed = op.cast((x if promoted else scaled) * factor, x.dtype)
            return w * normed if weight_first else normed * w
        shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 3)))) + (int(rng.integers(2, 9)),)
        return body, {"x": rand(rng, *shape, dtype=ml_dtypes.bfloat16),
                      "w": rand(rng, shape[-1], dtype=ml_dtypes.bfloat16)}
    return example


def _upcast_rules():
    """A 16-bit x normalized in float32, x̂ cast back, then weighted in x's dtype: the norm op of x,
    whose row kernel keeps its statistics and x̂ in float32 anyway (one rounding, not two)."""
    narrow, x0 = Expr("dn"), Expr("x0")
    upcast = ("(= (shp x) s)", '(= (dt x) "float32")', f"(= ax (vec-of {LAST}))", "(>= eps 0.0)",
              f"(= x {t.cast(x0, dtype='float32', of=(s, 'float32')).text})", "(= (dt x0) dn)", '(!= dn "float32")',
              "(= (dt w) dn)", f"(= (shp w) (vec-of (vec-get s {LAST})))")
    for norm in ("layernorm", "rmsnorm"):
        for weight_first in (False, True):
            back = t.cast(_written(norm, "rsqrt"), dtype=narrow, of=(s, narrow))
            shown = f"cast({norm} of cast(x, f32) written out, d)"
            yield Rule(f"{norm}-in-float32{'-weight-first' if weight_first else ''}",
                       f"{'w · ' + shown if weight_first else shown + ' · w'} = {norm}(x, w, eps)",
                       lhs=t.mul(w, back, of=(s, narrow)) if weight_first else t.mul(back, w, of=(s, narrow)),
                       rhs=t.term(norm, x0, w, axes=ax, eps=eps, has_weight=True, has_bias=False, of=(s, narrow)),
                       when=upcast, example=_upcast_example(norm, weight_first, promoted=False),
                       needs=("pow-two",))


def _norm_op_example(norm: str, weighted: bool, biased: bool):
    """The norm op of a bf16 x, weight and bias each upcast to float32, its result cast back
    (open_clip's LayerNormFp32: layer_norm(x.float(), w.float(), b.float()).type_as(x))."""
    def example(rng: np.random.Generator):
        def body(x, w=None, b=None):
            wide = [op.cast(v, "float32") if v is not None else None for v in (x, w, b)]
            return op.cast(getattr(op, norm)(*wide, eps=EPS), x.dtype)
        shape = (int(rng.integers(1, 5)), int(rng.integers(2, 9)))
        inputs = {"x": rand(rng, *shape, dtype=ml_dtypes.bfloat16)}
        inputs |= {"w": rand(rng, shape[-1], dtype=ml_dtypes.bfloat16)} if weighted else {}
        inputs |= {"b": rand(rng, shape[-1], dtype=ml_dtypes.bfloat16)} if biased else {}
        return body, inputs
    return example


def _norm_op_rules():
    """cast(norm(cast(x, f32), cast(w, f32), cast(b, f32)), d) = norm(x, w, b) for 16-bit x, w, b of
    dtype d: the row kernel computes in float32 whatever it reads, so the upcasts are no kernels of
    their own (a float32 norm of 16-bit tensors)."""
    narrow = Expr("dn")
    for norm in ("layernorm", "rmsnorm"):
        for weighted, biased in ((False, False), (True, False), (True, True)):
            names = ("x", "w", "b")[:1 + weighted + biased]
            narrow_ops = [Expr(f"{n}0") for n in names]
            wide = [t.cast(v, dtype="float32", of=(Expr(f"s{n}"), "float32")) for n, v in zip(names, narrow_ops)]
            flags = dict(axes=ax, eps=eps, has_weight=weighted, has_bias=biased)
            yield Rule(f"{norm}-of-upcasts{'-weighted' if weighted else ''}{'-biased' if biased else ''}",
                       f"cast({norm}(cast({', '.join(names)}, f32)), d) = {norm}({', '.join(names)})",
                       lhs=t.cast(t.term(norm, *wide, **flags, of=(s, "float32")), dtype=narrow, of=(s, narrow)),
                       rhs=t.term(norm, *narrow_ops, **flags, of=(s, narrow)),
                       when=tuple(f"(= s{n} (shp {n}0))" for n in names) + tuple(f"(= (dt {n}0) dn)" for n in names)
                       + ('(!= dn "float32")',),
                       example=_norm_op_example(norm, weighted, biased))


RULES = tuple(_rules()) + tuple(_upcast_rules()) + tuple(_norm_op_rules())
