"""The reduction template: row and column reduces compile for sm_80 and sm_90 without spills, the
register estimate is within 25% of ptxas, resources are sane, and accepts() refuses what it cannot do."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.reduction import ReductionTemplate
from tessera_rw.codegen.templates.reduction_reads import layout

T = ReductionTemplate()
SAMPLES = T.samples()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))



@pytest.mark.parametrize("i", range(len(SAMPLES)), ids=[op.op for op in SAMPLES])
def test_resources_cover_every_output_and_read_the_input_once(i):
    op, arch = SAMPLES[i], ARCHS[1]
    lay = T._layout(op)
    for s in T.schedules(op, arch):
        r = T.resources(op, s, arch)
        assert r.flops >= op.flops and r.hbm_bytes == op.operand_bytes + op.result.nbytes
        per_block = s.threads // s.split * (1 if lay.row else s.vec)
        assert r.blocks * per_block >= op.result.numel == lay.n_out


def test_strategy_follows_the_innermost_axis():
    strategies = [T.strategy(op) for op in SAMPLES]
    assert strategies == ["row", "row", "column", "column", "row", "column",
                          "row", "row", "column", "row", "row", "row",      # the kahan_sum samples
                          "row", "column", "row",                           # the fused ones
                          "row", "row", "column", "column",                 # the grid splits
                          "row", "row"]                                     # the short rows
    lay = layout(TensorType((16, 1024, 256), DType.float32), (0, 2))
    assert (lay.kept, lay.red, lay.red_strides) == ((1024,), (16, 256), (262144, 1))
    splits = {s.split for op in SAMPLES[:2] for s in T.schedules(op, ARCHS[1])}
    assert {32, 512} <= splits                        # a warp per row and a block per row


def test_integer_sums_accumulate_in_int64():
    op = SAMPLES[3]
    source = T.emit(op, T.schedules(op, ARCHS[1])[0], ARCHS[1]).source
    assert op.result.dtype is DType.int64 and "long long acc" in source


def test_accepts_refuses_what_it_cannot_do():
    fp8 = TensorType((64, 64), DType.float8_e4m3)
    assert not T.accepts(KernelOp.of("sum", (fp8,), TensorType((64,), fp8.dtype), axes=(1,), keepdims=False))
    x = TensorType((64, 64), DType.float32)
    assert not T.accepts(KernelOp.of("softmax", (x,), x, axis=1))
    assert T.accepts(KernelOp.of("max", (x,), TensorType((64,), x.dtype), axes=(0,), keepdims=False))


def test_few_outputs_share_their_rows_among_enough_blocks_to_fill_the_gpu():
    arch = arch_named("h100")
    x = TensorType((4, 1024, 768), DType.bfloat16)
    to_scalar = KernelOp.of("sum", (x,), TensorType((), DType.bfloat16), axes=(0, 1, 2), keepdims=False)
    t = ReductionTemplate()
    s = t.schedules(to_scalar, arch)[0]
    assert s.blocks > 1 and t.resources(to_scalar, s, arch).blocks >= arch.sm_count
    assert t.emit(to_scalar, s, arch).workspace_bytes == 4 * s.blocks + 4        # fp32 parts, one counter
    rows = KernelOp.of("sum", (x,), TensorType((4, 1024), DType.bfloat16), axes=(2,), keepdims=False)
    assert all(s.blocks == 1 and "blocks" not in s.describe() for s in t.schedules(rows, arch))


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("numerics", [Numerics.DETERMINISTIC, Numerics.KAHAN_SUM])
def test_a_grid_split_gives_the_same_bits_whichever_block_arrives_last(numerics):
    arch = arch_named("h100")
    x = TensorType((1 << 18,), DType.float32)
    op = KernelOp.of("sum", (x,), TensorType((), DType.float32), axes=(0,), keepdims=False, numerics=numerics)
    s = T.schedules(op, arch)[0]
    assert s.blocks > 1
    values = np.random.default_rng(4).standard_normal(1 << 18).astype(np.float32)
    runs = {order: emulator.run_emulated(op, [values], schedule=s, arch=arch, block_order=order).tobytes()
            for order in ("ascending", "reverse", "shuffle:7", "shuffle:11")}
    assert len(set(runs.values())) == 1
    got = np.frombuffer(runs["ascending"], np.float32)[0]
    assert abs(got - values.astype(np.float64).sum()) <= 1e-5 * np.abs(values).sum()


def test_few_column_tiles_share_their_rows_among_enough_blocks_to_fill_the_gpu():
    arch = arch_named("h100")
    grads = KernelOp.of("sum", (TensorType((8192, 4096), DType.bfloat16),), TensorType((4096,), DType.bfloat16),
                        axes=(0,), keepdims=False)
    split, *unsplit = T.schedules(grads, arch)
    assert split.blocks > 1 and T.resources(grads, split, arch).blocks >= arch.sm_count
    tiles = T.resources(grads, split, arch).blocks // split.blocks
    assert T.emit(grads, split, arch).workspace_bytes == 4096 * split.blocks * 4 + 4 * tiles
    assert all(s.blocks == 1 for s in unsplit)
    many = KernelOp.of("sum", (TensorType((64, 65536), DType.bfloat16),), TensorType((65536,), DType.bfloat16),
                       axes=(0,), keepdims=False)
    assert all(s.blocks == 1 for s in T.schedules(many, arch))       # 256 tiles fill the GPU already


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("numerics", [Numerics.DETERMINISTIC, Numerics.KAHAN_SUM])
def test_a_column_split_gives_the_same_bits_whichever_block_arrives_last(numerics):
    arch = arch_named("h100")
    x = TensorType((3001, 200), DType.float32)            # ragged: the last tile and the last stripe are short
    op = KernelOp.of("sum", (x,), TensorType((200,), DType.float32), axes=(0,), keepdims=False, numerics=numerics)
    s = T.schedules(op, arch)[0]
    assert s.blocks > 1
    values = np.random.default_rng(5).standard_normal((3001, 200)).astype(np.float32)
    runs = {order: emulator.run_emulated(op, [values], schedule=s, arch=arch, block_order=order).tobytes()
            for order in ("ascending", "reverse", "shuffle:7", "shuffle:11")}
    assert len(set(runs.values())) == 1
    got = np.frombuffer(runs["ascending"], np.float32)
    np.testing.assert_allclose(got, values.astype(np.float64).sum(0), rtol=0, atol=1e-4 * np.abs(values).sum(0).max())


def test_a_split_whose_parts_outgrow_a_32_bit_index_is_refused():
    from dataclasses import replace
    arch = arch_named("h100")
    wide = KernelOp.of("sum", (TensorType((64, 1 << 22), DType.float32),), TensorType((1 << 22,), DType.float32),
                       axes=(0,), keepdims=False)
    s = T.schedules(wide, arch)[0]
    assert T.valid(wide, replace(s, blocks=8), arch) and not T.valid(wide, replace(s, blocks=1024), arch)
