"""`python -m bench sanitize`'s own checks, without a GPU: the attention backward's kernels it
runs, and its count of wrong schedules on a stand-in runner (the CPU emulator, then a runner that
writes zeros)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import sanitize
from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.templates.attention_stats import AttentionStatsFromLseTemplate
from tessera_rw.codegen.templates.registry import templates_for


def test_the_backward_kernels_it_runs_cover_both_forms_and_the_forward_that_writes_the_logsumexp():
    ops = sanitize.backward_ops()
    assert {(o.op, o.numerics.value) for o in ops} == {
        ("flash_attention_lse", "deterministic"), ("flash_attention_bwd", "deterministic"),
        ("flash_attention_bwd", "fast"), ("attention_row_stats_from_lse", "deterministic")}
    assert {o.operands[0].shape[-1] for o in ops if o.op == "flash_attention_bwd"} == {64, 128}


def test_the_cross_block_kernels_include_every_norm_backward_row_kernel():
    ops = {o.op for o in sanitize.cross_block_ops()}
    assert {"norm_backward", "norm_backward_stats", "norm_backward_grads"} <= ops


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_check_op_counts_the_schedules_that_are_wrong(monkeypatch):
    arch = arch_named("h100")
    op = AttentionStatsFromLseTemplate.sample((1, 2, 40, 64), DType.bfloat16)
    monkeypatch.setattr(sanitize, "run_poisoned",
                        lambda op, arrays, schedule: emulator.run_emulated(op, arrays, schedule=schedule, arch=arch))
    assert sanitize.check_op(op, arch) == 0
    monkeypatch.setattr(sanitize, "run_poisoned",
                        lambda op, arrays, schedule: np.zeros(op.result.shape, op.result.dtype.numpy))
    assert sanitize.check_op(op, arch) == len(AttentionStatsFromLseTemplate().schedules(op, arch)) == 1


def test_the_variants_it_runs_are_persistent_gemms_walking_several_tiles_a_block():
    from tessera_rw.codegen.templates.gemm import GemmTemplate
    from tessera_rw.codegen.templates.gemm_variants import persistent_grid, tiles_of
    arch = arch_named("h100")
    found = [(op, schedules) for op, schedules in sanitize.variant_ops(arch) if op.op != "flash_attention"]
    assert {op.op for op, _ in found} == {"matmul", "matmul_bias_grad", "gemm_pre_act", "gated_gemm"}
    for op, schedules in found:
        persistent = [s for s in schedules if getattr(s, "persistent", False)]
        assert len(persistent) >= 2 and any(s.group for s in schedules if not getattr(s, "persistent", False))
        for s in schedules:
            assert GemmTemplate().valid(op, s, arch), s.describe()
        assert all(tiles_of(op, s) > persistent_grid(op, s, arch) == arch.sm_count for s in persistent)


def test_the_attention_variants_it_runs_are_every_producer_form():
    from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
    h100 = arch_named("h100")
    found = sanitize.attention_variant_ops(h100)
    assert len(found) == 2 and not sanitize.attention_variant_ops(arch_named("a100"))
    forms = [s for _, schedules in found for s in schedules]
    assert {s.consumers for s in forms} == {2} and {s.pingpong for s in forms} == {False, True}
    assert {s.stages for s in forms} >= {2, 3}
    for op, schedules in found:
        assert all(s.producer and FlashAttentionTemplate().valid(op, s, h100) for s in schedules)
    assert any(op.attr_map["causal"] and op.operands[0].shape[-3] != op.operands[1].shape[-3] for op, _ in found)
    assert any(op.attr_map["has_mask"] for op, _ in found)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_check_op_runs_the_schedules_it_is_given(monkeypatch):
    from dataclasses import replace
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.templates.gemm import TmaSchedule
    arch = arch_named("h100").model_copy(update={"sm_count": 2, "max_blocks_per_sm": 2})
    a, b = TensorType((200, 80), DType.bfloat16), TensorType((80, 136), DType.bfloat16)
    op = KernelOp.of("matmul", (a, b), TensorType((200, 136), DType.bfloat16), accum_dtype=None)
    ran = []

    def emulated(op, arrays, schedule):
        ran.append(schedule)
        return emulator.run_emulated(op, arrays, schedule=schedule, arch=arch)
    monkeypatch.setattr(sanitize, "run_poisoned", emulated)
    persistent = TmaSchedule(64, 64, 64, 1, 1, 3, persistent=True)
    assert sanitize.check_op(op, arch, (persistent, replace(persistent, group=2))) == 0
    assert ran == [persistent, replace(persistent, group=2)]


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_view_kernels_it_runs_are_right_in_the_emulator(monkeypatch):
    arch = arch_named("h100")
    ops = sanitize.view_ops()
    assert {o.op for o in ops} == {"strided_attention", "strided_attention_lse", "strided_attention_row_stats_from_lse",
                                   "strided_attention_bwd", "concatenated_elementwise", "strided_elementwise",
                                   "strided_normalization", "strided_conv"}
    monkeypatch.setattr(sanitize, "run_poisoned",
                        lambda op, arrays, schedule: emulator.run_emulated(op, arrays, schedule=schedule, arch=arch))
    for op in ops:       # the first schedule each (tests/codegen/test_emulated_kernels.py covers the rest)
        first = templates_for(op)[0].schedules(op, arch)[:1]
        assert sanitize.check_op(op, arch, first) == 0, op.op
