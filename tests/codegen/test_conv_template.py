"""The direct convolution template: every sample under every default schedule compiles for sm_80 and
sm_90 without spills, its register estimate is within 25% of ptxas, and its resource model is sane;
depthwise convolutions take the sliding-window kernel, whose executed FLOPs are the useful ones."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import KNOWN_ARCHS, MathUnit, arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.conv import ConvSchedule, DirectConvTemplate
from tessera_rw.codegen.templates.conv_depthwise import DepthwiseSchedule
from tessera_rw.codegen.templates.conv_epilogue import with_epilogue
from tessera_rw.codegen.templates.conv_problem import conv_op, conv_operands

T = DirectConvTemplate()
SAMPLES = T.samples()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))


def _gemm(op: KernelOp) -> tuple[int, int, int, int]:
    """(M, N, K, groups) of the implicit GEMM per group."""
    x, w = conv_operands(op)
    groups = op.attr_map["groups"]
    ones = bool(op.attr_map.get("bias_grad"))      # dW flattened, then w.shape[0] sums: an image of ones more
    out_spatial = (op.result.numel - ones * w.shape[0]) // (x.shape[0] * w.shape[0])
    taps = w.numel // (w.shape[0] * w.shape[1])
    return (x.shape[0] + ones) * out_spatial, w.shape[0] // groups, w.shape[1] * taps, groups



@pytest.mark.parametrize("op", SAMPLES, ids=str)
def test_resources_cover_the_work(op):
    m, n, k, groups = _gemm(op)
    for arch in KNOWN_ARCHS:
        schedules = T.schedules(op, arch)
        assert schedules, arch.name
        for s in schedules:
            r = T.resources(op, s, arch)
            assert r.flops >= op.flops
            assert r.hbm_bytes >= op.operand_bytes + op.result.nbytes
            assert 0 < r.efficiency <= 1
            if isinstance(s, DepthwiseSchedule):
                (rows, cols), plane = s.tile, op.result.shape[2:]
                oh, ow = plane if len(plane) == 2 else (1, plane[0])
                assert r.blocks == -(-oh // rows) * -(-ow // cols) * op.result.shape[1] * op.result.shape[0]
                assert rows * cols == s.threads * s.outputs_per_thread and r.threads == s.threads
                continue
            assert r.blocks == -(-m // s.bm) * -(-n // s.bn) * groups * s.split_k
            assert r.blocks * s.bm * s.bn >= m * n * groups
            assert r.threads == 32 * s.warps_m * s.warps_n


def test_math_unit_follows_the_dtype_and_the_path():
    h100 = arch_named("h100")
    for op in SAMPLES:
        s = T.schedules(op, h100)[0]
        r = T.resources(op, s, h100)
        simt = op.operands[0].dtype is DType.float32 or isinstance(s, DepthwiseSchedule)
        assert r.unit is (MathUnit.FP32 if simt else MathUnit.BF16)
    fp16 = conv_op((2, 16, 8, 8), (32, 16, 3, 3), DType.float16, padding=((1, 1), (1, 1)))
    assert T.resources(fp16, T.schedules(fp16, h100)[0], h100).unit is MathUnit.BF16


def test_tiles_never_much_wider_than_the_output_channels():
    two_per_group = conv_op((8, 64, 32, 32), (64, 2, 7, 7), DType.bfloat16, padding=((3, 3), (3, 3)), groups=32)
    assert [s.bn for s in T.schedules(two_per_group, arch_named("h100"))] == [16]


def test_one_input_channel_per_group_takes_the_sliding_window():
    h100 = arch_named("h100")
    multiplier = conv_op((2, 8, 100), (24, 1, 5), DType.float32, padding=((2, 2),), groups=8)
    grouped = conv_op((2, 8, 100), (8, 2, 5), DType.float32, padding=((2, 2),), groups=4)
    assert all(isinstance(s, DepthwiseSchedule) for s in T.schedules(multiplier, h100))
    assert all(isinstance(s, ConvSchedule) for s in T.schedules(grouped, h100))
    # an 8192-tap row and its halo outgrow static shared memory: the implicit GEMM still serves it
    hyena = conv_op((1, 4, 8192), (4, 1, 8192), DType.bfloat16, padding=((8191, 0),), groups=4)
    assert all(isinstance(s, ConvSchedule) for s in T.schedules(hyena, h100))


def test_depthwise_executes_the_useful_flops_and_streams_once():
    """bf16 (16, 768, 2048) with 64 taps: the implicit GEMM pads N=1 to a 16-wide tile (16x the
    work); the sliding window executes the 3.2 GFLOP it must, and reads x, w and writes y once."""
    h100 = arch_named("h100")
    op = conv_op((16, 768, 2048), (768, 1, 64), DType.bfloat16, padding=((63, 0),), groups=768)
    for s in T.schedules(op, h100):
        r = T.resources(op, s, h100)
        assert op.flops <= r.flops <= 1.5 * op.flops
        assert r.hbm_bytes == op.operand_bytes + op.result.nbytes
    gemm = ConvSchedule(64, 16, 32, 4, 1)
    assert T.resources(op, gemm, h100).flops >= 10 * op.flops
    # fp32, 3 taps: memory-bound on the roofline (FLOP time far below the time to stream x and y)
    short = conv_op((16, 768, 4096), (768, 1, 3), DType.float32, padding=((2, 0),), groups=768)
    r = T.resources(short, T.schedules(short, h100)[0], h100)
    flop_s = r.flops / (h100.peak_flops(r.unit) * r.efficiency)
    assert flop_s < 0.2 * r.hbm_bytes / h100.hbm_bytes_per_s


def test_x_is_reread_per_channel_tile_only_when_it_outgrows_l2():
    h100 = arch_named("h100")
    small = SAMPLES[0]
    s = T.schedules(small, h100)[0]
    assert T.resources(small, s, h100).hbm_bytes == small.operand_bytes + small.result.nbytes
    big = conv_op((64, 256, 64, 64), (512, 256, 3, 3), DType.bfloat16, padding=((1, 1), (1, 1)))
    s = T.schedules(big, h100)[0]
    x, w = big.operands
    assert T.resources(big, s, h100).hbm_bytes == x.nbytes * -(-512 // s.bn) + w.nbytes + big.result.nbytes


def test_accepts_rejects_what_it_cannot_do():
    x16, w16 = TensorType((1, 4, 10), DType.bfloat16), TensorType((8, 4, 3), DType.bfloat16)
    attrs = dict(stride=(1,), padding=((1, 1),), dilation=(1,), groups=1)
    mixed = KernelOp.of("conv1d", (x16, TensorType((8, 4, 3), DType.float32)), TensorType((1, 8, 10), DType.float32),
                        **attrs)
    assert T.accepts(conv_op((1, 4, 10), (8, 4, 3), DType.bfloat16, padding=((1, 1),)))
    assert not T.accepts(mixed)
    assert not T.accepts(conv_op((1, 4, 10), (8, 4, 3), DType.float64, padding=((1, 1),)))
    assert not T.accepts(KernelOp.of("matmul", (x16, w16), x16, accum_dtype=None))


def test_few_tiles_over_a_long_k_split_it_among_blocks_and_many_tiles_do_not():
    h100 = arch_named("h100")
    wgrad, forward = SAMPLES[4], SAMPLES[2]        # a 3x3 layer's weight gradient, and its forward
    split = T.schedules(wgrad, h100)[0]
    assert split.split_k > 1 and T.resources(wgrad, split, h100).blocks >= h100.sm_count
    assert T.emit(wgrad, split, h100).workspace_bytes > 0 and "split_k" in split.describe()
    assert all(s.split_k == 1 for s in T.schedules(forward, h100))
    assert T.resources(wgrad, split, h100).blocks > T.resources(wgrad, T.schedules(wgrad, h100)[1], h100).blocks


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_a_split_k_gives_the_same_bits_whichever_block_arrives_last():
    from tests.codegen.emulated_ops import EMULATED
    arch = arch_named("h100")
    op = EMULATED["conv2d weight-gradient shape bf16, split K"]
    s = T.schedules(op, arch)[0]
    assert s.split_k > 1
    rng = np.random.default_rng(3)
    x, w = (rng.standard_normal(t.shape).astype(t.dtype.numpy) for t in op.operands)
    runs = {order: emulator.run_emulated(op, [x, w], schedule=s, arch=arch, block_order=order).tobytes()
            for order in ("ascending", "reverse", "shuffle:5")}
    assert len(set(runs.values())) == 1


def test_an_epilogue_reads_its_inputs_once_and_names_what_it_fused():
    h100 = arch_named("h100")
    plain = SAMPLES[2]                                       # a ResNet layer's 3x3 conv, bf16
    fused = with_epilogue(plain, "relu(add(add($0,$1),$2))", ((64, 1, 1), DType.bfloat16),
                          (plain.result.shape, DType.bfloat16))
    s = T.schedules(fused, h100)[0]
    assert s == T.schedules(plain, h100)[0]
    extra = T.resources(fused, s, h100).hbm_bytes - T.resources(plain, s, h100).hbm_bytes
    assert extra == 64 * 2 + plain.result.nbytes
    assert T.fused(fused) == ("relu", "add") and T.fused(plain) == ()
    source = T.emit(fused, s, h100).source
    assert "(x, w, e0, e1, y)" in source and "const bf16_t* __restrict__ e1" in source


def test_an_epilogue_the_kernels_cannot_write_is_refused_with_its_reason():
    conv = conv_op((1, 4, 10), (8, 4, 3), DType.bfloat16, padding=((1, 1),))
    widened = with_epilogue(conv, "add($0,$1)", ((8, 1), DType.float32))        # bf16 + f32 is f32
    assert not T.accepts(widened)
    assert "write their inputs' dtype bfloat16, not float32" in T.refusal(widened)
    assert T.accepts(with_epilogue(conv, "add($0,$1)", ((8, 1), DType.bfloat16)))
