"""A row's logsumexp and the normalizations made of it: part of the `algebra` ruleset.

x − logsumexp(x) over the rows is log_softmax(x), and exp of that is softmax(x): one row kernel
writing the rows, where the written form is the logsumexp's kernel and a pass reading x again. A
logsumexp's gradient is g · exp(x − logsumexp(x)), a softmax scaled as it is written. A logsumexp
spread back over its row (lse[:, None], or expand_dims) is the op with keepdims, which the rules
above match.

Over an axis that is not the last, log_softmax is (x − max x) − log Σ exp(x − max x) (a 16-bit x's
max and sum in fp32, as torch keeps them): two column reductions and a pass, where the row kernel
would need x transposed there and its result transposed back, two copies of x's size.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import SIXTEEN_BIT_FLOATS, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, ax, axes, s, d, s1, s0 = t.vars("x ax axes s d s1 s0")
T = (s, d)
LAST = "(- (vec-length (shp x)) 1)"


def _rows(rng: np.random.Generator) -> np.ndarray:
    return rand(rng, 0, 0) * 3.0


def _keepdims_example(rng: np.random.Generator):
    return (lambda x: op.logsumexp(x, axis=-1)[:, None] * 2.0), {"x": _rows(rng)}


def _log_softmax_example(rng: np.random.Generator):
    return (lambda x: x - op.logsumexp(x, axis=-1, keepdims=True)), {"x": _rows(rng)}


def _softmax_example(rng: np.random.Generator):
    return (lambda x: op.exp(op.log_softmax(x, axis=int(rng.integers(0, 2))))), {"x": _rows(rng)}


def _explicit_log_softmax(stats: Expr) -> Expr:
    """(x − max x) − log Σ exp(x − max x) over `ax`, computed in `stats` (d, or "float32" cast back to d)."""
    wide = stats != d
    x_in = t.cast(x, dtype="float32", of=(s, stats)) if wide else x
    keep = dict(axes=Expr(f"(vec-of {ax})"), keepdims=True, of=(Expr(f"(vec-set s {ax} 1)"), stats))
    shifted = t.sub(x_in, t.max(x_in, **keep), of=(s, stats))
    result = t.sub(shifted, t.log(t.sum(t.exp(shifted, of=(s, stats)), **keep), of=keep["of"]), of=(s, stats))
    return t.cast(result, dtype=d, of=T) if wide else result


def _middle_axis_example(dtype):
    def example(rng: np.random.Generator):
        return (lambda x: op.log_softmax(x, axis=0)), {"x": rand(rng, int(rng.integers(1, 5)), 0, dtype=dtype)}
    return example


def _middle_axis_rules():
    not_last = "(!= ax (- (vec-length s) 1))"
    yield Rule("log-softmax-to-max-sum-exp", "log_softmax(x) = (x − max x) − log Σ exp(x − max x) over a "
               "middle axis (the row kernel takes a trailing one)",
               lhs=t.log_softmax(x, axis=ax, of=T), rhs=_explicit_log_softmax(d),
               when=(not_last, *(f'(!= d "{narrow}")' for narrow in SIXTEEN_BIT_FLOATS)),
               example=_middle_axis_example(np.float32))
    for narrow, dtype in SIXTEEN_BIT_FLOATS.items():
        yield Rule(f"log-softmax-to-max-sum-exp-{narrow}", f"log_softmax(x) = (x − max x) − log Σ exp(x − max x) "
                   f"over a middle axis, {narrow} x's max and sum in fp32",
                   lhs=t.log_softmax(x, axis=ax, of=T), rhs=_explicit_log_softmax(Expr('"float32"')),
                   when=(not_last, f'(= d "{narrow}")'), example=_middle_axis_example(dtype))


RULES = (
    Rule("logsumexp-spread-is-keepdims", "reshape(logsumexp(x, last), (…, 1)) = logsumexp(x, last, keepdims)",
         lhs=t.reshape(t.logsumexp(x, axes=axes, keepdims=False, of=(s0, d)), shape=s1, of=(s1, d)),
         rhs=t.logsumexp(x, axes=axes, keepdims=True, of=(s1, d)),
         when=(f"(= axes (vec-of {LAST}))", f"(= s1 (vec-set (shp x) {LAST} 1))"),
         example=_keepdims_example),
    Rule("log-softmax-from-logsumexp", "x − logsumexp(x, keepdims) = log_softmax(x)",
         lhs=t.sub(x, t.logsumexp(x, axes=axes, keepdims=True, of=(s1, d)), of=T),
         rhs=t.log_softmax(x, axis=ax, of=T),
         when=("(= (vec-length axes) 1)", "(= ax (vec-get axes 0))", "(= (shp x) s)", "(= (dt x) d)"),
         example=_log_softmax_example),
    Rule("softmax-from-exp-of-log-softmax", "exp(log_softmax(x)) = softmax(x)",
         lhs=t.exp(t.log_softmax(x, axis=ax, of=T), of=T),
         rhs=t.softmax(x, axis=ax, of=T),
         example=_softmax_example),
    *_middle_axis_rules(),
)
