"""Random operands for checking a generated kernel: each in its own dtype, never zero, with its
exact float64 (complex128) twin, so the reference computes on the very numbers the kernel reads.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> t = TensorType((3, 5), DType.bfloat16)
>>> inputs = random_inputs(KernelOp.of("exp", (t,), t), np.random.default_rng(0))
>>> inputs.arrays[0].dtype.name, bool((inputs.wide(0) == inputs.arrays[0].astype(np.float64)).all())
('bfloat16', True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.opdef import OpKind
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.ops.norm_backward import NORM_BACKWARD_OPS
from tessera_rw.algebra.ops.strided_attention_backward import viewed_arrays
from tessera_rw.codegen.cpu_attention import flash_attention_blockwise
from tessera_rw.codegen.cpu_attention_backward import row_stats_blockwise
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.attention_problem import FORWARD_OPS

# Values come from a fresh pool of a prime count, repeated to fill the tensor: drawing 10^8 normals
# takes numpy seconds, and a prime period never lines up with a power-of-two stride or tile, so a
# kernel reading a neighbouring row or tile still reads different numbers.
POOL = 1_000_003
POSITIVE_OPS = frozenset({"log", "sqrt", "rsqrt", "reciprocal", "pow", "div"})
KEEP = 0.75            # attention keeps most keys: a row with every key masked would be NaN
INT_RANGE = 100        # integer operands in ±[1, 100): sums of thousands stay exact in int32


@dataclass(frozen=True)
class Inputs:
    """Operands in their own dtypes (what the kernel reads), and their values in float64 / complex128
    (integers and bools as they are) on demand: operand i is `pools[i]` repeated to fill its shape."""
    arrays: tuple[np.ndarray, ...]
    pools: tuple[np.ndarray, ...]        # the wide twins of each operand's pool

    def wide(self, i: int) -> np.ndarray:
        return np.resize(self.pools[i], self.arrays[i].size).reshape(self.arrays[i].shape)

    def wide_take(self, i: int, rows: np.ndarray, axis: int) -> np.ndarray:
        """wide(i).take(rows, axis), without widening the rest of the operand."""
        shape = self.arrays[i].shape
        index = [np.arange(n) for n in shape]
        index[axis] = rows
        strides = np.cumprod((1,) + shape[:0:-1])[::-1]
        flat = sum(g * int(st) for g, st in zip(np.ix_(*index), strides))
        return self.pools[i][flat % self.pools[i].size]


def _positive(op: KernelOp) -> bool:
    """Ops with a domain (log, sqrt, a divisor) get inputs in [0.5, 2]: no NaN, no huge quotients."""
    expr = " ".join(str(op.attr_map.get(k, "")) for k in ("expr", "post"))
    return op.op in POSITIVE_OPS or any(f"{name}(" in expr for name in POSITIVE_OPS)


def _pool(dtype: DType, rng: np.random.Generator, positive: bool, keep: float) -> np.ndarray:
    if dtype is DType.bool:
        return rng.random(POOL) < keep
    if dtype.is_integer:
        return (rng.integers(1, INT_RANGE, POOL) * rng.choice((-1, 1), POOL)).astype(dtype.numpy)
    if dtype.is_complex:
        return (rng.standard_normal(POOL) + 1j * rng.standard_normal(POOL)).astype(dtype.numpy)
    values = rng.uniform(0.5, 2.0, POOL) if positive else rng.standard_normal(POOL)
    return values.astype(dtype.numpy)


def _wide(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind in "biu":
        return x
    return x.astype(np.float64)


def random_inputs(op: KernelOp, rng: np.random.Generator) -> Inputs:
    """Random operands for `op`, never zero: normal(0, 1) floats (uniform [0.5, 2] for ops with a
    positive domain), nonzero integers, random bool masks."""
    arrays, pools = [], []
    positive = _positive(op)
    keep = KEEP if op.op in FORWARD_OPS else 0.5
    for t in op.operands:
        pool = _pool(t.dtype, rng, positive, keep)
        arrays.append(np.resize(pool, math.prod(t.shape)).reshape(t.shape))
        pools.append(_wide(pool))
    if opdef(op.op).kind is OpKind.ATTENTION and op.attr_map.get("causal") and op.attr_map.get("has_mask"):
        _keep_the_diagonal(op, arrays, pools)
    if op.op in ("flash_attention_bwd", "strided_attention_bwd"):
        _consistent_row_stats(op, arrays, pools)
    if op.op in NORM_BACKWARD_OPS:
        _cotangent_along_x(op, arrays, pools)
    return Inputs(tuple(arrays), tuple(pools))


def _keep_the_diagonal(op: KernelOp, arrays: list, pools: list) -> None:
    """A causal attention's bool mask keeps each query's own key: causality leaves the first rows
    few keys (row 0 one), and a random mask would drop them all, a NaN row in torch and in ours."""
    i = next((i for i, t in enumerate(op.operands) if t.dtype is DType.bool), None)
    if i is None:                      # an additive float mask: finite, never drops a key outright
        return
    mask = np.array(arrays[i])
    if mask.ndim < 2:                  # one row of keys shared by every query: its first key is query 0's
        mask[..., 0] = True
    else:
        diagonal = np.arange(min(mask.shape[-2:]))
        mask[..., diagonal, diagonal] = True
    arrays[i], pools[i] = mask, _wide(mask.ravel())


def _cotangent_along_x(op: KernelOp, arrays: list, pools: list) -> None:
    """norm_backward's g as x + 1/2 + noise, element for element, and its weight (if any) positive,
    as a trained one is: the row sums Σ g·w and Σ g·w·x̂ are then of the size of g itself (with g
    independent of x, or w centred on 0, they average out to ~1/sqrt(n) and a wrong one hides under
    the tolerance)."""
    def replace(i: int, pool: np.ndarray) -> None:
        pool = pool.astype(op.operands[i].dtype.numpy)
        arrays[i] = np.resize(pool, arrays[i].size).reshape(arrays[i].shape)
        pools[i] = pool.astype(np.float64)
    replace(1, pools[0] + 0.5 + pools[1])
    if op.attr_map["has_weight"]:
        replace(2, 0.5 + np.abs(pools[2]))


def _consistent_row_stats(op: KernelOp, arrays: list, pools: list) -> None:
    """flash_attention_bwd's stats operand as a backward pass meets it: each row's logsumexp of the
    scores of these q and k (so P = exp(S − lse) stays within [0, 1]) and Σ dO·O with O the
    attention's output (so dP − D is centred as in training, and dS as small)."""
    q, k, v, do = (np.resize(pools[i], arrays[i].size).reshape(arrays[i].shape) for i in range(4))
    attrs = op.attr_map
    if op.op == "strided_attention_bwd":                # q, k, v and dO are views of these
        q, k, v, do = viewed_arrays(op.op, (q, k, v, do), attrs["shapes"], attrs["strides"], attrs["offsets"])
    mask = (np.resize(pools[5], arrays[5].size).reshape(arrays[5].shape),) if attrs["has_mask"] else ()
    flags = dict(scale=attrs["scale"], causal=attrs["causal"], has_mask=attrs["has_mask"],
                 window=attrs.get("window", 0))
    o = flash_attention_blockwise(q, k, v, *mask, **flags)
    arrays[4] = row_stats_blockwise(q, k, o, do, *mask, **flags).astype(op.operands[4].dtype.numpy)
    pools[4] = arrays[4].astype(np.float64).ravel()
