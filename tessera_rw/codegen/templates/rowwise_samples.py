"""RowwiseTemplate's sample problems, the ones its register model is fit to and its tests compile."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics


def rowwise_samples() -> tuple[KernelOp, ...]:
    """The row kernels' sample problems: each walk (a warp or a block per row, resident or looped),
    each norm, a fused prologue and epilogue, a strided view, and the kahan_sum policy's paths."""
    bf, f32, kahan = DType.bfloat16, DType.float32, Numerics.KAHAN_SUM
    x = TensorType((8192, 8192), bf)
    ln = TensorType((4096, 768), bf)
    w = TensorType((768,), bf)
    rms = TensorType((4096, 4096), bf)
    short = TensorType((4096, 512), f32)
    long_row = TensorType((64, 65536), f32)
    mask = TensorType((1, 512), f32)
    fused_attrs = dict(expr="add(mul($0,$1),$2)", norm="softmax", axes=(1,), eps=0.0, has_weight=False,
                       has_bias=False, post="$0")
    scale = TensorType((), f32)
    fused_ln = dict(expr="add($0,$1)", norm="layernorm", axes=(1,), eps=1e-5, has_weight=True, has_bias=True,
                    post="mul($0,sigmoid($1))")
    hid = TensorType((4096, 768), bf)
    return (
        KernelOp.of("softmax", (x,), x, axis=1),                                   # long rows, block per row
        KernelOp.of("log_softmax", (short,), short, axis=1),                       # short rows, warp per row
        KernelOp.of("layernorm", (ln, w, w), ln, axes=(1,), eps=1e-5, has_weight=True, has_bias=True),
        KernelOp.of("rmsnorm", (rms, TensorType((4096,), bf)), rms, axes=(1,), eps=1e-6, has_weight=True,
                    has_bias=False),
        KernelOp.of("softmax", (long_row,), long_row, axis=1),                     # looped: row > registers
        KernelOp.of("fused_normalization", (short, scale, mask), short, **fused_attrs),   # scale + mask prologue
        KernelOp.of("fused_normalization", (hid, hid, w, w, hid), hid, **fused_ln),      # residual -> LN -> gate
        KernelOp.of("layernorm", (TensorType((2048, 65536), bf),), TensorType((2048, 65536), bf), axes=(1,),
                    eps=1e-5, has_weight=False, has_bias=False),                  # looped three-pass
        # QK-norm: k's heads RMS-normalized where a q|k|v projection wrote them (a strided view)
        KernelOp.of("strided_normalization", (TensorType((4, 512, 2304), bf), TensorType((64,), bf)),
                    TensorType((4, 12, 512, 64), bf), expr="$0", norm="rmsnorm", axes=(3,), eps=1e-6,
                    has_weight=True, has_bias=False, post="$0", shape=(4, 12, 512, 64),
                    strides=(512 * 2304, 64, 2304, 1), offsets=(768,)),
        # kahan_sum: the same paths with compensated statistics
        KernelOp.of("softmax", (x,), x, axis=1, numerics=kahan),
        KernelOp.of("log_softmax", (short,), short, axis=1, numerics=kahan),
        KernelOp.of("layernorm", (ln, w, w), ln, axes=(1,), eps=1e-5, has_weight=True, has_bias=True,
                    numerics=kahan),
        KernelOp.of("rmsnorm", (rms, TensorType((4096,), bf)), rms, axes=(1,), eps=1e-6, has_weight=True,
                    has_bias=False, numerics=kahan),
        KernelOp.of("softmax", (long_row,), long_row, axis=1, numerics=kahan),
        KernelOp.of("layernorm", (long_row,), long_row, axes=(1,), eps=1e-5, has_weight=False,
                    has_bias=False, numerics=kahan),
    )
