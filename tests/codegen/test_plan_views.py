"""Executors honour a value's offset into its buffer: the numpy executor reads and returns views,
the GPU runtime's pure parts (output buffers shared by disjoint views, windows into them) give the
same answers without a device, and profiled runs still record one step per kernel."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.device_arrays import DeviceTensor, window
from tessera_rw.codegen.plan_runtime import _fills, _output_groups, _view
from tessera_rw.codegen.step_timing import recording
from tessera_rw.lower.lowering import lower
from tessera_rw.lower.plan import ValueRef

F32 = DType.float32
RNG = np.random.default_rng(3)


def rows(x: Node, a: int, b: int) -> Node:
    return make("slice", x, starts=(a, *(0,) * (x.type.ndim - 1)), stops=(b, *x.shape[1:]),
                steps=(1,) * x.type.ndim)


def packed_plan(m: int = 8, k: int = 16, n: int = 32):
    a, b = make_input("a", (m + 1, k), F32), make_input("b", (k, n), F32)
    packed = make("matmul", a, b, accum_dtype=None)
    db = make("reshape", rows(packed, m, m + 1), shape=(n,))
    return lower(Graph("packed", (a, b), (rows(packed, 0, m), make("exp", a), db)))


def test_the_numpy_executor_returns_views_as_fresh_arrays():
    plan = packed_plan()
    a, b = RNG.standard_normal((9, 16)).astype(np.float32), RNG.standard_normal((16, 32)).astype(np.float32)
    dw, e, db = run_plan_on_cpu(plan, {"a": a, "b": b})
    np.testing.assert_allclose(dw, (a @ b)[:8], rtol=1e-5)
    np.testing.assert_allclose(db, (a @ b)[8], rtol=1e-5)
    np.testing.assert_allclose(e, np.exp(a), rtol=1e-6)
    assert dw.base is None and db.base is None and not np.shares_memory(dw, db)


def test_kernels_read_views_of_inputs_at_their_offset():
    x = make_input("x", (8, 4), F32)
    plan = lower(Graph("f", (x,), (make("tanh", rows(x, 4, 8)),)))
    assert [s.op for s in plan.steps] == ["tanh"] and plan.steps[0].inputs[0].offset == 64
    value = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
    np.testing.assert_allclose(run_plan_on_cpu(plan, {"x": value})[0], np.tanh(value[4:]), rtol=1e-6)


def test_a_profiled_run_records_every_kernel_and_no_view():
    class Steps:
        def __init__(self):
            self.seen = []

        def record_step(self, run, step, start_ns, duration_ns):
            self.seen.append(run.plan.steps[step].op)

    plan = packed_plan()
    feeds = {"a": np.ones((9, 16), np.float32), "b": np.ones((16, 32), np.float32)}
    with recording(Steps()) as steps:
        run_plan_on_cpu(plan, feeds)
    assert steps.seen == ["matmul", "exp"]


def test_outputs_are_grouped_by_the_buffer_they_share():
    plan = packed_plan()
    gemm_buffer = plan.steps[0].output.buffer
    assert _output_groups(plan) == ((gemm_buffer, (0, 2)), (plan.steps[1].output.buffer, (1,)))
    nbytes = plan.buffers[gemm_buffer].nbytes
    assert not _fills(plan.outputs[0], nbytes) and _fills(plan.outputs[1], plan.buffers[plan.outputs[1].buffer].nbytes)


def test_device_views_add_the_offset_to_the_pointer():
    flat = DeviceTensor(0x10000, (9 * 32,), F32, owner="keep", kind="cuda", device=1)
    ref = ValueRef(5, make_input("t", (32,), F32).type, offset=8 * 32 * 4)
    got = _view(flat, ref)
    assert (got.ptr, got.shape, got.dtype, got.owner, got.device) == (0x10000 + 1024, (32,), F32, "keep", 1)
    part = window(flat, 1024, (32,))
    assert (part.ptr, part.shape, part.owner) == (0x10000 + 1024, (32,), "keep")


def test_windows_of_torch_tensors_share_their_storage():
    torch = pytest.importorskip("torch")
    flat = torch.zeros(9 * 32, dtype=torch.bfloat16)
    part = window(flat, 8 * 32 * 2, (1, 32))
    part += 1
    assert part.shape == (1, 32) and float(flat[8 * 32:].sum()) == 32 and float(flat[:8 * 32].sum()) == 0
