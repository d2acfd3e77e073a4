"""What every GEMM kernel shares: its name, batch offsets, epilogue and launch comment.

GemmTemplate (gemm.py) decodes the op into a GemmProblem (gemm_problem.py), picks the schedule and
models its cost; the emitters spell the chosen kernel out with every size folded in as a constant:
gemm_mma_cuda.py on tensor cores, gemm_simt_cuda.py in FFMA. Both build on this module's pieces,
so the epilogue reads the same in each.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.kernel_op import KernelOp
>>> from tessera_rw.codegen.templates.gemm import GemmSimtSchedule
>>> from tessera_rw.codegen.templates.gemm_problem import GemmProblem
>>> t = TensorType((64, 64), DType.float32)
>>> kernel_name(GemmProblem.of(KernelOp.of("matmul", (t, t), t, accum_dtype=None)), GemmSimtSchedule())
'gemm_f32_f32_none_1x64x64x64_128x128x8x8x8'
>>> kernel_name(GemmProblem.of(KernelOp.of("gemm", (t, t), t, scale=1.0, activation="none", has_bias=False,
...                           has_residual=False, accum_dtype=None, dtype=DType.float32, trans_b=True)),
...             GemmSimtSchedule())
'gemm_f32_f32_none_nt_1x64x64x64_128x128x8x8x8'
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import TYPE_CHECKING

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.codegen.templates.cuda_scalar import float_literal
from tessera_rw.codegen.templates.gemm_tile_order import tile_origin

if TYPE_CHECKING:
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem

CTYPE = {DType.float32: "float", DType.bfloat16: "bf16_t", DType.float16: "f16_t",
         DType.float8_e4m3: "fp8_t", DType.float8_e5m2: "fp8_t"}
_LOAD = {DType.float32: "{}", DType.bfloat16: "bf16_to_f32({})", DType.float16: "f16_to_f32({})"}
_ACT = {
    "none": "v",
    "relu": "(v < 0.0f ? 0.0f : v)",            # NaN stays NaN, as the elementwise relu keeps it
    "gelu": "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))",
    "gelu_tanh": "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))",
    "silu": "v / (1.0f + expf(-v))",
}
# v · act'(a) for a derivative activation, a being the aux operand's element: statements, as the
# tanh-gelu derivative uses its tanh twice
_DERIVATIVE = {
    "drelu": "v = a > 0.0f ? v : 0.0f;",
    "dgelu": "v *= 0.5f * (1.0f + erff(a * 0.70710678118654752f)) + a * 0.39894228040143268f * expf(-0.5f * a * a);",
    "dgelu_tanh": ("const float t = tanhf(0.79788456080286536f * (a + 0.044715f * a * a * a)); "
                   "v *= 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * a * a);"),
    "dsilu": "const float sg = 1.0f / (1.0f + expf(-a)); v *= sg * (1.0f + a * (1.0f - sg));",
}


def kernel_name(p: GemmProblem, s: Schedule) -> str:
    """The entry point's name: dtypes, epilogue, sizes and tile, one name per specialization."""
    quiet = s.quiet_fields()
    changed = [(name, getattr(s, name)) for name, default in quiet.items() if getattr(s, name) != default]
    named = "".join(f"_{name}" if value is True else f"_{name}{value}" for name, value in changed)
    tile = s.tag + "x".join(str(getattr(s, f.name)) for f in fields(s) if f.name not in quiet) + named
    epi = ("b" if p.bias else "") + (("g" if p.gate else "r") if p.residual else "") + \
        ("bgrad" if p.bias_grad else "") + ("pre" if p.keep_pre else "")
    layout = "" if p.layout == "nn" else "_" + p.layout
    shape = f"{p.nbatch}x{p.m}x{p.n}x{p.k}"
    operands = "tf32" if p.tf32 else p.in_dtype.short
    return f"gemm_{operands}_{p.out_dtype.short}_{p.activation}{epi and '_' + epi}{layout}_{shape}_{tile}"


def _batch_offset(name: str, shape: tuple[int, ...], out_batch: tuple[int, ...], inner: int) -> str:
    """A device function: the element offset of batch `z` (flattened over `out_batch`) in a tensor
    whose leading dims `shape` broadcast to `out_batch` and whose matrices hold `inner` elements."""
    shape = (1,) * (len(out_batch) - len(shape)) + tuple(shape)
    if shape == out_batch:
        body = f"(long long)z * {inner}LL" if math.prod(out_batch) > 1 else "0LL"
    else:
        terms, stride, below = [], inner, 1
        for size, out in reversed(list(zip(shape, out_batch))):
            if size == out and size > 1:
                terms.append(f"(long long)((z / {below}) % {size}) * {stride}LL")
            stride *= size
            below *= out
        body = " + ".join(terms) or "0LL"
    return f"__device__ __forceinline__ long long gemm_boff_{name}(int z) {{ return {body}; }}\n"


def _operand_index(name: str, t: TensorType, p: GemmProblem) -> str:
    """Offset functions of a bias/aux/residual broadcast onto (batch..., M, N)."""
    shape = (1,) * (len(p.batch) + 2 - t.ndim) + t.shape
    rows, cols = shape[-2], shape[-1]
    rs = cols if rows > 1 else 0
    cs = 1 if cols > 1 else 0
    return (_batch_offset(name, shape[:-2], p.batch, rows * cols) +
            f"__device__ __forceinline__ long long gemm_idx_{name}(int z, int r, int c) "
            f"{{ return gemm_boff_{name}(z) + (long long)r * {rs} + (long long)c * {cs}; }}\n")


def common(p: GemmProblem) -> tuple[str, str, str]:
    """(device functions, extra kernel parameters, epilogue function) shared by both paths."""
    t_in = CTYPE[p.in_dtype]
    fns = (_batch_offset("a", p.a_batch, p.batch, p.a_rows * p.k) +
           _batch_offset("b", p.b_batch, p.batch, p.k * p.n) +
           _batch_offset("c", p.batch, p.batch, p.m * p.n))
    params, args, steps = "", "", []
    if p.scale != 1.0:
        steps.append(f"v *= {float_literal(p.scale)};")
    operands = (("bias", p.bias), ("aux", p.aux), ("res", p.residual))
    for name, t in operands:
        if t is None:
            continue
        fns += _operand_index(name, t, p)
        params += f"const {CTYPE[t.dtype]}* __restrict__ {name}, "
        args += f", {name}"
    if p.bias is not None:
        steps.append(f"v += {_LOAD[p.bias.dtype].format('bias[gemm_idx_bias(z, r, c)]')};")
    if p.aux is not None:
        steps.append(f"const float a = {_LOAD[p.aux.dtype].format('aux[gemm_idx_aux(z, r, c)]')}; "
                     f"{_DERIVATIVE[p.activation]}")
    elif p.keep_pre:        # the stores write v, then gemm_activate(v) one product further on
        fns += f"__device__ __forceinline__ float gemm_activate(float v) {{ return {_ACT[p.activation]}; }}\n"
    else:
        steps.append(f"v = {_ACT[p.activation]};")
    if p.residual is not None:      # added, or a gate multiplied by
        steps.append(f"v {'*' if p.gate else '+'}= {_LOAD[p.residual.dtype].format('res[gemm_idx_res(z, r, c)]')};")
    epi_params = "".join(f", const {CTYPE[t.dtype]}* __restrict__ {n}" for n, t in operands if t is not None)
    fns += (f"__device__ __forceinline__ float gemm_epilogue(float v, int z, int r, int c{epi_params}) {{\n"
            f"    {' '.join(steps)}\n    return v;\n}}\n")
    signature = (f"const {t_in}* __restrict__ A, const {t_in}* __restrict__ B, {params}"
                 f"{CTYPE[p.out_dtype]}* __restrict__ C")
    return fns, signature, args


def launch_comment(p: GemmProblem, s: Schedule, name: str, signature: str) -> str:
    return (f"// launch: {name}<<<{p.tiles(s.bm, s.bn)}, {s.threads}>>> (a 1-d grid of resources().blocks, "
            f"no dynamic shared memory)\n// arguments: {signature}\n")


def block_origin(ctype: str, group: int) -> str:
    """The kernel lines placing a block: its tile's first row m0 and column n0 and its batch z
    (walking `group` tile rows per group, gemm_tile_order.py), and the batch's A and B (of C type
    `ctype`) at Ab and Bb."""
    return f"""{tile_origin(group)}
    const {ctype}* Ab = A + gemm_boff_a(z);
    const {ctype}* Bb = B + gemm_boff_b(z);"""


def a_rows_name(p: GemmProblem) -> str:
    """The constant the kernel calls A's rows by: M, or MA below the ones row of a bias gradient."""
    return "MA" if p.bias_grad else "M"


def ones_row_decl(p: GemmProblem) -> str:
    """The declaration of MA, the rows of A in memory, when a bias gradient's ones row follows them."""
    return f"\n    constexpr int MA = {p.a_rows};   // rows of A; row MA is the virtual row of ones" if p.bias_grad else ""
