"""The per-element CUDA spelling the element-walking templates share: elementwise, rowwise,
reduction and copy.

How one value is typed, loaded, stored and written as a literal (16- and 8-bit floats compute in
fp32); the `vec_t` struct behind vector loads and stores; where an element of a broadcast operand
lives (strides, coalesced axes, offset expressions); C expressions for elementwise ops and for
fused expression trees; and the stable kernel name. It is a module of its own because four
templates import it and none of them owns it; it imports no template.

>>> from tessera_rw.algebra.dtypes import DType
>>> lines = []
>>> emit_tree(("relu", ("add", 0, 1)), [("x0", DType.bfloat16), ("x1", DType.bfloat16)], lines)
('t1', <DType.bfloat16: 'bfloat16'>)
>>> lines[1]
'const float t1 = (t0 < 0.0f ? 0.0f : t0);'
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable

from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.shapes import contiguous_strides
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.fused_expr import Scalar, expression_op
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule

# ---- scalar types ---------------------------------------------------------------------------

STORAGE = {DType.float32: "float", DType.float16: "f16_t", DType.bfloat16: "bf16_t", DType.float64: "double",
           DType.int32: "int", DType.int64: "long long", DType.bool: "unsigned char",
           DType.float8_e4m3: "fp8_t", DType.float8_e5m2: "fp8_t"}
# fp8 widening to fp32: exact, in plain arithmetic (the prelude's helpers), so any arch reads fp8
FP8_LOADS = {DType.float8_e4m3: "e4m3_to_f32", DType.float8_e5m2: "e5m2_to_f32"}
# dtypes every element-walking template reads and writes (complex is the fft's)
SUPPORTED = frozenset(STORAGE) - frozenset(FP8_LOADS)
# ...and what the elementwise template also reads: fp8 (narrowing to fp8 is the GEMM epilogue's)
READABLE = frozenset(STORAGE)
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
    if d in FP8_LOADS:
        return f"{FP8_LOADS[d]}({x})"
    return {DType.bfloat16: f"bf16_to_f32({x})", DType.float16: f"f16_to_f32({x})",
            DType.bool: f"({x} != 0)"}.get(d, x)


def store(d: DType, x: str) -> str:
    """A computed value as stored `d` (bool stores 0/1 bytes like numpy)."""
    return {DType.bfloat16: f"f32_to_bf16((float)({x}))", DType.float16: f"f32_to_f16((float)({x}))",
            DType.bool: f"(unsigned char)(({x}) != 0)"}.get(d, f"({STORAGE[d]})({x})")


# the bits of the values C++ has no literal for, by compute type
_NON_FINITE = {"float": ("__int_as_float(0x7f800000)", "__int_as_float(0x7fffffff)"),
               "double": ("__longlong_as_double(0x7ff0000000000000LL)", "__longlong_as_double(0x7ff8000000000000LL)")}


def literal(value: float, d: DType) -> str:
    """`value` as a C++ literal of `d`'s compute type; ±inf and NaN by their bits.

    >>> literal(0.5, DType.float32), literal(float("-inf"), DType.float32), literal(float("nan"), DType.float64)
    ('0.5f', '(-__int_as_float(0x7f800000))', '__longlong_as_double(0x7ff8000000000000LL)')
    """
    c = ctype(d)
    if c in _NON_FINITE:
        v = float(value)
        if not math.isfinite(v):
            inf, nan = _NON_FINITE[c]
            return nan if math.isnan(v) else inf if v > 0 else f"(-{inf})"
        return f"{v!r}f" if c == "float" else f"{v!r}"
    if c == "bool":
        return "true" if value else "false"
    return f"({c}){int(value)}"


def float_literal(value: float) -> str:
    """`value` as a C++ float literal: '0.125f', or the bits of ±inf and NaN."""
    return literal(value, DType.float32)


VEC_STRUCT = """template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };"""


def vector_widths(widths: Iterable[int], fits: Callable[[int], bool]) -> tuple[int, ...]:
    """The widths of a tuning grid that `fits` admits, scalar access (1) only when no wider one does:
    a scalar walk of data that vectorizes issues more loads for the same bytes, and ptxas gives it
    about a third fewer registers than the register models (fit on vector widths) count.

    >>> vector_widths((1, 2, 4, 8), lambda v: 12 % v == 0)
    (2, 4)
    >>> vector_widths((1, 2, 4), lambda v: v == 1)
    (1,)
    """
    ok = tuple(v for v in widths if fits(v))
    return tuple(v for v in ok if v > 1) or ok


# ---- broadcast offsets ----------------------------------------------------------------------



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
# a cast to a 16-bit float inside an expression: rounded there, then computed on in fp32
ROUNDED_CASTS = {DType.bfloat16: ("f32_to_bf16", "bf16_to_f32"), DType.float16: ("f32_to_f16", "f16_to_f32")}


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
    if name == "pow" and out.is_integer:
        return f"({c})ipow((long long)({args[0][0]}), (long long)({args[1][0]}))"
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
        if out is DType.bool:
            return f"({x} != 0)"
        if out in ROUNDED_CASTS:         # rounded as a stored value is (16-bit values compute in fp32 unrounded)
            to, back = ROUNDED_CASTS[out]
            return f"{back}({to}({as_(args[0], 'float')}))"
        return x
    if name == "where":
        return f"({args[0][0]} ? {as_(args[1])} : {as_(args[2])})"
    raise NotImplementedError(f"no CUDA spelling for elementwise op {name!r}")


def emit_tree(tree, leaves: list[tuple[str, DType]], lines: list[str], prefix: str = "t") -> tuple[str, DType]:
    """Emit `tree` (parse_expr form) over computed `leaves` as statements; returns (name, dtype)."""
    if isinstance(tree, int):
        return leaves[tree]
    if isinstance(tree, Scalar):
        return literal(tree.value, tree.dtype), tree.dtype
    name, *subtrees = tree
    args = [emit_tree(s, leaves, lines, prefix) for s in subtrees]
    op, attrs = expression_op(name)
    out = OPS[op].infer(*(TensorType((), d) for _, d in args), **attrs).dtype
    var = f"{prefix}{len(lines)}"
    lines.append(f"const {ctype(out)} {var} = {scalar_op(op, args, attrs, out)};")
    return var, out


def expr_ops(tree) -> list[str]:
    return [] if isinstance(tree, (int, Scalar)) else [tree[0]] + [n for s in tree[1:] for n in expr_ops(s)]
