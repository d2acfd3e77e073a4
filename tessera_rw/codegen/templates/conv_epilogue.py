"""A fused_conv's epilogue as both convolution kernels write it: the expression over the fp32
accumulator and each epilogue input, loaded where the output element lies.

Every epilogue input broadcasts to the output (N, O, OH, OW) (conv1d: OH = 1); its element for
output (image, channel, position = oh·OW + ow) lies at image·sn + channel·sc + (its row and column
terms), with 0 strides along the axes it repeats: a per-channel bias reads one value per channel, a
residual the output's own layout. The epilogue runs after the K loop, in the registers the
prefetched tiles and fragments held: ptxas's count is that of the plain convolution (every sample,
sm_80 and sm_90), so the register models add nothing for it.

>>> from tessera_rw.codegen.templates.conv_problem import conv_op
>>> conv = conv_op((2, 4, 8, 8), (6, 4, 3, 3), DType.bfloat16, padding=((1, 1), (1, 1)))
>>> bias = TensorType((6, 1, 1), DType.bfloat16)
>>> op = KernelOp.of("fused_conv", (*conv.operands, bias, conv.result), conv.result, post="relu(add(add($0,$1),$2))",
...                  **conv.attr_map)
>>> lines, value = ConvEpilogue.of(op).apply("acc", "im", "ch", "p")
>>> lines[:2], value
(['const float ev0 = bf16_to_f32(e0[ch]);', 'const float ev1 = bf16_to_f32(e1[im * 384 + ch * 64 + p]);'], 'ep4')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.ops.fused_conv import convolution_of
from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.conv_problem import conv_operands
from tessera_rw.codegen.templates.cuda_scalar import (READABLE, STORAGE, broadcast_strides, ctype, emit_tree,
                                                      expr_ops, load)

_INT_MAX = 2**31 - 1
EPILOGUE_OPS = frozenset({"fused_conv", "strided_conv"})     # the convolutions that carry a `post`


@dataclass(frozen=True)
class ConvEpilogue:
    """What a fused_conv applies to each output element before writing it (a plain conv: nothing)."""
    post: object                                  # parse_expr form; $0 the accumulator
    extras: tuple[TensorType, ...]
    strides: tuple[tuple[int, int, int, int], ...]   # each input's (image, channel, row, column) strides
    out_w: int                                    # OW: a position's row and column
    out_h: int
    conv_dtype: DType

    @classmethod
    def of(cls, op: KernelOp) -> ConvEpilogue | None:
        if op.op not in EPILOGUE_OPS or op.attr_map["post"] == "$0":
            return None
        out = op.result.shape
        flat = len(out) == 3                      # conv1d: a height of one
        strides = []
        for e in op.operands[2:]:
            st = broadcast_strides(out, e.shape)
            strides.append((st[0], st[1], 0, st[2]) if flat else tuple(st))
        return cls(parse_expr(op.attr_map["post"]), tuple(op.operands[2:]), tuple(strides),
                   out[-1], 1 if flat else out[2], op.operands[0].dtype)

    @staticmethod
    def refusal(op: KernelOp) -> str | None:
        """Why the convolution kernels cannot write `op`'s epilogue, or None."""
        if op.op not in EPILOGUE_OPS:
            return None
        if op.result.dtype != op.operands[0].dtype:
            return f"the convolution kernels write their inputs' dtype {op.operands[0].dtype}, not {op.result.dtype}"
        if bad := [str(e.dtype) for e in op.operands[2:] if e.dtype not in READABLE]:
            return f"the convolution's epilogue reads no {', '.join(bad)} inputs"
        return None

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(expr_ops(self.post)))

    @property
    def bytes_read(self) -> int:
        return sum(e.nbytes for e in self.extras)

    def params(self) -> str:
        """The kernel's parameters for the epilogue's inputs, after x and w."""
        return "".join(f", const {STORAGE[e.dtype]}* __restrict__ e{i}" for i, e in enumerate(self.extras))

    def apply(self, acc: str, img: str, chan: str, pos: str) -> tuple[list[str], str]:
        """Statements computing the epilogue of accumulator `acc` (an fp32 expression) at output
        (`img`, `chan`, `pos`), and the C expression of its value (in fp32 for 16-bit outputs)."""
        lines, leaves = [], [(acc, self.conv_dtype)]
        for i, (e, st) in enumerate(zip(self.extras, self.strides)):
            at = self._offset(e, st, img, chan, pos)
            lines.append(f"const {ctype(e.dtype)} ev{i} = {load(e.dtype, f'e{i}[{at}]')};")
            leaves.append((f"ev{i}", e.dtype))
        var, _ = emit_tree(self.post, leaves, lines, "ep")
        return lines, var

    def gemm_store(self, acc: str, to_stored: str, indent: str) -> str:
        """The implicit GEMM's write of accumulator `acc` to yrow (image im, channel g·OG + o,
        position p), epilogue applied: a braced block at `indent`."""
        lines, value = self.apply(acc, "im", "g * OG + o", "p")
        body = [*lines, f"yrow[(long long)o * P] = {to_stored}({value});"]
        return "{\n" + "".join(f"{indent}    {line}\n" for line in body) + f"{indent}}}"

    def in_place(self) -> str:
        """The depthwise kernel's epilogue on its row of V accumulators (image img, channel o, row oh,
        columns from tc0 + c0; `left` of them inside the row), before they are packed and stored."""
        lines, value = self.apply("acc[v]", "img", "o", "p")
        body = ["const int p = oh * OW + tc0 + c0 + v;", *lines, f"acc[v] = {value};"]
        return ("#pragma unroll\n    for (int v = 0; v < V; ++v) {          // the epilogue, on this row's outputs\n"
                "        if (v >= left) continue;\n" + "".join(f"        {line}\n" for line in body) + "    }")

    def _offset(self, e: TensorType, strides: tuple[int, int, int, int], img: str, chan: str, pos: str) -> str:
        sn, sc, sh, sw = strides
        wide = "(long long)" if e.numel > _INT_MAX else ""
        terms = [f"{wide}{var}" + (f" * {st}" if st != 1 else "") for var, st in ((img, sn), (chan, sc)) if st]
        if sh == sw * self.out_w or self.out_h == 1:      # rows and columns walk the position's layout
            if sw:
                terms.append(f"{wide}{pos}" + (f" * {sw}" if sw != 1 else ""))
        else:
            terms += [f"{wide}({pos} / {self.out_w}) * {sh}"] * bool(sh)
            terms += [f"{wide}({pos} % {self.out_w}) * {sw}"] * bool(sw)
        return " + ".join(terms) or "0"


def placed(text: str, epilogue: ConvEpilogue | None, to_stored: str) -> str:
    """A convolution kernel's `text` with its epilogue's parameters and code where its placeholders
    stand (EXTRA_PARAMS, each `if (o < OG) WRITE_Y(acc);`, EPILOGUE_IN_PLACE); a plain convolution's
    writes convert the accumulator with `to_stored` and nothing more."""
    def write(m: re.Match) -> str:
        indent, acc = m.groups()
        store = f"yrow[(long long)o * P] = {to_stored}({acc});" if epilogue is None \
            else epilogue.gemm_store(acc, to_stored, indent)
        return f"{indent}if (o < OG) {store}"
    text = re.sub(r"^( *)if \(o < OG\) WRITE_Y\((.+)\);$", write, text, flags=re.M)
    text = text.replace("EXTRA_PARAMS", epilogue.params() if epilogue else "")
    return text.replace("    EPILOGUE_IN_PLACE\n", f"    {epilogue.in_place()}\n" if epilogue else "")


def epilogue_flops(op: KernelOp) -> int:
    """The FLOPs of a fused_conv's epilogue (0 for a plain convolution)."""
    if op.op not in EPILOGUE_OPS:
        return 0
    x, w = conv_operands(op)
    conv = opdef(convolution_of(x))
    return op.flops - conv.flops(op.result, x, w, **{k: op.attr_map[k] for k in conv.attr_names})


def launch_operands(op: KernelOp) -> str:
    """The kernel's arguments as its header comment names them: x, w, the epilogue's inputs, y."""
    return ", ".join(["x", "w", *(f"e{i}" for i in range(len(op.operands) - 2)), "y"])


def with_epilogue(conv: KernelOp, post: str, *extras: tuple[tuple[int, ...], DType]) -> KernelOp:
    """The fused_conv applying `post` to `conv` (a conv1d / conv2d KernelOp), reading `extras`
    (shape, dtype) as $1…; for samples and tests.

    >>> from tessera_rw.codegen.templates.conv_problem import conv_op
    >>> conv = conv_op((1, 4, 10), (8, 4, 3), DType.float32, padding=((1, 1),))
    >>> with_epilogue(conv, "relu(add($0,$1))", ((8, 1), DType.float32)).operands[2].shape
    (8, 1)
    """
    operands = (*conv.operands, *(TensorType(shape, dtype) for shape, dtype in extras))
    attrs = dict(conv.attr_map, post=post)
    return KernelOp.of("fused_conv", operands, opdef("fused_conv").infer(*operands, **attrs), **attrs)
