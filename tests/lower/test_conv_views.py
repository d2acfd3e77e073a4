"""Convolutions read transposed, sliced and flipped operands where they lie (lower/conv_views.py): a
weight gradient's xᵀ and dYᵀ copies go, and an input gradient's flipped kernel; a copy someone else
reads, a view whose innermost axis is not contiguous and a depthwise convolution's operands keep
theirs."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.lower.conv_views import read_conv_views_in_place

BF16 = DType.bfloat16
VALID = dict(stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1)


def _ops(graph: Graph) -> list[str]:
    return [n.op for n in read_conv_views_in_place(graph).nodes if n.op != "input"]


def _transposed(*shapes):
    nodes = [make_input(f"v{i}", s, BF16) for i, s in enumerate(shapes)]
    return nodes, [make("transpose", v, axes=(1, 0, 2, 3)) for v in nodes]


def test_a_weight_gradient_reads_x_and_dy_transposed_where_they_lie():
    (x, g), (xt, gt) = _transposed((4, 8, 6, 6), (4, 16, 4, 4))
    dw = make("conv2d", xt, gt, **VALID)
    assert _ops(Graph("g", (x, g), (dw,))) == ["strided_conv"]
    bias = make_input("b", (8, 16, 1, 1), BF16)
    fused = make("fused_conv", xt, gt, bias, post="add($0,$1)", **VALID)
    (node,) = [n for n in read_conv_views_in_place(Graph("g", (x, g, bias), (fused,))).nodes if n.op == "strided_conv"]
    assert node.args[2] is bias and node.attr_map["post"] == "add($0,$1)"


def test_a_weight_gradient_is_written_transposed_where_only_the_transpose_reads_it():
    (x, g), (xt, gt) = _transposed((4, 8, 6, 6), (4, 16, 4, 4))
    dw = make("conv2d", xt, gt, **VALID)
    dw_t = make("transpose", dw, axes=(1, 0, 2, 3))
    (node,) = [n for n in read_conv_views_in_place(Graph("g", (x, g), (dw_t,))).nodes if n.op != "input"]
    assert node.op == "strided_conv" and node.attr_map["out_swapped"] and node.shape == dw_t.shape
    # the result read twice stays as it is, and its transpose a copy
    assert _ops(Graph("g", (x, g), (dw_t, make("relu", dw)))) == ["strided_conv", "transpose", "relu"]


def test_a_copy_another_kernel_reads_stays_and_so_does_a_view_across_the_innermost_axis():
    (x, g), (xt, gt) = _transposed((4, 8, 6, 6), (4, 16, 4, 4))
    dw = make("conv2d", xt, gt, **VALID)
    assert _ops(Graph("g", (x, g), (dw, make("relu", xt)))).count("transpose") == 1    # xᵀ stays, dYᵀ goes
    w = make_input("w", (8, 8, 3, 3), BF16)
    across = make("transpose", x, axes=(0, 1, 3, 2))                                    # W no longer innermost
    assert _ops(Graph("g", (x, w), (make("conv2d", across, w, **VALID),))) == ["transpose", "conv2d"]


def test_a_depthwise_convolution_keeps_its_copies():
    (x,), (xt,) = _transposed((8, 4, 6, 6))
    w = make_input("w", (8, 1, 3, 3), BF16)
    depthwise = make("conv2d", xt, w, **(VALID | dict(groups=8)))
    assert _ops(Graph("g", (x, w), (depthwise,))) == ["transpose", "conv2d"]


def test_a_conv_layers_gradient_plan_copies_no_activation():
    grad = op.grad(lambda x, w: op.sum(op.conv2d(x, w, padding=1) ** 2), argnums=(0, 1))
    x, w = op.tensor((4, 16, 12, 12), "bf16"), op.tensor((32, 16, 3, 3), "bf16")
    plan = grad.program(x, w).plan
    ops = [s.op for s in plan.steps]
    assert ops.count("strided_conv") == 2 and "flip" not in ops       # dx reads the kernel flipped in place
    weight_bytes = 32 * 16 * 9 * 2
    assert all(s.output.type.nbytes <= weight_bytes for s in plan.steps if s.op == "transpose")
    rng = np.random.default_rng(8)
    xv, wv = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(w.shape).astype(np.float32) / 12
    feeds = {"x": xv.astype(ml_dtypes.bfloat16), "w": wv.astype(ml_dtypes.bfloat16)}
    want = grad(*(v.astype(np.float64) for v in feeds.values()))
    for got, ref in zip(run_plan_on_cpu(plan, feeds), want, strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=3e-2, atol=3e-2 * np.abs(ref).max())
