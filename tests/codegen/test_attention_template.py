"""FlashAttentionTemplate: every sample compiles without spills at every default schedule, the
register model tracks ptxas, and the resource model accounts for the work and traffic."""

from __future__ import annotations

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import MathUnit, arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.attention import AttentionSchedule, FlashAttentionTemplate
from tessera_rw.codegen.templates.attention_cuda import batch_offsets
from tessera_rw.codegen.templates.attention_problem import (RowLayout, WarpgroupAttentionSchedule, attention_operands,
                                                            packed_qkv_attention)

TEMPLATE = FlashAttentionTemplate()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))


def attention(q_shape, kv_shape, dtype=DType.bfloat16, v_dim=None, mask=None, causal=False, kv_dtype=None):
    q = TensorType(q_shape, dtype)
    k = TensorType(kv_shape, kv_dtype or dtype)
    v = TensorType(kv_shape[:-1] + (v_dim or kv_shape[-1],), kv_dtype or dtype)
    out = TensorType(q_shape[:-1] + (v.shape[-1],), dtype)
    return KernelOp.of("flash_attention", (q, k, v) + ((mask,) if mask else ()), out,
                       scale=q_shape[-1] ** -0.5, causal=causal, has_mask=mask is not None)



@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.sm)
def test_every_sample_has_schedules_and_sound_resources(arch):
    for op in TEMPLATE.samples():
        assert TEMPLATE.accepts(op)
        schedules = TEMPLATE.schedules(op, arch)
        assert bool(schedules) != bool(TEMPLATE.unavailable(op, arch)), op
        read = attention_operands(op)                         # a strided_attention's views
        sq = read[0].shape[-2]
        heads = op.result.numel // (sq * read[2].shape[-1])
        for s in schedules:
            res = TEMPLATE.resources(op, s, arch)
            assert res.threads == 32 * s.warps and res.unit is MathUnit.BF16
            assert res.blocks * s.bm >= heads * sq              # query blocks cover every row of every head
            assert res.flops >= op.flops
            if not op.attr_map["causal"]:                      # causal never reads the masked-off half
                assert res.hbm_bytes >= sum(t.nbytes for t in read) + op.result.nbytes
            assert 0.2 < res.efficiency < 0.8


def test_long_sequences_reread_kv_only_beyond_l2():
    arch = arch_named("H100-SXM")
    short = attention((4, 16, 4096, 64), (4, 16, 4096, 64))
    long = attention((1, 32, 262144, 128), (1, 32, 262144, 128))
    for op, rereads in ((short, False), (long, True)):
        s = TEMPLATE.schedules(op, arch)[0]
        once = op.operand_bytes + op.result.nbytes
        assert (TEMPLATE.resources(op, s, arch).hbm_bytes > once) == rereads


def test_causal_executes_about_half_the_flops():
    arch = arch_named("A100-SXM")
    full, causal = (attention((2, 8, 4096, 64), (2, 8, 4096, 64), causal=c) for c in (False, True))
    s = TEMPLATE.schedules(full, arch)[0]
    ratio = TEMPLATE.resources(causal, s, arch).flops / TEMPLATE.resources(full, s, arch).flops
    assert 0.5 < ratio < 0.55


def test_short_sequences_shrink_the_tiles():
    op = attention((1, 2, 16, 128), (1, 2, 16, 128))
    assert TEMPLATE.schedules(op, arch_named("h100")) == (AttentionSchedule(16, 16, 1, 2),)


@pytest.mark.parametrize("op, why", [
    (attention((2, 4, 128, 64), (2, 4, 128, 64), DType.float32), "fp32 stays unfused"),
    (attention((2, 4, 128, 72), (2, 4, 128, 72)), "head_dim 72: not a multiple of 16"),
    (attention((2, 4, 128, 192), (2, 4, 128, 192)), "head_dim 192: beyond mma.sync, not a wgmma width"),
    (attention((2, 4, 128, 512), (2, 4, 128, 512)), "head_dim 512"),
    (attention((2, 4, 128, 64), (2, 4, 128, 64), v_dim=128), "Dv != D"),
    (attention((2, 4, 128, 64), (2, 4, 128, 64), kv_dtype=DType.float16), "mixed dtypes"),
    (attention((2, 4, 128, 64), (2, 4, 128, 64), mask=TensorType((128, 128), DType.int32)), "int mask"),
])
def test_rejects_what_it_cannot_do(op, why):
    assert not TEMPLATE.accepts(op), why


def test_source_names_the_op_schedule_and_launch():
    op = TEMPLATE.samples()[2]
    s = TEMPLATE.schedules(op, arch_named("h100"))[0]
    src = TEMPLATE.emit(op, s, arch_named("h100"))
    head = src.source.splitlines()[:3]
    assert head[0] == f"// {op}" and s.describe() in head[1]
    assert f"<<<{TEMPLATE.resources(op, s, arch_named('h100')).blocks}, {32 * s.warps}" in head[2]
    assert "(q, k, v, mask, out)" in head[2] and src.threads == 32 * s.warps
    assert TEMPLATE.fused(op) == ("scale", "mask", "softmax")


def test_batch_offsets_broadcast_and_group_heads():
    q = TensorType((2, 8, 64, 64), DType.bfloat16)
    kv = TensorType((2, 2, 64, 64), DType.bfloat16)
    layouts = [RowLayout.dense(t.shape, 2) for t in (q, kv, kv, q)]
    code, strides = batch_offsets((2, 8), layouts, (1, 1, 64, 1))    # a per-query mask, broadcast over keys
    assert "k_off += (long long)(i / 4) * 4096;" in code              # 4 query heads share a kv head
    assert "k_off += (long long)i * 8192;" in code                    # batch stride: 2 heads · 64 · 64
    assert "m_off" in code.splitlines()[0] and "m_off +=" not in code
    assert strides == (1, 0)


@pytest.mark.parametrize("d", [16, 32, 48, 80, 96, 112])
def test_head_dims_up_to_128_run_on_mma_sync_everywhere(d):
    op = attention((1, 4, 512, d), (1, 4, 512, d), causal=True)
    for arch in ARCHS:
        schedules = TEMPLATE.schedules(op, arch)
        assert schedules and all(type(s) is AttentionSchedule for s in schedules), (d, arch.name)


def test_head_dim_256_runs_on_sm_90_wgmma_only_and_says_why_elsewhere():
    op = attention((1, 8, 16, 256), (1, 8, 16, 256))        # even a short query: two warpgroups
    h100, a100 = arch_named("h100"), arch_named("a100")
    assert [s.describe() for s in TEMPLATE.schedules(op, h100)] == [
        "wg bm=128 bn=32 warps=8 stages=4", "wg bm=128 bn=32 warps=8 stages=3"]
    assert all(s.bn == 32 for s in TEMPLATE.space(op, h100))
    assert TEMPLATE.unavailable(op, h100) is None
    assert TEMPLATE.schedules(op, a100) == () and TEMPLATE.space(op, a100) == ()
    assert "256" in TEMPLATE.unavailable(op, a100) and "sm_90" in TEMPLATE.unavailable(op, a100)


def test_strided_attention_refuses_rows_off_16_bytes_and_says_which_view():
    op = packed_qkv_attention(1, 2, 64, 64, DType.bfloat16)
    a = dict(op.attr_map)
    a["offsets"] = (0, 132, 256)                                 # k starts 264 bytes in
    shifted = KernelOp.of("strided_attention", op.operands, op.result, **a)
    reason = TEMPLATE.refusal(shifted)
    assert reason is not None and "k's view" in reason and "offset 132" in reason
    assert not TEMPLATE.accepts(shifted) and TEMPLATE.accepts(op)


def test_strided_attention_keeps_to_cp_async_kernels_and_says_what_it_fused():
    h100 = arch_named("h100")
    strided = packed_qkv_attention(2, 4, 1024, 64, DType.bfloat16, causal=True)
    dense = attention((2, 4, 1024, 64), (2, 4, 1024, 64), causal=True)
    assert any(getattr(s, "producer", False) for s in TEMPLATE.space(dense, h100))
    assert not any(getattr(s, "producer", False) for s in TEMPLATE.space(strided, h100))   # TMA maps are dense
    assert TEMPLATE.fused(strided)[-2:] == ("strided_read", "strided_write")
    s = TEMPLATE.schedules(strided, h100)[0]
    assert TEMPLATE.resources(strided, s, h100) == TEMPLATE.resources(dense, s, h100)   # the same rows move
    source = TEMPLATE.emit(strided, s, h100).source
    assert "Q_ROW = 768, K_ROW = 768, V_ROW = 768;" in source and "O_ROW = 256;" in source


def test_strided_attention_prices_a_broadcast_view_at_its_own_size_and_keeps_off_the_producer_kernel():
    h100, bf = arch_named("h100"), DType.bfloat16
    q, kv = TensorType((16, 8, 1024, 64), bf), TensorType((1, 8, 1024, 64), bf)
    views = dict(shapes=q.shape * 3, strides=(524288, 65536, 64, 1) + (0, 65536, 64, 1) * 2, offsets=(0, 0, 0))
    attrs = dict(scale=0.125, causal=False, has_mask=False, **views, shape=q.shape, out_strides=(524288, 65536, 64, 1))
    strided = KernelOp.of("strided_attention", (q, kv, kv), q, **attrs)
    dense = attention(q.shape, kv.shape)
    s = TEMPLATE.schedules(dense, h100)[0]
    assert TEMPLATE.resources(strided, s, h100).hbm_bytes == TEMPLATE.resources(dense, s, h100).hbm_bytes
    producer = WarpgroupAttentionSchedule(128, 64, 8, 3, producer=True)
    with pytest.raises(ValueError, match="producer"):
        TEMPLATE.emit(packed_qkv_attention(1, 2, 256, 64, bf), producer, h100)
