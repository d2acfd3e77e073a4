"""The cost model agrees with lowering on which slices are views: a contiguous, aligned slice
launches nothing (no cost, no copy kernel in a candidate); a strided or misaligned one is a copy."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.lower.lowering import lower, view_offset
from tessera_rw.tune.cost import kernel_cost
from tessera_rw.tune.extract import candidate_of

H100 = arch_named("H100-SXM")


def slice_op(shape, starts, stops, steps=None, dtype=DType.bfloat16) -> KernelOp:
    steps = steps or (1,) * len(shape)
    out = tuple(len(range(a, b, s)) for a, b, s in zip(starts, stops, steps))
    return KernelOp.of("slice", (TensorType(shape, dtype),), TensorType(out, dtype),
                       starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


VIEWS = [
    slice_op((129, 64), (0, 0), (128, 64)),                    # rows 0:M of a packed [M+1, N] result
    slice_op((129, 64), (128, 0), (129, 64)),                  # row M
    slice_op((8, 64, 64), (3, 0, 0), (4, 64, 64)),             # x[3]
    slice_op((3, 4, 12, 512, 64), (1, 0, 0, 0, 0), (2, 4, 12, 512, 64)),   # k of a q|k|v split
]
COPIES = [
    slice_op((129, 64), (0, 0), (129, 32)),                    # a column block
    slice_op((128, 64), (0, 0), (128, 64), (2, 1)),            # every other row
    slice_op((9, 3), (1, 0), (5, 3), dtype=DType.float32),     # contiguous, but 12 bytes in
]


@pytest.mark.parametrize("op_", VIEWS, ids=str)
def test_contiguous_aligned_slices_cost_nothing(op_):
    assert kernel_cost(op_, H100) is None


@pytest.mark.parametrize("op_", COPIES, ids=str)
def test_strided_or_misaligned_slices_are_copy_kernels(op_):
    cost = kernel_cost(op_, H100)
    assert cost is not None and cost.kind == "copy" and cost.est_us > 0


@pytest.mark.parametrize("op_", VIEWS + COPIES, ids=str)
def test_the_cost_model_and_lowering_agree(op_):
    x = make_input("x", op_.operands[0].shape, op_.operands[0].dtype)
    s = make("slice", x, **op_.attr_map)
    no_copy = [step.op for step in lower(Graph("f", (x,), (make("neg", s),))).steps] == ["neg"]
    assert no_copy == (kernel_cost(op_, H100) is None)
    assert (view_offset("slice", op_.operands[0], op_.attr_map) is None) == (kernel_cost(op_, H100) is not None)


def test_a_candidate_counts_no_kernel_for_a_view():
    x = make_input("x", (129, 64), DType.bfloat16)
    h = make("exp", x)
    views = make("add", make("slice", h, starts=(0, 0), stops=(128, 64), steps=(1, 1)),
                 make("slice", h, starts=(128, 0), stops=(129, 64), steps=(1, 1)))
    assert [k.kind for k in candidate_of(Graph("g", (x,), (views,)), H100).kernels] == ["elementwise"] * 2


def test_a_packed_gemm_split_into_its_parts_is_one_kernel_end_to_end():
    @op.kernel
    def weight_and_bias(a, b):
        packed = a @ b
        return packed[:8], packed[8]

    a = np.random.default_rng(0).standard_normal((9, 16)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    program = weight_and_bias.program(a, b)
    assert [k.kind for k in program.candidate.kernels] == ["gemm"]
    assert len(program.plan.steps) == 1 and [r.offset for r in program.plan.outputs] == [0, 8 * 64 * 4]
    dw, db = weight_and_bias(a, b)
    np.testing.assert_allclose(dw, (a @ b)[:8], rtol=1e-4, atol=1e-4)     # on a GPU too, where there is one
    np.testing.assert_allclose(db, (a @ b)[8], rtol=1e-4, atol=1e-4)
