"""A LLaMA decoder block written as HF transformers writes it, dtype handling included.

    x = x + o_proj(attention(rms_norm(x)))      # GQA: 8 query heads share each key/value head
    x = x + down(silu(gate(h)) · up(h))         # h = rms_norm(x), SwiGLU with separate weights

Model code is careful with dtypes, and every care is a pass of its own when run as written: the
RMS norm upcasts x to float32 and casts x̂ back before its weight; the causal mask is built in
float32 with finfo.min above the diagonal, given two leading dims of 1 (`mask[None, None]`) and
added to bf16 scores, which promotes them; the softmax runs in float32 and is cast back; K and V
are repeated for their query heads (`repeat_kv`). tessera_rw sees through all of it:

- each RMS norm is one row kernel (`rmsnorm`), however it was spelled;
- the attention is one causal `strided_attention` kernel: the mask is the `causal` flag (it is never
  built), K and V are read once per key/value head, q, k and v where their projections wrote them,
  and the output where o_proj reads it;
- one of the MLP's two projections multiplies by the other's result in its epilogue, after silu of
  its own product (a `gated_gemm`): the MLP launches no elementwise kernel.

By the cost model on an H100, at the example's inputs: 10 kernels and 1,029.6 µs, against 18 kernels
and 1,427.5 µs with attention left unfused, and 33 kernels and 2,700.2 µs with nothing fused.

    tessera-rewrite --explain examples/llama_block.py --run
    python examples/llama_block.py    # small inputs, checked against the numpy version below
"""

import sys

import ml_dtypes
import numpy as np

from tessera_rw import op

HEAD_DIM = 64
GROUPS = 8              # query heads per key/value head
EPS = 1e-6


def rms_norm(x, w):                                  # HF's LlamaRMSNorm.forward
    h = op.cast(x, "float32")
    variance = op.mean(h ** 2, axis=-1, keepdims=True)
    h = h * op.rsqrt(variance + EPS)
    return w * op.cast(h, x.dtype)


def repeat_kv(x, groups):                            # HF's repeat_kv: (B, Hkv, S, D) -> (B, Hkv·groups, S, D)
    b, h, s, d = x.shape
    return op.reshape(op.broadcast_to(op.reshape(x, (b, h, 1, s, d)), (b, h, groups, s, d)), (b, h * groups, s, d))


@op.kernel
def llama_block(x, attn_norm, w_q, w_k, w_v, w_o, mlp_norm, w_gate, w_up, w_down):
    batch, seq, width = x.shape
    heads, kv_heads = width // HEAD_DIM, width // HEAD_DIM // GROUPS

    # -- attention ----------------------------------------------------------------------------------
    h = rms_norm(x, attn_norm)
    q = op.transpose(op.reshape(h @ w_q.T, (batch, seq, heads, HEAD_DIM)), (0, 2, 1, 3))
    k = op.transpose(op.reshape(h @ w_k.T, (batch, seq, kv_heads, HEAD_DIM)), (0, 2, 1, 3))
    v = op.transpose(op.reshape(h @ w_v.T, (batch, seq, kv_heads, HEAD_DIM)), (0, 2, 1, 3))
    mask = op.triu(op.full((seq, seq), float(np.finfo(np.float32).min)), 1)[None, None]
    scores = (q @ repeat_kv(k, GROUPS).mT) * (HEAD_DIM ** -0.5) + mask
    probs = op.cast(op.softmax(op.cast(scores, "float32"), axis=-1), q.dtype)
    a = op.reshape(op.transpose(probs @ repeat_kv(v, GROUPS), (0, 2, 1, 3)), (batch, seq, width))
    x = x + a @ w_o.T

    # -- MLP ------------------------------------------------------------------------------------------
    h = rms_norm(x, mlp_norm)
    return x + (op.silu(h @ w_gate.T) * (h @ w_up.T)) @ w_down.T


def parameter_shapes(batch, seq, width, ffn):
    """Every parameter's shape, by name (weights stored [out, in], as torch's Linear keeps them)."""
    kv_width = width // GROUPS
    return {"x": (batch, seq, width), "attn_norm": (width,),
            "w_q": (width, width), "w_k": (kv_width, width), "w_v": (kv_width, width), "w_o": (width, width),
            "mlp_norm": (width,), "w_gate": (ffn, width), "w_up": (ffn, width), "w_down": (width, ffn)}


def random_parameters(rng, batch, seq, width, ffn):
    """float32 values at a trained model's scale: weights ~ 1/√fan_in, norm weights near 1."""
    params = {}
    for name, shape in parameter_shapes(batch, seq, width, ffn).items():
        scale = 1 / np.sqrt(shape[-1]) if name.startswith("w_") else 1.0
        params[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    for name in ("attn_norm", "mlp_norm"):
        params[name] = 1 + 0.1 * params[name]
    return params


def example_inputs():
    """A LLaMA-2-7B-wide block with 4 key/value heads (width 4096, 32 heads, FFN 11008) on 2 sequences
    of 1024 tokens, in bf16."""
    params = random_parameters(np.random.default_rng(0), batch=2, seq=1024, width=4096, ffn=11008)
    return {name: value.astype(ml_dtypes.bfloat16) for name, value in params.items()}


# ---- the same block in plain numpy -------------------------------------------------------------------

def llama_block_reference(x, attn_norm, w_q, w_k, w_v, w_o, mlp_norm, w_gate, w_up, w_down):
    """float64 numpy, one query head at a time."""
    def norm(v, w):
        return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + EPS) * w

    x = np.asarray(x, np.float64)
    seq, width = x.shape[-2:]
    h = norm(x, attn_norm)
    q, k, v = h @ w_q.T, h @ w_k.T, h @ w_v.T
    causal = np.tril(np.ones((seq, seq), bool))
    heads = []
    for i in range(width // HEAD_DIM):
        kv = slice(i // GROUPS * HEAD_DIM, (i // GROUPS + 1) * HEAD_DIM)
        s = q[..., i * HEAD_DIM:(i + 1) * HEAD_DIM] @ np.swapaxes(k[..., kv], -1, -2) / np.sqrt(HEAD_DIM)
        e = np.exp(np.where(causal, s, -np.inf) - s.max(axis=-1, keepdims=True))
        heads.append(e / e.sum(axis=-1, keepdims=True) @ v[..., kv])
    x = x + np.concatenate(heads, axis=-1) @ w_o.T
    h = norm(x, mlp_norm)
    gate = h @ w_gate.T
    return x + (gate / (1 + np.exp(-gate)) * (h @ w_up.T)) @ w_down.T


# ---- checking the kernel against it ----------------------------------------------------------------

TOLERANCE = 2e-2        # bf16 inputs; the error is measured relative to the output's largest value


def main() -> int:
    """Run the block on a small model (16 query heads, 2 key/value heads) in bf16 on the GPU if there
    is one, else on the numpy executor."""
    params = random_parameters(np.random.default_rng(0), batch=2, seq=64, width=1024, ffn=256)
    narrow = {name: value.astype(ml_dtypes.bfloat16) for name, value in params.items()}
    want = llama_block_reference(**{name: value.astype(np.float64) for name, value in narrow.items()})
    got = np.asarray(llama_block(**narrow), np.float64)
    error = float(np.abs(got - want).max() / np.abs(want).max())
    ok = error < TOLERANCE
    print(f"{llama_block.name:18s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
