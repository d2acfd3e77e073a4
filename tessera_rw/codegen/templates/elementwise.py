"""Elementwise kernels: one pass over the result, every operand broadcast to it, vectorized.

Shapes are baked into the emitted source: the kernel is compiled per shape anyway, so each
operand's broadcast index math is specialized there (division by constants becomes a multiply),
and the launch takes only pointers. Adjacent axes that every operand walks the same way are
coalesced first, so `x[4096,4096] + bias[4096]` indexes the bias with one `%`.

16- and 8-bit values are computed in fp32 and rounded once on store. The scalar pieces (types,
conversions, the expression emitter, broadcast offsets) are shared with the row-wise and
reduction templates.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((1024, 1024), DType.bfloat16)
>>> op = KernelOp.of("add", (t, TensorType((1024,), DType.bfloat16)), t)
>>> ElementwiseTemplate().schedules(op, arch_named("h100"))[0].describe()
'threads=256 vec=8'
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpKind
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused import parse_expr
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Resources, Schedule, Template

# ---- scalar types ---------------------------------------------------------------------------

STORAGE = {DType.float32: "float", DType.float16: "f16_t", DType.bfloat16: "bf16_t", DType.float64: "double",
           DType.int32: "int", DType.int64: "long long", DType.bool: "unsigned char"}
SUPPORTED = frozenset(STORAGE)   # fp8 has no conversion that sm_80 can run; complex is the fft's
MAX_ACCESS_BYTES = 16            # the widest single global load/store (ld.global.v4.b32)


def ctype(d: DType) -> str:
    """The C type values of `d` are computed in: fp32 for 16-bit floats."""
    return {DType.float64: "double", DType.int32: "int", DType.int64: "long long",
            DType.bool: "bool"}.get(d, "float")


def words(d: DType) -> int:
    """32-bit registers one computed value of `d` occupies."""
    return 2 if d in (DType.float64, DType.int64) else 1


def load(d: DType, x: str) -> str:
    """A stored value of `d` as its compute type."""
    return {DType.bfloat16: f"bf16_to_f32({x})", DType.float16: f"f16_to_f32({x})",
            DType.bool: f"({x} != 0)"}.get(d, x)


def store(d: DType, x: str) -> str:
    """A computed value as stored `d` (bool stores 0/1 bytes like numpy)."""
    return {DType.bfloat16: f"f32_to_bf16((float)({x}))", DType.float16: f"f32_to_f16((float)({x}))",
            DType.bool: f"(unsigned char)(({x}) != 0)"}.get(d, f"({STORAGE[d]})({x})")


def literal(value: float, d: DType) -> str:
    c = ctype(d)
    if c == "float":
        return f"{float(value)!r}f".replace("inf", "__int_as_float(0x7f800000)")
    if c == "double":
        return f"{float(value)!r}"
    if c == "bool":
        return "true" if value else "false"
    return f"({c}){int(value)}"


VEC_STRUCT = """template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };"""


# ---- broadcast offsets ----------------------------------------------------------------------

def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def broadcast_strides(out: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a contiguous `shape` read as the broadcast `out` (0 along repeated axes)."""
    own = (0,) * (len(out) - len(shape)) + contiguous_strides(shape)
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    return tuple(s if f == o else 0 for s, f, o in zip(own, full, out))


def coalesce(out: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent axes every operand walks as one: ((4096, 4096), [(4096, 1), (0, 1)]) stays,
    ((8, 64, 64), [(4096, 64, 1)]) becomes ((32768,), [(1,)])."""
    sizes, cols = [], [[] for _ in strides]
    for axis, size in enumerate(out):
        if size == 1:
            continue
        if sizes and all(col[-1] == st[axis] * size for col, st in zip(cols, strides)):
            sizes[-1] *= size
            for col, st in zip(cols, strides):
                col[-1] = st[axis]
            continue
        sizes.append(size)
        for col, st in zip(cols, strides):
            col.append(st[axis])
    return tuple(sizes), [tuple(c) for c in cols]


def offset_expr(index: str, sizes: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """C expression of the element offset at linear `index` of `sizes` walked with `strides`."""
    if strides == contiguous_strides(sizes):
        return index
    terms, inner = [], 1
    for axis in range(len(sizes) - 1, -1, -1):
        size, stride = sizes[axis], strides[axis]
        if stride:
            coord = index if inner == 1 else f"{index} / {inner}u"
            if axis > 0:
                coord = f"({coord}) % {size}u"
            terms.append(coord if stride == 1 else f"({coord}) * {stride}u")
        inner *= size
    return " + ".join(terms) or "0"


def kernel_name(kind: str, op: KernelOp, schedule: Schedule) -> str:
    """A name stable across processes (the binary cache keys on the source): kind_op_digest."""
    digest = hashlib.blake2b(f"{op}|{schedule.describe()}".encode(), digest_size=4).hexdigest()
    return f"{kind}_{op.op}_{digest}"


def index_type(numel: int) -> str:
    """32-bit index math whenever the grid-stride loop cannot overflow it: fewer registers."""
    return "unsigned" if numel < 2**31 else "unsigned long long"


# ---- the expression emitter -----------------------------------------------------------------

_FLOAT_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "sin": "sin", "cos": "cos",
             "erf": "erf", "rsqrt": "rsqrt"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
SQRT_HALF, SQRT_2_OVER_PI, GELU_CUBIC = 0.7071067811865476, 0.7978845608028654, 0.044715


def scalar_op(name: str, args: list[tuple[str, DType]], attrs: dict, out: DType) -> str:
    """C expression of one elementwise op on computed values, typed as its shape rule says."""
    c = ctype(out)
    f = "f" if c == "float" else ""

    def as_(x: tuple[str, DType], t: str = c) -> str:
        return x[0] if ctype(x[1]) == t else f"({t})({x[0]})"

    def num(v: float) -> str:
        return literal(v, out)

    if name in _ARITH:
        return f"({as_(args[0])} {_ARITH[name]} {as_(args[1])})"
    if name in _CMP:
        common = ctype(promote(args[0][1], args[1][1]))
        return f"({as_(args[0], common)} {_CMP[name]} {as_(args[1], common)})"
    if name in ("maximum", "minimum"):
        a, b = as_(args[0]), as_(args[1])
        pick = ">" if name == "maximum" else "<"
        nan = f" || {a} != {a}" if c in ("float", "double") else ""   # numpy propagates NaN
        return f"(({a} {pick} {b}{nan}) ? {a} : {b})"
    if name == "pow":
        return f"({c})pow{f}({as_(args[0], 'float' if f else 'double')}, {as_(args[1], 'float' if f else 'double')})"
    if name == "logical_and":
        return f"({args[0][0]} && {args[1][0]})"
    if name == "logical_or":
        return f"({args[0][0]} || {args[1][0]})"
    if name == "logical_not":
        return f"(!{args[0][0]})"
    x = as_(args[0])
    if name in _FLOAT_FN:
        return f"{_FLOAT_FN[name]}{f}({x})"
    if name == "neg":
        return f"(-{x})"
    if name == "abs":
        return {"float": f"fabsf({x})", "double": f"fabs({x})", "long long": f"llabs({x})"}.get(c, f"abs({x})")
    if name == "reciprocal":
        return f"({num(1)} / {x})"
    if name == "relu":
        return f"({x} < {num(0)} ? {num(0)} : {x})"
    if name == "sigmoid":
        return f"({num(1)} / ({num(1)} + exp{f}(-{x})))"
    if name == "silu":
        return f"({x} / ({num(1)} + exp{f}(-{x})))"
    if name == "gelu":
        if attrs.get("approximate") == "tanh":
            inner = f"{num(SQRT_2_OVER_PI)} * ({x} + {num(GELU_CUBIC)} * {x} * {x} * {x})"
            return f"({num(0.5)} * {x} * ({num(1)} + tanh{f}({inner})))"
        return f"({num(0.5)} * {x} * ({num(1)} + erf{f}({x} * {num(SQRT_HALF)})))"
    if name == "cast":
        return f"({x} != 0)" if out is DType.bool else x
    if name == "where":
        return f"({args[0][0]} ? {as_(args[1])} : {as_(args[2])})"
    raise NotImplementedError(f"no CUDA spelling for elementwise op {name!r}")


def emit_tree(tree, leaves: list[tuple[str, DType]], lines: list[str], prefix: str = "t") -> tuple[str, DType]:
    """Emit `tree` (parse_expr form) over computed `leaves` as statements; returns (name, dtype)."""
    if isinstance(tree, int):
        return leaves[tree]
    name, *subtrees = tree
    args = [emit_tree(s, leaves, lines, prefix) for s in subtrees]
    out = OPS[name].infer(*(TensorType((), d) for _, d in args)).dtype
    var = f"{prefix}{len(lines)}"
    lines.append(f"const {ctype(out)} {var} = {scalar_op(name, args, {}, out)};")
    return var, out


TRANSCENDENTAL = frozenset({"exp", "log", "tanh", "sin", "cos", "erf", "sigmoid", "silu", "gelu", "pow"})


def expr_ops(tree) -> list[str]:
    return [] if isinstance(tree, int) else [tree[0]] + [n for s in tree[1:] for n in expr_ops(s)]


# ---- the template ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ElementwiseSchedule(Schedule):
    threads: int = 256
    vec: int = 4          # consecutive result elements per thread per loop trip


THREAD_CHOICES = (256, 128)

# The register model (fit to ptxas 12.x on samples(), within 20% on sm_80 and sm_90).
REG_BASE = 10             # loop index, bound, step, output address
REG_SM90 = 1.5            # sm_90 code keeps more 64-bit addresses live
REG_SCALAR = 0.5          # a repeated operand: one value per loop trip
REG_INDEXED = 6           # ...whose offset needs index math (a division, a 64-bit address)
REG_PER_LOADED_WORD = 0.5
REG_PER_LANE = 0.5
REG_PER_BOOL_WORD = 1.25
REG_PER_STORED_WORD = 0.75
REG_PER_MASK_LANE = 0.4   # tril / triu: row and column per lane
MAX_LANES_IN_FLIGHT = 4   # ptxas overlaps the transcendental sequences of about four lanes
HEAVY_TEMPS = {"exp": 1, "log": 1, "sigmoid": 1, "silu": 1, "sin": 2, "cos": 2, "pow": 3, "tanh": 3.5,
               "gelu_tanh": 3.5, "erf": 4, "gelu": 4, "sqrt": 0.5, "rsqrt": 0.5}
GRID_WAVES = 4            # grid-stride: this many full waves of resident blocks, then loop
CREATION = frozenset({"full", "arange"})
TRIANGLE = frozenset({"tril", "triu"})


class ElementwiseTemplate(Template):
    """Every elementwise op, fused_elementwise, and the creation ops full / arange."""

    kind = "elementwise"
    ops = frozenset(n for n, d in OPS.items() if d.kind is OpKind.ELEMENTWISE) | CREATION

    def accepts(self, op: KernelOp) -> bool:
        types = op.operands + (op.result,)
        return op.op in self.ops and all(t.dtype in SUPPORTED for t in types) and op.result.numel > 0

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        if op.op == "fused_elementwise":
            return tuple(dict.fromkeys(expr_ops(parse_expr(op.attr_map["expr"]))))
        return ()

    # -- layout -------------------------------------------------------------------------------

    def _layout(self, op: KernelOp) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        out = op.result.shape
        sizes, strides = coalesce(out, [contiguous_strides(out)] + [broadcast_strides(out, t.shape) for t in op.operands])
        if op.op in TRIANGLE:   # the row and column stay separate axes: the mask needs both
            sizes, strides = out, [contiguous_strides(out)] * 2
        return sizes or (1,), [s or (1,) for s in strides]

    def _vec_ok(self, op: KernelOp, vec: int) -> bool:
        sizes, _ = self._layout(op)
        widest = max(t.dtype.itemsize for t in op.operands + (op.result,))
        return sizes[-1] % vec == 0 and vec * widest <= MAX_ACCESS_BYTES

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[ElementwiseSchedule, ...]:
        vecs = [v for v in (8, 4, 2, 1) if self._vec_ok(op, v)]
        best, half = vecs[0], vecs[min(1, len(vecs) - 1)]
        return tuple(dict.fromkeys((ElementwiseSchedule(THREAD_CHOICES[0], best),
                                    ElementwiseSchedule(THREAD_CHOICES[1], half))))

    # -- resources ----------------------------------------------------------------------------

    def _expr(self, op: KernelOp):
        if op.op == "fused_elementwise":
            return parse_expr(op.attr_map["expr"])
        return (op.op, *range(len(op.operands)))

    def resources(self, op: KernelOp, schedule: ElementwiseSchedule, arch: ArchSpec) -> Resources:
        v = schedule.vec
        sizes, strides = self._layout(op)
        units = op.result.numel // v
        resident = min(arch.max_blocks_per_sm, arch.max_warps_per_sm * 32 // schedule.threads)
        blocks = max(1, min(math.ceil(units / schedule.threads), arch.sm_count * resident * GRID_WAVES))
        # A broadcast operand is read at its own size: the repeats hit L1/L2.
        hbm = op.operand_bytes + op.result.nbytes
        tree = self._expr(op)
        heavy = sum(n in TRANSCENDENTAL for n in expr_ops(tree))
        return Resources(threads=schedule.threads, blocks=blocks, registers=self._registers(op, v, strides, arch),
                         smem_bytes=0, hbm_bytes=hbm, flops=op.flops, unit=MathUnit.FP32,
                         efficiency=1.0 if heavy < 2 else 0.8)

    def _registers(self, op: KernelOp, v: int, strides, arch: ArchSpec) -> int:
        # Calibrated against ptxas on samples(); every term is a value the loop keeps live.
        regs = REG_BASE + (REG_SM90 if arch.compute_capability >= (9, 0) else 0)
        for t, st in zip(op.operands, strides[1:]):
            if not st[-1]:   # one value per trip; an indexed one pays a division and its own address
                regs += REG_SCALAR + (REG_INDEXED if any(st) else 0)
            elif t.dtype is DType.bool:   # bytes stay packed four to a register
                regs += REG_PER_BOOL_WORD * max(1, v // 4)
            else:            # the loaded vector, then its values unpacked to compute type
                regs += REG_PER_LOADED_WORD * max(1, v * t.dtype.itemsize // 4) + REG_PER_LANE * v * words(t.dtype)
        lanes_in_flight = min(v, MAX_LANES_IN_FLIGHT)
        regs += sum(HEAVY_TEMPS.get(n, 0) for n in self._ops_weighted(op)) * lanes_in_flight
        if not op.operands:  # creation ops: only the packed result vector is live
            regs += REG_PER_STORED_WORD * max(1, v * op.result.dtype.itemsize // 4)
        if op.op in TRIANGLE:
            regs += REG_PER_MASK_LANE * v
        return round(regs)

    def _ops_weighted(self, op: KernelOp) -> list[str]:
        names = expr_ops(self._expr(op))
        if op.op == "gelu":
            names = ["gelu_tanh" if op.attr_map.get("approximate") == "tanh" else "gelu"]
        return names

    # -- emission -----------------------------------------------------------------------------

    def emit(self, op: KernelOp, schedule: ElementwiseSchedule, arch: ArchSpec) -> KernelSource:
        v, n = schedule.vec, op.result.numel
        sizes, strides = self._layout(op)
        idx = index_type(n)
        name = kernel_name(self.kind, op, schedule)
        out_t = STORAGE[op.result.dtype]
        params = [f"const {STORAGE[t.dtype]}* __restrict__ in{i}" for i, t in enumerate(op.operands)]
        params.append(f"{out_t}* __restrict__ out")
        body, leaves = [], []
        for i, (t, st) in enumerate(zip(op.operands, strides[1:])):
            off = offset_expr("i", sizes, st)
            if st[-1]:   # this operand runs along the result's inner axis: one vector load
                body.append(f"const vec_t<{STORAGE[t.dtype]}, {v}> a{i} = "
                            f"*reinterpret_cast<const vec_t<{STORAGE[t.dtype]}, {v}>*>(in{i} + ({off}));")
                leaves.append((f"x{i}", t.dtype, f"a{i}.v[j]"))
            else:        # repeated along the inner axis: one scalar serves all lanes
                body.append(f"const {STORAGE[t.dtype]} a{i} = in{i}[{off}];")
                leaves.append((f"x{i}", t.dtype, f"a{i}"))
        lane = [f"const {ctype(d)} {x} = {load(d, src)};" for x, d, src in leaves]
        value = self._value(op, [(x, d) for x, d, _ in leaves], lane, idx)
        cfg = schedule.describe()
        source = f"""// {op}
// elementwise, schedule {cfg}; shapes are baked in (broadcast index math specialized).
// launch: {name}<<<grid, {schedule.threads}>>>({', '.join(f'in{i}' for i in range(len(op.operands)))}{', ' if op.operands else ''}out)
//   any grid works (grid-stride loop); resources() gives the one the model assumes.
{VEC_STRUCT}

extern "C" __global__ void __launch_bounds__({schedule.threads}) {name}({', '.join(params)}) {{
    const {idx} step = gridDim.x * blockDim.x * {v}u;
    for ({idx} i = ((({idx})blockIdx.x) * blockDim.x + threadIdx.x) * {v}u; i < {n}u; i += step) {{
        {chr(10).join('        ' + s for s in body).strip()}
        vec_t<{out_t}, {v}> r;
        #pragma unroll
        for (int j = 0; j < {v}; ++j) {{
            {chr(10).join('            ' + s for s in lane).strip()}
            r.v[j] = {store(op.result.dtype, value)};
        }}
        *reinterpret_cast<vec_t<{out_t}, {v}>*>(out + i) = r;
    }}
}}
"""
        return KernelSource(name, source, schedule.threads)

    def _value(self, op: KernelOp, leaves: list[tuple[str, DType]], lines: list[str], idx: str) -> str:
        a, out = op.attr_map, op.result.dtype
        if op.op == "full":
            return literal(a["value"], out)
        if op.op == "arange":
            c = ctype(out)
            step = f"({c})(i + j) * {literal(a['step'], out)}" if c != "bool" else "(i + j)"
            return f"({literal(a['start'], out)} + {step})"
        if op.op in TRIANGLE:
            rows, cols = op.result.shape[-2:]
            lines.append(f"const int col = (int)((i + j) % {cols}u), row = (int)(((i + j) / {cols}u) % {rows}u);")
            keep = "<=" if op.op == "tril" else ">="
            return f"((col - row {keep} {int(a['k'])}) ? {leaves[0][0]} : {literal(0, leaves[0][1])})"
        if op.op == "fused_elementwise":
            var, _ = emit_tree(parse_expr(a["expr"]), leaves, lines)
            return var
        return scalar_op(op.op, leaves, dict(a), out)

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32, b = DType.bfloat16, DType.float32, DType.bool
        big, row, col = TensorType((4096, 4096), bf), TensorType((4096,), bf), TensorType((4096, 1), bf)
        x32 = TensorType((2048, 1024), f32)

        def ew(name, *xs, **attrs):
            return KernelOp.of(name, xs, OPS[name].infer(*xs, **attrs), **attrs)

        mask = TensorType((1, 1, 1024, 1024), b)
        scores = TensorType((4, 8, 1024, 1024), bf)
        return (
            ew("add", big, row),                                   # bf16 bias broadcast, vec 8
            ew("mul", x32, TensorType((), f32)),                   # fp32 times a scalar
            ew("exp", x32),
            ew("gelu", big, approximate="tanh"),
            ew("gelu", x32, approximate="none"),
            ew("sub", big, col),                                   # inner-broadcast operand
            ew("where", mask, scores, TensorType((), bf)),         # masked fill
            ew("cast", x32, dtype=bf),
            ew("lt", x32, TensorType((1024,), f32)),
            ew("logical_and", TensorType((4096, 4096), b), TensorType((4096, 4096), b)),
            ew("tril", big, k=0),
            ew("fused_elementwise", big, row, big, expr="mul(relu(add($0,$1)),$2)"),
            KernelOp.of("full", (), TensorType((4096, 4096), bf), shape=(4096, 4096), value=1.5, dtype=bf),
            KernelOp.of("arange", (), TensorType((1 << 20,), f32), start=0, stop=1 << 20, step=1, dtype=f32),
        )
