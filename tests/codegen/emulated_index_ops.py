"""take and index_add ops for the CPU emulator: an embedding's lookup and gradient, an inner axis, a
ragged run, int64 indices, slices wider than a block's sums hold (split into strips), and an axis
shorter than the indices' range (indices ±[1, 100)), whose out-of-range indices take zeros and add
nothing."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_op import KernelOp
from tests.codegen.ragged_ops import of

BF16, F32, I32, I64 = DType.bfloat16, DType.float32, DType.int32, DType.int64


def take(x: tuple[int, ...], indices: tuple[int, ...], axis: int, dtype=BF16, index=I32) -> KernelOp:
    return of("take", TensorType(x, dtype), TensorType(indices, index), axis=axis)


def index_add(g: tuple[int, ...], indices: tuple[int, ...], axis: int, size: int, dtype=BF16, index=I32) -> KernelOp:
    return of("index_add", TensorType(g, dtype), TensorType(indices, index), axis=axis, size=size)


INDEX_OPS: dict[str, KernelOp] = {
    "take embedding rows bf16": take((500, 64), (4, 33), 0),
    "take int64 indices f32": take((300, 24), (70,), 0, F32, I64),
    "take inner axis ragged f32": take((5, 200, 3), (37,), 1, F32),
    "take from a short axis (out of range: zeros)": take((60, 16), (90,), 0),
    "index_add embedding gradient bf16": index_add((4, 33, 64), (4, 33), 0, 500),
    "index_add int64 indices f32": index_add((70, 24), (70,), 0, 300, F32, I64),
    "index_add inner axis ragged f32": index_add((5, 37, 3), (37,), 1, 200, F32),
    "index_add into a short axis (out of range: dropped)": index_add((90, 16), (90,), 0, 60),
    "index_add of wide slices, each row in strips": index_add((6, 12288), (6,), 0, 120),
}
