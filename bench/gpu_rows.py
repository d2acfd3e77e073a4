"""The rows `python -m bench gpu` times: per kernel, its op, random torch inputs, torch's version of
it, a float64 reference, and its FLOPs and bytes (bench/gpu.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.attention import causal_pairs
from tessera_rw.algebra.ops.multi_output import multi_reduction_attrs
from tessera_rw.codegen.kernel_op import KernelOp

BF16, E4M3 = DType.bfloat16, DType.float8_e4m3


@dataclass(frozen=True)
class Row:
    name: str
    op: KernelOp
    make: Callable[[], tuple]                 # random torch inputs, in operand order
    torch_fn: Callable[..., Any]              # the library's version, on the same inputs
    reference: Callable[..., Any]             # float64, on the same inputs
    flops: float
    bytes: float
    compiled: tuple[int, int, int] | None = None    # (M, N, K) of a torch.compile comparison


def op_of(name: str, *operands: TensorType, **attrs) -> KernelOp:
    """A KernelOp of `name` on `operands`, its result inferred: op_of("softmax", x, axis=1)."""
    return KernelOp.of(name, operands, OPS[name].infer(*operands, **attrs), **attrs)


def _torch():
    import torch     # rows are built before anything runs; torch is needed only then
    return torch


def _functional():
    import torch.nn.functional as F
    return F


def _randn(*shape: int):
    torch = _torch()
    return torch.randn(*shape, dtype=torch.bfloat16, device="cuda")


def gemm_row(n: int) -> Row:
    return gemm_shape_row(n, n, n)


def gemm_shape_row(m: int, k: int, n: int) -> Row:
    """[m, k] @ [k, n] in bf16 (a cube is labelled n^3)."""
    a, b = TensorType((m, k), BF16), TensorType((k, n), BF16)
    label = f"{n}^3" if m == k == n else f"{m}x{k}x{n}"
    return Row(f"gemm bf16 {label} vs torch.matmul", op_of("matmul", a, b, accum_dtype=None),
               lambda: (_randn(m, k), _randn(k, n)), lambda x, y: _torch().matmul(x, y),
               lambda x, y: x.double() @ y.double(), 2 * m * k * n, (m * k + k * n + m * n) * 2)


def fp8_gemm_row(n: int) -> Row:
    """e4m3 operands with B stored [N, K] (the layout cuBLASLt's fp8 GEMM and torch._scaled_mm take),
    fp32 accumulation, bf16 out. Its floor is taken at the measured bf16 matmul rate, so fp8 kernels
    on fp8 tensor cores (ours on sm_90's warpgroup MMAs, cuBLASLt's) can pass 100% of it."""
    a = TensorType((n, n), E4M3)
    op = op_of("gemm", a, a, scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
               dtype=BF16, trans_b=True)

    def make():
        torch = _torch()
        return tuple((torch.randn(n, n, device="cuda") / 2).to(torch.float8_e4m3fn) for _ in range(2))

    def scaled_mm(x, w):
        torch = _torch()
        one = torch.ones((), device="cuda", dtype=torch.float32)
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return Row(f"gemm fp8 e4m3 {n}^3 (B as [N,K]) vs torch._scaled_mm", op, make, scaled_mm,
               lambda x, w: x.double() @ w.double().t(), 2 * n ** 3, 2 * n * n + n * n * 2)


def kept_band(s_len: int, window: int, device):
    """The bool mask a causal attention of a sliding window of `window` keys keeps, as torch code builds it."""
    import torch
    ones = torch.ones(s_len, s_len, dtype=torch.bool, device=device)
    return ones.tril() & ~ones.tril(-window)


def attention_reference(q, k, v, causal: bool, window: int = 0):
    """softmax(q kᵀ / sqrt(d)) v in float64, one batch item at a time (the scores of all would not fit)."""
    import torch
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    s_len = q.shape[-2]
    hidden = torch.ones(s_len, s_len, dtype=torch.bool, device=q.device).triu(1) if causal else None
    if window:
        hidden = ~kept_band(s_len, window, q.device)
    for b in range(q.shape[0]):
        s = (q[b].double() @ k[b].double().transpose(-1, -2)) * q.shape[-1] ** -0.5
        if hidden is not None:
            s.masked_fill_(hidden, float("-inf"))
        out[b] = torch.softmax(s, dim=-1) @ v[b].double()
    return out


def attention_row(b: int, h: int, s: int, d: int, causal: bool, window: int = 0) -> Row:
    """Ours against SDPA; under a sliding window SDPA takes the band as a bool mask, as a model
    without a windowed kernel hands it over."""
    q = TensorType((b, h, s, d), BF16)
    op = op_of("flash_attention", q, q, q, scale=d ** -0.5, causal=causal, has_mask=False, window=window)

    def sdpa(q, k, v):
        if window:
            return _functional().scaled_dot_product_attention(q, k, v, attn_mask=kept_band(s, window, q.device))
        return _functional().scaled_dot_product_attention(q, k, v, is_causal=causal)
    shown = (" causal" if causal else "") + (f" window={window}" if window else "")
    return Row(f"flash_attention fwd bf16 B={b} H={h} S={s} D={d}{shown} vs SDPA", op,
               lambda: tuple(_randn(b, h, s, d) for _ in range(3)), sdpa,
               lambda q, k, v: attention_reference(q, k, v, causal, window),
               # the usual count: two products of 2·S·S·D per head over the (query, key) pairs kept
               4 * b * h * d * (causal_pairs(s, s, window) if causal else s * s), 4 * b * h * s * d * 2)


def softmax_row(n: int) -> Row:
    x = TensorType((n, n), BF16)
    return Row(f"softmax bf16 {n}x{n} vs torch.softmax", op_of("softmax", x, axis=1), lambda: (_randn(n, n),),
               lambda x: x.softmax(dim=-1), lambda x: x.double().softmax(dim=-1), 0, 2 * n * n * 2)


def layernorm_row(n: int) -> Row:
    x, w = TensorType((n, n), BF16), TensorType((n,), BF16)
    op = op_of("layernorm", x, w, w, axes=(1,), eps=1e-5, has_weight=True, has_bias=True)
    return Row(f"layernorm bf16 {n}x{n} vs F.layer_norm", op, lambda: (_randn(n, n), _randn(n), _randn(n)),
               lambda x, w, b: _functional().layer_norm(x, (n,), w, b, 1e-5),
               lambda x, w, b: _functional().layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5),
               0, 2 * n * n * 2 + 2 * n * 2)


def cross_entropy_row(n: int, classes: int) -> Row:
    """Each row's cross-entropy against one-hot labels: log_softmax, the product and the row sum in one
    kernel (a reduced_normalization), against torch's with class probabilities as the target."""
    x = TensorType((n, classes), BF16)
    op = op_of("reduced_normalization", x, x, expr="$0", norm="log_softmax", axes=(1,), eps=0.0, has_weight=False,
               has_bias=False, post="neg(mul($0,$1))", reduce="sum", keepdims=False)

    def make():
        torch = _torch()
        labels = _functional().one_hot(torch.randint(0, classes, (n,), device="cuda"), classes)
        return _randn(n, classes), labels.to(torch.bfloat16)
    return Row(f"cross-entropy bf16 {n}x{classes} vs F.cross_entropy", op, make,
               lambda x, y: _functional().cross_entropy(x, y, reduction="none"),
               lambda x, y: -(_torch().log_softmax(x.double(), dim=-1) * y.double()).sum(dim=-1),
               0, 2 * n * classes * 2 + n * 2)


def logsumexp_row(n: int, classes: int) -> Row:
    """Each row's logsumexp in one read (the online softmax statistics), against torch.logsumexp."""
    x = TensorType((n, classes), BF16)
    op = op_of("logsumexp", x, axes=(1,), keepdims=False)
    return Row(f"logsumexp bf16 {n}x{classes} vs torch.logsumexp", op, lambda: (_randn(n, classes),),
               lambda x: _torch().logsumexp(x, dim=-1),
               lambda x: _torch().logsumexp(x.double(), dim=-1),
               0, n * classes * 2 + n * 2)


def embedding_rows(vocab: int, dim: int, tokens: int) -> list[Row]:
    """An embedding's lookup (take) against F.embedding, and its gradient (index_add, one block per
    rows of the table, in index order) against torch's index_add_ into zeros."""
    table, ids = TensorType((vocab, dim), BF16), TensorType((tokens,), DType.int64)
    rows = TensorType((tokens, dim), BF16)

    def ids_of():
        return _torch().randint(0, vocab, (tokens,), device="cuda")

    lookup = Row(f"embedding lookup bf16 {vocab}x{dim}, {tokens} tokens vs F.embedding",
                 op_of("take", table, ids, axis=0), lambda: (_randn(vocab, dim), ids_of()),
                 lambda t, i: _functional().embedding(i, t), lambda t, i: t.double()[i], 0,
                 2 * tokens * dim * 2 + tokens * 8)
    grad = Row(f"embedding gradient bf16 {vocab}x{dim}, {tokens} tokens vs index_add_",
               op_of("index_add", rows, ids, axis=0, size=vocab), lambda: (_randn(tokens, dim), ids_of()),
               lambda g, i: _torch().zeros((vocab, dim), dtype=g.dtype, device="cuda").index_add_(0, i, g),
               lambda g, i: _torch().zeros((vocab, dim), dtype=_torch().float64, device="cuda").index_add_(
                   0, i, g.double()), 0, tokens * dim * 2 + vocab * dim * 2 + tokens * 8)
    return [lookup, grad]


ADAMW = (0.9, 0.999, 1e-3, 1e-2, 1e-8)        # beta1, beta2, lr, weight decay, eps


def adamw_row(n: int) -> Row:
    """An AdamW step (bias correction left out) in fp32, the parameter and both moments written by one
    kernel reading the parameter, gradient and moments once, against torch eager writing the three
    results into one stacked tensor (out=, no copy)."""
    b1, b2, lr, wd, eps = ADAMW
    m_new = f"add(mul($2,{b1}:float32),mul($1,{1 - b1}:float32))"
    v_new = f"add(mul($3,{b2}:float32),mul(mul($1,$1),{1 - b2}:float32))"
    p_new = f"sub(mul($0,{1 - lr * wd}:float32),mul(div({m_new},add(sqrt({v_new}),{eps}:float32)),{lr}:float32))"
    x = TensorType((n, n), DType.float32)
    op = op_of("multi_elementwise", x, x, x, x, exprs=f"{m_new};{v_new};{p_new}")
    out = {}

    def make():
        torch = _torch()
        p, g, m = (torch.randn(n, n, device="cuda") for _ in range(3))
        return p, g, m, torch.rand(n, n, device="cuda")

    def step(p, g, m, v):
        torch = _torch()
        o = out.setdefault("o", torch.empty((3, n, n), device="cuda"))
        torch.add(m * b1, g, alpha=1 - b1, out=o[0])
        torch.add(v * b2, g * g, alpha=1 - b2, out=o[1])
        torch.sub(p * (1 - lr * wd), o[0] / (o[1].sqrt() + eps), alpha=lr, out=o[2])
        return o

    def reference(p, g, m, v):
        p, g, m, v = (t.double() for t in (p, g, m, v))
        m2, v2 = m * b1 + g * (1 - b1), v * b2 + g * g * (1 - b2)
        return _torch().stack((m2, v2, p * (1 - lr * wd) - lr * m2 / (v2.sqrt() + eps)))
    return Row(f"adamw step f32 {n}x{n} vs torch eager into one stacked tensor", op, make, step, reference,
               0, 7 * n * n * 4)


def batch_norm_sums_row(n: int, c: int, hw: int) -> Row:
    """A batch norm's backward through a relu, per channel: Σdy·x̂, Σdy and Σdy·g/σ with
    x̂ = (x − μ)/σ and dy = [x̂·g + b > 0], from one read of x (fp32 NCHW), against torch eager
    computing x̂ and dy and taking the three sums."""
    x_hat = "div(sub($0,$1),$2)"
    dy = f"where(gt(add(mul({x_hat},$3),$4),0.0:float32),1.0:float32,0.0:float32)"
    x, channel = TensorType((n, c, hw, hw), DType.float32), TensorType((1, c, 1, 1), DType.float32)
    operands = (x, channel, channel, channel, channel)
    op = op_of("multi_reduction", *operands, **multi_reduction_attrs(
        *operands, exprs=f"mul({dy},{x_hat});{dy};div(mul({dy},$3),$2)", reduce="sum", axes=(0, 2, 3), keepdims=False))

    def make():
        torch = _torch()
        x = torch.randn(n, c, hw, hw, device="cuda") * 2 + 0.5
        mu, sd = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
        return x, mu, sd, torch.rand(1, c, 1, 1, device="cuda") + 0.5, torch.randn(1, c, 1, 1, device="cuda")

    def sums(x, mu, sd, g, b):
        x_hat = (x - mu) / sd
        dy = (x_hat * g + b > 0).to(x.dtype)
        return _torch().stack([(dy * x_hat).sum((0, 2, 3)), dy.sum((0, 2, 3)), (dy * g / sd).sum((0, 2, 3))])
    return Row(f"batch-norm channel sums f32 {n}x{c}x{hw}x{hw} vs torch eager", op, make, sums,
               lambda *t: sums(*(a.double() for a in t)), 0, n * c * hw * hw * 4)


def max_pool_rows(n: int, c: int, hw: int) -> list[Row]:
    """A ResNet stem's 3×3 max pool, stride 2, padding 1 (bf16 NCHW), against F.max_pool2d, and its
    input gradient (each element visiting the windows that cover it, their picks found again from
    x) against aten's backward from the indices torch's forward saved."""
    window = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), dilation=(1, 1), ceil_mode=False)
    x = TensorType((n, c, hw, hw), BF16)
    pooled = OPS["max_pool2d"].infer(x, **window)
    side = pooled.shape[-1]
    saved = {}

    def pool(x):
        return _functional().max_pool2d(x, 3, 2, 1)

    def make_grad():
        x, g = _randn(n, c, hw, hw), _randn(n, c, side, side)
        saved["indices"] = _functional().max_pool2d(x, 3, 2, 1, return_indices=True)[1]
        return x, g

    def backward(x, g):
        return _torch().ops.aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False,
                                                                  saved["indices"])
    forward = Row(f"max_pool2d 3x3/2 pad 1 bf16 {n}x{c}x{hw}x{hw} vs F.max_pool2d", op_of("max_pool2d", x, **window),
                  lambda: (_randn(n, c, hw, hw),), pool, lambda x: pool(x.double()), 0, x.nbytes + pooled.nbytes)
    grad = Row(f"max_pool2d gradient bf16 {n}x{c}x{hw}x{hw} vs aten's backward from saved indices",
               op_of("max_pool2d_grad", x, pooled, **window), make_grad, backward,
               lambda x, g: backward(x.double(), g.double()), 0, 2 * x.nbytes + pooled.nbytes)
    return [forward, grad]


def epilogue_row(m: int, n: int, k: int) -> Row:
    a, b, bias = TensorType((m, k), BF16), TensorType((k, n), BF16), TensorType((n,), BF16)
    op = op_of("gemm", a, b, bias, scale=1.0, activation="gelu", has_bias=True, has_residual=False,
             accum_dtype=None, dtype=BF16)
    return Row(f"gemm+bias+gelu bf16 {m}x{n}x{k} vs torch matmul, +bias, gelu", op,
               lambda: (_randn(m, k), _randn(k, n), _randn(n)),
               lambda a, b, bias: _functional().gelu(_torch().matmul(a, b) + bias),
               lambda a, b, bias: _functional().gelu(a.double() @ b.double() + bias.double()),
               2 * m * n * k, (m * k + k * n + n + m * n) * 2, compiled=(m, n, k))


def rows(quick: bool) -> list[Row]:
    found = [gemm_row(4096)] + ([] if quick else [gemm_row(8192)]) + [fp8_gemm_row(4096)]
    found += [attention_row(4, 16, 4096, d, causal) for d in (64, 128) for causal in (False, True)]
    found += [attention_row(4, 16, 4096, 128, True, window=1024)]
    return found + [softmax_row(8192), layernorm_row(8192), cross_entropy_row(4096, 32000),
                    logsumexp_row(4096, 32000), adamw_row(4096), *embedding_rows(50257, 768, 8192),
                    batch_norm_sums_row(32, 64, 56), *max_pool_rows(32, 64, 112), epilogue_row(4096, 4096, 4096)]
