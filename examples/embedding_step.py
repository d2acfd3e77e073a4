"""An embedding's training step: the lookup, a cross-entropy against the next token through a tied
output projection, the table's gradient, and the AdamW update, in one program.

    x = table[tokens]                          # take: a copy kernel reading the rows it takes
    loss = cross_entropy(x @ tableᵀ, next)     # one row kernel over the logits, then the mean
    g = ∂loss/∂table                           # index_add (rows summed in index order) + the gemm's share
    m, v, table = adamw(table, g, m, v)        # one kernel writing all three (multi_elementwise)

    tessera-rewrite --explain examples/embedding_step.py:embedding_step
    python examples/embedding_step.py          # small inputs, checked against numpy in float64
"""

import sys

import numpy as np
from scipy.special import log_softmax

from tessera_rw import op

BETA1, BETA2, LR, EPS = 0.9, 0.999, 1e-3, 1e-8


def loss(table, tokens, following):
    logits = table[tokens] @ table.T
    return op.cross_entropy(logits, following)


@op.kernel
def embedding_step(table, m, v, tokens, following):
    value, g = op.value_and_grad(loss)(table, tokens, following)
    m = BETA1 * m + (1 - BETA1) * g
    v = BETA2 * v + (1 - BETA2) * g * g
    return value, table - LR * m / (op.sqrt(v) + EPS), m, v


def example_inputs():
    """GPT-2's vocabulary and width, 512 tokens, the table and its moments in float32."""
    table = op.tensor((50257, 768), "float32")
    return {"table": table, "m": table, "v": table, "tokens": op.tensor((512,), "int32"),
            "following": op.tensor((512,), "int32")}


def reference(table, m, v, tokens, following):
    """The same step in float64 numpy."""
    table, m, v = (np.asarray(a, np.float64) for a in (table, m, v))
    x = table[tokens]
    logp = log_softmax(x @ table.T, axis=-1)
    n = len(tokens)
    dlogits = (np.exp(logp) - np.eye(table.shape[0])[following]) / n
    g = dlogits.T @ x
    np.add.at(g, tokens, dlogits @ table)
    m = BETA1 * m + (1 - BETA1) * g
    v = BETA2 * v + (1 - BETA2) * g * g
    return -logp[np.arange(n), following].mean(), table - LR * m / (np.sqrt(v) + EPS), m, v


def main() -> int:
    """A vocabulary of 300, width 64, 40 tokens (some repeated), float32, on the GPU if there is
    one, else the numpy executor, against the float64 numpy step."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((300, 64)) * 0.1).astype(np.float32)
    m = (rng.standard_normal((300, 64)) * 1e-3).astype(np.float32)
    v = rng.random((300, 64)).astype(np.float32) * 1e-4
    tokens = rng.integers(0, 300, 40).astype(np.int32)
    tokens[:5] = 7
    following = rng.integers(0, 300, 40).astype(np.int32)
    got = embedding_step(table, m, v, tokens, following)
    want = reference(table, m, v, tokens, following)
    error = max(float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))
                for a, b in zip(got, want))
    ok = error < 1e-4
    print(f"{'embedding_step':22s} loss {float(got[0]):.4f} (numpy {want[0]:.4f}), step against numpy: "
          f"max error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
