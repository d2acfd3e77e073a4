"""Views at offsets on the GPU: kernels read contiguous slices of a buffer at pointer + offset,
outputs that are disjoint views of one value come back sharing its output buffer (numpy copies,
DeviceTensors at the offset pointer, torch views of one storage), and profiled runs record one
event pair per kernel. Every result is checked against the numpy executor running the same plan."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.step_timing import recording
from tessera_rw.lower.lowering import lower

pytestmark = pytest.mark.gpu

BF16 = DType.bfloat16
RNG = np.random.default_rng(11)


def rows(x: Node, a: int, b: int) -> Node:
    return make("slice", x, starts=(a, *(0,) * (x.type.ndim - 1)), stops=(b, *x.shape[1:]),
                steps=(1,) * x.type.ndim)


def row(x: Node, i: int) -> Node:
    return make("reshape", rows(x, i, i + 1), shape=x.shape[1:])


def bf16(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.5).astype(ml_dtypes.bfloat16)


def as_f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def packed_gemm_plan(m: int = 256, k: int = 128, n: int = 192):
    """dW = packed[:m] and db = packed[m] of one GEMM result, returned without a copy."""
    a, b = make_input("a", (m + 1, k), BF16), make_input("b", (k, n), BF16)
    packed = make("matmul", a, b, accum_dtype=None)
    plan = lower(Graph("packed", (a, b), (rows(packed, 0, m), row(packed, m))))
    assert [s.op for s in plan.steps] == ["matmul"] and plan.outputs[1].offset == m * n * 2
    return plan, {"a": bf16(m + 1, k), "b": bf16(k, n)}


def assert_close(got, want, tol=3e-2):
    np.testing.assert_allclose(as_f32(got), as_f32(want), rtol=tol, atol=tol)


def test_kernels_read_views_at_their_offsets():
    # rows of 512 bf16 are 1 KiB: every row offset is aligned, and the elementwise kernels run 16-byte vectors
    x = make_input("x", (65, 512), BF16)
    h = make("exp", x)
    y = make("add", make("tanh", rows(h, 1, 65)), row(h, 0))
    plan = lower(Graph("views", (x,), (y,)))
    assert [s.op for s in plan.steps] == ["exp", "tanh", "add"]
    assert plan.steps[1].inputs[0].offset == 1024
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    feeds = {"x": bf16(65, 512)}
    (got,) = run_plan_on_gpu(plan, feeds)
    (want,) = run_plan_on_cpu(plan, feeds)
    assert_close(got, want)


def test_flash_attention_reads_q_k_v_as_views_of_one_buffer():
    qkv = make_input("qkv", (3, 2, 4, 128, 64), BF16)
    t = make("tanh", qkv)                                    # a kernel's result: the views are of a temporary
    q, k, v = (row(t, i) for i in range(3))
    out = make("flash_attention", q, k, v, scale=64 ** -0.5, causal=True, has_mask=False)
    plan = lower(Graph("split", (qkv,), (out,)))
    assert [s.op for s in plan.steps] == ["tanh", "flash_attention"]
    assert [r.offset for r in plan.steps[1].inputs] == [0, 2 * 4 * 128 * 64 * 2, 2 * 2 * 4 * 128 * 64 * 2]
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    feeds = {"qkv": bf16(3, 2, 4, 128, 64)}
    assert_close(run_plan_on_gpu(plan, feeds)[0], run_plan_on_cpu(plan, feeds)[0])


def test_view_outputs_come_back_as_numpy_arrays():
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    plan, feeds = packed_gemm_plan()
    got = run_plan_on_gpu(plan, feeds)
    want = run_plan_on_cpu(plan, feeds)
    assert [g.shape for g in got] == [(256, 192), (192,)]
    for g, w in zip(got, want):
        assert_close(g, w)


def test_view_outputs_of_device_tensors_point_into_one_buffer():
    from tessera_rw.codegen.device import resolve_stream
    from tessera_rw.codegen.device_arrays import DeviceTensor, to_device, to_host
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    plan, feeds = packed_gemm_plan()
    stream = resolve_stream(None, 0)
    dw, db = run_plan_on_gpu(plan, {n: to_device(v, stream) for n, v in feeds.items()}, stream=stream)
    assert isinstance(dw, DeviceTensor) and isinstance(db, DeviceTensor)
    assert db.ptr - dw.ptr == plan.outputs[1].offset and dw.owner is db.owner
    want = run_plan_on_cpu(plan, feeds)
    assert_close(to_host(dw, stream), want[0])
    assert_close(to_host(db, stream), want[1])


def test_view_outputs_of_torch_tensors_share_one_storage():
    torch = pytest.importorskip("torch")
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
    plan, feeds = packed_gemm_plan()
    tensors = {n: torch.from_numpy(as_f32(v)).to("cuda", torch.bfloat16) for n, v in feeds.items()}
    dw, db = run_plan_on_gpu(plan, tensors)
    assert isinstance(dw, torch.Tensor) and dw.shape == (256, 192) and db.shape == (192,)
    assert dw.untyped_storage().data_ptr() == db.untyped_storage().data_ptr()
    assert db.data_ptr() - dw.data_ptr() == plan.outputs[1].offset
    torch.cuda.synchronize()
    want = run_plan_on_cpu(plan, feeds)
    assert_close(dw.float().cpu().numpy(), want[0])
    assert_close(db.float().cpu().numpy(), want[1])


def test_a_profiled_run_times_each_kernel_and_no_view():
    from tessera_rw.codegen.plan_runtime import run_plan_on_gpu

    class Steps:
        def __init__(self):
            self.seen = []

        def record_step(self, run, step, start_ns, duration_ns):
            self.seen.append((run.plan.steps[step].op, run.device, duration_ns > 0))

    plan, feeds = packed_gemm_plan()
    run_plan_on_gpu(plan, feeds)                            # compiled and warm
    with recording(Steps()) as steps:
        got = run_plan_on_gpu(plan, feeds)
    assert steps.seen == [("matmul", "cuda:0", True)]
    assert_close(got[1], run_plan_on_cpu(plan, feeds)[1])
