"""A row's logsumexp and the normalizations made of it: part of the `algebra` ruleset.

x − logsumexp(x) over the rows is log_softmax(x), and exp of that is softmax(x): one row kernel
writing the rows, where the written form is the logsumexp's kernel and a pass reading x again. A
logsumexp's gradient is g · exp(x − logsumexp(x)), a softmax scaled as it is written. A logsumexp
spread back over its row (lse[:, None], or expand_dims) is the op with keepdims, which the rules
above match.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import TermBuilder
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
)
