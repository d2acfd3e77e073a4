"""A convolution's sizes as both conv kernels see them, and the limits they share.

ConvProblem normalizes conv1d and conv2d to two spatial axes (conv1d: a height of one) and names
the implicit GEMM of one group. conv_op builds a conv KernelOp from shapes for samples and tests.

>>> p = ConvProblem.of(conv_op((8, 64, 56, 56), (64, 64, 3, 3), DType.bfloat16, padding=((1, 1), (1, 1))))
>>> p.gemm, p.tensor_cores, p.depthwise
((25088, 64, 576), True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused_conv import conv_views, convolution_of
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.codegen.kernel_op import KernelOp

# 16-bit inputs run on tensor cores: (CUDA type, name suffix of the kernel's helpers)
TENSOR_CORE_DTYPES = {DType.bfloat16: ("bf16_t", "bf16"), DType.float16: ("f16_t", "f16")}
STATIC_SMEM_LIMIT = 48 * 1024            # static __shared__ arrays; more needs dynamic smem and opt-in
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class ConvProblem:
    """The convolution's sizes, normalized to two spatial axes (conv1d: height 1)."""
    n: int
    c: int
    h: int
    w: int
    o: int
    groups: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]                 # low padding (top, left); high padding only sets oh, ow
    dilation: tuple[int, int]
    dtype: DType
    # a strided_conv's views of x and w: (strides of the 4 axes above, offset); None where dense
    x_view: tuple[tuple[int, int, int, int], int] | None = None
    w_view: tuple[tuple[int, int, int, int], int] | None = None
    out_swapped: bool = False            # the output written (O, N, OH, OW)
    bias_grad: bool = False              # one more image of x, all ones: row N's first position sums w

    @classmethod
    def of(cls, op: KernelOp) -> ConvProblem:
        x, w = conv_operands(op)
        a = op.attr_map
        flat = len(x.shape) == 3             # conv1d: prepend a height axis of size one

        def two(values, unit):
            return (unit,) + tuple(values) if flat else tuple(values)

        def shape(t: TensorType) -> tuple[int, ...]:
            return t.shape[:2] + (1,) + t.shape[2:] if flat else t.shape

        out = op.result if not a.get("bias_grad") else \
            OPS[convolution_of(x)].infer(x, w, **{k: a[k] for k in ("stride", "padding", "dilation", "groups")})
        (n, c, h, wd), (o, _, kh, kw), (_, _, oh, ow) = shape(x), shape(w), shape(out)   # oh, ow: either way
        pads = two(a["padding"], (0, 0))
        views = [None, None]
        if op.op == "strided_conv":          # a height axis of one is never stepped along: any stride
            (_, xs, x_off), (_, ws, w_off) = conv_views(a["shapes"], a["strides"], a["offsets"])
            views = [(xs[:2] + (0,) + xs[2:], x_off), (ws[:2] + (ws[2] * kw,) + ws[2:], w_off)] if flat \
                else [(xs, x_off), (ws, w_off)]
        return cls(n=n, c=c, h=h, w=wd, o=o, groups=a["groups"], kh=kh, kw=kw, oh=oh, ow=ow,
                   stride=two(a["stride"], 1), pad=(pads[0][0], pads[1][0]), dilation=two(a["dilation"], 1),
                   dtype=x.dtype, x_view=views[0], w_view=views[1], out_swapped=bool(a.get("out_swapped")),
                   bias_grad=bool(a.get("bias_grad")))

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of one group's implicit GEMM (a bias gradient's image of ones included)."""
        return (self.n + self.bias_grad) * self.oh * self.ow, self.og, self.cg * self.kh * self.kw

    @property
    def tensor_cores(self) -> bool:
        return self.dtype in TENSOR_CORE_DTYPES

    @property
    def depthwise(self) -> bool:
        """One input channel per group: the implicit GEMM would be one output channel wide."""
        return self.cg == 1


def conv_operands(op: KernelOp) -> tuple[TensorType, TensorType]:
    """x and w as the convolution reads them: a strided_conv's views, the first two operands else
    (a fused_conv's epilogue inputs follow)."""
    if op.op != "strided_conv":
        return op.operands[0], op.operands[1]
    a = op.attr_map
    x, w = (TensorType(shape, t.dtype) for t, (shape, _, _) in
            zip(op.operands, conv_views(a["shapes"], a["strides"], a["offsets"])))
    return x, w


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


def conv_op(x: tuple[int, ...], w: tuple[int, ...], dtype: DType, *, padding, stride=None, dilation=None,
            groups: int = 1) -> KernelOp:
    """A conv1d/conv2d KernelOp from shapes and normalized attributes (the result shape is inferred).

    >>> conv_op((1, 4, 10), (8, 4, 3), DType.float32, padding=((1, 1),)).result.shape
    (1, 8, 10)
    """
    spatial = len(x) - 2
    attrs = dict(stride=stride or (1,) * spatial, padding=padding, dilation=dilation or (1,) * spatial,
                 groups=groups)
    name = f"conv{spatial}d"
    operands = (TensorType(x, dtype), TensorType(w, dtype))
    return KernelOp.of(name, operands, OPS[name].infer(*operands, **attrs), **attrs)




def strided_conv_op(x: tuple[int, ...], x_view: tuple, w: tuple[int, ...], w_view: tuple, dtype: DType, *,
                    post: str = "$0", extras: tuple[tuple[int, ...], ...] = (), out_swapped: bool = False,
                    **attrs) -> KernelOp:
    """A strided_conv reading storages of shapes `x` and `w` through views (shape, strides, offset),
    with `post` over `extras` (shapes, of `dtype`); unset attributes as a dense unit-stride conv's.

    >>> op = strided_conv_op((4, 8, 10), swapped_leading((4, 8, 10)), (16, 4, 3), ((16, 4, 3), (12, 3, 1), 0),
    ...                      DType.float32)
    >>> op.result.shape
    (8, 16, 8)
    """
    spatial = len(x_view[0]) - 2
    attrs = dict(stride=(1,) * spatial, padding=((0, 0),) * spatial, dilation=(1,) * spatial, groups=1) | attrs
    operands = (TensorType(x, dtype), TensorType(w, dtype), *(TensorType(e, dtype) for e in extras))
    views = dict(shapes=(*x_view[0], *w_view[0]), strides=(*x_view[1], *w_view[1]), offsets=(x_view[2], w_view[2]),
                 out_swapped=out_swapped)
    return KernelOp.of("strided_conv", operands, OPS["strided_conv"].infer(*operands, post=post, **attrs, **views),
                       post=post, **attrs, **views)


def swapped_leading(shape: tuple[int, ...]) -> tuple:
    """The view (shape, strides, 0) of a dense `shape` with its two leading axes swapped: xᵀ or dYᵀ
    as a weight gradient reads them, the batch playing the channels."""
    strides = contiguous_strides(shape)
    return (shape[1], shape[0], *shape[2:]), (strides[1], strides[0], *strides[2:]), 0
