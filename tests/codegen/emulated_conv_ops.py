"""The convolution ops the emulator runs: each family of the direct convolution (tensor-core and SIMT
implicit GEMM, split K, depthwise sliding window) plain and with a fused epilogue (bias, residual,
activation, broadcast inputs), at emulator sizes."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.conv_epilogue import with_epilogue
from tessera_rw.codegen.templates.conv_problem import conv_op, strided_conv_op, swapped_leading

BF16, F16, F32 = DType.bfloat16, DType.float16, DType.float32


def _plain() -> dict[str, KernelOp]:
    return {
        "conv1d 3-tap bf16": conv_op((2, 64, 256), (64, 64, 3), BF16, padding=((1, 1),)),
        "conv1d grouped f32": conv_op((2, 64, 128), (128, 16, 5), F32, padding=((2, 2),), groups=4),
        "conv2d 3x3 bf16": conv_op((1, 32, 16, 16), (64, 32, 3, 3), BF16, padding=((1, 1), (1, 1))),
        "conv2d 3x3 stride 2 f32": conv_op((2, 16, 14, 14), (32, 16, 3, 3), F32, padding=((1, 1), (1, 1)),
                                           stride=(2, 2)),
        "conv1d depthwise 3-tap bf16": conv_op((2, 64, 512), (64, 1, 3), BF16, padding=((1, 1),), groups=64),
        "conv1d depthwise causal 64-tap bf16": conv_op((2, 32, 300), (32, 1, 64), BF16, padding=((63, 0),),
                                                       groups=32),
        "conv1d depthwise stride dilation f32": conv_op((2, 32, 200), (64, 1, 5), F32, padding=((4, 4),),
                                                        stride=(2,), dilation=(2,), groups=32),
        "conv2d depthwise 3x3 bf16": conv_op((2, 32, 20, 20), (32, 1, 3, 3), BF16, padding=((1, 1), (1, 1)),
                                             groups=32),
        "conv2d depthwise 7x7 f32": conv_op((2, 16, 14, 14), (16, 1, 7, 7), F32, padding=((3, 3), (3, 3)),
                                            groups=16),
        # a weight gradient's shape (few output tiles, a long K): blocks split K
        "conv2d weight-gradient shape bf16, split K": conv_op((8, 8, 18, 18), (8, 8, 16, 16), BF16,
                                                              padding=((0, 0), (0, 0))),
        "conv2d weight-gradient shape f32, split K, grouped": conv_op((4, 8, 12, 12), (8, 4, 10, 10), F32,
                                                                      padding=((0, 0), (0, 0)), groups=2),
    }



def _fused(plain: dict[str, KernelOp]) -> dict[str, KernelOp]:
    """A ResNet block's two epilogues, an fp32 one mixing dtypes and reading a row-broadcast input,
    a split K's and a depthwise one's: each input read where it broadcasts to the output."""
    resnet = plain["conv2d 3x3 bf16"]
    out = resnet.result.shape
    return {
        "conv2d 3x3 bf16 + bias, relu": with_epilogue(resnet, "relu(add($0,$1))", ((64, 1, 1), BF16)),
        "conv2d 3x3 bf16 + bias + residual, relu": with_epilogue(
            resnet, "relu(add(add($0,$1),$2))", ((64, 1, 1), BF16), (out, BF16)),
        "conv2d 3x3 stride 2 f32, tanh(y * column scale + bias)": with_epilogue(
            plain["conv2d 3x3 stride 2 f32"], "tanh(add(mul($0,$1),$2))", ((7,), F32), ((32, 1, 1), BF16)),
        "conv1d grouped f32, y - mean per image, silu": with_epilogue(
            plain["conv1d grouped f32"], "silu(sub($0,$1))", ((2, 1, 1), F32)),
        "conv1d grouped f32 + bias, gelu": with_epilogue(
            plain["conv1d grouped f32"], "gelu(add($0,$1))", ((plain["conv1d grouped f32"].result.shape[1], 1), F32)),
        "conv2d weight-gradient shape bf16, split K, scaled": with_epilogue(
            plain["conv2d weight-gradient shape bf16, split K"], "mul($0,0.25:bfloat16)"),
        "conv2d depthwise 3x3 bf16 + bias, relu, + residual": with_epilogue(
            plain["conv2d depthwise 3x3 bf16"], "add(relu(add($0,$1)),$2)", ((32, 1, 1), BF16),
            (plain["conv2d depthwise 3x3 bf16"].result.shape, BF16)),
        "conv1d depthwise causal 64-tap bf16, gated": with_epilogue(
            plain["conv1d depthwise causal 64-tap bf16"], "mul($0,sigmoid($1))",
            (plain["conv1d depthwise causal 64-tap bf16"].result.shape, BF16)),
    }


def _strided() -> dict[str, KernelOp]:
    """A 3x3 layer's weight gradient as lowering reads it (xᵀ and dYᵀ where they lie) and writes it
    (transposed back to dW's layout), bf16 and fp32, with its bias gradient beside it,
    its input gradient's (the kernel flipped and transposed where it lies), and a conv1d over a slice
    of channels and steps at an odd offset, with a bias epilogue."""
    def weight_gradient(dtype, out_swapped=False):
        return strided_conv_op((4, 8, 10, 10), swapped_leading((4, 8, 10, 10)), (4, 16, 8, 8),
                               swapped_leading((4, 16, 8, 8)), dtype, out_swapped=out_swapped)

    def with_bias_gradient(x, dy, dtype):       # a same-padded layer's dW, then its db = Σ dY
        return strided_conv_op(x, swapped_leading(x), dy, swapped_leading(dy), dtype, out_swapped=True,
                               padding=((1, 1),) * (len(x) - 2), bias_grad=True)
    return {
        "conv2d weight and bias gradients bf16": with_bias_gradient((4, 8, 10, 10), (4, 16, 10, 10), BF16),
        "conv2d weight and bias gradients f32": with_bias_gradient((3, 8, 9, 9), (3, 12, 9, 9), F32),
        "conv1d weight and bias gradients f16": with_bias_gradient((5, 6, 40), (5, 24, 40), F16),
        "conv2d weight gradient bf16, x and dY transposed in place": weight_gradient(BF16),
        "conv2d weight gradient f32, x and dY transposed in place": weight_gradient(F32),
        "conv2d weight gradient bf16, written transposed": weight_gradient(BF16, out_swapped=True),
        "conv2d weight gradient f32, written transposed": weight_gradient(F32, out_swapped=True),
        # dx's transposed convolution: w (24, 16, 3, 3) read as (16, 24, 3, 3) reversed along its taps
        "conv2d input gradient bf16, the kernel flipped and transposed in place": strided_conv_op(
            (2, 24, 9, 9), ((2, 24, 9, 9), (1944, 81, 9, 1), 0), (24, 16, 3, 3), ((16, 24, 3, 3), (9, 144, -3, -1), 8),
            BF16, padding=((1, 1), (1, 1))),
        "conv1d over a channel and step slice bf16 + bias": strided_conv_op(
            (2, 96, 130), ((2, 64, 128), (96 * 130, 130, 1), 16 * 130 + 1), (32, 64, 3), ((32, 64, 3), (192, 3, 1), 0),
            BF16, post="add($0,$1)", extras=((32, 1),), padding=((1, 1),)),
    }


CONV_OPS: dict[str, KernelOp] = _plain()
CONV_OPS |= _fused(CONV_OPS) | _strided()
