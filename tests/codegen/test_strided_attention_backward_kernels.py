"""The attention backward's kernels over views (strided_attention_lse, strided_attention_row_stats_from_lse,
strided_attention_bwd): they take the dense kernels' schedules and resources, say what they fuse,
refuse rows off 16 bytes naming the operand, and spell the views' row strides in the source (the
emulator runs them: tests/codegen/emulated_attention_ops.py)."""

from __future__ import annotations

from dataclasses import replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
from tessera_rw.codegen.templates.attention_backward_problem import packed_qkv_backward
from tessera_rw.codegen.templates.attention_problem import dense_op, packed_qkv_lse
from tessera_rw.codegen.templates.attention_stats import AttentionStatsFromLseTemplate

BWD, FORWARD, STATS = FlashAttentionBwdTemplate(), FlashAttentionTemplate(), AttentionStatsFromLseTemplate()
H100 = arch_named("h100")


def with_attrs(op: KernelOp, **changes) -> KernelOp:
    return KernelOp.of(op.op, op.operands, op.result, **(dict(op.attr_map) | changes))


def test_the_strided_backward_moves_the_dense_backward_s_rows_and_says_what_it_fused():
    strided = packed_qkv_backward(2, 4, 1024, 64, DType.bfloat16, causal=True)
    dense = dense_op(strided)
    assert dense.op == "flash_attention_bwd" and dense.operands[0].shape == (2, 4, 1024, 64)
    assert dense.result.shape == (3 * 2 * 4 * 1024 * 64,) and strided.result.shape == (2, 1024, 3, 4, 64)
    assert BWD.fused(strided)[-2:] == ("strided_read", "strided_write")
    assert BWD.schedules(strided, H100) == BWD.schedules(dense, H100)
    for s in BWD.schedules(strided, H100):
        assert BWD.resources(strided, s, H100) == BWD.resources(dense, s, H100)
    source = BWD.emit(strided, BWD.schedules(strided, H100)[0], H100).source
    assert "Q_ROW = 768, K_ROW = 768, V_ROW = 768, DO_ROW = 256;" in source
    assert "DQ_ROW = 768, DK_ROW = 768, DV_ROW = 768;" in source


def test_the_fast_strided_backward_keeps_its_atomic_form():
    strided = replace(packed_qkv_backward(1, 2, 512, 64, DType.float16), numerics=Numerics.FAST)
    assert {s.dq for s in BWD.schedules(strided, arch_named("a100"))} == {"jobs", "atomic"}


def test_the_strided_backward_refuses_rows_off_16_bytes_naming_the_operand_or_gradient():
    op = packed_qkv_backward(1, 2, 64, 64, DType.bfloat16)
    assert BWD.accepts(op)
    shifted = with_attrs(op, offsets=(0, 132, 256, 0))                       # k starts 264 bytes in
    assert "k's view" in BWD.refusal(shifted) and not BWD.accepts(shifted)
    misplaced = with_attrs(op, out_offsets=(0, 132, 264))                    # dK written from 264 bytes in
    reason = BWD.refusal(misplaced)
    assert "dK" in reason and "offset 132" in reason and not BWD.accepts(misplaced)


def test_the_strided_forward_with_logsumexps_and_the_row_statistics_read_views():
    lse = packed_qkv_lse(2, 4, 1024, 64, DType.bfloat16, causal=True)
    assert FORWARD.accepts(lse) and FORWARD.fused(lse)[-3:] == ("logsumexp", "strided_read", "strided_write")
    assert not any(getattr(s, "producer", False) for s in FORWARD.space(lse, H100))    # TMA maps are dense
    source = FORWARD.emit(lse, FORWARD.schedules(lse, H100)[0], H100).source
    assert "Q_ROW = 768, K_ROW = 768, V_ROW = 768;" in source and "O_ROW = 256;" in source   # O's heads merged
    dense_o = packed_qkv_lse(2, 4, 1024, 64, DType.bfloat16, causal=True, merged=False)
    assert "O_ROW = 64;" in FORWARD.emit(dense_o, FORWARD.schedules(dense_o, H100)[0], H100).source
    misaligned = with_attrs(lse, o_strides=(262144, 64, 256, 1)[:2] + (258, 1))
    assert "output's strides" in FORWARD.refusal(misaligned)
    stats = STATS.sample((2, 12, 1000, 64), DType.bfloat16, merged=True)
    assert STATS.accepts(stats) and STATS.fused(stats) == ("row_stats", "strided_read")
    source = STATS.emit(stats, STATS.schedules(stats, H100)[0], H100).source
    assert source.count("(row % 1000) * 768LL") == 2                       # O and dO, heads side by side
    misaligned = KernelOp.of(stats.op, (stats.operands[0], TensorType((2, 1000, 770), DType.bfloat16)), stats.result,
                             shapes=(2, 12, 1000, 64), strides=(770000, 64, 770, 1), offsets=(0,))
    assert not STATS.accepts(misaligned)                                     # rows 1540 bytes apart
