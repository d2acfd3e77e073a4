"""The elementwise template: every sample compiles for sm_80 and sm_90 without spills, its register
estimate is within 25% of ptxas, its resources are sane, and accepts() refuses what it cannot do."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.strided import operand_views
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.emulator import run_emulated
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.elementwise import ElementwiseTemplate, coalesce, offset_expr

T = ElementwiseTemplate()
SAMPLES = T.samples()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))



@pytest.mark.parametrize("i", range(len(SAMPLES)), ids=[op.op for op in SAMPLES])
def test_resources_cover_the_result_and_read_every_operand_once(i):
    op, arch = SAMPLES[i], ARCHS[1]
    read = op.operand_bytes
    if op.op == "strided_elementwise":        # a view: its own elements, once
        views = [view for view, _ in operand_views(op.result.shape, op.attr_map["strides"], op.attr_map["offsets"])]
        read = sum(t.dtype.itemsize * math.prod(n for n, s in zip(op.result.shape, st) if s)
                   for t, st in zip(op.operands, views))
        assert read < op.operand_bytes
    for s in T.schedules(op, arch):
        r = T.resources(op, s, arch)
        assert r.flops >= op.flops
        assert r.hbm_bytes == read + op.result.nbytes
        assert op.result.numel % s.vec == 0 and r.threads == s.threads
        # grid-stride: any grid covers the result; the model's grid is never larger than the work
        assert 1 <= r.blocks <= math.ceil(op.result.numel / s.vec / s.threads)


def test_samples_cover_each_path():
    names = {op.op for op in SAMPLES}
    assert {"add", "where", "cast", "tril", "fused_elementwise", "full", "arange", "gelu"} <= names
    dtypes = {t.dtype for op in SAMPLES for t in op.operands + (op.result,)}
    assert {DType.bfloat16, DType.float32, DType.bool} <= dtypes
    vecs = {s.vec for op in SAMPLES for s in T.schedules(op, ARCHS[1])}
    assert {8, 4, 2} <= vecs


def test_broadcast_axes_coalesce_and_index_with_constants():
    sizes, (out, bias) = coalesce((8, 64, 64), [(4096, 64, 1), (0, 0, 1)])
    assert sizes == (512, 64) and bias == (0, 1)
    assert offset_expr("i", sizes, bias) == "(i) % 64u"
    assert offset_expr("i", (4096, 4096), (1, 0)) == "i / 4096u"


def test_vector_width_follows_the_inner_axis():
    odd, row = TensorType((1024, 1001), DType.bfloat16), TensorType((1001,), DType.bfloat16)
    op = KernelOp.of("add", (odd, row), odd)
    assert {s.vec for s in T.schedules(op, ARCHS[1])} == {1}
    op = KernelOp.of("exp", (odd,), odd)          # no broadcast: one contiguous run of 1024 * 1001
    assert max(s.vec for s in T.schedules(op, ARCHS[1])) == 8
    f32 = TensorType((1024, 1024), DType.float32)
    op = KernelOp.of("exp", (f32,), f32)
    assert max(s.vec for s in T.schedules(op, ARCHS[1])) == 4     # 16-byte accesses


def test_accepts_refuses_what_it_cannot_do():
    fp8 = TensorType((64, 64), DType.float8_e4m3)
    assert not T.accepts(KernelOp.of("exp", (fp8,), fp8))               # reads fp8, never writes it
    assert T.accepts(KernelOp.of("cast", (fp8,), TensorType((64, 64), DType.bfloat16), dtype=DType.bfloat16))
    x = TensorType((64, 64), DType.float32)
    assert not T.accepts(KernelOp.of("softmax", (x,), x, axis=1))
    assert T.accepts(KernelOp.of("exp", (x,), x))
    assert T.fused(SAMPLES[[op.op for op in SAMPLES].index("fused_elementwise")]) == ("mul", "relu", "add")


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("dtype", [DType.float8_e4m3, DType.float8_e5m2], ids=["e4m3", "e5m2"])
def test_every_fp8_value_widens_to_float32_exactly(dtype):
    """All 256 bit patterns (subnormals, ±0, the largest finite, NaN, e5m2's infinities) through the
    kernel's software conversion, bit for bit against ml_dtypes."""
    x = np.arange(256, dtype=np.uint8).view(dtype.numpy)
    op = KernelOp.of("cast", (TensorType((256,), dtype),), TensorType((256,), DType.float32), dtype=DType.float32)
    got, want = run_emulated(op, [x], arch="a100"), x.astype(np.float32)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    assert (got.view(np.uint32)[~nan] == want.view(np.uint32)[~nan]).all()


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("dtype", [DType.int32, DType.int64], ids=["int32", "int64"])
def test_an_integer_power_is_exact_and_agrees_with_the_reference_for_negative_exponents(dtype):
    """Exact where a double's pow is not (3³⁹ needs 62 bits), wrapping as numpy does, and 0 or ±1 for a
    negative exponent (torch's integer pow), the reference's answer where numpy itself raises."""
    from tessera_rw.algebra.ops.elementwise import integer_power

    rng = np.random.default_rng(5)
    base = np.concatenate([[3, -3, 1, -1, -1, 0, 2, 7], rng.integers(-9, 10, 248)]).astype(dtype.numpy)
    exponent = np.concatenate([[39, 39, -4, -3, -2, -1, -1, 30], rng.integers(-4, 40, 248)]).astype(dtype.numpy)
    t = TensorType((256,), dtype)
    got = run_emulated(KernelOp.of("pow", (t, t), t), [base, exponent], arch="h100")
    want = integer_power(base, exponent)
    assert (want[2:7] == [1, -1, 1, 0, 0]).all() and (dtype is DType.int32 or want[0] == 3**39)
    np.testing.assert_array_equal(got, want)


def test_a_view_into_storage_past_32_bits_indexes_it_in_64_bits():
    # a [2, 1024] slice at the end of a 2³¹-element tensor: the result is small, the offsets are not
    big = TensorType((2**21, 1024), DType.bfloat16)
    op = KernelOp.of("strided_elementwise", (big,), TensorType((2, 1024), DType.bfloat16), expr="exp($0)",
                     shape=(2, 1024), strides=(1024, 1), offsets=((2**21 - 2) * 1024,))
    source = T.emit(op, T.schedules(op, ARCHS[1])[0], ARCHS[1]).source
    assert "unsigned long long i" in source and f"+ {(2**21 - 2) * 1024}u" in source
