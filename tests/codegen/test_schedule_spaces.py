"""Every template's tuning space: its defaults first and in their order, no schedule twice, each one
valid with a finite, positive resource model, and the GEMM and attention spaces reach past their
defaults. Non-default schedules of the GEMM (bf16, fp32 SIMT, tf32, fp8) and attention (head_dim 64 and
128) kernels compile for sm_90 without spills, ptxas's register count within the register model's
bound. (Their numerics need a GPU: tests/gpu/test_schedule_space_numerics.py.)"""

from __future__ import annotations

import math

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.linalg import matmul_dims
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention import AttentionSchedule, FlashAttentionTemplate
from tessera_rw.codegen.templates.base import MAX_SPACE
from tessera_rw.codegen.templates.gemm import GemmSchedule, GemmSimtSchedule, GemmTemplate
from tessera_rw.codegen.templates.registry import templates
from tessera_rw.codegen.templates.spectral import FFTTemplate
from tests.codegen.test_template_contract import REGISTER_BOUND

ARCHS = (arch_named("H100-SXM"), arch_named("A100-SXM"))
CASES = [pytest.param(t, i, arch, id=f"{type(t).__name__}-{i}-{arch.name}")
         for t in templates() for i in range(len(t.samples())) for arch in ARCHS]
TUNED = (GemmTemplate, FlashAttentionTemplate)


@pytest.mark.parametrize("template, index, arch", CASES)
def test_space_leads_with_the_defaults_and_holds_only_valid_schedules(template, index, arch):
    op = template.samples()[index]
    defaults, space = template.schedules(op, arch), template.space(op, arch)
    assert space[:len(defaults)] == defaults
    assert len(set(space)) == len(space) <= MAX_SPACE
    assert template.space(op, arch) == space                       # deterministic
    for s in space:
        assert template.valid(op, s, arch), s.describe()
        r = template.resources(op, s, arch)
        assert 0 < r.threads <= arch.max_threads_per_block and r.blocks > 0, s.describe()
        assert 0 < r.registers <= arch.registers_per_thread and r.spill_bytes == 0, s.describe()
        assert 0 <= r.smem_bytes <= arch.smem_per_block and r.hbm_bytes > 0 and r.flops >= 0, s.describe()
        assert math.isfinite(r.efficiency) and 0 < r.efficiency <= 1, s.describe()


@pytest.mark.parametrize("template", [t for t in templates() if isinstance(t, TUNED)], ids=lambda t: type(t).__name__)
def test_gemm_and_attention_spaces_reach_past_their_defaults(template):
    for arch in ARCHS:
        for op in template.samples():
            if template.unavailable(op, arch):      # fp8 before sm_89: no schedule at all
                assert template.space(op, arch) == ()
                continue
            assert len(template.space(op, arch)) > len(template.schedules(op, arch)), f"{op} on {arch.name}"


def test_a_template_without_a_grid_offers_its_defaults():
    x = TensorType((16, 2112), DType.float32)
    op = KernelOp.of("rfft", (x,), TensorType((16, 1057), DType.complex64), n=2112, axis=1, norm="backward")
    fft, h100 = FFTTemplate(), ARCHS[0]
    assert fft.space(op, h100) == fft.schedules(op, h100)
    assert all(fft.valid(op, s, h100) for s in fft.space(op, h100))


def test_valid_refuses_what_the_kernels_cannot_run():
    gemm, attention, h100 = GemmTemplate(), FlashAttentionTemplate(), ARCHS[0]
    bf16 = mm((1024, 1024), (1024, 1024), DType.bfloat16)
    assert gemm.valid(bf16, GemmSchedule(), h100)
    assert not gemm.valid(bf16, GemmSimtSchedule(), h100)                  # the wrong code path
    assert not gemm.valid(bf16, GemmSchedule(bk=48), h100)                 # a k-depth the mma kernel lacks
    assert not gemm.valid(bf16, GemmSchedule(256, 256, 64, 2, 2, 4), h100)  # past 48 KiB of static smem
    assert not gemm.valid(bf16, GemmSchedule(128, 128, 32, 1, 1, 2), h100)  # one warp: 512 accumulators
    d64 = attn(64)
    assert attention.valid(d64, AttentionSchedule(128, 64, 4, 2), h100)    # two 16-row tiles per warp
    assert not attention.valid(d64, AttentionSchedule(96, 64, 4, 2), h100)  # rows not whole tiles per warp
    assert not attention.valid(d64, AttentionSchedule(128, 40, 8, 2), h100)  # keys not whole mma k-steps
    assert not attention.valid(bf16, AttentionSchedule(), h100)


# ---- compiled -------------------------------------------------------------------------------------

def mm(a, b, dtype, numerics=Numerics.DEFAULT) -> KernelOp:
    batch, m, n, _ = matmul_dims(a, b)
    return KernelOp.of("matmul", (TensorType(a, dtype), TensorType(b, dtype)), TensorType(batch + (m, n), dtype),
                       accum_dtype=None, numerics=numerics)


def fp8(a, b, trans_b: bool) -> KernelOp:
    """An e4m3 product writing bf16, B stored [N, K] (read as it lies) or [K, N] (staged)."""
    batch, m, n, _ = matmul_dims(a, b)
    stored_b = b[:-2] + (b[-1], b[-2]) if trans_b else b
    return KernelOp.of("gemm", (TensorType(a, DType.float8_e4m3), TensorType(stored_b, DType.float8_e4m3)),
                       TensorType(batch + (m, n), DType.bfloat16), scale=1.0, activation="none", has_bias=False,
                       has_residual=False, accum_dtype=None, dtype=DType.bfloat16, trans_b=trans_b)


def attn(d: int, causal: bool = False) -> KernelOp:
    q = TensorType((2, 8, 1024, d), DType.bfloat16)
    return KernelOp.of("flash_attention", (q, q, q), q, scale=d ** -0.5, causal=causal, has_mask=False)


COMPILED = {
    "gemm-bf16": (GemmTemplate(), mm((2048, 1024), (1024, 2048), DType.bfloat16)),
    "gemm-fp32-simt": (GemmTemplate(), mm((1024, 1024), (1024, 1024), DType.float32)),
    "gemm-tf32": (GemmTemplate(), mm((2048, 1024), (1024, 2048), DType.float32, Numerics.FAST)),
    "gemm-fp8": (GemmTemplate(), fp8((2048, 1024), (1024, 2048), trans_b=True)),
    "gemm-fp8-staged": (GemmTemplate(), fp8((2048, 1024), (1024, 2048), trans_b=False)),
    "attention-d64": (FlashAttentionTemplate(), attn(64)),
    "attention-d128-causal": (FlashAttentionTemplate(), attn(128, causal=True)),
}
PICKS = 4


def beyond_defaults(template, op, arch, n: int = PICKS) -> list:
    """Up to `n` schedules of the space that are neither defaults nor their variants, spread evenly
    over it from its first to its last (the grid's far corner: the largest tiles, the most warps),
    the same each run."""
    defaults = template.schedules(op, arch)
    variants = {v for d in defaults for v in template.variants(op, d, arch)}   # walked or launched otherwise
    others = [s for s in template.space(op, arch) if s not in defaults and s not in variants]
    picks = (round(i * (len(others) - 1) / max(1, n - 1)) for i in range(n))
    return list(dict.fromkeys(others[i] for i in picks)) if others else []


@pytest.mark.parametrize("name", list(COMPILED))
def test_schedules_beyond_the_defaults_compile_without_spills(name):
    template, op = COMPILED[name]
    arch = ARCHS[0]
    picked = beyond_defaults(template, op, arch)
    beyond = len(template.space(op, arch)) - len(template.schedules(op, arch))
    assert len(picked) == min(PICKS, beyond) >= 3     # a staged fp8 operand leaves 3 (3 stages only)
    for s in picked:
        compiled = compile_cuda(template.emit(op, s, arch), arch.sm)
        res = template.resources(op, s, arch)
        what = f"{op} at {s.describe()}"
        assert compiled.spill_bytes == 0, f"{what}: ptxas spills {compiled.spill_bytes} bytes"
        error = (res.registers - compiled.registers) / compiled.registers
        assert abs(error) <= REGISTER_BOUND, f"{what}: estimate {res.registers}, ptxas {compiled.registers}"
        assert compiled.smem_bytes <= res.smem_bytes <= arch.smem_per_block
