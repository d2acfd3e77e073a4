"""Transposed operands read in place: a GEMM takes Xᵀ as X with a layout flag, not as a copy.

    gemm(Xᵀ, B, …)  =  gemm(X, B, …; trans_a)        gemm(A, Yᵀ, …)  =  gemm(A, Y, …; trans_b)
    gemm(A, B)ᵀ  =  gemm(B, A; trans_a=¬trans_b, trans_b=¬trans_a)

Xᵀ swaps the last two axes. A backward pass is full of them (dX = dY Wᵀ, dW = Xᵀ dY): unfused, each
is a copy kernel that writes the whole operand once more before the GEMM reads it. The kernels load
a transposed tile as cheaply as a plain one (cuBLAS's op(A) = Aᵀ), so these rules give the e-graph
the copy-free form and extraction takes it wherever the transpose has no other reader. A transpose
of a GEMM's result goes the other way: the GEMM of the swapped operands writes it directly.

8-bit float products are the exception: their tensor cores (Hopper's wgmma) read both operands with
k contiguous, A as [M, K] and B as [N, K], so an fp8 operand stored the other way is offered in a
transposed copy too, and the cost model weighs the copy against the slower kernels that read it
where it lies:

    gemm(X, B, …; trans_a)  =  gemm(Xᵀ, B, …)        gemm(A, Y, …)  =  gemm(A, Yᵀ, …; trans_b)     (fp8)

These rules live in the `epilogue` ruleset, the fold one per number of epilogue operands (a gemm
built before the fold, like an activation derivative's, is folded too); the packed bias-gradient
GEMM's fold is the `gradient` ruleset's.
"""

from __future__ import annotations

from typing import Iterator

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.algebra import mT, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
a, b, x, bias, c0, acc, act, hb, hr, s, d, ta, tb, p = t.vars("a b x bias c0 acc act hb hr s d ta tb p")
EXTRAS = t.vars("e0 e1")
T = (s, d)


def _gemm(left: Expr, right: Expr, extras: tuple[Expr, ...], trans_a: Expr | bool, trans_b: Expr | bool,
          has_bias: Expr | bool = hb, has_residual: Expr | bool = hr, of=T) -> Expr:
    return t.gemm(left, right, *extras, scale=c0, activation=act, has_bias=has_bias, has_residual=has_residual,
                  accum_dtype=acc, dtype=d, trans_a=trans_a, trans_b=trans_b, of=of)


def _gemm_example(side: str, extras: int):
    """A product with operand `side` ("a" or "b") stored transposed and `extras` epilogue operands
    (a bias, then a residual)."""
    def read(v, named):
        return v.mT if side == named else v

    bodies = (lambda x, w: read(x, "a") @ read(w, "b"),
              lambda x, w, bias: read(x, "a") @ read(w, "b") + bias,
              lambda x, w, bias, res: op.gelu(read(x, "a") @ read(w, "b") + bias) + res)

    def example(rng: np.random.Generator):
        m, k, n, batch = (int(v) for v in rng.integers(1, 8, size=4))
        inputs = {"x": rand(rng, batch, *((k, m) if side == "a" else (m, k))),
                  "w": rand(rng, *((n, k) if side == "b" else (k, n))),
                  "bias": rand(rng, n), "res": rand(rng, batch, m, n)}
        return bodies[extras], dict(list(inputs.items())[:2 + extras])
    return example


_EXTRA_NEEDS = ((), ("bias-into-gemm",), ("bias-into-gemm", "gelu-into-gemm-with-bias", "residual-after-bias-into-gemm"))


def transposed_operand_rules() -> Iterator[Rule]:
    """gemm(Xᵀ, B, …) = gemm(X, B, …; trans_a) and the same for B, for 0 to 2 epilogue operands."""
    xt, facts = mT(x)
    for n in range(len(_EXTRA_NEEDS)):
        extras = EXTRAS[:n]
        yield Rule(f"transposed-a-into-gemm{n + 2}", "gemm(Xᵀ, B, …) = gemm(X, B, …; trans_a)",
                   lhs=_gemm(xt, b, extras, False, tb), rhs=_gemm(x, b, extras, True, tb), when=facts,
                   example=_gemm_example("a", n), needs=("matmul-is-gemm", *_EXTRA_NEEDS[n]))
        yield Rule(f"transposed-b-into-gemm{n + 2}", "gemm(A, Yᵀ, …) = gemm(A, Y, …; trans_b)",
                   lhs=_gemm(a, xt, extras, ta, False), rhs=_gemm(a, x, extras, ta, True), when=facts,
                   example=_gemm_example("b", n), needs=("matmul-is-gemm", *_EXTRA_NEEDS[n]))


def _fp8_example(side: str, extras: int):
    """`_gemm_example`'s product on float8_e4m3 operands, with a bf16 bias and residual (what an
    fp8 product writes)."""
    example = _gemm_example(side, extras)

    def fp8(rng: np.random.Generator):
        body, inputs = example(rng)
        kinds = {"x": ml_dtypes.float8_e4m3fn, "w": ml_dtypes.float8_e4m3fn}
        return body, {name: v.astype(kinds.get(name, ml_dtypes.bfloat16)) for name, v in inputs.items()}
    return fp8


def k_major_fp8_rules() -> Iterator[Rule]:
    """gemm(X, B, …; trans_a) = gemm(Xᵀ, B, …) and gemm(A, Y, …) = gemm(A, Yᵀ, …; trans_b) for an
    8-bit float operand, for 0 to 2 epilogue operands: the transposed copy the k-major tensor cores read."""
    xt, facts = mT(x)
    k_major = facts + ("(= (k-major-mma x_d) true)",)
    for n in range(len(_EXTRA_NEEDS)):
        extras = EXTRAS[:n]
        yield Rule(f"fp8-a-k-major{n + 2}", "gemm(X, B, …; trans_a) = gemm(Xᵀ, B, …) for fp8 X",
                   lhs=_gemm(x, b, extras, True, tb), rhs=_gemm(xt, b, extras, False, tb), when=k_major,
                   example=_fp8_example("a", n),
                   needs=("matmul-is-gemm", "transposed-a-into-gemm2", *_EXTRA_NEEDS[n]))
        yield Rule(f"fp8-b-k-major{n + 2}", "gemm(A, Y, …) = gemm(A, Yᵀ, …; trans_b) for fp8 Y",
                   lhs=_gemm(a, x, extras, ta, False), rhs=_gemm(a, xt, extras, ta, True), when=k_major,
                   example=_fp8_example("in place", n), needs=("matmul-is-gemm", *_EXTRA_NEEDS[n]))


def _product_example(with_bias: bool):
    def example(rng: np.random.Generator):
        m, k, n, batch = (int(v) for v in rng.integers(1, 8, size=4))
        inputs = {"x": rand(rng, batch, m, k), "w": rand(rng, k, n)}
        if not with_bias:
            return (lambda x, w: (x @ w).mT), inputs
        return (lambda x, w, bias: op.gelu(x @ w + bias).mT), inputs | {"bias": rand(rng, n)}
    return example


def transposed_product_rules() -> Iterator[Rule]:
    """(A B)ᵀ = Bᵀ Aᵀ: a transposed GEMM result is the GEMM of the operands swapped, each read the
    other way round, so the product writes the layout its reader wants. An elementwise activation
    commutes with the transpose; a bias along the columns becomes one along the rows."""
    swapped = ("(= p (swap-last (vec-length s)))",)
    inner = (Expr("sg"), d)
    yield Rule("transposed-gemm-product", "gemm(A, B)ᵀ = gemm(B, A; trans_a=¬trans_b, trans_b=¬trans_a)",
               lhs=t.transpose(_gemm(a, b, (), ta, tb, of=inner), axes=p, of=T),
               rhs=_gemm(b, a, (), Expr("(not tb)"), Expr("(not ta)")),
               when=swapped, example=_product_example(False), needs=("matmul-is-gemm",))
    bias_facts = ("(= sbias (shp bias))", "(= (vec-length sbias) 1)", "(= nb (vec-get sbias 0))",
                  "(= dbias (dt bias))")
    column = t.reshape(bias, shape=Expr("(vec-of nb 1)"), of=(Expr("(vec-of nb 1)"), Expr("dbias")))
    yield Rule("transposed-gemm-product-with-bias",
               "gemm(A, B, b)ᵀ = gemm(B, A, b as a column; trans_a=¬trans_b, trans_b=¬trans_a)",
               lhs=t.transpose(_gemm(a, b, (bias,), ta, tb, has_bias=True, has_residual=False, of=inner), axes=p, of=T),
               rhs=_gemm(b, a, (column,), Expr("(not tb)"), Expr("(not ta)"), has_bias=True, has_residual=False),
               when=swapped + bias_facts, example=_product_example(True),
               needs=("matmul-is-gemm", "bias-into-gemm", "gelu-into-gemm-with-bias"))
