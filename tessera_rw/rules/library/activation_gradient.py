"""Activation derivatives into the GEMM that produces their cotangent: part of the `gradient` ruleset.

In a backward pass through h = act(z) followed by a linear layer, dh = dY Wᵀ comes out of a GEMM and
dz = dh ∘ act'(z) is an elementwise pass over it (for gelu, a dozen ops on z). cuBLASLt's
DGELU/DRELU epilogues apply act'(z) in the GEMM's registers instead:

    dz = (A B) ∘ act'(z)  =  gemm(A, B, z; activation="d<act>")

The left-hand sides are the VJPs themselves (algebra.ops.elementwise.ACTIVATION_COTANGENTS),
traced into patterns: what reverse mode builds, or a hand-written derivative spelled the same way,
is what the rules match.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra.ops.elementwise import ACTIVATION_COTANGENTS
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
a, b, z, acc, s, d = t.vars("a b z acc s d")
T = (s, d)


def _example(cotangent):
    def example(rng: np.random.Generator):
        m, k, n, batch = (int(v) for v in rng.integers(1, 8, size=4))
        inputs = {"x": rand(rng, batch, m, k), "w": rand(rng, k, n), "z": rand(rng, batch, m, n)}
        return (lambda x, w, z: cotangent(x @ w, z)), inputs
    return example


def _rules():
    for name, cotangent in ACTIVATION_COTANGENTS.items():
        yield Rule(f"{name}-derivative-into-gemm", f"(A B) ∘ {name}'(z) = gemm(A, B, z; act=d{name})",
                   lhs=t.traced(cotangent, t.matmul(a, b, accum_dtype=acc, of=T), z, dtype=d, of=T),
                   rhs=t.gemm(a, b, z, scale=1.0, activation=f"d{name}", has_bias=False, has_residual=False,
                              accum_dtype=acc, dtype=d, trans_a=False, trans_b=False, of=T),
                   when=("(>= (vec-length (shp a)) 2)", "(>= (vec-length (shp b)) 2)", "(= (shp z) s)",
                         "(= (dt z) d)"),
                   example=_example(cotangent))


RULES = tuple(_rules())
