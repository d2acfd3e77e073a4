"""A layer's bias gradient, Σ dY over the batch and the positions, comes out of its weight
gradient's convolution (lower/conv_bias_grads.py): one strided_conv with `bias_grad` whose result
holds dW and then db; the program computes what it did, on the numpy reference and, for a ResNet
block's training step, on the CPU executor and the emulated CUDA kernels."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen import emulator
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.lower.conv_bias_grads import sum_bias_grads_in_weight_grads
from tessera_rw.lower.conv_views import read_conv_views_in_place

F32 = DType.float32


def layer_gradients(x_shape, dy_shape, *, sum_axes=None, keepdims=False, sliced=False):
    """The lowered (dW, db) of a same-padded layer: dW = (xᵀ ⋆ dYᵀ)ᵀ, db = Σ dY over `sum_axes`
    (all but the channels unless given); `sliced` reads dY's first images only for dW."""
    x, dy = make_input("x", x_shape, F32), make_input("dy", dy_shape, F32)
    rank = len(x_shape)
    swap = (1, 0, *range(2, rank))
    g = make("slice", dy, starts=(0,) * rank, stops=(x_shape[0], *dy_shape[1:]), steps=(1,) * rank) if sliced else dy
    conv = f"conv{rank - 2}d"
    dw = make(conv, make("transpose", x, axes=swap), make("transpose", g, axes=swap), stride=(1,) * (rank - 2),
              padding=((1, 1),) * (rank - 2), dilation=(1,) * (rank - 2), groups=1)
    db = make("sum", dy, axes=sum_axes or (0, *range(2, rank)), keepdims=keepdims)
    return read_conv_views_in_place(Graph("g", (x, dy), (make("transpose", dw, axes=swap), db)))


def kernels(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op not in ("input", "slice", "reshape")]


def same_values(merged: Graph, graph: Graph) -> None:
    rng = np.random.default_rng(0)
    feeds = {x.attr_map["name"]: rng.standard_normal(x.shape).astype(np.float32) for x in graph.inputs}
    for got, want in zip(evaluate(merged, feeds), evaluate(graph, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("x_shape, dy_shape", [((3, 4, 6, 6), (3, 5, 6, 6)), ((2, 3, 11), (2, 7, 11))],
                         ids=["conv2d", "conv1d"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_the_bias_gradient_comes_out_of_the_weight_gradient(x_shape, dy_shape, keepdims):
    graph = layer_gradients(x_shape, dy_shape, keepdims=keepdims)
    merged = sum_bias_grads_in_weight_grads(graph)
    (conv,) = kernels(merged)
    assert conv.op == "strided_conv" and conv.attr_map["bias_grad"] and conv.args == graph.inputs
    assert [o.shape for o in merged.outputs] == [o.shape for o in graph.outputs]
    same_values(merged, graph)


@pytest.mark.parametrize("variant", [dict(sum_axes=(0, 2)), dict(sliced=True)],
                         ids=["a sum keeping a spatial axis", "dW of a slice of dY"])
def test_a_sum_that_is_not_the_layers_bias_gradient_stays_a_reduction(variant):
    graph = layer_gradients((3, 4, 6, 6), (4, 5, 6, 6) if variant.get("sliced") else (3, 5, 6, 6), **variant)
    assert sum_bias_grads_in_weight_grads(graph) is graph


def test_a_weight_gradient_written_unswapped_keeps_its_layout():
    x, dy = make_input("x", (3, 4, 6, 6), F32), make_input("dy", (3, 5, 6, 6), F32)
    swap = (1, 0, 2, 3)
    dw = make("conv2d", make("transpose", x, axes=swap), make("transpose", dy, axes=swap), stride=(1, 1),
              padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)          # (C, O, 3, 3): no transpose after it
    graph = read_conv_views_in_place(Graph("g", (x, dy), (dw, make("sum", dy, axes=(0, 2, 3), keepdims=False))))
    assert sum_bias_grads_in_weight_grads(graph) is graph


def block_loss(x, w1, b1, w2, b2, t):
    h = op.relu(op.conv2d(x, w1, padding=1) + b1)
    return op.sum((op.relu(op.conv2d(h, w2, padding=1) + b2 + x) - t) ** 2)


def test_a_resnet_blocks_training_step_has_no_reduction_kernel():
    # both biases' gradients ride in their layers' weight-gradient convolutions, and the loss
    # gradient in the second convolution's epilogue: 24 kernels unfused, 6 here
    images, kernel, bias = (32, 64, 56, 56), (64, 64, 3, 3), (64, 1, 1)
    grad = op.grad(block_loss, argnums=(0, 1, 2, 3, 4))
    plan = grad.program(*(op.tensor(s, "bf16") for s in (images, kernel, bias, kernel, bias, images))).plan
    assert [s.node.attr_map.get("bias_grad") for s in plan.steps if s.op == "strided_conv"].count(True) == 2
    assert not {"sum", "fused_reduction", "fused_elementwise"} & {s.op for s in plan.steps}
    assert len(plan.steps) == 6


def test_a_resnet_blocks_training_step_runs_right_with_a_bias_gradient_in_a_convolution():
    grad = op.grad(block_loss, argnums=(0, 1, 2, 3, 4))
    shapes = [(2, 8, 10, 10), (8, 8, 3, 3), (8, 1, 1), (8, 8, 3, 3), (8, 1, 1), (2, 8, 10, 10)]
    plan = grad.program(*(op.tensor(s, "float32") for s in shapes)).plan
    assert any(s.node.attr_map.get("bias_grad") for s in plan.steps if s.op == "strided_conv")
    rng = np.random.default_rng(8)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = grad(*(v.astype(np.float64) for v in values))            # float64: no kernel fuses
    feeds = dict(zip(("x", "w1", "b1", "w2", "b2", "t"), values))
    runs = [run_plan_on_cpu(plan, feeds)] + ([run_plan_emulated(plan, feeds)] if emulator.available() else [])
    for got in runs:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3 * np.abs(w).max())
