"""Ops whose sizes are multiples of no tile, vector width or warp: the shapes where predicated edges,
partial tiles and scalar tails are exercised. Built like the templates' samples, from operand types
and each op's own shape inference.

>>> print(RAGGED["matmul 77x129x63 bf16"].result)
bf16[77,129]
>>> {op.op for op in RAGGED.values()} >= {"conv1d", "flash_attention", "matmul", "softmax", "transpose"}
True
"""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.kernel_op import KernelOp

BF16, F32 = DType.bfloat16, DType.float32


def of(name: str, *operands: TensorType, **attrs) -> KernelOp:
    """A KernelOp of `name` on `operands`, its result type inferred by the op's declaration."""
    return KernelOp.of(name, operands, OPS[name].infer(*operands, **attrs), **attrs)


def matmul(a: tuple[int, ...], b: tuple[int, ...], dtype: DType) -> KernelOp:
    return of("matmul", TensorType(a, dtype), TensorType(b, dtype), accum_dtype=None)


def gemm_bias_gelu(m: int, n: int, k: int, dtype: DType) -> KernelOp:
    a, b, bias = TensorType((m, k), dtype), TensorType((k, n), dtype), TensorType((n,), dtype)
    return of("gemm", a, b, bias, scale=1.0, activation="gelu", has_bias=True, has_residual=False,
              accum_dtype=None, dtype=dtype)


def attention(b: int, h: int, s: int, d: int, dtype: DType, causal: bool) -> KernelOp:
    q = TensorType((b, h, s, d), dtype)
    return of("flash_attention", q, q, q, scale=d ** -0.5, causal=causal, has_mask=False)


def rowwise(name: str, rows: int, cols: int, dtype: DType) -> KernelOp:
    x, w = TensorType((rows, cols), dtype), TensorType((cols,), dtype)
    if name == "softmax":
        return of("softmax", x, axis=1)
    params = (w, w) if name == "layernorm" else (w,)
    return of(name, x, *params, axes=(1,), eps=1e-5, has_weight=True, has_bias=name == "layernorm")


def reduce(name: str, shape: tuple[int, ...], dtype: DType, axes: tuple[int, ...]) -> KernelOp:
    return of(name, TensorType(shape, dtype), axes=axes, keepdims=False)


def conv1d(x: tuple[int, ...], w: tuple[int, ...], dtype: DType, padding: tuple[int, int], groups: int = 1) -> KernelOp:
    return of("conv1d", TensorType(x, dtype), TensorType(w, dtype), stride=(1,), padding=(padding,),
              dilation=(1,), groups=groups)


ELEMENTS = 1_000_003     # a prime: no vector width divides it

RAGGED: dict[str, KernelOp] = {
    "matmul 77x129x63 bf16": matmul((77, 63), (63, 129), BF16),
    "matmul 77x129x63 f32": matmul((77, 63), (63, 129), F32),
    "matmul batched broadcast 3x1x65x33 @ 33x70 bf16": matmul((3, 1, 65, 33), (33, 70), BF16),
    "gemm bias gelu 77x129x63 bf16": gemm_bias_gelu(77, 129, 63, BF16),
    "attention S=200 D=64 bf16": attention(2, 4, 200, 64, BF16, causal=False),
    "attention S=200 D=64 causal bf16": attention(2, 4, 200, 64, BF16, causal=True),
    "softmax rows of 1000 bf16": rowwise("softmax", 64, 1000, BF16),
    "softmax rows of 8191 f32": rowwise("softmax", 16, 8191, F32),
    "layernorm rows of 1000 bf16": rowwise("layernorm", 64, 1000, BF16),
    "layernorm rows of 8191 f32": rowwise("layernorm", 16, 8191, F32),
    "rmsnorm rows of 1000 f32": rowwise("rmsnorm", 64, 1000, F32),
    "rmsnorm rows of 8191 bf16": rowwise("rmsnorm", 16, 8191, BF16),
    "sum rows of 1001 f32": reduce("sum", (37, 1001), F32, (1,)),
    "max columns of 999 bf16": reduce("max", (999, 33), BF16, (0,)),
    "mean middle axis of 1023 f32": reduce("mean", (5, 1023, 7), F32, (1,)),
    "add 1000003 bf16": of("add", TensorType((ELEMENTS,), BF16), TensorType((ELEMENTS,), BF16)),
    "gelu 1000003 f32": of("gelu", TensorType((ELEMENTS,), F32), approximate="none"),
    "transpose 333x517 bf16": of("transpose", TensorType((333, 517), BF16), axes=(1, 0)),
    "transpose 333x517 f32": of("transpose", TensorType((333, 517), F32), axes=(1, 0)),
    "conv1d L=1001 bf16": conv1d((2, 16, 1001), (32, 16, 5), BF16, (2, 2)),
    "conv1d L=1001 f32": conv1d((2, 16, 1001), (32, 16, 5), F32, (2, 2)),
    "conv1d depthwise causal L=1001 bf16": conv1d((2, 64, 1001), (64, 1, 7), BF16, (6, 0), groups=64),
}
