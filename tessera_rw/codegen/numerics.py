"""Numerics policies: what a kernel may trade of its result's bits for speed or accuracy.

    fast           fp32 matrix products on tensor cores in tf32 (10-bit mantissa products, fp32
                   accumulation), NVRTC's fast math (approximate exp, tanh, division...), and
                   sums whose order depends on timing (the attention backward's dQ, by atomics),
                   so two runs may differ in the last bits.
    deterministic  the default: every run gives bitwise-identical results.
    kahan_sum      sums (sum, mean, softmax's denominator, layernorm/rmsnorm statistics) carry a
                   Neumaier compensation term per thread, and partial sums merge as (sum,
                   compensation) pairs, so the error no longer grows with the row length.

Why `deterministic` costs nothing: every template reduces in an order fixed by the source alone
(a thread's strided walk, then warp shuffles in a fixed butterfly, then shared memory in warp
order), never with atomics, and split-K does not exist. The same kernel on the same inputs
therefore reproduces its bits on every run. A template that adds an atomic or order-dependent
combination must emit it only when the policy is `fast`: so far one does, the attention
backward's dQ summed by the key blocks (flash_attention_bwd's dq="atomic" form, which saves two
of seven products). tests/codegen/test_numerics.py greps every generated kernel for 'atomic' to
hold that line.

The policy is scoped (a context variable, so threads and asyncio tasks each see their own) and
it is part of a KernelOp, so compiled kernels and costs keyed by KernelOp keep policies apart:

>>> current_numerics()
<Numerics.DETERMINISTIC: 'deterministic'>
>>> restore = set_numerics("fast")
>>> current_numerics().value
'fast'
>>> restore(); current_numerics().value
'deterministic'

Users scope it with `tessera_rw.numerics.policy`.

`compensated_sum` is the CPU side of kahan_sum, for the numpy executor.
"""

from __future__ import annotations

import contextvars
import enum
import math
from typing import Callable

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError


class NumericsError(TesseraError):
    """A numerics policy name that is not one of the three."""


class Numerics(str, enum.Enum):
    """A numerics policy; `Numerics.DEFAULT` is DETERMINISTIC."""
    FAST = "fast"
    DETERMINISTIC = "deterministic"
    KAHAN_SUM = "kahan_sum"
    DEFAULT = "deterministic"       # an alias: fixed-order, atomic-free kernels unless asked for speed

    @classmethod
    def parse(cls, name: Numerics | str) -> Numerics:
        """A policy from its name (case-insensitive; '-' reads as '_').

        >>> Numerics.parse("Kahan-Sum")
        <Numerics.KAHAN_SUM: 'kahan_sum'>
        """
        if isinstance(name, cls):
            return name
        if isinstance(name, str):
            key = name.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == key:
                    return member
        names = ", ".join(repr(m.value) for m in cls)
        raise NumericsError(f"unknown numerics policy {name!r}; the policies are {names}",
                            hint="use numerics.policy('fast'), numerics.policy('deterministic') "
                                 "or numerics.policy('kahan_sum')")

    def __str__(self) -> str:
        return self.value


_CURRENT: contextvars.ContextVar[Numerics] = contextvars.ContextVar("tessera_rw_numerics",
                                                                    default=Numerics.DEFAULT)


def current_numerics() -> Numerics:
    """The policy in force here: the innermost `numerics.policy` block or the last
    policy set, else DETERMINISTIC."""
    return _CURRENT.get()


def set_numerics(name: Numerics | str) -> Callable[[], None]:
    """Put policy `name` in force here; the function returned puts back the one it replaced."""
    token = _CURRENT.set(Numerics.parse(name))
    return lambda: _CURRENT.reset(token)


# ---- the GPU side of kahan_sum --------------------------------------------------------------

# Device functions of compensated summation, for float and double accumulators. The adds are the
# round-to-nearest intrinsics so that no compiler flag (fast math, FMA contraction) can
# reassociate away the error term. kahan_merge combines two threads' (sum, compensation) pairs:
# the sums add with their own error captured, the compensations add plainly.
COMPENSATED_SUM_CUDA = r"""
__device__ __forceinline__ float kahan_plus(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double kahan_plus(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float kahan_minus(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double kahan_minus(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float kahan_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double kahan_abs(double a) { return fabs(a); }
// s + x into s; what the add rounded off into c (Neumaier: subtract from the larger magnitude)
template <typename T> __device__ __forceinline__ void kahan_add(T& s, T& c, T x) {
    const T t = kahan_plus(s, x);
    const T lost = kahan_abs(s) >= kahan_abs(x) ? kahan_plus(kahan_minus(s, t), x) : kahan_plus(kahan_minus(x, t), s);
    c = kahan_plus(c, lost);
    s = t;
}
template <typename T> __device__ __forceinline__ void kahan_merge(T& s, T& c, T s2, T c2) {
    kahan_add(s, c, s2);
    c = kahan_plus(c, c2);
}
// the sum with its compensation; a sum gone infinite or NaN stays as plain summation gives it
// (an infinity's compensation is inf - inf)
template <typename T> __device__ __forceinline__ T kahan_total(T s, T c) {
    return kahan_minus(s, s) == T(0) ? kahan_plus(s, c) : s;     // s - s is 0 exactly when s is finite
}
"""


# ---- the CPU side of kahan_sum --------------------------------------------------------------

# Steps of the vectorised walk: the reduced axis is cut into this many slices at most, and each
# step adds one slice to per-lane (sum, compensation) pairs across every output at once.
_MAX_STEPS = 512


def _two_sum_error(s: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """What t = s + x lost (Neumaier: subtract from the larger magnitude, so it is exact)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.abs(s) >= np.abs(x), (s - t) + x, (x - t) + s)


def _is_real_float(dtype: np.dtype) -> bool:
    try:
        d = DType.parse(dtype)
    except TesseraError:
        return False
    return d.is_float and not d.is_complex


def compensated_sum(x: np.ndarray, axis: int | tuple[int, ...] | None = None,
                    keepdims: bool = False) -> np.ndarray:
    """Sum of `x` over `axis` with Kahan-Babuska (Neumaier) compensation, in x's float precision.

    16- and 32-bit floats accumulate in float32 (the GPU kernels' accumulator), float64 in
    float64; the result has x's dtype. Integers sum exactly as numpy does. Infinities and NaNs
    come out as plain summation gives them.

    >>> x = np.array([1.0, 1e8, 1.0, -1e8] * 1000, dtype=np.float32)
    >>> float(x.sum()), float(compensated_sum(x))
    (0.0, 2000.0)
    """
    x = np.asarray(x)
    if not _is_real_float(x.dtype):
        return np.sum(x, axis=axis, keepdims=keepdims)
    axes = tuple(range(x.ndim)) if axis is None else \
        tuple(sorted(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis)))
    acc = np.float64 if x.dtype == np.float64 else np.float32
    kept = [d for i, d in enumerate(x.shape) if i not in axes]
    n = math.prod(x.shape[a] for a in axes)
    rows = np.moveaxis(x, axes, tuple(range(len(axes)))).reshape(n, math.prod(kept)).astype(acc)

    lanes = max(1, math.ceil(n / _MAX_STEPS))
    steps = math.ceil(n / lanes) if n else 0
    padded = np.zeros((steps * lanes, rows.shape[1]), acc)
    padded[:n] = rows
    blocks = padded.reshape(steps, lanes, rows.shape[1])
    s = np.zeros((lanes, rows.shape[1]), acc)
    c = np.zeros_like(s)
    with np.errstate(invalid="ignore", over="ignore"):
        for block in blocks:                       # per lane, in order: the running Neumaier sum
            t = s + block
            c += _two_sum_error(s, block, t)
            s = t
        while s.shape[0] > 1:                      # lanes merge pairwise as (sum, compensation)
            if s.shape[0] % 2:
                s = np.concatenate([s, np.zeros_like(s[:1])])
                c = np.concatenate([c, np.zeros_like(c[:1])])
            h = s.shape[0] // 2
            t = s[:h] + s[h:]
            c = c[:h] + c[h:] + _two_sum_error(s[:h], s[h:], t)
            s = t
        total = np.where(np.isfinite(s[0]), s[0] + c[0], s[0])
    out = total.astype(x.dtype).reshape(kept)
    if keepdims:
        out = out.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
    return out
