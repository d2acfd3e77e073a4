"""The `gradient` ruleset: reductions of gradients fused into the GEMMs that produce them.

A linear layer's backward pass computes dW = Xᵀ dY and db = Σ_rows dY, two passes over dY. With a
virtual row of ones appended to A, one GEMM writes both (cuBLASLt's BGRADB epilogue):

    [Xᵀ; 1ᵀ] dY = [Xᵀ dY; Σ_rows dY]  =  matmul_bias_grad(Xᵀ, dY)

dW and db become the two row blocks of that one result. Each rule only fires where both halves
exist (a matmul and a sum read the same b), so the e-graph offers the packed GEMM exactly there;
extraction, paying a shared subexpression once, takes it when it beats a GEMM plus a reduction.
Micro-batch sums Σ_i X_iᵀ dY_i are first turned into one GEMM over the concatenated K, and Σ over
batch and rows of dY into one sum over rows of the flattened dY, so the bias rules apply there too.
An activation's derivative goes into the epilogue of the GEMM that produces its cotangent
(activation_gradient.py), and attention's backward pass becomes one fused node (attention_gradient.py)
whose row statistics the forward writes (attention_forward_stats.py); so does a layer norm's or RMS
norm's input gradient (norm_gradient.py), which writes the row statistics the weight gradient
reads (norm_stats.py), or sums the weight's and bias's gradients itself (norm_grads.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library import (activation_gradient, attention_forward_stats, attention_gradient, norm_gradient,
                                      norm_grads, norm_stats)
from tessera_rw.rules.library.algebra import mT, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset

t = TermBuilder()
a, b, x, dy, p, acc, s, d, ta, tb = t.vars("a b x dy p acc s d ta tb")
E = Expr
T = (s, d)
MAX_BATCH_DIMS = 3        # micro-batch rules for 1..3 leading batch dims (egglog cannot fold a vector)

# a [M, K] and b [K, N], both of dtype d, with M and N bound as m and n
PRODUCT_TYPES = ("(= sa (shp a))", "(= (vec-length sa) 2)", "(= sb (shp b))", "(= (vec-length sb) 2)",
                 "(= (dt a) d)", "(= (dt b) d)", "(= m (vec-get sa 0))", "(= n (vec-get sb 1))")
# Query facts that join on the e-graph: the other half of the pair must exist for a rule to fire.
MATMUL_OF_B = f"(= mm {t.matmul(a, b, accum_dtype=acc, of=(None, d))})"           # a @ b, of dtype d
SUM_OF_B = f"(= bsum {t.sum(b, axes=E('(vec-of 0)'), of=(None, d))})"             # Σ_rows b, of dtype d


def _packed() -> Expr:
    return t.matmul_bias_grad(a, b, accum_dtype=acc, trans_a=False, trans_b=False, of=(E("(vec-of (+ m 1) n)"), d))


def _rows(start: str, stop: str, of) -> Expr:
    return t.slice(_packed(), starts=E(f"(vec-of {start} 0)"), stops=E(f"(vec-of {stop} n)"),
                   steps=E("(vec-of 1 1)"), of=of)


def _linear_backward(rng: np.random.Generator, dtype=np.float32) -> dict[str, np.ndarray]:
    tokens, d_in, d_out = (int(v) for v in rng.integers(1, 9, size=3))
    return {"x": rand(rng, tokens, d_in, dtype=dtype), "dy": rand(rng, tokens, d_out, dtype=dtype)}


def _bias_example(keepdims: bool, dtype=np.float32):
    def example(rng: np.random.Generator):
        return (lambda x, dy: (x.T @ dy, op.sum(dy, axis=0, keepdims=keepdims))), _linear_backward(rng, dtype)
    return example


def _bias_rules():
    # The weight side is one rule; the bias side one per keepdims (a [1, N] row, or reshaped to [N]).
    yield Rule("weight-grad-in-packed-gemm", "A B = rows 0..M-1 of [A; 1ᵀ] B (when Σ_rows B is also taken)",
               lhs=t.matmul(a, b, accum_dtype=acc, of=T),
               rhs=_rows("0", "m", T),
               when=PRODUCT_TYPES + (SUM_OF_B,),
               example=_bias_example(False))
    for keepdims in (False, True):
        row = _rows("m", "(+ m 1)", (E("(vec-of 1 n)"), d))
        yield Rule(f"bias-grad-from-packed-gemm{'-keepdims' if keepdims else ''}",
                   "Σ_rows B = row M of [A; 1ᵀ] B (when A B is also taken)",
                   lhs=t.sum(b, axes=E("(vec-of 0)"), keepdims=keepdims, of=T),
                   rhs=row if keepdims else t.reshape(row, shape=s, of=T),
                   when=PRODUCT_TYPES + (MATMUL_OF_B,),
                   example=_bias_example(keepdims, ml_dtypes.bfloat16 if keepdims else np.float32))


def _bias_grad(left: Expr, right: Expr, trans_a: Expr | bool, trans_b: Expr | bool) -> Expr:
    return t.matmul_bias_grad(left, right, accum_dtype=acc, trans_a=trans_a, trans_b=trans_b, of=T)


def _transposed_dy_example(rng: np.random.Generator):
    """dY arriving transposed ([d_out, tokens]): the product and the sum both read dYᵀ."""
    inputs = _linear_backward(rng)
    return (lambda x, g: (x.T @ g.T, op.sum(g.T, axis=0))), {"x": inputs["x"], "g": np.ascontiguousarray(inputs["dy"].T)}


def _transposed_operand_rules():
    """The packed GEMM reads a transposed operand in place, as a gemm does (transposed_operands.py):
    a linear layer's Xᵀ is read as X."""
    xt, facts = mT(x)
    needs = ("weight-grad-in-packed-gemm", "bias-grad-from-packed-gemm")
    yield Rule("transposed-a-into-bias-grad-gemm", "[Xᵀ; 1ᵀ] B = matmul_bias_grad(X, B; trans_a)",
               lhs=_bias_grad(xt, b, False, tb), rhs=_bias_grad(x, b, True, tb), when=facts,
               example=_bias_example(False), needs=needs)
    yield Rule("transposed-b-into-bias-grad-gemm", "[A; 1ᵀ] Yᵀ = matmul_bias_grad(A, Y; trans_b)",
               lhs=_bias_grad(a, xt, ta, False), rhs=_bias_grad(a, x, ta, True), when=facts,
               example=_transposed_dy_example, needs=needs)


# ---- micro-batches: Σ_i X_iᵀ dY_i = [X_1; …; X_B]ᵀ [dY_1; …; dY_B] ----------------------------------

def _vec(*items: str) -> Expr:
    return E(f"(vec-of {' '.join(items)})")


def _micro_batch(rng: np.random.Generator, batch_dims: int) -> dict[str, np.ndarray]:
    batch = tuple(int(v) for v in rng.integers(1, 4, size=batch_dims))
    tokens, d_in, d_out = (int(v) for v in rng.integers(1, 7, size=3))
    return {"x": rand(rng, *batch, tokens, d_in), "dy": rand(rng, *batch, tokens, d_out)}


def _micro_batch_example(batch_dims: int, keepdims: bool):
    lead = tuple(range(batch_dims))

    def body(x, dy):
        return (op.sum(x.mT @ dy, axis=lead, keepdims=keepdims),
                op.sum(dy, axis=lead + (batch_dims,), keepdims=keepdims))
    return lambda rng: (body, _micro_batch(rng, batch_dims))


def _flat_dy(j: int) -> tuple[tuple[str, ...], Expr]:
    """Facts binding dy [B…, T, N] (j batch dims) of dtype d, with bt = B…·T, and dy as [B…·T, N]."""
    rows = "1"
    for i in range(j + 1):
        rows = f"(* {rows} (vec-get sy {i}))"
    facts = ("(= sy (shp dy))", f"(= (vec-length sy) {j + 2})", "(= (dt dy) d)", f"(= bt {rows})",
             f"(= n (vec-get sy {j + 1}))")
    return facts, t.reshape(dy, shape=_vec("bt", "n"), of=(_vec("bt", "n"), d))


def _flat_x(j: int) -> tuple[tuple[str, ...], Expr]:
    """Facts binding x [B…, T, K] with dy's B… and T, and x as [B…·T, K]."""
    facts = ("(= sx (shp x))", f"(= (vec-length sx) {j + 2})", "(= (dt x) d)", f"(= k (vec-get sx {j + 1}))",
             *(f"(= (vec-get sx {i}) (vec-get sy {i}))" for i in range(j + 1)))
    return facts, t.reshape(x, shape=_vec("bt", "k"), of=(_vec("bt", "k"), d))


def _micro_batch_rules():
    for j in range(1, MAX_BATCH_DIMS + 1):
        dy_facts, flat_dy = _flat_dy(j)
        x_facts, flat_x = _flat_x(j)
        lead = " ".join(map(str, range(j)))
        batched = t.matmul(t.transpose(x, axes=p), dy, accum_dtype=acc)
        product = t.matmul(t.transpose(flat_x, axes=E("(vec-of 1 0)"), of=(_vec("k", "bt"), d)), flat_dy,
                           accum_dtype=acc, of=(_vec("k", "n"), d))
        total = t.sum(flat_dy, axes=E("(vec-of 0)"), keepdims=False, of=(_vec("n"), d))
        for keepdims in (False, True):
            suffix = f"-{j}d{'-keepdims' if keepdims else ''}"
            yield Rule(f"micro-batch-weight-grad{suffix}", "Σ_i X_iᵀ dY_i = [X_1; …; X_B]ᵀ [dY_1; …; dY_B]",
                       lhs=t.sum(batched, axes=E(f"(vec-of {lead})"), keepdims=keepdims, of=T),
                       rhs=t.reshape(product, shape=s, of=T) if keepdims else product,
                       when=dy_facts + x_facts + (f"(= p (swap-last {j + 2}))",),
                       example=_micro_batch_example(j, keepdims))
            yield Rule(f"micro-batch-bias-grad{suffix}", "Σ_{i,t} dY_it = Σ_rows [dY_1; …; dY_B]",
                       lhs=t.sum(dy, axes=E(f"(vec-of {lead} {j})"), keepdims=keepdims, of=T),
                       rhs=t.reshape(total, shape=s, of=T) if keepdims else total,
                       # only beside a batched product reading dy, whose rewrite reads the flat dy too
                       when=dy_facts + (f"(= bmm {t.matmul(E('xt'), dy, of=(None, d))})",),
                       example=_micro_batch_example(j, keepdims))


GRADIENT = Ruleset("gradient", tuple(_bias_rules()) + tuple(_micro_batch_rules()) + activation_gradient.RULES
                   + tuple(_transposed_operand_rules())
                   + attention_gradient.RULES + attention_forward_stats.RULES + norm_gradient.RULES + norm_stats.RULES
                   + norm_grads.RULES,
                   doc="bias gradients into the weight-gradient GEMM; micro-batch sums into one GEMM; "
                       "activation derivatives into the GEMM of their cotangent; transposed operands read "
                       "in place; attention's backward into one fused node, its row statistics read off "
                       "the forward; a layernorm's or rmsnorm's input gradient into one row pass, which also "
                       "writes the row statistics the weight gradient reads, or the weight's and bias's "
                       "gradients as partial sums")
