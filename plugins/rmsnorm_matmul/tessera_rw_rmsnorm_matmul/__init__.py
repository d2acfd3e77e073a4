"""RMSNorm followed by a projection, fused: rmsnorm(x, g) @ W -> rmsnorm_matmul(x, g, W).

The fused op normalizes each row once and feeds it straight into the GEMM, so the normalized
activations never travel through memory.
"""

from __future__ import annotations

import numpy as np

from tessera_rw import op
from tessera_rw.plugin import (DTypeError, OpDef, OpKind, Rule, RulePack, Ruleset, ShapeError, TensorType,
                               TermBuilder, promote)


def _infer(x: TensorType, g: TensorType, w: TensorType, eps: float) -> TensorType:
    if not (x.dtype.is_float and g.dtype.is_float and w.dtype.is_float):
        raise DTypeError(f"takes floating-point operands, got {x.dtype}, {g.dtype}, {w.dtype}")
    if x.ndim < 1 or w.ndim != 2 or g.shape != (x.shape[-1],) or w.shape[0] != x.shape[-1]:
        raise ShapeError(f"expects x (..., K), g (K,), w (K, N); got {x.shape}, {g.shape}, {w.shape}")
    return TensorType(x.shape[:-1] + (w.shape[1],), promote(promote(x.dtype, g.dtype), w.dtype))


def _reference(x: np.ndarray, g: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.asarray(eps, x.dtype)) * g
    return normed @ w


def _flops(out: TensorType, x: TensorType, g: TensorType, w: TensorType, eps: float) -> int:
    return 5 * x.numel + 2 * out.numel * w.shape[0]


RMSNORM_MATMUL = OpDef("rmsnorm_matmul", ("x", "g", "w"), OpKind.MATMUL, _infer, _reference, _flops,
                       doc="rmsnorm(x, g) @ w in one pass over x")

t = TermBuilder(extra_ops=(RMSNORM_MATMUL,))
x, g, w, axes, eps, acc, s, d = t.vars("x g w axes eps acc s d")


def _example(rng: np.random.Generator):
    k, n = (int(v) for v in rng.integers(2, 12, size=2))
    inputs = {"x": rng.standard_normal((int(rng.integers(1, 4)), 3, k)).astype(np.float32),
              "g": rng.standard_normal(k).astype(np.float32), "w": rng.standard_normal((k, n)).astype(np.float32)}
    return (lambda x, g, w: op.rmsnorm(x, g) @ w), inputs


FUSE = Rule(
    "rmsnorm-then-matmul", "rmsnorm(x, g) W = rmsnorm_matmul(x, g, W)",
    lhs=t.matmul(t.rmsnorm(x, g, axes=axes, eps=eps, has_weight=True, has_bias=False), w, accum_dtype=acc, of=(s, d)),
    rhs=t.term("rmsnorm_matmul", x, g, w, eps=eps, of=(s, d)),
    when=("(= (vec-length axes) 1)", "(= (vec-get axes 0) (- (vec-length (shp x)) 1))",
          "(= (vec-length (shp w)) 2)", '(= acc "")'),
    example=_example)


def rule_pack() -> RulePack:
    return RulePack(name="rmsnorm-matmul", version="0.1.0", tessera_rw=">=0.1,<0.2",
                    rulesets=(Ruleset("rmsnorm_matmul", (FUSE,), doc="RMSNorm + projection fusion"),),
                    ops=(RMSNORM_MATMUL,), description=__doc__.splitlines()[0])


__all__ = ["RMSNORM_MATMUL", "rule_pack"]
