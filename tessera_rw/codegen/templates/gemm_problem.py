"""A GEMM-kind op in the terms its kernels use: batch, M, N, K, operand layouts, dtypes, epilogue.

GemmTemplate (gemm.py) decides with it and the emitters (gemm_mma_cuda.py, gemm_simt_cuda.py) spell
kernels from it, so both read an op the same way. M, N and K are the product's: a transposed
operand (`trans_a`: A stored [..., K, M]) is described as the product reads it, and `a_stride` /
`b_stride` give the length of a stored row.

>>> from tessera_rw.algebra.dtypes import DType
>>> a, b = TensorType((768, 2048), DType.bfloat16), TensorType((768, 3072), DType.bfloat16)
>>> op = KernelOp.of("matmul_bias_grad", (a, b), TensorType((2049, 3072), DType.bfloat16), accum_dtype=None,
...                  trans_a=True)
>>> p = GemmProblem.of(op)
>>> (p.m, p.n, p.k, p.a_rows, p.a_stride, p.layout)
(2049, 3072, 768, 2048, 2048, 'tn')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.fused_gemm import epilogue_operands
from tessera_rw.algebra.ops.linalg import matmul_dims, read_as
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics

FP8_DTYPES = (DType.float8_e4m3, DType.float8_e5m2)
TENSOR_CORE_DTYPES = (DType.bfloat16, DType.float16, *FP8_DTYPES)
CP_ASYNC_BYTES = 16            # one cp.async moves 16 bytes: rows must start 16-byte aligned


@dataclass(frozen=True)
class GemmProblem:
    batch: tuple[int, ...]
    a_batch: tuple[int, ...]
    b_batch: tuple[int, ...]
    m: int
    n: int
    k: int
    in_dtype: DType
    out_dtype: DType
    scale: float
    activation: str
    bias: TensorType | None
    residual: TensorType | None
    aux: TensorType | None = None   # the pre-activation a derivative activation reads
    tf32: bool = False          # fp32 operands on tensor cores (the `fast` policy)
    bias_grad: bool = False     # a virtual row of ones under A: m counts it, a_rows does not
    trans_a: bool = False       # A stored [K, M]: rows of the stored array run along M
    trans_b: bool = False       # B stored [N, K]
    keep_pre: bool = False      # C holds the pre-activation, then the activation one product further on
    gate: bool = False          # `residual` is a gate the epilogue multiplies by (gated_gemm), not adds

    @staticmethod
    def of(op: KernelOp) -> GemmProblem:
        at = op.attr_map
        trans_a, trans_b = bool(at.get("trans_a")), bool(at.get("trans_b"))
        a, b = read_as(op.operands[0], trans_a), read_as(op.operands[1], trans_b)
        batch, m, n, k = matmul_dims(a.shape, b.shape)
        activation = at.get("activation", "none")
        gate = op.op == "gated_gemm"
        extra = dict(zip(epilogue_operands(at.get("has_bias"), activation, at.get("has_residual") or gate),
                         op.operands[2:]))
        bias_grad = op.op == "matmul_bias_grad"
        return GemmProblem(batch, a.shape[:-2], b.shape[:-2], m + bias_grad, n, k, a.dtype, op.result.dtype,
                           float(at.get("scale", 1.0)), activation, extra.get("bias"), extra.get("residual"),
                           extra.get("aux"), tf32=a.dtype is DType.float32 and op.numerics is Numerics.FAST,
                           bias_grad=bias_grad, trans_a=trans_a, trans_b=trans_b, keep_pre=op.op == "gemm_pre_act",
                           gate=gate)

    @property
    def a_rows(self) -> int:
        """Rows of A in the product's terms (m less the ones row of a bias-gradient product)."""
        return self.m - self.bias_grad

    @property
    def a_stride(self) -> int:
        """Elements per stored row of A: K, or M (a_rows) when A is stored transposed."""
        return self.a_rows if self.trans_a else self.k

    @property
    def b_stride(self) -> int:
        """Elements per stored row of B: N, or K when B is stored transposed."""
        return self.k if self.trans_b else self.n

    @property
    def layout(self) -> str:
        """BLAS's spelling of the operand layouts: 'n' as the product reads it, 't' transposed."""
        return ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")

    @property
    def fp8(self) -> bool:
        """8-bit float operands (mma.sync m16n8k32, sm_89 and newer)."""
        return self.in_dtype in FP8_DTYPES

    @property
    def stage_a(self) -> bool:
        """Whether A goes through registers to be transposed on its way to shared memory: an fp8
        operand must reach the mma with k contiguous, and ldmatrix transposes only 16-bit elements."""
        return self.fp8 and self.trans_a

    @property
    def stage_b(self) -> bool:
        """Whether B goes through registers to be transposed (fp8 B stored [K, N])."""
        return self.fp8 and not self.trans_b

    @property
    def a_k_major(self) -> bool:
        """Whether A's shared tile holds k contiguous ([BM][BK]), as its fragments are read."""
        return not self.trans_a or self.stage_a

    @property
    def b_k_major(self) -> bool:
        """Whether B's shared tile holds k contiguous ([BN][BK])."""
        return self.trans_b or self.stage_b

    def stride_aligned(self, stride: int) -> bool:
        """Whether stored rows of `stride` elements each start 16-byte aligned."""
        return stride * self.in_dtype.itemsize % CP_ASYNC_BYTES == 0

    @property
    def rows_aligned(self) -> bool:
        """Whether every stored row that cp.async copies (of A and B, less those staged through
        registers) starts 16-byte aligned, as cp.async needs."""
        return ((self.stage_a or self.stride_aligned(self.a_stride))
                and (self.stage_b or self.stride_aligned(self.b_stride)))

    @property
    def nbatch(self) -> int:
        return math.prod(self.batch)

    def tiles(self, bm: int, bn: int) -> int:
        """Output tiles of bm x bn over every batch: a flat grid's blocks, or a persistent one's walk."""
        return -(-self.m // bm) * -(-self.n // bn) * self.nbatch

    @property
    def tensor_core(self) -> bool:
        """Whether the product runs on mma.sync (8- and 16-bit operands, or fp32 ones as tf32)."""
        return self.in_dtype in TENSOR_CORE_DTYPES or self.tf32
