"""The bias-gradient GEMM, matmul_bias_grad(a, b) = [a; 1ᵀ] @ b, on the GPU of this machine.

test_kernel_numerics.py already runs the template's samples (bias-gradient ones included) at every
default schedule. Here: the edges the ones row meets (alone in its tile row, inside a ragged tile,
the only row, K-tails of a 16-byte chunk, element-wise loads), a linear layer's backward at a
realistic size, and the packed plan run end to end with both gradients read from its one buffer.

Inputs are random and never zero, outputs are poisoned with NaN bytes before each launch (so an
element never written fails) and the reference is float64 on the same rounded inputs, at the
tolerance of the output dtype (tessera_rw/codegen/kernel_check.py). kernel_check restricts a big
product's reference to rows of A, which cannot hold row M; the big case below builds its own
reference on sampled rows of A plus row M.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import kernel_check as kc
from tessera_rw.codegen.kernel_inputs import random_inputs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.gemm import GemmTemplate
from tests.gpu.test_kernel_numerics import _rng, check_schedules, run_poisoned

pytestmark = pytest.mark.gpu

T = GemmTemplate()
BF16, F16, F32 = DType.bfloat16, DType.float16, DType.float32


def bias_grad(m: int, k: int, n: int, dtype: DType = BF16, numerics: Numerics = Numerics.DEFAULT) -> KernelOp:
    return KernelOp.of("matmul_bias_grad", (TensorType((m, k), dtype), TensorType((k, n), dtype)),
                       TensorType((m + 1, n), dtype), accum_dtype=None, numerics=numerics)


EDGES = {
    "ones row alone in its tile row (M = 128)": bias_grad(128, 256, 128),
    "ones row inside a ragged tile (M = 100)": bias_grad(100, 256, 192),
    "A of one row": bias_grad(1, 64, 64),
    "K-tail inside a chunk, aligned rows (K = 40)": bias_grad(96, 40, 128),
    "K shorter than a chunk, element-wise loads (K = 5)": bias_grad(64, 5, 72),
    "odd N, element-wise loads": bias_grad(200, 333, 129, F16),
    "fp32 SIMT, ragged everything": bias_grad(33, 17, 65, F32),
    "tf32, K-tail inside a chunk": bias_grad(64, 22, 96, F32, Numerics.FAST),
    "tf32, aligned": bias_grad(256, 512, 256, F32, Numerics.FAST),
}


@pytest.mark.parametrize("name", list(EDGES))
def test_edge_matches_reference_at_every_default_schedule(name):
    from tessera_rw.codegen.arch import current_arch
    op = EDGES[name]
    assert T.accepts(op), op
    assert kc.row_plan(op) is None   # row M has no row of A: the reference is always whole, row M included
    check_schedules(T, op, T.schedules(op, current_arch()), current_arch())


@pytest.mark.parametrize("dtype, numerics", [(BF16, Numerics.DEFAULT), (F32, Numerics.DEFAULT),
                                             (F32, Numerics.FAST)], ids=["bf16", "fp32", "tf32"])
def test_linear_layer_backward_at_size(dtype, numerics):
    """dW and db of a 4096 -> 4096 linear layer over 8192 tokens (a = Xᵀ, b = dY), checked on
    sampled rows of dW and on all of db."""
    from tessera_rw.codegen.arch import current_arch
    arch = current_arch()
    op = bias_grad(4096, 8192, 4096, dtype, numerics)
    (m, k), n = op.operands[0].shape, op.operands[1].shape[1]
    rng = _rng(op)
    inputs = random_inputs(op, rng)
    rows = kc.pick_rows(m, float(m) * k * n, rng)
    product = inputs.wide_take(0, rows, 0) @ inputs.wide(1)
    value = np.vstack([product, inputs.wide(1).sum(axis=0, keepdims=True)]).astype(np.float32)
    scale = float(np.sqrt(np.mean(np.square(value))))
    failures = []
    for schedule in T.schedules(op, arch):
        unit = T.resources(op, schedule, arch).unit
        fast = numerics is Numerics.FAST
        reference = kc.Expected(op, value, False, 0, np.append(rows, m), kc.tolerance(dtype, k, unit, fast), scale)
        what = f"{op} at {schedule.describe()} on {arch.name}"
        try:
            kc.check(reference, run_poisoned(op, inputs.arrays, schedule, arch), what)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_packed_plan_returns_both_gradients_from_one_buffer():
    """The plan the gradient rules lead to: a transpose, one bias-gradient GEMM, and dW and db as
    views of its result, run on the device with numpy in and out."""
    from tessera_rw.algebra.builder import make, make_input
    from tessera_rw.algebra.graph import Graph
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    from tessera_rw.lower.lowering import lower
    tokens, d_in, d_out = 1024, 256, 384
    x, dy = make_input("x", (tokens, d_in), BF16), make_input("dy", (tokens, d_out), BF16)
    packed = make("matmul_bias_grad", make("transpose", x, axes=(1, 0)), dy, accum_dtype=None)
    dw = make("slice", packed, starts=(0, 0), stops=(d_in, d_out), steps=(1, 1))
    db = make("reshape", make("slice", packed, starts=(d_in, 0), stops=(d_in + 1, d_out), steps=(1, 1)),
              shape=(d_out,))
    plan = lower(Graph("linear_backward", (x, dy), (dw, db)))
    assert [s.op for s in plan.steps if s.op != "slice"] == ["transpose", "matmul_bias_grad"]
    rng = np.random.default_rng(7)
    xv = rng.standard_normal((tokens, d_in)).astype(BF16.numpy)
    dyv = rng.standard_normal((tokens, d_out)).astype(BF16.numpy)
    got_dw, got_db = run_plan_on_gpu(plan, {"x": xv, "dy": dyv})
    want_dw = xv.astype(np.float64).T @ dyv.astype(np.float64)
    want_db = dyv.astype(np.float64).sum(axis=0)
    tol = kc.tolerance(BF16, tokens)
    for got, want in ((got_dw, want_dw), (got_db, want_db)):
        scale = float(np.sqrt(np.mean(want ** 2)))
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= tol * (scale + np.abs(want))), float((err / (scale + np.abs(want))).max())
