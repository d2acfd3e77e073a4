"""gemm_pre_act ops for the CPU emulator: a product writing its pre-activation and its activation,
on each GEMM path; and gated_gemm ops, a product times its gate."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.linalg import read_as
from tessera_rw.codegen.kernel_op import KernelOp
from tests.codegen.ragged_ops import of

BF16, F16, F32, E4M3 = DType.bfloat16, DType.float16, DType.float32, DType.float8_e4m3


def pre_act(a, b, dtype, out, activation, trans_a=False, trans_b=False, bias=None, **attrs) -> KernelOp:
    """A gemm_pre_act of the product a @ b (shapes as read; operands stored transposed as asked)."""
    extra = () if bias is None else (TensorType(bias, out),)
    stored = read_as(TensorType(a, dtype), trans_a), read_as(TensorType(b, dtype), trans_b)
    base = dict(scale=1.0, has_bias=bias is not None, accum_dtype=None, dtype=out, trans_a=trans_a, trans_b=trans_b)
    return of("gemm_pre_act", *stored, *extra, activation=activation, **(base | attrs))


def _pre_act_ops() -> dict[str, KernelOp]:
    """Products keeping their pre-activation beside the activation, on each path: mma.sync, SIMT with an
    odd N (element stores), batched with a scale, sm_90's wgmma, fp8."""
    return {
        "gemm pre_act bias gelu 160x256x96 bf16": pre_act((160, 96), (96, 256), BF16, BF16, "gelu", bias=(256,)),
        "gemm pre_act relu 101x103x99 f32 simt": pre_act((101, 99), (99, 103), F32, F32, "relu", bias=(103,)),
        "gemm pre_act tt silu batched f16 scale": pre_act((2, 64, 128), (128, 96), F16, F16, "silu", True, True,
                                                          scale=0.5),
        "gemm pre_act wgmma tn long k gelu_tanh bf16": pre_act((72, 520), (520, 136), BF16, BF16, "gelu_tanh",
                                                              trans_a=True),
        "gemm pre_act fp8 nt bias gelu e4m3 -> bf16": pre_act((128, 128), (128, 256), E4M3, BF16, "gelu",
                                                             trans_b=True, bias=(256,)),
    }


def gated(a, b, dtype, out, gate, activation="none", trans_a=False, trans_b=False, bias=None, **attrs) -> KernelOp:
    """A gated_gemm of the product a @ b times a gate of shape `gate` (in the output's dtype)."""
    extra = (() if bias is None else (TensorType(bias, out),)) + (TensorType(gate, out),)
    stored = read_as(TensorType(a, dtype), trans_a), read_as(TensorType(b, dtype), trans_b)
    base = dict(scale=1.0, has_bias=bias is not None, accum_dtype=None, dtype=out, trans_a=trans_a, trans_b=trans_b)
    return of("gated_gemm", *stored, *extra, activation=activation, **(base | attrs))


def _gated_ops() -> dict[str, KernelOp]:
    """Products times their gate: SwiGLU's up projection (Wᵀ stored [N, K]) on mma.sync, a gate
    broadcast over rows on SIMT with an odd N, batched with a bias and an activation, sm_90's wgmma."""
    return {
        "gated gemm nt bf16": gated((160, 96), (96, 256), BF16, BF16, (160, 256), trans_b=True),
        "gated gemm row gate f32 simt": gated((101, 99), (99, 103), F32, F32, (1, 103)),
        "gated gemm batched bias silu f16": gated((2, 64, 128), (128, 96), F16, F16, (2, 64, 96), "silu",
                                                  bias=(96,), scale=0.5),
        "gated gemm wgmma tn long k bf16": gated((72, 520), (520, 136), BF16, BF16, (72, 136), trans_a=True),
    }


PRE_ACT_OPS = _pre_act_ops() | _gated_ops()
