"""Type promotion written out: part of the `algebra` ruleset.

x + y of a 16-bit float x and a float32 y is float32, as numpy and torch promote it: the same value
as cast(x, f32) + y, x widened exactly; likewise x − y and x · y. The rules that fuse upcast
programs (attention's scores upcast before a float32 mask is added, a norm computed in float32)
are written with the cast, so the programs that let the arithmetic promote reach them too: scores
added to a float32 mask, c · Q Kᵀ + M, and T5's norm, x · rsqrt(mean(cast(x, f32)²) + eps):

    x ∘ y = cast(x, f32) ∘ y        y ∘ x = y ∘ cast(x, f32)        (∘ one of + − ·, x bf16 or f16, y f32)
"""

from __future__ import annotations

import operator

import numpy as np

from tessera_rw.rules.library.example_inputs import SIXTEEN_BIT_FLOATS, rand
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, y, s, sx = t.vars("x y s sx")
WIDE = (s, "float32")


ARITHMETIC = {"add": ("+", operator.add), "sub": ("−", operator.sub), "mul": ("·", operator.mul)}


def _example(name: str, narrow, narrow_first: bool):
    """A 16-bit float and a float32 one combined by `name`, either of them broadcast over the other."""
    combine = ARITHMETIC[name][1]

    def example(rng: np.random.Generator):
        n, p = (int(v) for v in rng.integers(1, 7, size=2))
        small, full = (1, p), (n, p)
        shapes = (small, full) if rng.random() < 0.5 else (full, small)
        narrow_value, wide_value = rand(rng, *shapes[0], dtype=narrow), rand(rng, *shapes[1])
        if narrow_first:
            return (lambda x, y: combine(x, y) * 2.0), {"x": narrow_value, "y": wide_value}
        return (lambda y, x: combine(y, x) * 2.0), {"y": wide_value, "x": narrow_value}
    return example


def _promotion(name: str, narrow: str, narrow_first: bool) -> Rule:
    sign = ARITHMETIC[name][0]
    widened = t.cast(x, dtype="float32", of=(sx, "float32"))
    operands, shown = ((x, y), f"x {sign} y = cast(x, f32) {sign} y") if narrow_first else \
        ((y, x), f"y {sign} x = y {sign} cast(x, f32)")
    rewritten = (widened, y) if narrow_first else (y, widened)
    return Rule(f"promote-{narrow}-{'lhs' if narrow_first else 'rhs'}-of-{name}",
                f"{shown} (x {narrow}, y float32)",
                lhs=t.term(name, *operands, of=WIDE), rhs=t.term(name, *rewritten, of=WIDE),
                when=("(= sx (shp x))", f'(= (dt x) "{narrow}")', '(= (dt y) "float32")'),
                example=_example(name, SIXTEEN_BIT_FLOATS[narrow], narrow_first))


RULES = tuple(_promotion(name, narrow, first) for name in ARITHMETIC for narrow in SIXTEEN_BIT_FLOATS
              for first in (True, False))
