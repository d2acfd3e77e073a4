"""A fused_conv or fused_normalization takes in the elementwise kernel that alone reads it, after
extraction (lower/epilogue_merge.py): the reader's expression becomes the epilogue, its other
inputs the kernel's epilogue inputs; the program computes what it did, on the numpy reference and,
for a convolution's plan, on the CPU executor and the emulated CUDA kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen import emulator
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.lower.elementwise_merge import MERGED_INPUTS
from tessera_rw.lower.epilogue_merge import merge_epilogues

F32 = DType.float32
CONV = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)
IMAGES, PLANE = (2, 4, 6, 6), (4, 1, 1)


def kernels(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op not in ("input", "constant")]


def same_values(merged: Graph, graph: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = {x.attr_map["name"]: rng.standard_normal(x.shape).astype(np.float32) for x in graph.inputs}
    for got, want in zip(evaluate(merged, feeds), evaluate(graph, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def residual_conv():
    """fused_conv(x, w, b, x; conv + b + x) over its inputs (x, w, b, t)."""
    x, w = make_input("x", IMAGES, F32), make_input("w", (4, 4, 3, 3), F32)
    b, t = make_input("b", PLANE, F32), make_input("t", IMAGES, F32)
    return (x, w, b, t), make("fused_conv", x, w, b, x, **CONV, post="add(add($0,$1),$2)")


def test_a_residual_blocks_loss_gradient_goes_into_its_convolutions_epilogue():
    # where(pre > 0, 2·(relu(pre) − t), 0): pre read twice and the inputs it shares with the
    # convolution (x) read once; the convolution's epilogue inputs come first, t after them
    inputs, conv = residual_conv()
    grad = make("fused_elementwise", conv, inputs[3],
                expr="where(gt($0,0.0:float32),mul(sub(relu($0),$1),2.0:float32),0.0:float32)")
    graph = Graph("g", inputs, (grad,))
    merged = merge_epilogues(graph)
    (kernel,) = kernels(merged)
    assert kernel.op == "fused_conv" and kernel.args == (inputs[0], inputs[1], inputs[2], inputs[0], inputs[3])
    assert kernel.attr_map["post"].count("add(add($0,$1),$2)") == 2
    same_values(merged, graph)


def test_a_reader_that_reads_an_epilogue_input_again_reads_it_once():
    inputs, conv = residual_conv()
    y = make("fused_elementwise", conv, inputs[2], expr="mul($0,$1)")
    (kernel,) = kernels(merge_epilogues(Graph("g", inputs, (y,))))
    assert kernel.args == (inputs[0], inputs[1], inputs[2], inputs[0]) and "$3" not in kernel.attr_map["post"]


def test_a_normalization_takes_its_reader_after_its_own_epilogue():
    x, g, r = make_input("x", (4, 16), F32), make_input("g", (16,), F32), make_input("r", (4, 16), F32)
    norm = make("fused_normalization", x, g, r, expr="$0", norm="rmsnorm", axes=(1,), eps=1e-6,
                has_weight=True, has_bias=False, post="mul($0,$1)")
    y = make("fused_elementwise", norm, x, expr="tanh(add($0,$1))")
    graph = Graph("g", (x, g, r), (y,))
    merged = merge_epilogues(graph)
    (kernel,) = kernels(merged)
    assert kernel.op == "fused_normalization" and kernel.attr_map["post"] == "tanh(add(mul($0,$1),$2))"
    same_values(merged, graph)


def test_a_kernel_another_reader_or_the_caller_also_reads_keeps_its_epilogue():
    inputs, conv = residual_conv()
    relu = make("fused_elementwise", conv, expr="relu($0)")
    also = make("fused_elementwise", conv, inputs[3], expr="mul($0,$1)")
    for outputs in ((relu, also), (relu, conv)):
        graph = Graph("g", inputs, outputs)
        assert merge_epilogues(graph) is graph


def test_a_reader_that_broadcasts_the_result_wider_or_casts_it_stays_a_kernel():
    inputs, conv = residual_conv()
    wider = make("fused_elementwise", conv, make_input("u", (3, *IMAGES), F32), expr="add($0,$1)")
    mask = make("fused_elementwise", conv, expr="gt($0,0.0:float32)")        # a bool: not what the conv writes
    for reader in (wider, mask):
        graph = Graph("g", (*inputs, *reader.args[1:]), (reader,))
        assert merge_epilogues(graph) is graph


def sum_of(n: int) -> str:
    """add(…add(add($0,$1),$2)…,$n-1)"""
    expr = "$0"
    for i in range(1, n):
        expr = f"add({expr},${i})"
    return expr


@pytest.mark.parametrize("new_inputs", [MERGED_INPUTS - 3, MERGED_INPUTS - 2])
def test_an_epilogue_reads_fewer_than_merged_inputs_tensors(new_inputs):
    inputs, conv = residual_conv()                  # b and x already
    more = tuple(make_input(f"e{i}", IMAGES, F32) for i in range(new_inputs))
    graph = Graph("g", (*inputs, *more), (make("fused_elementwise", conv, *more, expr=sum_of(1 + new_inputs)),))
    merged = merge_epilogues(graph)
    assert len(kernels(merged)) == (1 if 2 + new_inputs < MERGED_INPUTS else 2)
    same_values(merged, graph)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["relu", "tanh", "neg", "exp"]), st.sampled_from(["add", "mul", "sub", "maximum"]),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_a_merged_epilogue_computes_what_the_two_kernels_did(unary, binary, reads_bias, seed):
    inputs, conv = residual_conv()
    other = inputs[2] if reads_bias else inputs[3]
    y = make("fused_elementwise", other, conv, expr=f"{binary}({unary}($1),$0)")
    graph = Graph("g", inputs, (y,))
    merged = merge_epilogues(graph)
    assert [n.op for n in kernels(merged)] == ["fused_conv"]
    same_values(merged, graph, seed)


@op.kernel
def residual_relu_gradient(x, w, b, t):
    pre = op.conv2d(x, w, padding=1) + b + x
    return op.where(pre > 0, (op.relu(pre) - t) * 2.0, 0.0)


def test_a_convolution_whose_epilogue_reads_four_tensors_is_one_kernel_and_computes_right():
    rng = np.random.default_rng(5)
    x, t = rng.standard_normal(IMAGES).astype(np.float32), rng.standard_normal(IMAGES).astype(np.float32)
    w = (rng.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32)
    b = rng.standard_normal(PLANE).astype(np.float32)
    plan = residual_relu_gradient.program(x, w, b, t).plan
    assert [s.op for s in plan.steps] == ["fused_conv"]
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = sum(np.einsum("nchw,oc->nohw", padded[:, :, i:i + 6, j:j + 6], w[:, :, i, j]) for i in range(3)
               for j in range(3))
    pre = conv + b + x
    want = np.where(pre > 0, (np.maximum(pre, 0) - t) * 2, 0)
    feeds = {"x": x, "w": w, "b": b, "t": t}
    runs = [run_plan_on_cpu(plan, feeds)] + ([run_plan_emulated(plan, feeds)] if emulator.available() else [])
    for (got,) in runs:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@op.kernel
def residual_norm_gradient(x, w, r, t):
    y = op.rmsnorm(x, w) + r
    return op.where(y > 0, (op.relu(y) - t) * 2.0, 0.0)


def test_a_normalization_whose_epilogue_reads_four_tensors_is_one_kernel_and_computes_right():
    rng = np.random.default_rng(7)
    x, r, t = (rng.standard_normal((64, 256)).astype(np.float32) for _ in range(3))
    w = rng.standard_normal(256).astype(np.float32)
    plan = residual_norm_gradient.program(x, w, r, t).plan
    assert [s.op for s in plan.steps] == ["fused_normalization"]
    wide = x.astype(np.float64)
    y = wide / np.sqrt((wide ** 2).mean(1, keepdims=True) + 1e-6) * w + r
    want = np.where(y > 0, (np.maximum(y, 0) - t) * 2, 0)
    feeds = {"x": x, "w": w, "r": r, "t": t}
    runs = [run_plan_on_cpu(plan, feeds)] + ([run_plan_emulated(plan, feeds)] if emulator.available() else [])
    for (got,) in runs:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def block_gradient():
    def loss(x, w1, b1, w2, b2, t):
        h = op.relu(op.conv2d(x, w1, padding=1) + b1)
        return op.sum((op.relu(op.conv2d(h, w2, padding=1) + b2 + x) - t) ** 2)
    return op.grad(loss, argnums=(0, 1, 2, 3, 4))


def test_a_resnet_blocks_gradient_has_no_elementwise_kernel(block_gradient):
    # at a ResNet-34 first-stage size the second convolution's epilogue computes dL/dpre, and pre
    # itself is never written (at a launch-bound size extraction may cut the program elsewhere)
    images, kernel, bias = (32, 64, 56, 56), (64, 64, 3, 3), (64, 1, 1)
    shapes = [images, kernel, bias, kernel, bias, images]
    plan = block_gradient.program(*(op.tensor(s, "bf16") for s in shapes)).plan
    assert [s.op for s in plan.steps].count("fused_elementwise") == 0
    assert [s.node.attr_map.get("post", "").count("where(") for s in plan.steps if s.op == "fused_conv"] == [0, 1]


def test_a_resnet_blocks_gradient_runs_right(block_gradient):
    shapes = [(2, 8, 10, 10), (8, 8, 3, 3), (8, 1, 1), (8, 8, 3, 3), (8, 1, 1), (2, 8, 10, 10)]
    plan = block_gradient.program(*(op.tensor(s, "float32") for s in shapes)).plan
    rng = np.random.default_rng(3)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = block_gradient(*(v.astype(np.float64) for v in values))
    feeds = dict(zip(("x", "w1", "b1", "w2", "b2", "t"), values))
    runs = [run_plan_on_cpu(plan, feeds)] + ([run_plan_emulated(plan, feeds)] if emulator.available() else [])
    for got in runs:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3 * np.abs(w).max())


NORM = dict(expr="$0", norm="log_softmax", axes=(1,), eps=0.0, has_weight=False, has_bias=False)


@pytest.mark.parametrize("host", ["fused_normalization", "reduced_normalization"])
def test_an_epilogue_input_written_for_the_row_kernel_alone_is_computed_in_its_epilogue(host):
    """A loss's gradient selects its cotangent by class: where(c == position, -1/n, 0) is written at
    the logits' size for the row kernel alone to read; computed in its epilogue from c and the
    positions, it is never written."""
    z, c, pos = make_input("z", (8, 50), F32), make_input("c", (8, 1), F32), make_input("pos", (1, 50), F32)
    picked = make("fused_elementwise", c, pos, expr="where(eq($0,$1),-0.125:float32,0.0:float32)")
    extra = dict(reduce="sum", keepdims=False) if host == "reduced_normalization" else {}
    rows = make(host, z, picked, **NORM, post="sub($1,exp($0))", **extra)
    graph = Graph("g", (z, c, pos), (rows,))
    merged = merge_epilogues(graph)
    [kernel] = kernels(merged)
    assert kernel.args == (z, c, pos) and kernel.attr_map["post"] == (
        "sub(where(eq($1,$2),-0.125:float32,0.0:float32),exp($0))")
    same_values(merged, graph)


def test_an_epilogue_input_another_kernel_reads_too_or_of_fewer_elements_stays_written():
    z, c, pos = make_input("z", (8, 50), F32), make_input("c", (8, 1), F32), make_input("pos", (1, 50), F32)
    picked = make("fused_elementwise", c, pos, expr="mul($0,$1)")
    row = make("fused_elementwise", c, expr="exp($0)")                      # [8, 1]: no larger than it is
    rows = make("fused_normalization", z, picked, row, **NORM, post="add(sub($1,$0),$2)")
    twice = Graph("g", (z, c, pos), (rows, picked))
    assert merge_epilogues(twice) is twice


def test_an_epilogue_input_normalizing_the_same_rows_is_computed_from_the_hosts_own():
    """log p · r (smoothed classes) is the host's own log p scaled: its epilogue computes it."""
    z, c, pos = make_input("z", (8, 50), F32), make_input("c", (8, 1), F32), make_input("pos", (1, 50), F32)
    scaled = make("fused_normalization", z, **NORM, post="mul($0,0.25:float32)")
    rows = make("reduced_normalization", z, c, pos, scaled, **NORM, post="where(eq($1,$2),$0,$3)", reduce="sum",
                keepdims=False)
    graph = Graph("g", (z, c, pos), (rows,))
    merged = merge_epilogues(graph)
    [kernel] = kernels(merged)
    assert kernel.args == (z, c, pos) and kernel.attr_map["post"] == "where(eq($1,$2),$0,mul($0,0.25:float32))"
    same_values(merged, graph)
    other = make("fused_normalization", z, **(NORM | {"norm": "softmax"}), post="mul($0,0.25:float32)")
    kept = make("reduced_normalization", z, c, pos, other, **NORM, post="where(eq($1,$2),$0,$3)", reduce="sum",
                keepdims=False)
    assert len(kernels(merge_epilogues(Graph("g", (z, c, pos), (kept,))))) == 2     # softmax's rows are others


def test_a_merge_the_caller_refuses_is_left_as_it_was():
    """A float64 selection computed in a float32 row kernel's epilogue would leave that kernel one no
    GPU template reads: extraction's `keeps` refuses it (tune/extract.py)."""
    z = make_input("z", (8, 50), F32)
    a, b = make_input("a", (8, 50), DType.float64), make_input("b", (1, 50), DType.float64)
    picked = make("fused_elementwise", a, b, expr="lt($0,$1)")
    rows = make("reduced_normalization", z, picked, **NORM, post="where($1,$0,0.0:float32)", reduce="sum",
                keepdims=False)
    graph = Graph("g", (z, a, b), (rows,))
    assert len(kernels(merge_epilogues(graph))) == 1
    assert merge_epilogues(graph, keeps=lambda before, after: False) is graph


def test_a_max_pool_s_gradient_takes_the_relu_mask_its_one_reader_applies():
    """relu′ · max_pool2d_grad(relu(y), g) as merged: where(r > 0, dx, 0) is the gradient kernel's
    epilogue (a fused_max_pool2d_grad reading r again at each element), one pass over r and dx fewer."""
    r, g = make_input("r", (2, 3, 9, 9), DType.float32), make_input("g", (2, 3, 5, 5), DType.float32)
    window = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), dilation=(1, 1), ceil_mode=False)
    dx = make("max_pool2d_grad", r, g, **window)
    masked = make("fused_elementwise", r, dx, expr="where(gt($0,0.0:float32),$1,0.0:float32)")
    graph = Graph("g", (r, g), (masked,))
    merged = merge_epilogues(graph)
    assert [n.op for n in merged.nodes if n.op != "input"] == ["fused_max_pool2d_grad"]
    rng = np.random.default_rng(3)
    feeds = {"r": np.maximum(rng.standard_normal(r.shape), 0).astype(np.float32),
             "g": rng.standard_normal(g.shape).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(merged, feeds)[0], evaluate(graph, feeds)[0])
    twice = Graph("g", (r, g), (masked, dx))                  # the caller reads the gradient too: no merge
    assert "max_pool2d_grad" in [n.op for n in merge_epilogues(twice).nodes]
