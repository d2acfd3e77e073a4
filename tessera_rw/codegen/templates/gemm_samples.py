"""The GEMM template's samples: the kinds of product its kernels are checked and calibrated on
(plain and batched matmuls, epilogues, activation derivatives, kept pre-activations, gated products,
bias gradients, transposed operands, ragged rows, tf32 and fp8), each at sizes a GPU check covers."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.linalg import matmul_dims, read_as
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.gemm_problem import FP8_DTYPES


def _mm(a, b, dtype, numerics=Numerics.DEFAULT) -> KernelOp:
    ta, tb = TensorType(a, dtype), TensorType(b, dtype)
    batch, m, n, _ = matmul_dims(a, b)
    return KernelOp.of("matmul", (ta, tb), TensorType(batch + (m, n), dtype), accum_dtype=None, numerics=numerics)


def _gemm(a, b, dtype, out, extra=(), trans_a=False, trans_b=False, **attrs) -> KernelOp:
    # an operand stored transposed is the product's operand with its last two axes swapped back
    ta, tb = read_as(TensorType(a, dtype), trans_a), read_as(TensorType(b, dtype), trans_b)
    batch, m, n, _ = matmul_dims(a, b)
    base = dict(scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
                dtype=out, trans_a=trans_a, trans_b=trans_b)
    return KernelOp.of("gemm", (ta, tb, *extra), TensorType(batch + (m, n), out), **(base | attrs))


def _pre_act(a, b, dtype, activation, bias=None, **attrs) -> KernelOp:
    # the product's pre-activation and its activation, stacked
    batch, m, n, _ = matmul_dims(a, b)
    base = dict(scale=1.0, activation=activation, has_bias=bias is not None, accum_dtype=None, dtype=dtype)
    ops = (TensorType(a, dtype), TensorType(b, dtype), *(() if bias is None else (TensorType(bias, dtype),)))
    return KernelOp.of("gemm_pre_act", ops, TensorType((2, *batch, m, n), dtype), **(base | attrs))


def _gated(a, b, dtype, gate, **attrs) -> KernelOp:
    # the product times a gate of the output's dtype (SwiGLU's up projection times silu of the gate's)
    batch, m, n, _ = matmul_dims(a, b)
    base = dict(scale=1.0, activation="none", has_bias=False, accum_dtype=None, dtype=dtype, trans_a=False,
                trans_b=False)
    ops = (TensorType(a, dtype), TensorType(b, dtype), TensorType(gate, dtype))
    return KernelOp.of("gated_gemm", ops, TensorType((*batch, m, n), dtype), **(base | attrs))


def _bias_grad(m, k, n, dtype, numerics=Numerics.DEFAULT, trans_a=False) -> KernelOp:
    return KernelOp.of("matmul_bias_grad", (read_as(TensorType((m, k), dtype), trans_a), TensorType((k, n), dtype)),
                       TensorType((m + 1, n), dtype), accum_dtype=None, numerics=numerics, trans_a=trans_a)


def gemm_samples() -> tuple[KernelOp, ...]:
    bf, f16, f32 = DType.bfloat16, DType.float16, DType.float32
    e4m3, e5m2 = FP8_DTYPES
    mm, gemm, pre_act, gated, bias_grad = _mm, _gemm, _pre_act, _gated, _bias_grad
    return (
        mm((4096, 4096), (4096, 4096), bf),
        gemm((2048, 1024), (1024, 4096), bf, bf, (TensorType((4096,), bf),), has_bias=True,
             activation="gelu"),
        gemm((1024, 2048), (2048, 1024), f16, f32, (TensorType((1024, 1024), f32),), has_residual=True,
             scale=0.5),
        mm((8, 512, 64), (64, 512), bf),
        mm((1024, 1024), (1024, 1024), f32),
        mm((1000, 1000), (1000, 1000), bf),
        mm((1001, 999), (999, 1003), bf),    # rows not 16-byte aligned: element-wise loads
        mm((4096, 4096), (4096, 4096), f32, Numerics.FAST),     # tf32 tensor cores
        mm((1000, 1000), (1000, 1000), f32, Numerics.FAST),     # tf32, partial tiles through cp.async
        mm((4, 1001, 999), (999, 1003), f32, Numerics.FAST),    # tf32, ragged rows: element-wise loads
        gemm((2048, 1024), (1024, 768), f32, f32, (TensorType((768,), f32),), has_bias=True,
             activation="gelu_tanh", numerics=Numerics.FAST),  # tf32 with an epilogue
        # activation derivatives of a backward pass, reading the pre-activation
        gemm((2048, 768), (768, 3072), bf, bf, (TensorType((2048, 3072), bf),), activation="dgelu"),
        gemm((4, 256, 512), (512, 384), f16, f16, (TensorType((4, 256, 384), f16),), activation="dsilu"),
        gemm((1000, 1000), (1000, 1000), f32, f32, (TensorType((1000, 1000), f32),), activation="drelu"),
        gemm((1024, 512), (512, 1024), f32, f32, (TensorType((1024, 1024), f32),), activation="dgelu_tanh",
             numerics=Numerics.FAST),
        # a layer's pre-activation kept for its backward pass: an MLP's, on SIMT with an odd N, batched
        pre_act((2048, 1024), (1024, 4096), bf, "gelu", bias=(4096,)),
        pre_act((500, 777), (777, 301), f32, "relu", bias=(301,)),
        pre_act((4, 256, 512), (512, 384), f16, "silu", scale=0.5),
        # gated units' up projections, times the gate: an LLaMA MLP's, and on SIMT with an odd N
        gated((2048, 1024), (1024, 4096), bf, (2048, 4096)),
        gated((500, 777), (777, 301), f32, (500, 301)),
        # bias gradients: the ones row alone in the last tile row (768 = 6 x 128), in the middle
        # of a ragged tile with element-wise loads, on SIMT, and in tf32; small enough that the
        # GPU check's reference covers every row (kernel_check subsets big products by rows of A)
        bias_grad(768, 1024, 1024, bf),
        bias_grad(1000, 999, 1003, f16),
        bias_grad(500, 777, 300, f32),
        bias_grad(1024, 512, 1024, f32, Numerics.FAST),
        # transposed operands, read in place: a backward pass's dX = dY Wᵀ (with an activation
        # derivative) and dW = Xᵀ dY (with the bias gradient), on each path and with ragged rows
        gemm((2048, 768), (768, 3072), bf, bf, (TensorType((2048, 3072), bf),), activation="dgelu", trans_b=True),
        bias_grad(768, 2048, 3072, bf, trans_a=True),
        gemm((4, 256, 512), (512, 384), f16, f16, trans_a=True, trans_b=True),
        gemm((1001, 999), (999, 1003), bf, f32, trans_a=True),
        bias_grad(1000, 999, 1003, f16, trans_a=True),
        gemm((1000, 1000), (1000, 1000), f32, f32, trans_a=True, numerics=Numerics.FAST),
        gemm((1024, 512), (512, 1024), f32, f32, trans_b=True, numerics=Numerics.FAST),
        bias_grad(500, 777, 300, f32, trans_a=True),
        gemm((3, 300, 200), (200, 500), f32, f32, trans_a=True, trans_b=True),
        # fp8 (sm_89+): B stored [N, K] is read as it lies (cuBLASLt's only fp8 layout); stored
        # [K, N] or A stored [K, M], it is transposed through registers; ragged rows byte by byte
        gemm((4096, 4096), (4096, 4096), e4m3, bf, trans_b=True),
        gemm((2048, 1024), (1024, 4096), e4m3, bf, (TensorType((4096,), bf),), has_bias=True, activation="gelu"),
        gemm((4, 512, 256), (256, 384), e5m2, f32, trans_a=True, scale=0.25),
        gemm((1001, 999), (999, 1003), e4m3, bf, trans_b=True),
        gemm((1001, 999), (999, 1003), e4m3, f16, trans_a=True, trans_b=True),
    )

