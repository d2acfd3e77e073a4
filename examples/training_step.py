"""A training step's gradients: `op.value_and_grad` of a pre-norm GPT block's loss.

    h = x + attention(layernorm(x))        # causal, the heads split off one q|k|v projection
    y = h + mlp(layernorm(h))              # gelu (tanh form), 4× wide
    loss = Σ y ∘ target

Reverse mode writes the backward graph from each op's VJP; the `gradient` ruleset then fuses it:

- attention's backward is FlashAttention-2's: the forward writes each row's logsumexp beside O, the
  row statistics are read off it, one `flash_attention_bwd` kernel writes dQ, dK, dV;
- a layer norm's input gradient (the second's: the first's input is x, whose gradient is not
  asked for) is one `norm_backward_stats` row kernel (the statistics recomputed from its input in
  registers), which also adds the residual branch's cotangent as it writes dx and writes the row
  statistics its weight gradient reads (rows of 4096 and more would have it sum the weight's and
  bias's gradients itself, `norm_backward_grads`);
- the weight-gradient gemms write the bias gradients as an extra row (`bias_grad`) where that is
  cheaper than a separate sum, and gelu′ runs in the epilogue of the gemm that writes its cotangent;
- q, k and v, cut from one projection and moved to heads, are one copy each; their cotangents,
  moved back, are joined into the projection's gradient by one copy.

    tessera-rewrite --explain examples/training_step.py:block_loss_and_grads
    python examples/training_step.py        # small inputs, checked by finite differences in numpy
"""

import sys

import numpy as np

from tessera_rw import op

HEAD_DIM = 64
PARAMETERS = ("ln1_w", "ln1_b", "w_qkv", "b_qkv", "w_out", "b_out", "ln2_w", "ln2_b", "w_up", "b_up",
              "w_down", "b_down")


def block_loss(params, x, target):
    """Σ block(x) ∘ target for a pre-norm GPT block whose parameters are the dict `params`."""
    p = params
    batch, seq, width = x.shape
    heads = width // HEAD_DIM
    qkv = op.layernorm(x, p["ln1_w"], p["ln1_b"]) @ p["w_qkv"] + p["b_qkv"]
    qkv = op.reshape(qkv, (batch, seq, 3, heads, HEAD_DIM))
    q, k, v = (op.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))     # (batch, heads, seq, head_dim)
    a = op.flash_attention(q, k, v, causal=True)
    h = x + op.reshape(op.transpose(a, (0, 2, 1, 3)), (batch, seq, width)) @ p["w_out"] + p["b_out"]
    up = op.gelu(op.layernorm(h, p["ln2_w"], p["ln2_b"]) @ p["w_up"] + p["b_up"], approximate="tanh")
    y = h + up @ p["w_down"] + p["b_down"]
    return op.sum(y * target)


block_loss_and_grads = op.value_and_grad(block_loss, argnums=0)


def parameter_shapes(width: int) -> dict[str, tuple[int, ...]]:
    return {"ln1_w": (width,), "ln1_b": (width,), "w_qkv": (width, 3 * width), "b_qkv": (3 * width,),
            "w_out": (width, width), "b_out": (width,), "ln2_w": (width,), "ln2_b": (width,),
            "w_up": (width, 4 * width), "b_up": (4 * width,), "w_down": (4 * width, width), "b_down": (width,)}


def example_inputs():
    """GPT-2 small's width (768, 12 heads) over 4 sequences of 1024 tokens, in bf16."""
    batch, seq, width = 4, 1024, 768
    params = {name: op.tensor(shape, "bf16") for name, shape in parameter_shapes(width).items()}
    return {"params": params, "x": op.tensor((batch, seq, width), "bf16"),
            "target": op.tensor((batch, seq, width), "bf16")}


# ---- the same loss in plain numpy, and the check -------------------------------------------------------

def _layernorm(x, w, b, eps=1e-5):
    centered = x - x.mean(-1, keepdims=True)
    return centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps) * w + b


def block_loss_reference(params, x, target) -> float:
    """The loss in float64 numpy."""
    p = {name: np.asarray(v, np.float64) for name, v in params.items()}
    x, target = np.asarray(x, np.float64), np.asarray(target, np.float64)
    batch, seq, width = x.shape
    heads = width // HEAD_DIM
    qkv = (_layernorm(x, p["ln1_w"], p["ln1_b"]) @ p["w_qkv"] + p["b_qkv"]).reshape(batch, seq, 3, heads, HEAD_DIM)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    scores = np.where(np.tril(np.ones((seq, seq), bool)), q @ k.transpose(0, 1, 3, 2) * HEAD_DIM ** -0.5, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    a = (e / e.sum(-1, keepdims=True)) @ v
    h = x + a.transpose(0, 2, 1, 3).reshape(batch, seq, width) @ p["w_out"] + p["b_out"]
    pre = _layernorm(h, p["ln2_w"], p["ln2_b"]) @ p["w_up"] + p["b_up"]
    up = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre ** 3)))
    return float(np.sum((h + up @ p["w_down"] + p["b_down"]) * target))


TOLERANCE = 2e-3        # float32 gradients against float64 central differences, relative to each
PROBES = 3              # parameter's largest gradient; coordinates of each parameter checked


def random_parameters(rng: np.random.Generator, width: int) -> dict[str, np.ndarray]:
    """float32 values; weights ~ 1/√fan_in, layer-norm weights near 1, as at initialization."""
    params = {}
    for name, shape in parameter_shapes(width).items():
        value = rng.standard_normal(shape)
        scale = 1 / np.sqrt(shape[0]) if len(shape) == 2 else 0.1
        params[name] = ((1.0 if name.endswith("_w") else 0.0) + scale * value).astype(np.float32)
    return params


def finite_difference_error(params, x, target, grads, rng: np.random.Generator) -> float:
    """The largest difference between a gradient and a float64 central difference of the numpy
    loss, relative to the parameter's largest gradient, over PROBES random coordinates of each."""
    wide = {name: v.astype(np.float64) for name, v in params.items()}
    worst = 0.0
    for name in PARAMETERS:
        for _ in range(PROBES):
            index = tuple(int(rng.integers(n)) for n in wide[name].shape)
            bumped = [{**wide, name: wide[name].copy()} for _ in range(2)]
            bumped[0][name][index] += 1e-6
            bumped[1][name][index] -= 1e-6
            numeric = (block_loss_reference(bumped[0], x, target) - block_loss_reference(bumped[1], x, target)) / 2e-6
            worst = max(worst, abs(numeric - float(grads[name][index])) / np.abs(grads[name]).max())
    return worst


def main() -> int:
    """The loss and gradients of 2 sequences of 16 tokens, width 128 (2 heads), in float32, on the
    GPU if there is one, else the numpy executor, against the float64 numpy loss."""
    rng = np.random.default_rng(0)
    params = random_parameters(rng, width=128)
    x, target = (rng.standard_normal((2, 16, 128)).astype(np.float32) for _ in range(2))
    value, grads = block_loss_and_grads(params, x, target)
    want = block_loss_reference(params, x, target)
    loss_error = abs(float(value) - want) / max(1.0, abs(want))
    error = finite_difference_error(params, x, target, {n: np.asarray(g) for n, g in grads.items()}, rng)
    ok = loss_error < 1e-4 and error < TOLERANCE
    print(f"{block_loss_and_grads.name:22s} loss {float(value):.4f} (numpy {want:.4f}), gradients against "
          f"finite differences: max error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
