"""max_pool2d / avg_pool2d and their input gradients: a thread per element written, walking windows.

The forward gives each output element a thread (in a grid-stride loop) that walks its window in
x's plane, skipping positions in the padding; neighbouring threads read overlapping windows, which
the L1 and L2 serve, so x streams from HBM about once. A max keeps the first of equals (a NaN
replacing it), an average sums in fp32 and divides as torch does.

The gradients give each element of x a thread instead, which visits the windows that cover it (for
each window position, the one output whose window holds the element there, if the stride lands on
it) and adds their cotangents: an average's divided by the window's divisor, a max's where that
window picked this element, found by walking the window again as the forward did. No thread
writes another's element: nothing is accumulated in memory, and every run adds in the same order.
A fused_max_pool2d_grad applies its epilogue (a relu's mask, from the element of x it reads again)
to each element's sum as it writes it.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = TensorType((32, 64, 112, 112), DType.bfloat16)
>>> attrs = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), dilation=(1, 1), ceil_mode=False)
>>> op = KernelOp.of("max_pool2d", (x,), OPS["max_pool2d"].infer(x, **attrs), **attrs)
>>> PoolTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=256'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused_expr import parse_expr
from tessera_rw.algebra.ops.pooling import NO_DILATION, POOL_OPS
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import (STORAGE, SUPPORTED, broadcast_strides, ctype, emit_tree,
                                                      expr_ops, kernel_name, literal, load, offset_expr, store)

MAX_INDEX = 2**31         # index math is 32-bit
GRID_WAVES = 4            # blocks in flight per SM, at most, before the grid-stride loop takes over
GRID_THREADS = (64, 128, 256, 512, 1024)
VALUE_DTYPES = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.float64})
RELU_MASK = "where(gt($1,0.0:bfloat16),$0,0.0:bfloat16)"      # a relu's mask, in the epilogue of its pool's gradient


@dataclass(frozen=True)
class PoolSchedule(Schedule):
    threads: int = 256


@dataclass(frozen=True)
class _Window:
    """A pool's window and planes: x's (H, W), the output's (Ho, Wo), and the attributes."""
    plane: tuple[int, int]
    pooled: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]

    @classmethod
    def of(cls, op: KernelOp) -> _Window:
        a = op.attr_map
        x = op.result if op.op.endswith("_grad") else op.operands[0]
        pooled = (op.operands[_cotangent(op)] if op.op.endswith("_grad") else op.result).shape[-2:]
        return cls(x.shape[-2:], pooled, a["kernel"], a["stride"], a["pad"], a.get("dilation", NO_DILATION))


def _cotangent(op: KernelOp) -> int:
    """Which operand of a pool's gradient is the cotangent it spreads."""
    return 0 if op.op == "avg_pool2d_grad" else 1


class PoolTemplate(Template):
    """max_pool2d, avg_pool2d and their gradients over float32, float16, bfloat16 and float64."""

    kind = "reduction"        # a window's max or sum
    ops = POOL_OPS

    def accepts(self, op: KernelOp) -> bool:
        pooled = (*op.operands[:2], op.result) if op.op == "fused_max_pool2d_grad" else (*op.operands, op.result)
        return (op.op in self.ops and all(t.dtype in VALUE_DTYPES for t in pooled)
                and all(t.dtype in SUPPORTED for t in op.operands) and op.result.numel > 0
                and all(t.numel < MAX_INDEX for t in (*op.operands, op.result)))

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        if op.op == "fused_max_pool2d_grad":
            return ("max_pool2d_grad", *expr_ops(parse_expr(op.attr_map["post"])))
        return (op.op,)

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[PoolSchedule, ...]:
        return (PoolSchedule(256), PoolSchedule(128))

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[PoolSchedule, ...]:
        grid = (PoolSchedule(t) for t in GRID_THREADS)
        return grid_space(self.schedules(op, arch), grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        return (isinstance(schedule, PoolSchedule) and self.accepts(op) and schedule.threads % 32 == 0
                and 0 < schedule.threads <= arch.max_threads_per_block)

    def resources(self, op: KernelOp, s: PoolSchedule, arch: ArchSpec) -> Resources:
        resident = min(arch.max_blocks_per_sm, arch.max_warps_per_sm * 32 // s.threads)
        blocks = max(1, min(math.ceil(op.result.numel / s.threads), arch.sm_count * resident * GRID_WAVES))
        wide = any(t.dtype is DType.float64 for t in (*op.operands, op.result))
        regs = (REG_BASE + (REG_SM90 if arch.compute_capability >= (9, 0) else 0)
                + {"max_pool2d_grad": REG_SCAN, "avg_pool2d": REG_DIVISOR, "avg_pool2d_grad": REG_DIVISOR,
                   "max_pool2d_picked": REG_PICK, "fused_max_pool2d_grad": REG_SCAN}.get(op.op, 0)
                + REG_PER_EPILOGUE_INPUT * len(op.operands[2:] if op.op == "fused_max_pool2d_grad" else ()))
        # each operand streamed once (overlapping windows re-read from cache), the result written once
        return Resources(threads=s.threads, blocks=blocks, registers=regs, smem_bytes=0,
                         hbm_bytes=sum(t.nbytes for t in op.operands) + op.result.nbytes,
                         flops=OPS[op.op].flops(op.result, *op.operands, **op.attr_map),
                         unit=MathUnit.FP64 if wide else MathUnit.FP32)

    def emit(self, op: KernelOp, s: PoolSchedule, arch: ArchSpec) -> KernelSource:
        name = kernel_name(self.kind, op, s)
        blocks = self.resources(op, s, arch).blocks
        w = _Window.of(op)
        params = ", ".join(f"const {STORAGE[t.dtype]}* __restrict__ in{i}" for i, t in enumerate(op.operands))
        inputs = ", ".join(f"in{i}" for i in range(len(op.operands)))
        body = _gradient(op, w) if op.op.endswith("_grad") else _forward(op, w)
        source = f"""// {op}
// pool ({op.op}: windows {w.kernel} stride {w.stride} padding {w.pad} dilation {w.dilation} over planes
// {w.plane} pooled to {w.pooled}), schedule {s.describe()}.
// launch: {name}<<<{blocks}, {s.threads}>>>({inputs}, out)
extern "C" __global__ void __launch_bounds__({s.threads}) {name}({params},
        {STORAGE[op.result.dtype]}* __restrict__ out) {{
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < {op.result.numel}u; e += step) {{
{_indent(body, 2)}
    }}
}}
"""
        return KernelSource(name, source, s.threads, grid=(blocks, 1, 1), fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32, f64 = DType.bfloat16, DType.float32, DType.float64
        stem = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1))
        return (
            pool_op("max_pool2d", TensorType((32, 64, 112, 112), bf), **stem, dilation=(1, 1), ceil_mode=False),
            pool_op("avg_pool2d", TensorType((8, 256, 28, 28), f32), **stem, ceil_mode=True, count_include_pad=False,
                  divisor=0),
            pool_op("max_pool2d_grad", TensorType((32, 64, 112, 112), bf), **stem, dilation=(1, 1), ceil_mode=False),
            pool_op("avg_pool2d_grad", TensorType((8, 256, 28, 28), f32), **stem, ceil_mode=False,
                  count_include_pad=True, divisor=0),
            pool_op("max_pool2d", TensorType((4, 16, 30, 30), f64), kernel=(2, 3), stride=(1, 2), pad=(0, 1),
                  dilation=(2, 1), ceil_mode=True),
            pool_op("max_pool2d_picked", TensorType((32, 64, 112, 112), bf), **stem, dilation=(1, 1), ceil_mode=False),
            pool_op("fused_max_pool2d_grad", TensorType((32, 64, 112, 112), bf),
                    extras=(TensorType((32, 64, 112, 112), bf),), post=RELU_MASK, **stem, dilation=(1, 1),
                    ceil_mode=False),
        )


def pool_op(name: str, x: TensorType, extras: tuple[TensorType, ...] = (), post: str = "", **attrs) -> KernelOp:
    """The KernelOp of pool `name` over x (a gradient: its cotangent's; picked: from x itself; a
    fused gradient: its epilogue `post` over `extras`)."""
    forward = name.removeprefix("fused_").removesuffix("_grad").removesuffix("_picked")
    pooled = OPS[forward].infer(x, **attrs)
    if name == forward:
        return KernelOp.of(name, (x,), pooled, **attrs)
    if name == "max_pool2d_grad":
        return KernelOp.of(name, (x, pooled), x, **attrs)
    if name == "fused_max_pool2d_grad":
        return KernelOp.of(name, (x, pooled, *extras), x, post=post, **attrs)
    if name == "max_pool2d_picked":
        return KernelOp.of(name, (x, x), pooled, **attrs)
    return KernelOp.of(name, (pooled,), x, plane=x.shape[-2:], **attrs)


def _forward(op: KernelOp, w: _Window) -> list[str]:
    """An output element's window walked: its max (or the element of v where it is), or its sum
    over the divisor."""
    (ho, wo), (h, wd) = w.pooled, w.plane
    x, c = op.operands[0], ctype(op.result.dtype)
    lines = [f"const int ow = (int)(e % {wo}u), oh = (int)(e / {wo}u % {ho}u);",
             f"const unsigned long long plane = (unsigned long long)(e / {ho * wo}u) * {h * wd}u;",
             f"const {STORAGE[x.dtype]}* src = in0 + plane;",
             f"const int h0 = oh * {w.stride[0]} - {w.pad[0]}, w0 = ow * {w.stride[1]} - {w.pad[1]};"]
    if op.op == "max_pool2d":
        lines += [f"{c} best = {literal(float('-inf'), x.dtype)};"]
        lines += _walk(w, lambda r, q: [f"const {c} v = {load(x.dtype, f'src[{r} * {wd} + {q}]')};",
                                        "if (v > best || v != v) best = v;      // v != v: a NaN, which replaces any"])
        return lines + [f"out[e] = {store(op.result.dtype, 'best')};"]
    if op.op == "max_pool2d_picked":
        # a dilated window may miss x: it picks nothing
        return lines + _picked(op, w) + [f"out[e] = at < 0 ? {STORAGE[op.result.dtype]}() : in1[plane + at];"]
    lines += [f"{c} total = 0;"]
    lines += _walk(w, lambda r, q: [f"total += {load(x.dtype, f'src[{r} * {wd} + {q}]')};"])
    return lines + _divisor(op, w) + [f"out[e] = {store(op.result.dtype, 'total / divisor')};"]


def _picked(op: KernelOp, w: _Window, first: str = "") -> list[str]:
    """`at`, where in its plane of x (at `src`) the window from corner (h0, w0) has the element
    max_pool2d picks: the first of equals in window order, a NaN replacing any."""
    x, wd = op.operands[0], w.plane[1]
    c = ctype(x.dtype)
    return [f"{c} best = {literal(float('-inf'), x.dtype)};", "int at = -1;"] + _walk(w, lambda r, q: [
        f"const {c} v = {load(x.dtype, f'src[{r} * {wd} + {q}]')};",
        f"if (at < 0 || v > best || v != v) {{ best = v; at = {r} * {wd} + {q}; }}"], first)


def _walk(w: _Window, body: Callable[[str, str], list[str]], first: str = "") -> list[str]:
    """The window from corner (h0, w0) walked row-major over the positions inside x's plane, `body`
    given each one's row and column variables; `first` suffixes the loop variables where walks nest."""
    h, wd = w.plane
    i, j, row, col = f"i{first}", f"j{first}", f"h{first}", f"w{first}"
    return ["#pragma unroll", f"for (int {i} = 0; {i} < {w.kernel[0]}; ++{i}) {{",
            f"    const int {row} = h0 + {i} * {w.dilation[0]};",
            f"    if ({row} < 0 || {row} >= {h}) continue;", "    #pragma unroll",
            f"    for (int {j} = 0; {j} < {w.kernel[1]}; ++{j}) {{",
            f"        const int {col} = w0 + {j} * {w.dilation[1]};",
            f"        if ({col} < 0 || {col} >= {wd}) continue;",
            *(f"        {line}" for line in body(row, col)), "    }", "}"]


def _divisor(op: KernelOp, w: _Window) -> list[str]:
    """`divisor`, as torch's avg_pool2d counts a window from corner (h0, w0)."""
    a, c = op.attr_map, ctype(op.result.dtype)
    if a["divisor"]:
        return [f"const {c} divisor = {a['divisor']};"]
    (h, wd), (kh, kw), (ph, pw) = w.plane, w.kernel, w.pad
    lines = [f"const int h1 = min(h0 + {kh}, {h + ph}), w1 = min(w0 + {kw}, {wd + pw});"]
    if a["count_include_pad"]:
        return lines + [f"const {c} divisor = ({c})((h1 - h0) * (w1 - w0));"]
    return lines + [f"const {c} divisor = ({c})((min(h1, {h}) - max(h0, 0)) * (min(w1, {wd}) - max(w0, 0)));"]


def _gradient(op: KernelOp, w: _Window) -> list[str]:
    """An element of x's cotangent: the windows covering it visited, each adding its share."""
    (ho, wo), (h, wd), (sh, sw) = w.pooled, w.plane, w.stride
    g, c = op.operands[_cotangent(op)], ctype(op.result.dtype)
    lines = [f"const int x_w = (int)(e % {wd}u), x_h = (int)(e / {wd}u % {h}u);",
             f"const unsigned plane = e / {h * wd}u;",
             f"const {STORAGE[g.dtype]}* cot = in{_cotangent(op)} + (unsigned long long)plane * {ho * wo}u;",
             f"{c} total = 0;"]
    if op.op != "avg_pool2d_grad":
        lines.append(f"const {STORAGE[op.operands[0].dtype]}* src = in0 + (unsigned long long)plane * {h * wd}u;")
    lines += ["#pragma unroll", f"for (int i = 0; i < {w.kernel[0]}; ++i) {{",
             f"    const int t = x_h + {w.pad[0]} - i * {w.dilation[0]};",
             f"    if (t < 0 || t % {sh} != 0 || t / {sh} >= {ho}) continue;", f"    const int oh = t / {sh};",
             "    #pragma unroll", f"    for (int j = 0; j < {w.kernel[1]}; ++j) {{",
             f"        const int u = x_w + {w.pad[1]} - j * {w.dilation[1]};",
             f"        if (u < 0 || u % {sw} != 0 || u / {sw} >= {wo}) continue;", f"        const int ow = u / {sw};",
             f"        const int h0 = oh * {sh} - {w.pad[0]}, w0 = ow * {sw} - {w.pad[1]};"]
    share = load(g.dtype, f"cot[oh * {wo} + ow]")
    if op.op == "avg_pool2d_grad":
        inner = _divisor(op, w) + [f"total += {share} / divisor;"]
    else:
        inner = _picked(op, w, first="p") + [f"if (at == x_h * {wd} + x_w) total += {share};"]
    return lines + [f"        {line}" for line in inner] + ["    }", "}"] + _stored(op)


def _stored(op: KernelOp) -> list[str]:
    """The element's gradient written, through the epilogue of a fused_max_pool2d_grad: `post` over
    it ($0) and the epilogue inputs at the element (broadcast to the result)."""
    if op.op != "fused_max_pool2d_grad":
        return [f"out[e] = {store(op.result.dtype, 'total')};"]
    shape, lines = op.result.shape, []
    leaves = [("total", op.result.dtype)]
    for i, extra in enumerate(op.operands[2:], 2):
        at = offset_expr("e", shape, broadcast_strides(shape, extra.shape))
        lines.append(f"const {ctype(extra.dtype)} e{i} = {load(extra.dtype, f'in{i}[{at}]')};")
        leaves.append((f"e{i}", extra.dtype))
    value, _ = emit_tree(parse_expr(op.attr_map["post"]), leaves, lines, prefix="p")
    return lines + [f"out[e] = {store(op.result.dtype, value)};"]


def _indent(lines: list[str], depth: int) -> str:
    return "\n".join("    " * depth + line for line in lines)


# The register model (fit to ptxas 12.x on samples(), sm_80 and sm_90).
REG_BASE = 16             # the loop, the window's corner and bounds, the plane's address
REG_SM90 = 4
REG_DIVISOR = 4           # an average's window bounds clipped to count its divisor
REG_SCAN = 12             # a max's gradient: the covering window walked again beside the element's
REG_PICK = 11             # the pick's position beside the max, and v's plane
REG_PER_EPILOGUE_INPUT = 2    # an epilogue input's address and value
