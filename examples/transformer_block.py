"""A pre-norm GPT-style transformer block, written as plain tensor math.

    x = x + attention(layernorm(x))        # causal multi-head self-attention
    x = x + mlp(layernorm(x))              # gelu MLP, 4× wide

Nothing here is hand-fused. tessera_rw finds the fusions itself:

- each projection's bias (and the MLP's gelu) runs in its matmul's epilogue: one `gemm` kernel;
- softmax(q kᵀ · scale + causal mask) v becomes one `flash_attention` kernel;
- the first residual add runs as the second layernorm's prologue, and the last one together with
  the down projection's bias in a single elementwise kernel.

    tessera-rewrite --explain examples/transformer_block.py:transformer_block --run
    python examples/transformer_block.py    # small inputs, checked against the numpy version below
"""

import sys

import ml_dtypes
import numpy as np
from scipy.special import erf

from tessera_rw import op

HEAD_DIM = 64           # GPT-2's; the number of heads is the model width over this


@op.kernel
def transformer_block(x, ln1_w, ln1_b, w_qkv, b_qkv, w_out, b_out, ln2_w, ln2_b, w_up, b_up, w_down, b_down):
    batch, seq, width = x.shape
    heads = width // HEAD_DIM

    # -- attention ----------------------------------------------------------------------------------
    h = op.layernorm(x, ln1_w, ln1_b)
    qkv = h @ w_qkv + b_qkv                                          # (batch, seq, 3·width)
    # split the last axis into (q|k|v, head, head_dim) and bring each head's rows together:
    # (3, batch, heads, seq, head_dim)
    qkv = op.transpose(op.reshape(qkv, (batch, seq, 3, heads, HEAD_DIM)), (2, 0, 3, 1, 4))
    q, k, v = qkv[0], qkv[1], qkv[2]

    keep = op.tril(op.ones((seq, seq), dtype="bool"))                 # token i sees tokens 0..i
    scores = op.where(keep, (q @ k.mT) * (HEAD_DIM ** -0.5), -np.inf)
    a = op.softmax(scores, axis=-1) @ v                              # (batch, heads, seq, head_dim)

    a = op.reshape(op.transpose(a, (0, 2, 1, 3)), (batch, seq, width))   # merge the heads again
    x = x + (a @ w_out + b_out)

    # -- MLP --------------------------------------------------------------------------------------------
    h = op.layernorm(x, ln2_w, ln2_b)
    h = op.gelu(h @ w_up + b_up)
    return x + (h @ w_down + b_down)


def parameter_shapes(batch, seq, width):
    """Every parameter's shape, by name (the MLP is 4× the model width)."""
    return {"x": (batch, seq, width),
            "ln1_w": (width,), "ln1_b": (width,),
            "w_qkv": (width, 3 * width), "b_qkv": (3 * width,),
            "w_out": (width, width), "b_out": (width,),
            "ln2_w": (width,), "ln2_b": (width,),
            "w_up": (width, 4 * width), "b_up": (4 * width,),
            "w_down": (4 * width, width), "b_down": (width,)}


def example_inputs():
    """GPT-2 small's block (width 768, 12 heads) on 4 sequences of 512 tokens, in bf16, with values at a
    trained model's scale (so `--run` checks numerics a real model would see)."""
    params = random_parameters(np.random.default_rng(0), batch=4, seq=512, width=768)
    return {name: value.astype(ml_dtypes.bfloat16) for name, value in params.items()}


# ---- the same block in plain numpy -------------------------------------------------------------------

def layernorm_reference(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def transformer_block_reference(x, ln1_w, ln1_b, w_qkv, b_qkv, w_out, b_out, ln2_w, ln2_b, w_up, b_up,
                                w_down, b_down):
    """float64 numpy (x is promoted, so everything after it is), one head at a time."""
    x = np.asarray(x, np.float64)
    seq, width = x.shape[-2:]
    h = layernorm_reference(x, ln1_w, ln1_b)
    q, k, v = np.split(h @ w_qkv + b_qkv, 3, axis=-1)
    causal = np.tril(np.ones((seq, seq), bool))
    heads = []
    for i in range(width // HEAD_DIM):
        cols = slice(i * HEAD_DIM, (i + 1) * HEAD_DIM)
        s = q[..., cols] @ np.swapaxes(k[..., cols], -1, -2) / np.sqrt(HEAD_DIM)
        s = np.where(causal, s, -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        heads.append(e / e.sum(axis=-1, keepdims=True) @ v[..., cols])
    x = x + np.concatenate(heads, axis=-1) @ w_out + b_out
    u = layernorm_reference(x, ln2_w, ln2_b) @ w_up + b_up
    return x + (0.5 * u * (1 + erf(u / np.sqrt(2)))) @ w_down + b_down


# ---- checking the kernel against it ----------------------------------------------------------------

TOLERANCE = 1e-3        # float32 inputs; the error is measured relative to the output's largest value


def random_parameters(rng, batch, seq, width):
    """float32 values at the scale a trained model keeps them: weights ~ 1/√fan_in, so the attention
    logits stay O(1) (unit-variance weights would make every softmax row nearly one-hot)."""
    params = {}
    for name, shape in parameter_shapes(batch, seq, width).items():
        scale = 1 / np.sqrt(shape[0]) if name.startswith("w_") else 0.1 if name != "x" else 1.0
        params[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    params["ln1_w"] += 1
    params["ln2_w"] += 1
    return params


def max_relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    """Run the block on a small model (2 heads) on the GPU if there is one, else the numpy executor."""
    params = random_parameters(np.random.default_rng(0), batch=2, seq=64, width=128)
    error = max_relative_error(transformer_block(**params), transformer_block_reference(**params))
    ok = error < TOLERANCE
    print(f"{transformer_block.name:18s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
