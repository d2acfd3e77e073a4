"""Model graphs the benchmarks trace: a BERT-base encoder and a GPT-style decoder stack.

Weights of all layers are stacked along a leading layer axis (as scanned models store them), so a
model is one kernel with a handful of named inputs whatever its depth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw import op


@dataclass(frozen=True)
class TransformerShape:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    batch: int = 8
    seq: int = 512
    dtype: str = "bf16"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


BERT_BASE = TransformerShape()
GPT_48 = TransformerShape(layers=48, hidden=1024, heads=16, ffn=4096, batch=4, seq=1024)


def _attention(h, wqkv, bqkv, mask, cfg: TransformerShape, causal: bool):
    b, s, d = h.shape
    qkv = (h @ wqkv + bqkv).reshape(b, s, 3, cfg.heads, cfg.head_dim)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))      # (B, H, S, Dh)
    scores = (q @ k.mT) / math.sqrt(cfg.head_dim)
    if causal:
        scores = op.where(op.tril(op.ones((s, s), "bool")), scores, -math.inf)
    else:
        scores = scores + mask
    ctx = op.softmax(scores, axis=-1) @ v
    return ctx.transpose(0, 2, 1, 3).reshape(b, s, d)


def encoder_layer(x, mask, w, i: int, cfg: TransformerShape):
    """Post-norm BERT layer: attention, residual + layernorm, GELU MLP, residual + layernorm."""
    a = _attention(x, w["wqkv"][i], w["bqkv"][i], mask, cfg, causal=False)
    h = op.layernorm(x + a @ w["wo"][i] + w["bo"][i], w["ln1_g"][i], w["ln1_b"][i])
    f = op.gelu(h @ w["w1"][i] + w["b1"][i]) @ w["w2"][i] + w["b2"][i]
    return op.layernorm(h + f, w["ln2_g"][i], w["ln2_b"][i])


def decoder_layer(x, w, i: int, cfg: TransformerShape):
    """Pre-norm GPT layer with causal attention."""
    a = _attention(op.layernorm(x, w["ln1_g"][i], w["ln1_b"][i]), w["wqkv"][i], w["bqkv"][i], None, cfg, causal=True)
    h = x + a @ w["wo"][i] + w["bo"][i]
    f = op.gelu(op.layernorm(h, w["ln2_g"][i], w["ln2_b"][i]) @ w["w1"][i] + w["b1"][i], approximate="tanh")
    return h + f @ w["w2"][i] + w["b2"][i]


def weight_shapes(cfg: TransformerShape) -> dict[str, tuple[int, ...]]:
    L, d, f = cfg.layers, cfg.hidden, cfg.ffn
    return {"wqkv": (L, d, 3 * d), "bqkv": (L, 3 * d), "wo": (L, d, d), "bo": (L, d),
            "ln1_g": (L, d), "ln1_b": (L, d), "w1": (L, d, f), "b1": (L, f), "w2": (L, f, d), "b2": (L, d),
            "ln2_g": (L, d), "ln2_b": (L, d)}


def bert_encoder(cfg: TransformerShape = BERT_BASE) -> op.Kernel:
    @op.kernel
    def bert(x, mask, wqkv, bqkv, wo, bo, ln1_g, ln1_b, w1, b1, w2, b2, ln2_g, ln2_b):
        w = dict(wqkv=wqkv, bqkv=bqkv, wo=wo, bo=bo, ln1_g=ln1_g, ln1_b=ln1_b, w1=w1, b1=b1, w2=w2, b2=b2,
                 ln2_g=ln2_g, ln2_b=ln2_b)
        for i in range(cfg.layers):
            x = encoder_layer(x, mask, w, i, cfg)
        return x
    return bert


def gpt_stack(cfg: TransformerShape = GPT_48) -> op.Kernel:
    @op.kernel
    def gpt(x, wqkv, bqkv, wo, bo, ln1_g, ln1_b, w1, b1, w2, b2, ln2_g, ln2_b):
        w = dict(wqkv=wqkv, bqkv=bqkv, wo=wo, bo=bo, ln1_g=ln1_g, ln1_b=ln1_b, w1=w1, b1=b1, w2=w2, b2=b2,
                 ln2_g=ln2_g, ln2_b=ln2_b)
        for i in range(cfg.layers):
            x = decoder_layer(x, w, i, cfg)
        return x
    return gpt


def placeholders(cfg: TransformerShape, with_mask: bool) -> dict[str, op.tensor]:
    inputs = {"x": op.tensor((cfg.batch, cfg.seq, cfg.hidden), cfg.dtype)}
    if with_mask:
        inputs["mask"] = op.tensor((cfg.batch, 1, 1, cfg.seq), cfg.dtype)
    return inputs | {n: op.tensor(s, cfg.dtype) for n, s in weight_shapes(cfg).items()}


# ---- the other model graphs of the CPU benchmark ---------------------------------------------------------

def hyena_block(batch: int = 4, seq: int = 8192, width: int = 768, dtype: str = "float32"):
    """A Hyena-style gated long convolution (the filter as long as the sequence), as in
    examples/hyena_conv.py; returns (kernel, placeholders)."""
    @op.kernel
    def hyena(x, w_in, b_in, filt, skip, w_out, b_out):
        u = op.transpose(x @ w_in + b_in, (0, 2, 1))
        v, g1, g2 = u[:, :width], u[:, width:2 * width], u[:, 2 * width:]
        z = g1 * v
        y = op.conv1d(z, filt, padding=(seq - 1, 0), groups=width)
        return op.transpose(g2 * (y + skip * z), (0, 2, 1)) @ w_out + b_out
    shapes = {"x": (batch, seq, width), "w_in": (width, 3 * width), "b_in": (3 * width,), "filt": (width, 1, seq),
              "skip": (width, 1), "w_out": (width, width), "b_out": (width,)}
    return hyena, {n: op.tensor(s, dtype) for n, s in shapes.items()}


def resnet_stack(blocks: int = 4, batch: int = 32, channels: int = 64, size: int = 56, dtype: str = "bf16"):
    """ResNet basic blocks (3x3 conv, bias, relu, 3x3 conv, bias, residual, relu) over NCHW activations,
    per-block weights stacked on a leading axis; returns (kernel, placeholders)."""
    @op.kernel
    def resnet(x, w1, b1, w2, b2):
        for i in range(blocks):
            h = op.relu(op.conv2d(x, w1[i], padding=1) + b1[i])
            x = op.relu(op.conv2d(h, w2[i], padding=1) + b2[i] + x)
        return x
    c = channels
    bias = (blocks, c, 1, 1)
    shapes = {"x": (batch, c, size, size), "w1": (blocks, c, c, 3, 3), "b1": bias, "w2": (blocks, c, c, 3, 3),
              "b2": bias}
    return resnet, {n: op.tensor(s, dtype) for n, s in shapes.items()}


def resnet_training_step(batch: int = 32, channels: int = 64, size: int = 56, dtype: str = "bf16"):
    """The gradients of a ResNet basic block's squared error with respect to its input and every
    weight (`op.grad`); returns (kernel, placeholders)."""
    def loss(x, w1, b1, w2, b2, target):
        h = op.relu(op.conv2d(x, w1, padding=1) + b1)
        return op.sum((op.relu(op.conv2d(h, w2, padding=1) + b2 + x) - target) ** 2)
    c, bias = channels, (channels, 1, 1)
    shapes = {"x": (batch, c, size, size), "w1": (c, c, 3, 3), "b1": bias, "w2": (c, c, 3, 3), "b2": bias,
              "target": (batch, c, size, size)}
    return op.grad(loss, argnums=(0, 1, 2, 3, 4)), {n: op.tensor(s, dtype) for n, s in shapes.items()}


def mlp_backward(tokens: int = 8192, width: int = 1024, hidden: int = 4096, dtype: str = "bf16"):
    """The gradients (weights and biases) of a pre-norm GELU MLP's squared-error loss, by `op.grad`;
    returns (kernel, placeholders)."""
    def loss(x, g, w1, b1, w2, b2):
        y = op.gelu(op.layernorm(x, g, None) @ w1 + b1) @ w2 + b2
        return op.sum(y * y) * 0.5
    shapes = {"x": (tokens, width), "g": (width,), "w1": (width, hidden), "b1": (hidden,), "w2": (hidden, width),
              "b2": (width,)}
    return op.grad(loss, argnums=(2, 3, 4, 5)), {n: op.tensor(s, dtype) for n, s in shapes.items()}


GPT2_SMALL_BLOCK = TransformerShape(layers=1, hidden=768, heads=12, ffn=3072, batch=4, seq=1024)


def gpt_training_step(cfg: TransformerShape = GPT2_SMALL_BLOCK):
    """A training step's loss and its gradient for every weight (`op.value_and_grad` over the dict
    of weights) of the GPT decoder stack, the loss Σ y ∘ target as in examples/training_step.py;
    returns (kernel, placeholders)."""
    def loss(w, x, target):
        for i in range(cfg.layers):
            x = decoder_layer(x, w, i, cfg)
        return op.sum(x * target)
    activation = (cfg.batch, cfg.seq, cfg.hidden)
    weights = {n: op.tensor(s, cfg.dtype) for n, s in weight_shapes(cfg).items()}
    return op.value_and_grad(loss, argnums=0), {"w": weights, "x": op.tensor(activation, cfg.dtype),
                                                "target": op.tensor(activation, cfg.dtype)}
