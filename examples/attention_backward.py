"""The gradients of causal attention by `op.grad`: FlashAttention-2's backward, found by rewriting.

Reverse mode turns softmax(QKᵀ/√d) V into products that hold three Sq×Sk matrices (P, dP, dS).
The `gradient` ruleset recognizes them and reads dQ, dK and dV off one `flash_attention_bwd` node
that recomputes P tile by tile from each row's logsumexp (`attention_row_stats`), which the
forward writes beside its output (`flash_attention_lse`), so the chosen plan is three kernels
(the forward, the row statistics read off it, the backward) storing nothing Sq×Sk, with the three
gradients views of one output buffer.

    tessera-rewrite --explain examples/attention_backward.py --run     # the fusion trace
    python examples/attention_backward.py          # small inputs, checked against numpy
"""

import sys

import numpy as np

from tessera_rw import op


def attention_loss(q, k, v, w):
    """Σ attention(q, k, v) ∘ w: its gradient in q, k, v is the backward pass for an output gradient w."""
    return op.sum(op.flash_attention(q, k, v, causal=True) * w)


attention_grads = op.grad(attention_loss, argnums=(0, 1, 2))


def example_inputs():
    """What `tessera-rewrite --explain` traces with: 2 sequences of 1024 tokens, 8 heads of 64, bf16."""
    return {name: op.tensor((2, 8, 1024, 64), "bf16") for name in ("q", "k", "v", "w")}


# ---- checking the gradients against plain numpy -----------------------------------------------------

TOLERANCE = 1e-3        # float32 inputs; the error is measured relative to each gradient's largest value


def attention_grads_reference(q, k, v, w):
    """dQ, dK, dV in float64 numpy, the obvious way (every score in memory)."""
    q, k, v, w = (np.asarray(a, np.float64) for a in (q, k, v, w))
    scale = q.shape[-1] ** -0.5
    s = np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), bool)), q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = w @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ w


def main() -> int:
    """Run the gradient kernel on small random inputs (on the GPU if there is one, else the numpy executor)."""
    rng = np.random.default_rng(0)
    q, k, v, w = (rng.standard_normal((2, 4, 128, 32)).astype(np.float32) for _ in range(4))
    got = attention_grads(q, k, v, w)
    want = attention_grads_reference(q, k, v, w)
    error = max(float(np.max(np.abs(g - r)) / np.max(np.abs(r))) for g, r in zip(got, want))
    ok = error < TOLERANCE
    print(f"{attention_grads.name:22s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
