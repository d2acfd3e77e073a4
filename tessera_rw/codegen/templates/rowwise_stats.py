"""The CUDA text of a row's statistics for RowwiseTemplate: the resident and looped walks, the
block-wide sum and max, and the compensated sums of the kahan_sum numerics policy.

RowwiseTemplate (rowwise.py) decides the geometry, models the cost and spells the loads and the
epilogue; this module spells how the statistics (max, softmax's denominator, mean, variance, mean
square) are computed and combined across a row's threads.

>>> Sums("warp_sum", kahan=False).add("s", "x")
's += x;'
>>> Sums("rowwise_warp_sum_kahan", kahan=True).add("s", "x")
'kahan_add(s, s_c, x);'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tessera_rw.codegen.numerics import COMPENSATED_SUM_CUDA
from tessera_rw.codegen.templates.cuda_scalar import float_literal


@dataclass(frozen=True)
class Sums:
    """How a statistic's sum is spelled: plain fp32, or a (sum, compensation) pair under kahan_sum."""
    reduce: str          # the function combining the threads of a row: (s) or (s, s_c) -> total
    kahan: bool

    def init(self, name: str) -> str:
        return f"float {name} = 0.0f, {name}_c = 0.0f;" if self.kahan else f"float {name} = 0.0f;"

    def add(self, name: str, value: str) -> str:
        return f"kahan_add({name}, {name}_c, {value});" if self.kahan else f"{name} += {value};"

    def scale(self, name: str, factor: str) -> str:
        return f"{name} *= {factor}; {name}_c *= {factor};" if self.kahan else f"{name} *= {factor};"

    def total(self, name: str, factor: str | None = None) -> str:
        """The row's sum, each thread's part multiplied by `factor` first."""
        f = f" * {factor}" if factor else ""
        return f"{self.reduce}({name}{f}, {name}_c{f})" if self.kahan else f"{self.reduce}({name}{f})"


def kahan_helpers(block: bool, warps: int) -> str:
    """Compensated adds, and the row sum merging (sum, compensation) pairs: warp shuffles, then
    (block mode) the warps' pairs through shared memory."""
    warp = """__device__ __forceinline__ void rowwise_warp_merge(float& s, float& c) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o), c2 = __shfl_xor_sync(0xffffffffu, c, o);
        kahan_merge(s, c, s2, c2);
    }
}
__device__ __forceinline__ float rowwise_warp_sum_kahan(float s, float c) {
    rowwise_warp_merge(s, c);
    return kahan_total(s, c);
}"""
    if not block:
        return COMPENSATED_SUM_CUDA + warp
    return COMPENSATED_SUM_CUDA + warp + f"""
__device__ __forceinline__ float rowwise_block_sum_kahan(float s, float c) {{
    __shared__ float partial_s[{warps}], partial_c[{warps}];
    rowwise_warp_merge(s, c);
    __syncthreads();                      // the previous reduction may still be reading the partials
    if (threadIdx.x % 32u == 0) {{ partial_s[threadIdx.x / 32u] = s; partial_c[threadIdx.x / 32u] = c; }}
    __syncthreads();
    const bool live = threadIdx.x % 32u < {warps}u;
    s = live ? partial_s[threadIdx.x % 32u] : 0.0f;
    c = live ? partial_c[threadIdx.x % 32u] : 0.0f;
    rowwise_warp_merge(s, c);
    return kahan_total(s, c);
}}"""


def block_helpers(warps: int) -> str:
    """Block-wide sum / max: warp shuffles, then the warps' partials through shared memory."""
    fns = []
    for name, warp_fn, ident in (("sum", "warp_sum", "0.0f"), ("max", "warp_max", f"-{float_literal(math.inf)}")):
        fns.append(f"""__device__ __forceinline__ float rowwise_block_{name}(float x) {{
    __shared__ float partial[{warps}];
    x = {warp_fn}(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return {warp_fn}(threadIdx.x % 32u < {warps}u ? partial[threadIdx.x % 32u] : {ident});
}}""")
    return "\n".join(fns)


# ---- the statistics ----------------------------------------------------------------------

def resident_statistics(spec, length: int, v: int, tpr: int, sums: Sums, red_max: str,
                        prologue, epilogue) -> list[str]:
    """A row held in registers: load it once, reduce its statistics, write it normalized."""
    chunks = math.ceil(length / (tpr * v))
    ragged = length % (tpr * v) != 0
    inf = float_literal(math.inf)
    neutral = f"-{inf}" if spec.norm in ("softmax", "log_softmax") else "0.0f"

    def each(lines: list[str], guarded: bool = True) -> list[str]:
        inner = []
        if (ragged and guarded) or any(re.search(r"\bc\b", x) for x in lines):   # the column, where a line reads it
            inner = [f"const unsigned c = (k * {tpr}u + lane) * {v}u;"]
        if ragged and guarded:
            inner += [f"if (c >= {length}u) continue;"]
        return ["#pragma unroll", f"for (int k = 0; k < {chunks}; ++k) {{", *("    " + x for x in inner + lines), "}"]

    out = [f"float v[{chunks}][{v}];"]
    load = prologue("v[k][j]")
    if ragged:
        load = [f"if (c >= {length}u) {{ for (int j = 0; j < {v}; ++j) v[k][j] = {neutral}; continue; }}"] + load
    out += each(load, guarded=False)
    def lanes(stmt: str) -> list[str]:
        return ["#pragma unroll", f"for (int j = 0; j < {v}; ++j) {stmt}"]
    if spec.norm in ("softmax", "log_softmax"):
        out += [f"float m = -{inf};"] + each(lanes("m = fmaxf(m, v[k][j]);"), False) + [f"m = {red_max}(m);"]
        shift = f"v[k][j] = v[k][j] - m; {sums.add('s', 'expf(v[k][j])')}" if spec.norm == "log_softmax" else \
            f"v[k][j] = expf(v[k][j] - m); {sums.add('s', 'v[k][j]')}"
        out += [sums.init("s")] + each(lanes("{ " + shift + " }")) + [f"const float denom = {sums.total('s')};"]
        value = "v[k][j] - logf(denom)" if spec.norm == "log_softmax" else "v[k][j] * inv"
        out += ["const float inv = 1.0f / denom;"]
    elif spec.norm == "layernorm":
        out += [sums.init("s")] + each(lanes(sums.add("s", "v[k][j]")), False)
        out += [f"const float mean = {sums.total('s')} * (1.0f / {length}.0f);", sums.init("q")]
        out += each(lanes(f"{{ v[k][j] -= mean; {sums.add('q', 'v[k][j] * v[k][j]')} }}"))
        out += [f"const float rstd = rsqrtf({sums.total('q')} * (1.0f / {length}.0f) + {float_literal(spec.eps)});"]
        value = "v[k][j] * rstd"
    else:
        out += [sums.init("q")] + each(lanes(sums.add("q", "v[k][j] * v[k][j]")), False)
        out += [f"const float rstd = rsqrtf({sums.total('q')} * (1.0f / {length}.0f) + {float_literal(spec.eps)});"]
        value = "v[k][j] * rstd"
    written = epilogue(value)
    return out + (each(written) if written else [])     # nothing written: the statistics were the point

def looped_statistics(spec, length: int, v: int, tpr: int, sums: Sums, red_max: str,
                      prologue, epilogue) -> list[str]:
    """A row longer than the registers: one walk per statistic, then one writing the result."""
    def walk(lines: list[str]) -> list[str]:
        return [f"for (unsigned c = lane * {v}u; c < {length}u; c += {tpr * v}u) {{",
                f"    float x[{v}];", *("    " + x for x in prologue("x[j]") + lines), "}"]

    def lanes(stmt: str) -> list[str]:
        return ["#pragma unroll", f"for (int j = 0; j < {v}; ++j) {stmt}"]

    inv_len = f"(1.0f / {length}.0f)"
    eps = float_literal(spec.eps)
    if spec.norm in ("softmax", "log_softmax"):
        inf = float_literal(math.inf)
        # Online softmax, rescaled once per vector: the running sum moves to the new maximum.
        online = ["float cm = x[0];", *lanes("cm = fmaxf(cm, x[j]);"), "const float n = fmaxf(m, cm);",
                  f"if (n != -{inf}) {{", f"    {{ const float f = expf(m - n); {sums.scale('s', 'f')} }}",
                  f"    for (int j = 0; j < {v}; ++j) {sums.add('s', 'expf(x[j] - n)')}", "    m = n;", "}"]
        out = [f"float m = -{inf};", sums.init("s")] + walk(online)
        out += [f"const float mx = {red_max}(m);",
                f"const float rescale = m == -{inf} ? 0.0f : expf(m - mx);",
                f"const float denom = {sums.total('s', 'rescale')};"]
        value = "x[j] - mx - logf(denom)" if spec.norm == "log_softmax" else "expf(x[j] - mx) * inv"
        out += ["const float inv = 1.0f / denom;"]
    elif spec.norm == "layernorm":
        out = [sums.init("s")] + walk(lanes(sums.add("s", "x[j]")))
        out += [f"const float mean = {sums.total('s')} * {inv_len};", sums.init("q")]
        out += walk(lanes(sums.add("q", "(x[j] - mean) * (x[j] - mean)")))
        out += [f"const float rstd = rsqrtf({sums.total('q')} * {inv_len} + {eps});"]
        value = "(x[j] - mean) * rstd"
    else:
        out = [sums.init("q")] + walk(lanes(sums.add("q", "x[j] * x[j]")))
        out += [f"const float rstd = rsqrtf({sums.total('q')} * {inv_len} + {eps});"]
        value = "x[j] * rstd"
    written = epilogue(value)
    return out + (walk(written) if written else [])
