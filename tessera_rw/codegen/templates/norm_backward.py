"""A layer norm's or RMS norm's input gradient, norm_backward, as one row kernel.

Per row of x and its cotangent g (w the weight, n the row's length):

    layernorm:  μ = Σx/n,  r = rsqrt(Σ(x − μ)²/n + eps),  x̂ = (x − μ) r
                dx = r (g w − Σ g w / n − x̂ Σ g w x̂ / n)
    rmsnorm:    r = rsqrt(Σx²/n + eps),  x̂ = x r,  dx = r (g w − x̂ Σ g w x̂ / n)

The geometry and the loads are RowwiseTemplate's (a warp or a block per row). When a thread's share
of both rows fits in registers (`rows_held` = 2), x and g·w are read from HBM once and every
statistic is reduced over the registers; a longer row is walked once per statistic (layernorm:
mean, variance, the two gradient sums, the write; rmsnorm one pass fewer), x alone in the first
walks. Statistics are fp32 and compensated under the `kahan_sum` policy like the forward's.
norm_backward_stats is the same kernel writing each row's statistics after dx as it goes (the
row's first thread: the mean, var and var + eps; an RMS norm's mean(x²) and mean(x²) + eps), for
the weight gradient to read.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.arch import arch_named
>>> x, w = TensorType((4096, 4096), DType.bfloat16), TensorType((4096,), DType.bfloat16)
>>> op = KernelOp.of("norm_backward", (x, x, w), x, norm="layernorm", axes=(1,), eps=1e-5, has_weight=True)
>>> t = NormBackwardTemplate()
>>> s = t.schedules(op, arch_named("h100"))[0]
>>> (s.describe(), t.row_values(op, s), t.resident(op, s))
('threads=256 vec=8 rows_per_block=1', 32, True)
"""

from __future__ import annotations

import math
import re
from functools import partial

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.norm_backward import stats_layout
from tessera_rw.codegen.arch import ArchSpec, arch_named  # noqa: F401  (doctest)
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.cuda_scalar import STORAGE, float_literal, index_type, store
from tessera_rw.codegen.templates.rowwise import REG_KAHAN, RowwiseSchedule, RowwiseTemplate, row_spec
from tessera_rw.codegen.templates.rowwise_stats import Sums

PASSES = {"layernorm": 4, "rmsnorm": 3}      # the looped walk's reads of a row
# The register model, fit to ptxas 12.x on samples() (within 16% on sm_80 and sm_90): resident, the
# row values held (x and g·w) over a base of statistics, addresses and loop state; looped, a constant
# (each walk is kept rolled, `#pragma unroll 1`, one vector of each operand in flight).
REG_RESIDENT_BASE = 16
REG_PER_HELD = 1.0
REG_LOOPED = 36


class NormBackwardTemplate(RowwiseTemplate):
    """norm_backward: the input gradient of layernorm / rmsnorm (kind 'layernorm', fused 'backward')."""

    kind = "layernorm"
    ops = frozenset({"norm_backward", "norm_backward_stats"})
    rows_held = 2

    def kind_of(self, op: KernelOp) -> str:
        return "layernorm"

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return (("backward",) + (("residual",) if op.attr_map.get("has_residual") else ())
                + (("row_stats",) if op.op == "norm_backward_stats" else ()))

    def row_shape(self, op: KernelOp) -> tuple[int, ...]:
        return op.operands[0].shape              # x's: norm_backward_stats's result is flat

    def describe_norm(self, op: KernelOp) -> str:
        return f"{op.attr_map['norm']} input gradient"

    def looped_passes(self, op: KernelOp) -> int:
        return PASSES[op.attr_map["norm"]]

    def reread_bytes(self, op: KernelOp) -> int:
        # x in every walk, g (and the weight) only in the last two
        x, g = op.operands[:2]
        return (self.looped_passes(op) - 1) * x.nbytes + g.nbytes

    def _registers(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> int:
        kahan = REG_KAHAN if op.numerics is Numerics.KAHAN_SUM else 0
        if self.resident(op, s):
            return round(REG_RESIDENT_BASE + REG_PER_HELD * self.row_values(op, s) + kahan)
        return REG_LOOPED + kahan

    def emit(self, op: KernelOp, s: RowwiseSchedule, arch: ArchSpec) -> KernelSource:
        spec = row_spec(op)
        _, length = self._row(op)
        v, tpr = s.vec, s.threads // s.rows_per_block
        acc = self._accesses(op)
        sums, _ = self.reductions(op, s)
        centered = spec.norm == "layernorm"

        walk = _resident if self.resident(op, s) else _looped
        stats = walk(centered, length, v, tpr, spec.eps, sums, partial(self.load_rows, op, acc, v),
                     partial(self.write_dx, op, acc, v), self._statistics_store(op))
        return self.kernel_source(op, s, arch, acc, stats)

    def load_rows(self, op: KernelOp, acc: list[tuple], v: int, x_to: str, gw_to: str | None) -> list[str]:
        """Load x's vector at column c into `x_to`[j], and g·w's into `gw_to`[j] where given."""
        x_lines, x = self.read(op, acc, 0, "x", v)
        lines, body = list(x_lines), [f"{x_to} = {x};"]
        if gw_to is not None:
            g_lines, g = self.read(op, acc, 1, "g", v)
            lines += g_lines
            if row_spec(op).weight is not None:
                w_lines, w = self.read(op, acc, 2, "w", v)
                lines += w_lines
                g = f"{g} * {w}"
            body.append(f"{gw_to} = {g};")
        return lines + ["#pragma unroll", f"for (int j = 0; j < {v}; ++j) {{", *("    " + b for b in body), "}"]

    def write_dx(self, op: KernelOp, acc: list[tuple], v: int, value: str) -> list[str]:
        """dx's vector at column c of `row` stored, the residual's added first where there is one."""
        _, length = self._row(op)
        ot = f"vec_t<{STORAGE[op.result.dtype]}, {v}>"
        idx = index_type(op.result.numel)
        lines = []
        if row_spec(op).epilogue:
            lines, r = self.read(op, acc, len(op.operands) - 1, "r", v)
            value = f"{value} + {r}"
        return lines + [f"{ot} o;", "#pragma unroll",
                        f"for (int j = 0; j < {v}; ++j) o.v[j] = {store(op.result.dtype, value)};",
                        f"*reinterpret_cast<{ot}*>(out + ({idx})row * {length}u + c) = o;"]

    def _statistics_store(self, op: KernelOp) -> list[str]:
        """norm_backward_stats's: the row's first thread writes its statistics after dx (all rows'
        means, then their var, then var + eps, each from an aligned start; rmsnorm's var is mean(x²)),
        and block 0 zeroes the gaps before them; none for norm_backward."""
        if op.op != "norm_backward_stats":
            return []
        rows, _ = self._row(op)
        dx = op.operands[0].numel
        idx = index_type(op.result.numel)
        values = ("mean", "var", "var_eps") if op.attr_map["norm"] == "layernorm" else ("var", "var_eps")
        starts, _ = stats_layout(dx, rows, len(values))
        stores = [f"out[({idx}){start}u + row] = {store(op.result.dtype, v)};" for start, v in zip(starts, values)]
        gaps = [(a, b) for a, b in zip((dx,) + tuple(start + rows for start in starts), starts) if b > a]
        zero = store(op.result.dtype, "0.0f")
        zeros = [f"if (blockIdx.x == 0u && threadIdx.x < {b - a}u) out[({idx}){a}u + threadIdx.x] = {zero};"
                 for a, b in gaps]
        return ["if (lane == 0) {", *("    " + line for line in stores), "}", *zeros]

    def samples(self) -> tuple[KernelOp, ...]:
        bf, f32, kahan = DType.bfloat16, DType.float32, Numerics.KAHAN_SUM

        def of(norm: str, shape: tuple[int, ...], dtype: DType, weighted: bool = True, residual: bool = False,
               name: str = "norm_backward", **kw) -> KernelOp:
            x = TensorType(shape, dtype)
            w = (TensorType(shape[-1:], dtype),) if weighted else ()
            operands = (x, x, *w, *((x,) if residual else ()))
            attrs = dict(norm=norm, axes=(len(shape) - 1,), eps=1e-5, has_weight=weighted, has_residual=residual)
            return KernelOp.of(name, operands, OPS[name].infer(*operands, **attrs), **attrs, **kw)
        return (
            of("layernorm", (8192, 4096), bf),                     # a block per row, resident
            of("layernorm", (4096, 768), bf),                      # BERT-base hidden size
            of("rmsnorm", (4096, 4096), bf),
            of("rmsnorm", (4096, 256), f32, weighted=False),       # a warp per row
            of("layernorm", (64, 65536), f32),                     # looped
            of("rmsnorm", (64, 65536), bf),
            of("layernorm", (4096, 768), bf, numerics=kahan),
            of("layernorm", (64, 65536), f32, numerics=kahan),
            of("layernorm", (4096, 1024), bf, residual=True),         # a pre-norm block's x: dx + the branch's
            of("rmsnorm", (64, 65536), bf, residual=True),
            # writing each row's statistics beside dx
            of("layernorm", (8192, 4096), bf, name="norm_backward_stats"),
            of("rmsnorm", (64, 65536), bf, residual=True, name="norm_backward_stats"),
            of("layernorm", (4096, 768), bf, numerics=kahan, name="norm_backward_stats"),
        )


def each_vector(chunks: int, length: int, v: int, tpr: int, lines: list[str], guarded: bool = True) -> list[str]:
    """`lines` for each of a thread's resident vectors k at column c; `guarded` skips those past a
    ragged row's end."""
    ragged = guarded and length % (tpr * v) != 0
    column = ragged or any(re.search(r"\bc\b", line) for line in lines)
    inner = ([f"const unsigned c = (k * {tpr}u + lane) * {v}u;"] if column else []) \
        + ([f"if (c >= {length}u) continue;"] if ragged else [])
    return ["#pragma unroll", f"for (int k = 0; k < {chunks}; ++k) {{", *("    " + x for x in inner + lines), "}"]


def lanes(stmt: str, v: int) -> list[str]:
    return ["#pragma unroll", f"for (int j = 0; j < {v}; ++j) {stmt}"]


def _resident(centered: bool, length: int, v: int, tpr: int, eps: float, sums: Sums, rows, write,
              keep: list[str]) -> list[str]:
    """x and g·w held in registers: read once, the statistics reduced over them, dx written."""
    chunks = math.ceil(length / (tpr * v))
    inv = f"(1.0f / {length}.0f)"
    load = rows("x[k][j]", "gw[k][j]")
    if length % (tpr * v):
        load = [f"if (c >= {length}u) {{ for (int j = 0; j < {v}; ++j) x[k][j] = gw[k][j] = 0.0f; continue; }}"] + load
    out = [f"float x[{chunks}][{v}], gw[{chunks}][{v}];"] + each_vector(chunks, length, v, tpr, load, guarded=False)
    if centered:
        out += [sums.init("s")] + each_vector(chunks, length, v, tpr, lanes(sums.add("s", "x[k][j]"), v), guarded=False)
        out += [f"const float mean = {sums.total('s')} * {inv};"]
        out += each_vector(chunks, length, v, tpr, lanes("x[k][j] -= mean;", v))
    out += [sums.init("q")] + each_vector(chunks, length, v, tpr, lanes(sums.add("q", "x[k][j] * x[k][j]"), v),
                                          guarded=False)
    out += [*_rstd(sums, inv, eps, keep), *_gradient_inits(centered, sums)]
    step = "{ x[k][j] *= rstd; " + (sums.add("a", "gw[k][j]") + " " if centered else "") \
        + sums.add("b", "gw[k][j] * x[k][j]") + " }"
    out += each_vector(chunks, length, v, tpr, lanes(step, v), guarded=False)
    out += _gradient_sums(centered, sums, inv)
    return out + each_vector(chunks, length, v, tpr, write("rstd * (gw[k][j] - c1 - x[k][j] * c2)"))


def _looped(centered: bool, length: int, v: int, tpr: int, eps: float, sums: Sums, rows, write,
            keep: list[str]) -> list[str]:
    """A row longer than the registers: one walk per statistic, then one writing dx."""
    def walk(with_g: bool, lines: list[str]) -> list[str]:
        decl = f"float x[{v}], gw[{v}];" if with_g else f"float x[{v}];"
        return ["#pragma unroll 1", f"for (unsigned c = lane * {v}u; c < {length}u; c += {tpr * v}u) {{", f"    {decl}",
                *("    " + x for x in rows("x[j]", "gw[j]" if with_g else None) + lines), "}"]

    inv = f"(1.0f / {length}.0f)"
    out, shift = [], ""
    if centered:
        out += [sums.init("s")] + walk(False, lanes(sums.add("s", "x[j]"), v))
        out += [f"const float mean = {sums.total('s')} * {inv};"]
        shift = " - mean"
    out += [sums.init("q")] + walk(False, lanes(f"{{ const float d = x[j]{shift}; {sums.add('q', 'd * d')} }}", v))
    out += [*_rstd(sums, inv, eps, keep), *_gradient_inits(centered, sums)]
    step = f"{{ const float xh = (x[j]{shift}) * rstd; " + (sums.add("a", "gw[j]") + " " if centered else "") \
        + sums.add("b", "gw[j] * xh") + " }"
    out += walk(True, lanes(step, v)) + _gradient_sums(centered, sums, inv)
    return out + walk(True, write(f"rstd * (gw[j] - c1 - (x[j]{shift}) * rstd * c2)"))


def _rstd(sums: Sums, inv: str, eps: float, keep: list[str]) -> list[str]:
    """rstd from the sum of squares; where the statistics are kept (`keep`, the lines storing them),
    var + eps named first and the lines after."""
    if not keep:
        return [f"const float rstd = rsqrtf({sums.total('q')} * {inv} + {float_literal(eps)});"]
    return [f"const float var = {sums.total('q')} * {inv};", f"const float var_eps = var + {float_literal(eps)};",
            "const float rstd = rsqrtf(var_eps);", *keep]


def _gradient_inits(centered: bool, sums: Sums) -> list[str]:
    """Σ g·w (layernorm only) and Σ g·w·x̂."""
    return ([sums.init("a")] if centered else []) + [sums.init("b")]


def _gradient_sums(centered: bool, sums: Sums, inv: str) -> list[str]:
    c1 = f"{sums.total('a')} * {inv}" if centered else "0.0f"
    return [f"const float c1 = {c1};", f"const float c2 = {sums.total('b')} * {inv};"]
