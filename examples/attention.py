"""Scaled dot-product attention written the plain way; tessera_rw recognizes it as flash attention.

No kernel mentions flash attention: the e-graph rewrites softmax(q kᵀ · scale [+ mask]) v into a
single `flash_attention` kernel that never writes the (seq × seq) score matrix to memory, and the
cost model picks it over the unfused matmul → softmax → matmul program.

    tessera-rewrite --explain examples/attention.py:causal_attention --run   # the fusion trace
    python examples/attention.py                    # the kernels on small inputs, checked against numpy
"""

import sys

import ml_dtypes
import numpy as np

from tessera_rw import op


@op.kernel
def attention(q, k, v):
    s = (q @ k.mT) * (q.shape[-1] ** -0.5)
    return op.softmax(s, axis=-1) @ v


@op.kernel
def causal_attention(q, k, v):
    # Written differently on purpose: dividing by √d instead of scaling, and a boolean lower-triangular
    # mask through `where`. The rules normalize both, so this also becomes one flash_attention kernel
    # (with causal=True: the masked half of the scores is skipped, not computed and thrown away).
    seq = q.shape[-2]
    keep = op.tril(op.ones((seq, seq), dtype="bool"))
    s = op.where(keep, (q @ k.mT) / np.sqrt(q.shape[-1]), -np.inf)
    return op.softmax(s, axis=-1) @ v


@op.kernel
def sliding_window_attention(q, k, v):
    # Local attention as Mistral's transformers code writes it: each query sees its last seq/4 keys,
    # the band built from two triangles and the rest filled with bf16's most negative value rather
    # than −∞. The rules read the band as flash_attention(causal=True, window=seq/4): the kernel
    # loads only the key blocks that meet each query block's band, and the mask is never built.
    seq = q.shape[-2]
    ones = op.ones((seq, seq), dtype="bool")
    keep = op.tril(ones) & ~op.tril(ones, k=-(seq // 4))
    s = op.where(keep, (q @ k.mT) / np.sqrt(q.shape[-1]), float(ml_dtypes.finfo(ml_dtypes.bfloat16).min))
    return op.softmax(s, axis=-1) @ v


def example_inputs():
    """What `tessera-rewrite --explain` traces with: 4 sequences of 2048 tokens, 16 heads of 64, bf16."""
    shape = (4, 16, 2048, 64)
    return {name: op.tensor(shape, "bf16") for name in ("q", "k", "v")}


# ---- checking the kernels against plain numpy ------------------------------------------------------

TOLERANCE = 1e-3        # float32 inputs; the error is measured relative to the output's largest value


def attention_reference(q, k, v, causal=False, window=None):
    """The same math in float64 numpy, the obvious way (the whole score matrix in memory); a
    window (with causal) keeps each query's last `window` keys."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        seq = q.shape[-2]
        keep = np.tril(np.ones((seq, seq), bool))
        if window:
            keep &= ~np.tril(np.ones((seq, seq), bool), k=-window)
        s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def max_relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    """Run the kernels on small random inputs (on the GPU if there is one, else the numpy executor)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 128, 32)).astype(np.float32) for _ in range(3))
    failures = 0
    for kernel, causal, window in ((attention, False, None), (causal_attention, True, None),
                                   (sliding_window_attention, True, 128 // 4)):
        error = max_relative_error(kernel(q, k, v), attention_reference(q, k, v, causal, window))
        ok = error < TOLERANCE
        failures += not ok
        print(f"{kernel.name:24s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
