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
