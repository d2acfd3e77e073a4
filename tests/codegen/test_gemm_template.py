"""The GEMM template: every sample under every default schedule compiles for sm_80 and sm_90 without
spills, its register estimate is within 25% of ptxas, and its resource model is sane."""

from __future__ import annotations

import math

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import KNOWN_ARCHS, MathUnit, arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.gemm import GemmSchedule, GemmSimtSchedule, GemmTemplate
from tessera_rw.codegen.templates.gemm_footprint import TmaSchedule, WgmmaSchedule

T = GemmTemplate()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))


def _id(case) -> str:
    arch, op, s = case
    return f"{arch.sm}-{T.samples().index(op)}-{s.describe().replace(' ', ',')}"


def mm(a, b, dtype=DType.bfloat16, **attrs) -> KernelOp:
    from tessera_rw.algebra.ops.linalg import matmul_dims
    batch, m, n, _ = matmul_dims(a, b)
    return KernelOp.of("matmul", (TensorType(a, dtype), TensorType(b, dtype)),
                       TensorType(batch + (m, n), dtype), accum_dtype=attrs.get("accum_dtype"))



@pytest.mark.parametrize("op", T.samples(), ids=str)
def test_resources_cover_the_work(op):
    for arch in KNOWN_ARCHS:
        schedules = T.schedules(op, arch)
        if T.unavailable(op, arch):          # fp8 on an arch without fp8 tensor cores
            assert not schedules and not arch.has(MathUnit.FP8)
            continue
        assert schedules, arch.name
        for s in schedules:
            r = T.resources(op, s, arch)
            assert r.flops >= op.flops
            assert r.hbm_bytes >= op.operand_bytes + op.result.nbytes
            *batch, m, n = op.result.shape[op.op == "gemm_pre_act":]    # a kept pre-activation: 2 stores a tile
            assert r.blocks * s.bm * s.bn >= math.prod(batch) * m * n
            assert r.blocks == math.prod(batch) * -(-m // s.bm) * -(-n // s.bn)
            assert 0 < r.efficiency <= 1


def test_math_unit_and_schedule_kind_follow_the_dtype():
    bf16, fp32 = mm((256, 256), (256, 256)), mm((256, 256), (256, 256), DType.float32)
    h100, a100 = arch_named("h100"), arch_named("a100")
    # sm_90 offers warpgroup MMAs first (TMA-fed, then cp.async-fed), then mma.sync; sm_80 mma.sync only
    kinds = [type(s) for s in T.schedules(bf16, h100)]
    assert kinds[0] is TmaSchedule and WgmmaSchedule in kinds and GemmSchedule in kinds
    assert kinds == sorted(kinds, key=[TmaSchedule, WgmmaSchedule, GemmSchedule].index)
    # a bias gradient's ones row, or rows not 16-byte aligned, keep the cp.async wgmma kernel first
    ragged = mm((1001, 999), (999, 1003))
    assert type(T.schedules(ragged, h100)[0]) is WgmmaSchedule
    assert all(isinstance(s, GemmSchedule) for s in T.schedules(bf16, a100))
    assert all(isinstance(s, GemmSimtSchedule) for s in T.schedules(fp32, h100))
    assert T.resources(bf16, T.schedules(bf16, h100)[0], h100).unit is MathUnit.BF16
    assert T.resources(fp32, T.schedules(fp32, h100)[0], h100).unit is MathUnit.FP32


def fp8_gemm(a, b, dtype=DType.float8_e4m3, out=DType.bfloat16, op="gemm", **attrs) -> KernelOp:
    from tessera_rw.algebra.ops.linalg import matmul_dims
    batch, m, n, _ = matmul_dims(a, b)
    if op == "matmul_bias_grad":
        return KernelOp.of(op, (TensorType(a, dtype), TensorType(b, dtype)), TensorType((m + 1, n), dtype),
                           accum_dtype=None)
    base = dict(scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None, dtype=out)
    return KernelOp.of(op, (TensorType(a, dtype), TensorType(b, dtype)), TensorType(batch + (m, n), out),
                       **(base | attrs))


def test_fp8_products_run_on_fp8_tensor_cores_from_sm_89():
    from tessera_rw.algebra.errors import TesseraError
    op = fp8_gemm((256, 256), (256, 256), trans_b=True)
    h100, l4, a100 = arch_named("h100"), arch_named("l4"), arch_named("a100")
    # sm_90: warpgroup MMAs (QGMMA), then mma.sync; sm_89: mma.sync (native QMMA)
    for arch, mma in ((h100, "wgmma_m64n256k32_e4m3"), (l4, "mma_e4m3_16832")):
        s = T.schedules(op, arch)[0]
        assert T.unavailable(op, arch) is None and T.resources(op, s, arch).unit is MathUnit.FP8
        assert mma in T.emit(op, s, arch).source
    mma_sync = next(s for s in T.schedules(op, h100) if isinstance(s, GemmSchedule))
    assert "mma_e4m3_16832" in T.emit(op, mma_sync, h100).source
    # sm_89 runs the fp8 mma.sync natively, sm_90 as fp16 MMAs: the model expects more of the
    # former, and most of sm_90's warpgroup MMAs
    l4_eff = T.resources(op, T.schedules(op, l4)[0], l4).efficiency
    assert T.resources(op, mma_sync, h100).efficiency < l4_eff < T.resources(op, T.schedules(op, h100)[0], h100).efficiency
    assert T.schedules(op, a100) == () and T.space(op, a100) == ()
    assert "sm_89" in T.unavailable(op, a100) and "bfloat16" in T.unavailable(op, a100)
    with pytest.raises(TesseraError, match="on A100-SXM") as e:
        T.emit(op, T.schedules(op, h100)[0], a100)
    assert "cast the operands to bfloat16" in e.value.hint
    e5m2 = fp8_gemm((256, 256), (256, 256), DType.float8_e5m2, DType.float32)
    assert "mma_e5m2_16832" in T.emit(e5m2, T.schedules(e5m2, h100)[0], h100).source   # B as [K, N]: staged
    assert not T.accepts(fp8_gemm((256, 256), (256, 256), op="matmul_bias_grad"))


def test_fp8_operands_stored_across_k_are_transposed_through_registers():
    h100 = arch_named("h100")
    for trans_a, trans_b, staged in ((False, True, ""), (False, False, "b"), (True, True, "a"), (True, False, "ab")):
        op = fp8_gemm((256, 256), (256, 256), trans_a=trans_a, trans_b=trans_b)
        source = T.emit(op, T.schedules(op, h100)[0], h100).source
        assert [x for x in "ab" if f"stash_{x}(" in source] == list(staged), (trans_a, trans_b)
        # one staged operand is written after the MMAs (its loads overlap them), two as they land
        assert ("after the math" in source) == (len(staged) == 1)
        assert "ldmatrix_x4_trans" not in source      # 8-bit tiles always hold k contiguous


def test_hbm_traffic_grows_with_the_problem():
    h100 = arch_named("h100")
    s = GemmSchedule()
    sizes = [T.resources(mm((n, n), (n, n)), s, h100).hbm_bytes for n in (1024, 2048, 4096, 8192)]
    assert sizes == sorted(sizes)
    small = mm((1024, 1024), (1024, 1024))
    assert T.resources(small, s, h100).hbm_bytes == small.operand_bytes + small.result.nbytes


def test_unaligned_rows_take_the_element_wise_copy():
    h100 = arch_named("h100")
    aligned, unaligned = mm((64, 64), (64, 64)), mm((64, 60), (60, 61))
    assert "gemm_copy8" not in T.emit(aligned, GemmSchedule(), h100).source
    source = T.emit(unaligned, GemmSchedule(), h100).source
    assert "gemm_copy8(" in source and "cp_async_16(" not in source.split("gemm_copy8", 1)[1]


def test_fused_names_the_epilogue():
    plain, bias_gelu, residual_cast, *_ = T.samples()
    assert T.fused(plain) == ()
    assert T.fused(bias_gelu) == ("bias", "gelu")
    assert T.fused(residual_cast) == ("scale", "residual", "cast")


def test_a_derivative_epilogue_reads_its_pre_activation():
    derivatives = [op for op in T.samples() if op.attr_map.get("activation", "").startswith("d")]
    assert {op.attr_map["activation"] for op in derivatives} == {"drelu", "dgelu", "dgelu_tanh", "dsilu"}
    h100 = arch_named("h100")
    for op in derivatives:
        assert T.fused(op) == (op.attr_map["activation"],)
        source = T.emit(op, T.schedules(op, h100)[0], h100).source
        assert "__restrict__ aux, " in source and "aux[gemm_idx_aux(z, r, c)]" in source
        # without its aux operand the op is not one the template implements
        assert not T.accepts(KernelOp.of("gemm", op.operands[:2], op.result, **op.attr_map))
    dgelu = next(op for op in derivatives if op.attr_map["activation"] == "dgelu")
    assert "erff(a * 0.70710678118654752f)" in T.emit(dgelu, T.schedules(dgelu, h100)[0], h100).source


def test_accepts_what_it_can_do_and_rejects_the_rest():
    assert all(T.accepts(op) for op in T.samples())
    assert T.accepts(mm((3, 5), (5, 7), DType.float32))             # SIMT path has no alignment need
    assert T.accepts(mm((2, 1, 64, 64), (3, 64, 64)))               # broadcast batch dims
    assert T.accepts(mm((64, 64), (64, 64), accum_dtype=DType.float32))
    assert T.accepts(mm((64, 60), (60, 64)))                        # K*2 bytes not a multiple of 16
    assert T.accepts(mm((64, 64), (64, 61)))                        # odd N
    assert not T.accepts(mm((64,), (64, 64)))                       # rank-1 operand
    assert not T.accepts(mm((64, 64), (64, 64), accum_dtype=DType.float16))
    for dtype in (DType.float64, DType.complex64, DType.float8_e4m3):   # fp8 results: a GEMM writes 16 or 32 bits
        assert not T.accepts(mm((64, 64), (64, 64), dtype)), dtype
    mixed = KernelOp.of("matmul", (TensorType((64, 64), DType.bfloat16), TensorType((64, 64), DType.float32)),
                        TensorType((64, 64), DType.float32), accum_dtype=None)
    assert not T.accepts(mixed)
    assert T.accepts(mm((70000, 8, 8), (8, 8)))                     # a flat grid has room for any batch
    assert T.refusal(mixed) == "the gemm kernel takes two operands of one dtype, here bf16 and f32 (cast one)"
    assert T.refusal(mm((64, 64), (64, 64), accum_dtype=DType.float16)) == \
        "the gemm kernel accumulates in f32, not float16"


def test_a_product_past_32_bit_indices_is_refused_with_what_to_do():
    assert T.accepts(mm((46340, 46340), (46340, 46340)))
    why = T.refusal(mm((46341, 64), (64, 46341)))
    assert why.startswith("the gemm kernel indexes each matrix with 32-bit ints, and the result holds "
                          "2,147,488,281 elements (M=46341, N=46341, K=64)") and "split the product" in why
    assert "and a holds 2,147,483,648 elements" in T.refusal(mm((2 ** 28, 8), (8, 1)))


def test_emit_refuses_what_it_does_not_accept():
    from tessera_rw.algebra.errors import TesseraError
    h100 = arch_named("h100")
    with pytest.raises(TesseraError, match="rank >= 2"):
        T.emit(mm((64,), (64, 64)), GemmSchedule(), h100)
    with pytest.raises(TesseraError, match="GemmSimtSchedule"):
        T.emit(mm((64, 64), (64, 64), DType.float32), GemmSchedule(), h100)


def test_a_warpgroup_mma_kernel_builds_for_sm_90a_only():
    from tessera_rw.codegen.compile import CompileError, compile_cuda
    h100 = arch_named("h100")
    op = mm((512, 512), (512, 512))
    source = T.emit(op, T.schedules(op, h100)[0], h100)
    assert source.target == "sm_90a" and compile_cuda(source, "sm_90").arch == "sm_90a"
    with pytest.raises(CompileError, match="sm_90a-only instructions and cannot be built for sm_80"):
        compile_cuda(source, "sm_80")
    # nor is a warpgroup schedule emitted for an arch without warpgroup MMAs
    from tessera_rw.algebra.errors import TesseraError
    with pytest.raises(TesseraError, match="needs sm_90 warpgroup MMAs"):
        T.emit(op, T.schedules(op, h100)[0], arch_named("a100"))
    # the TMA kernel takes its operands' tensor maps after the pointers: A's, then B's
    assert [m.operand for m in source.tensor_maps] == [0, 1]
    assert "const __grid_constant__ TmaMap tma_a, const __grid_constant__ TmaMap tma_b)" in source.source
