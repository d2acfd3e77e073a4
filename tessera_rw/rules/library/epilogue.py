"""The `epilogue` ruleset: a matmul and the elementwise work after it become one gemm.

    act(scale · A B + bias) + residual, cast to d  =  gemm(A, B, bias, residual; scale, act, d)
    act(scale · A B + bias) · gate                 =  gated_gemm(A, B, bias, gate; scale, act, d)

A matmul is a gemm with an empty epilogue; each rule then absorbs the next op, in epilogue order
(scale before bias, bias before the activation, the residual after it, the cast last). A transposed
operand is read in place (transposed_operands.py), so a backward pass's Wᵀ and Xᵀ cost no copy.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.ops.fused_gemm import DERIVATIVES
from tessera_rw.rules.library.algebra import const, rand
from tessera_rw.rules.library.conv_epilogue import CONV_EPILOGUE_RULES
from tessera_rw.rules.library.fused_reductions import REDUCTION_FUSION_RULES
from tessera_rw.rules.library.fusion import FUSION_RULES
from tessera_rw.rules.library.transposed_operands import (
    k_major_fp8_rules, transposed_operand_rules, transposed_product_rules)
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset

t = TermBuilder()
a, b, bias, res, c, c0, acc, act, s, d, d0, ta, tb = t.vars("a b bias res c c0 acc act s d d0 ta tb")
T = (s, d)


def gemm(*operands: Expr, scale=c0, activation=act, has_bias=False, has_residual=False, dtype=d, of=T,
         trans_a=ta, trans_b=tb) -> Expr:
    return t.gemm(a, b, *operands, scale=scale, activation=activation, has_bias=has_bias,
                  has_residual=has_residual, accum_dtype=acc, dtype=dtype, trans_a=trans_a, trans_b=trans_b, of=of)


def _mm(rng: np.random.Generator, lead: int = 1):
    m, k, n = (int(v) for v in rng.integers(1, 8, size=3))
    batch = tuple(int(v) for v in rng.integers(1, 3, size=lead))
    return rand(rng, *batch, m, k), rand(rng, k, n)


def _example(body, with_bias: bool = False, with_residual: bool = False):
    def example(rng: np.random.Generator):
        x, w = _mm(rng)
        inputs = {"x": x, "w": w}
        if with_bias:
            inputs["bias"] = rand(rng, w.shape[-1])
        if with_residual:
            inputs["res"] = rand(rng, *x.shape[:-1], w.shape[-1])
        return body, inputs
    return example


# elementwise activation op -> (pattern attrs, gemm activation name)
ACTIVATIONS = {"relu": ({}, "relu"), "silu": ({}, "silu"),
               "gelu": ({"approximate": "none"}, "gelu"), "gelu_tanh": ({"approximate": "tanh"}, "gelu_tanh")}
ACTIVATION_FN = {"relu": op.relu, "silu": op.silu, "gelu": op.gelu,
                 "gelu_tanh": lambda y: op.gelu(y, approximate="tanh")}


def _activation_rules():
    for name, (attrs, fused) in ACTIVATIONS.items():
        op_name = "gelu" if name.startswith("gelu") else name
        fn = ACTIVATION_FN[name]
        for with_bias in (False, True):
            ops = (bias,) if with_bias else ()
            yield Rule(f"{name}-into-gemm{'-with-bias' if with_bias else ''}",
                       f"{name}(A B{' + b' if with_bias else ''}) = gemm(A, B; act={fused})",
                       lhs=t.term(op_name, gemm(*ops, activation="none", has_bias=with_bias, dtype=d0,
                                                of=(s, d0)), **attrs, of=T),
                       rhs=gemm(*ops, activation=fused, has_bias=with_bias, dtype=d),
                       when=("(= d0 d)",),
                       example=_example((lambda x, w, bias, fn=fn: fn(x @ w + bias)) if with_bias else
                                        (lambda x, w, fn=fn: fn(x @ w)), with_bias=with_bias),
                       needs=NEEDS_GEMM + (("bias-into-gemm",) if with_bias else ()))


NEEDS_GEMM = ("matmul-is-gemm",)


def _gate_rules():
    """gemm(A, B[, b]) · g = gated_gemm(A, B[, b], g) (and g · gemm): a gated unit's product times its
    gate in the product's epilogue. SwiGLU's silu(X W_g) · (X W_u) takes either GEMM as the gate."""
    g = Expr("g")
    not_derivative = tuple(f'(!= act "{name}")' for name in DERIVATIVES)
    for with_bias in (False, True):
        ops = (bias,) if with_bias else ()
        for gate_first in (False, True):
            product = gemm(*ops, has_bias=with_bias, dtype=d, of=T)
            shown = f"gemm(A, B{', b' if with_bias else ''})"
            yield Rule(f"gate{'-first' if gate_first else ''}-into-gemm{'-with-bias' if with_bias else ''}",
                       f"{'g · ' + shown if gate_first else shown + ' · g'} = gated_gemm(A, B, g)",
                       lhs=t.mul(g, product, of=T) if gate_first else t.mul(product, g, of=T),
                       rhs=t.gated_gemm(a, b, *ops, g, scale=c0, activation=act, has_bias=with_bias, accum_dtype=acc,
                                        dtype=d, trans_a=ta, trans_b=tb, of=T),
                       when=("(= (shp g) s)", "(= (dt g) d)") + not_derivative,
                       example=_gate_example(with_bias, gate_first),
                       needs=NEEDS_GEMM + (("bias-into-gemm",) if with_bias else ()))


def _gate_example(with_bias: bool, gate_first: bool):
    def body(x, w, g, bias=None):
        product = x @ w + bias if with_bias else x @ w
        return g * product if gate_first else product * g

    def example(rng: np.random.Generator):
        x, w = _mm(rng)
        inputs = {"x": x, "w": w, "g": rand(rng, *x.shape[:-1], w.shape[-1])}
        return body, inputs | ({"bias": rand(rng, w.shape[-1])} if with_bias else {})
    return example


def _cast_rules():
    """The cast absorbs into a gemm whatever its epilogue operands (none, bias or residual, both),
    where the gemm writes its accumulator's dtype (f32, or f64 for f64 operands): rounding that
    again to d is rounding the accumulator to d. A narrower gemm (bf16) already rounded: casting
    that to f32 keeps the rounding, which writing f32 directly would drop (a user's
    cast(cast(y, bf16), f32) round trip would vanish)."""
    operands = t.vars("e0 e1")
    flags = dict(has_bias=Expr("hb"), has_residual=Expr("hr"))
    for n in range(3):
        yield Rule(f"cast-into-gemm{n + 2}", "cast(gemm(A, B, ...), d) = gemm(A, B, ...; dtype=d)",
                   lhs=t.cast(gemm(*operands[:n], **flags, dtype=d0, of=(s, d0)), dtype=d, of=T),
                   rhs=gemm(*operands[:n], **flags, dtype=d),
                   when=("(= d0 (accum-float (dt a)))",),
                   example=_CAST_EXAMPLES[n], needs=NEEDS_GEMM + _CAST_NEEDS[n])


_CAST_EXAMPLES = (
    _example(lambda x, w: op.cast(op.relu(x @ w), "bfloat16")),
    _example(lambda x, w, bias: op.cast(x @ w + bias, "bfloat16"), with_bias=True),
    _example(lambda x, w, bias, res: op.cast(op.silu(x @ w + bias) + res, "bfloat16"), with_bias=True,
             with_residual=True),
)
_CAST_NEEDS = (("relu-into-gemm",), ("bias-into-gemm",),
               ("bias-into-gemm", "silu-into-gemm-with-bias", "residual-after-bias-into-gemm"))

RULES = (
    Rule("matmul-is-gemm", "A B = gemm(A, B)",
         lhs=t.matmul(a, b, accum_dtype=acc, of=T),
         rhs=gemm(scale=1.0, activation="none", dtype=d, trans_a=False, trans_b=False),
         when=("(>= (vec-length (shp a)) 2)", "(>= (vec-length (shp b)) 2)"),
         example=_example(lambda x, w: x @ w)),
    Rule("scale-into-gemm", "(A B) · c = gemm(A, B; scale=c)",
         lhs=t.mul(gemm(activation="none", dtype=d, of=T), const(), of=T),
         rhs=gemm(scale=Expr("(* c0 c)"), activation="none", dtype=d),
         when=("(= cd d)",),
         example=_example(lambda x, w: (x @ w) * 0.5), needs=NEEDS_GEMM),
    Rule("bias-into-gemm", "A B + b = gemm(A, B, b)",
         lhs=t.add(gemm(activation="none", dtype=d, of=T), bias, of=T),
         rhs=gemm(bias, activation="none", has_bias=True, dtype=d),
         when=("(= (dt bias) d)",),
         example=_example(lambda x, w, bias: x @ w + bias, with_bias=True), needs=NEEDS_GEMM),
    Rule("bias-first-into-gemm", "b + A B = gemm(A, B, b)",
         lhs=t.add(bias, gemm(activation="none", dtype=d, of=T), of=T),
         rhs=gemm(bias, activation="none", has_bias=True, dtype=d),
         when=("(= (dt bias) d)",),
         example=_example(lambda x, w, bias: bias + x @ w, with_bias=True), needs=NEEDS_GEMM),
    *_activation_rules(),
    Rule("residual-into-gemm", "gemm(A, B) + r = gemm(A, B, r; residual)",
         lhs=t.add(gemm(dtype=d, of=T), res, of=T),
         rhs=gemm(res, has_residual=True, dtype=d),
         when=("(= (shp res) s)", "(= (dt res) d)", '(!= act "none")'),
         example=_example(lambda x, w, res: op.relu(x @ w) + res, with_residual=True),
         needs=NEEDS_GEMM + ("relu-into-gemm",)),
    Rule("residual-after-bias-into-gemm", "gemm(A, B, b) + r = gemm(A, B, b, r)",
         lhs=t.add(gemm(bias, has_bias=True, dtype=d, of=T), res, of=T),
         rhs=gemm(bias, res, has_bias=True, has_residual=True, dtype=d),
         when=("(= (shp res) s)", "(= (dt res) d)"),
         example=_example(lambda x, w, bias, res: op.gelu(x @ w + bias) + res, with_bias=True, with_residual=True),
         needs=NEEDS_GEMM + ("bias-into-gemm", "gelu-into-gemm-with-bias")),
    Rule("residual-first-into-gemm", "r + gemm(A, B) = gemm(A, B, r; residual)",
         lhs=t.add(res, gemm(dtype=d, of=T), of=T),
         rhs=gemm(res, has_residual=True, dtype=d),
         when=("(= (shp res) s)", "(= (dt res) d)", '(!= act "none")'),
         example=_example(lambda x, w, res: res + op.relu(x @ w), with_residual=True),
         needs=NEEDS_GEMM + ("relu-into-gemm",)),
    Rule("residual-first-after-bias-into-gemm", "r + gemm(A, B, b) = gemm(A, B, b, r)",
         lhs=t.add(res, gemm(bias, has_bias=True, dtype=d, of=T), of=T),
         rhs=gemm(bias, res, has_bias=True, has_residual=True, dtype=d),
         when=("(= (shp res) s)", "(= (dt res) d)"),
         example=_example(lambda x, w, bias, res: res + (x @ w + bias), with_bias=True, with_residual=True),
         needs=NEEDS_GEMM + ("bias-into-gemm",)),
    Rule("bias-after-residual-into-gemm", "(A B + r) + b = gemm(A, B, b, r)",
         lhs=t.add(gemm(res, activation="none", has_bias=True, dtype=d, of=T), bias, of=T),
         rhs=gemm(bias, res, activation="none", has_bias=True, has_residual=True, dtype=d),
         when=("(= (shp res) s)", "(= (dt bias) d)", "(!= (shp bias) s)"),
         example=_example(lambda x, w, bias, res: x @ w + res + bias, with_bias=True, with_residual=True),
         needs=NEEDS_GEMM + ("bias-into-gemm",)),
    *_cast_rules(),
    *_gate_rules(),
    *transposed_operand_rules(),
    *transposed_product_rules(),
    *k_major_fp8_rules(),
)

EPILOGUE = Ruleset("epilogue", RULES + FUSION_RULES + REDUCTION_FUSION_RULES + CONV_EPILOGUE_RULES,
                   doc="matmul + scale / bias / activation / residual / cast / gate → one gemm; elementwise "
                       "chains → one node, which a reduction of it absorbs and a convolution takes as its epilogue")


