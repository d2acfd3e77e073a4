"""The row-wise template (softmax, log_softmax, layernorm, rmsnorm, fused_normalization): every
sample compiles for sm_80 and sm_90 without spills, the register estimate is within 25% of ptxas,
resources are sane, and accepts() refuses non-trailing axes."""

from __future__ import annotations

import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.registry import template_for
from tessera_rw.codegen.templates.rowwise import MAX_RESIDENT, RowwiseTemplate
from tessera_rw.tune.plan_tuner import tunable_ops

T = RowwiseTemplate()
SAMPLES = T.samples()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))



@pytest.mark.parametrize("i", range(len(SAMPLES)), ids=[op.op for op in SAMPLES])
def test_resources_cover_every_row_and_read_each_operand_once(i):
    op, arch = SAMPLES[i], ARCHS[1]
    rows, length = T._row(op)
    read = op.operand_bytes
    if op.op == "strided_normalization":      # its rows are a view: their own bytes, not the storage's
        read += op.result.nbytes - op.operands[0].nbytes
        assert read < op.operand_bytes
    for s in T.schedules(op, arch):
        r = T.resources(op, s, arch)
        assert r.flops >= op.flops and r.hbm_bytes >= read + op.result.nbytes
        assert r.blocks * s.rows_per_block >= rows
        assert T.elements_per_thread(op, s) * (s.threads // s.rows_per_block) >= length


def test_samples_cover_each_path():
    h100 = ARCHS[1]
    paths = {(T.kind_of(op), T.resident(op, s), s.rows_per_block == 1) for op in SAMPLES for s in T.schedules(op, h100)}
    assert {("softmax", True, True), ("softmax", True, False), ("softmax", False, True),
            ("layernorm", True, True), ("layernorm", True, False), ("layernorm", False, True)} <= paths
    softmax = SAMPLES[0]
    assert all(T.elements_per_thread(softmax, s) <= MAX_RESIDENT for s in T.schedules(softmax, h100))


def test_a_long_row_is_re_read_from_l2_when_it_fits():
    op, h100 = SAMPLES[4], ARCHS[1]                 # softmax over 65536 fp32 columns: 256 KiB a row
    s = T.schedules(op, h100)[0]
    assert not T.resident(op, s)
    assert T.resources(op, s, h100).hbm_bytes == op.operand_bytes + op.result.nbytes


def test_kind_and_fusion_names():
    assert [T.kind_of(op) for op in SAMPLES[:4]] == ["softmax", "softmax", "layernorm", "layernorm"]
    assert T.fused(SAMPLES[5]) == ("add", "mul")
    assert T.fused(SAMPLES[6]) == ("add", "mul", "sigmoid")


def test_accepts_refuses_non_trailing_axes():
    x = TensorType((64, 128), DType.float32)
    assert not T.accepts(KernelOp.of("softmax", (x,), x, axis=0))
    assert T.accepts(KernelOp.of("softmax", (x,), x, axis=1))
    fp8 = TensorType((64, 128), DType.float8_e4m3)
    assert not T.accepts(KernelOp.of("softmax", (fp8,), fp8, axis=1))
    fused = dict(expr="$0", norm="softmax", axes=(0,), eps=0.0, has_weight=False, has_bias=False, post="$0")
    assert not T.accepts(KernelOp.of("fused_normalization", (x,), x, **fused))


@pytest.mark.parametrize("length", [1, 3, 64, 200, 768])
def test_a_row_that_fits_a_warps_registers_gets_a_warp_not_a_block_of_idle_warps(length):
    x = TensorType((4096, length), DType.bfloat16)
    op = KernelOp.of("layernorm", (x,), x, axes=(1,), eps=1e-5, has_weight=False, has_bias=False)
    t = RowwiseTemplate()
    for s in t.schedules(op, arch_named("h100")):
        assert s.rows_per_block == s.threads // 32 and t.resident(op, s)
        assert length >= 32 * s.vec or s.vec == 1


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
def test_float64_rows_have_no_gpu_kernel_their_statistics_are_kept_in_float(name):
    from tessera_rw.codegen.templates.registry import templates_for
    f64, f32 = TensorType((64, 512), DType.float64), TensorType((64, 512), DType.float32)
    attrs = dict(axis=1) if "softmax" in name else dict(axes=(1,), eps=1e-6, has_weight=False, has_bias=False)
    assert templates_for(KernelOp.of(name, (f64,), f64, **attrs)) == []     # the host runs them, in double
    assert templates_for(KernelOp.of(name, (f32,), f32, **attrs))


def test_every_default_schedule_is_valid_where_the_resident_ones_hold_too_much():
    # a cross-entropy gradient's row kernel over 32000 classes: its epilogue's values beside a
    # resident row exceed the registers of 1024 threads, so the looped walk comes first
    arch = arch_named("h100")
    z, t = op.tensor((4096, 32000), "bfloat16"), op.tensor((4096,), "int32")
    plan = op.grad(lambda z, t: op.cross_entropy(z, t, ignore_index=-100)).program(z, t).plan
    rows = [k for _, k in tunable_ops(plan, Numerics.DETERMINISTIC, arch)
            if isinstance(template_for(k), RowwiseTemplate)]
    assert rows
    for k in rows:
        assert all(template_for(k).valid(k, s, arch) for s in template_for(k).schedules(k, arch)), k
