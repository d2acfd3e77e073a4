"""The copy template (transpose, pad, concatenate, slice, flip, broadcast_to): every sample compiles for
sm_80 and sm_90 without spills, the register estimate is within 25% of ptxas, resources are sane."""

from __future__ import annotations

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.copy import TILE, CopyTemplate

T = CopyTemplate()
SAMPLES = T.samples()
ARCHS = (arch_named("A100-SXM"), arch_named("H100-SXM"))



@pytest.mark.parametrize("i", range(len(SAMPLES)), ids=[op.op for op in SAMPLES])
def test_resources_move_every_byte_once(i):
    op, arch = SAMPLES[i], ARCHS[1]
    for s in T.schedules(op, arch):
        r = T.resources(op, s, arch)
        if op.op in ("slice", "strided_copy", "strided_concatenate"):    # only the selected elements are read
            assert 2 * op.result.nbytes <= r.hbm_bytes <= op.operand_bytes + op.result.nbytes
        else:
            assert r.hbm_bytes == op.operand_bytes + op.result.nbytes
        if s.tile:
            assert r.blocks * TILE * TILE >= op.result.numel
        else:
            assert op.result.numel % s.vec == 0


def test_paths():
    assert [T.tiled(op) for op in SAMPLES[:3]] == [True, False, True]
    assert {s.vec for op in SAMPLES for s in T.schedules(op, ARCHS[1])} >= {1, 2, 4, 8}
    x = TensorType((64, 1, 32), DType.float32)         # moving a size-1 axis is a plain copy
    assert not T.tiled(KernelOp.of("transpose", (x,), TensorType((64, 32, 1), x.dtype), axes=(0, 2, 1)))


def test_accepts_refuses_what_it_cannot_do():
    fp8 = TensorType((64, 64), DType.float8_e4m3)
    assert T.accepts(KernelOp.of("transpose", (fp8,), fp8, axes=(1, 0)))      # bytes move as they are
    x = TensorType((64, 64), DType.float32)
    assert not T.accepts(KernelOp.of("reshape", (x,), TensorType((4096,), x.dtype), shape=(4096,)))
    assert T.accepts(KernelOp.of("transpose", (x,), x, axes=(1, 0)))


def test_flip_reads_backwards_with_vectors_only_when_the_inner_axis_keeps_its_order():
    inner, outer = (op for op in SAMPLES if op.op == "flip")
    assert {s.vec for s in T.schedules(inner, ARCHS[1])} == {1}
    assert max(s.vec for s in T.schedules(outer, ARCHS[1])) > 1
    source = T.emit(inner, T.schedules(inner, ARCHS[1])[0], ARCHS[1]).source
    assert "4095u + ((i) % 4096u) * -1u" in source        # the row's far end, walking back
