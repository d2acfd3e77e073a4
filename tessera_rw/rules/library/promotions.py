"""Type promotion written out: part of the `algebra` ruleset.

x + y of a 16-bit float x and a float32 y is float32, as numpy and torch promote it: the same value
as cast(x, f32) + y, x widened exactly. The rules that fuse upcast programs (attention's scores
upcast before a float32 mask is added) are written with the cast, so scores added to a float32
mask as written, c · Q Kᵀ + M, reach them too:

    x + y = cast(x, f32) + y        y + x = y + cast(x, f32)        (x bf16 or f16, y f32)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
x, y, s, sx = t.vars("x y s sx")
WIDE = (s, "float32")
SIXTEEN_BIT = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _example(narrow, narrow_first: bool):
    """A 16-bit float added to a float32 one, either of them broadcast over the other."""
    def example(rng: np.random.Generator):
        n, p = (int(v) for v in rng.integers(1, 7, size=2))
        small, full = (1, p), (n, p)
        shapes = (small, full) if rng.random() < 0.5 else (full, small)
        narrow_value, wide_value = rand(rng, *shapes[0], dtype=narrow), rand(rng, *shapes[1])
        if narrow_first:
            return (lambda x, y: (x + y) * 2.0), {"x": narrow_value, "y": wide_value}
        return (lambda y, x: (y + x) * 2.0), {"y": wide_value, "x": narrow_value}
    return example


def _promotion(narrow: str, narrow_first: bool) -> Rule:
    widened = t.cast(x, dtype="float32", of=(sx, "float32"))
    operands, shown = ((x, y), "x + y = cast(x, f32) + y") if narrow_first else ((y, x), "y + x = y + cast(x, f32)")
    rewritten = (widened, y) if narrow_first else (y, widened)
    return Rule(f"promote-{narrow}-{'lhs' if narrow_first else 'rhs'}-of-add",
                f"{shown} (x {narrow}, y float32)",
                lhs=t.add(*operands, of=WIDE), rhs=t.add(*rewritten, of=WIDE),
                when=("(= sx (shp x))", f'(= (dt x) "{narrow}")', '(= (dt y) "float32")'),
                example=_example(SIXTEEN_BIT[narrow], narrow_first))


RULES = tuple(_promotion(narrow, first) for narrow in SIXTEEN_BIT for first in (True, False))
