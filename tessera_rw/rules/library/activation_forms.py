"""GELU written out is the gelu op: part of the `algebra` ruleset.

GPT-2's gelu_new (minGPT's and HF's NewGELUActivation) and BERT's original gelu spell the
activation with tanh or erf,

    0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))     = gelu(x, approximate="tanh")
    x · 0.5 · (1 + erf(x / √2))                            = gelu(x)

and as the op it joins a GEMM's epilogue, where the written form is a pass of its own. x³ may be
written x ** 3 or x · x · x, 1 + t as t + 1, the constants on either side of their products (the
`constant-to-the-right` rule makes those one), and √(2/π), 1/√2 as Python computes them either way.
"""

from __future__ import annotations

import math

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, s, d = t.vars("x s d")
T = (s, d)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INVERSE_SQRT_2 = 1.0 / math.sqrt(2.0)
CLOSE = 1e-9            # a constant within this of √(2/π) or 1/√2 is that constant however it was computed


def _const(name: str) -> Expr:
    return t.constant(value=Expr(name), dtype=Expr(f"{name}d"))


def _near(name: str, value: float) -> tuple[str, ...]:
    return (f"(> {name} {value - CLOSE!r})", f"(< {name} {value + CLOSE!r})")


def _exactly(name: str, value: float) -> str:
    return f"(= {name} {value!r})"


def _one_plus(term: Expr, one_first: bool) -> Expr:
    return t.add(_const("one"), term) if one_first else t.add(term, _const("one"))


def _example(approximate: str, one_first: bool, cube: str = "pow"):
    def example(rng: np.random.Generator):
        def body(x):
            if approximate == "tanh":
                cubed = op.power(x, 3.0) if cube == "pow" else x * x * x
                inner = op.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * cubed))
                return 0.5 * x * ((1.0 + inner) if one_first else (inner + 1.0))
            inner = op.erf(x / math.sqrt(2.0))
            return x * 0.5 * ((1.0 + inner) if one_first else (inner + 1.0))
        return body, {"x": rand(rng, 0, 0)}
    return example


def _rules():
    half = ("(= (shp x) s)", "(= (dt x) d)", _exactly("half", 0.5), _exactly("one", 1.0))
    for one_first in (True, False):
        order = "1 + t" if one_first else "t + 1"
        for cube in ("pow", "products"):
            cubed = t.pow(x, _const("three")) if cube == "pow" else t.mul(t.mul(x, x), x)
            inner = t.mul(t.add(x, t.mul(cubed, _const("c"))), _const("k"))
            yield Rule(f"gelu-tanh-written-out-{cube}{'' if one_first else '-one-last'}",
                       f"0.5 · x · ({order} of tanh(√(2/π)(x + 0.044715 x³))) = gelu(x, tanh)",
                       lhs=t.mul(t.mul(x, _const("half")), _one_plus(t.tanh(inner), one_first), of=T),
                       rhs=t.gelu(x, approximate="tanh", of=T),
                       when=half + (_exactly("c", 0.044715), *_near("k", SQRT_2_OVER_PI))
                       + ((_exactly("three", 3.0),) if cube == "pow" else ()),
                       example=_example("tanh", one_first, cube), needs=("constant-to-the-right",))
        yield Rule(f"gelu-written-out{'' if one_first else '-one-last'}",
                   f"x · 0.5 · ({order} of erf(x / √2)) = gelu(x)",
                   lhs=t.mul(t.mul(x, _const("half")), _one_plus(t.erf(t.mul(x, _const("k"))), one_first), of=T),
                   rhs=t.gelu(x, approximate="none", of=T),
                   when=half + _near("k", INVERSE_SQRT_2),
                   example=_example("none", one_first), needs=("div-by-constant", "constant-to-the-right"))


RULES = tuple(_rules())
