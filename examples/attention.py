"""Scaled dot-product attention written the plain way; tessera_rw recognizes it as flash attention."""

import numpy as np

from tessera_rw import op


@op.kernel
def attention(q, k, v):
    s = (q @ k.mT) * (q.shape[-1] ** -0.5)
    return op.softmax(s, axis=-1) @ v


@op.kernel
def causal_attention(q, k, v):
    seq = q.shape[-2]
    keep = op.tril(op.ones((seq, seq), dtype="bool"))
    s = op.where(keep, (q @ k.mT) / np.sqrt(q.shape[-1]), -np.inf)
    return op.softmax(s, axis=-1) @ v


def example_inputs():
    shape = (4, 16, 2048, 64)
    return {name: op.tensor(shape, "bf16") for name in ("q", "k", "v")}
