"""A gemm whose result an activation and another kernel both read becomes one gemm_pre_act writing
the pre-activation and the activation (lower/kept_preactivations.py): the program computes what it
did, on the numpy reference and, for a GELU MLP's backward pass, on the CPU executor and the
emulated CUDA kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen import emulator
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.lower.kept_preactivations import keep_preactivations

F32 = DType.float32
ACTIVATIONS = {"gelu": lambda h: make("gelu", h, approximate="none"),
               "gelu_tanh": lambda h: make("gelu", h, approximate="tanh"),
               "relu": lambda h: make("relu", h), "silu": lambda h: make("silu", h),
               "fused relu": lambda h: make("fused_elementwise", h, expr="relu($0)")}


def layer(bias: bool = True, **attrs):
    """(inputs, gemm(x, w[, b])) over x (2, 8, 12), w (12, 16), b (16,)."""
    x, w, b = make_input("x", (2, 8, 12), F32), make_input("w", (12, 16), F32), make_input("b", (16,), F32)
    base = dict(scale=1.0, activation="none", has_bias=bias, has_residual=False, accum_dtype=None, dtype=F32)
    return (x, w, b), make("gemm", x, w, *((b,) if bias else ()), **(base | attrs))


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op not in ("input", "slice", "reshape")]


def same_values(merged: Graph, graph: Graph, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = {x.attr_map["name"]: rng.standard_normal(x.shape).astype(np.float32) for x in graph.inputs}
    for got, want in zip(evaluate(merged, feeds), evaluate(graph, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(ACTIVATIONS)), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_a_gemm_and_its_activation_become_one_product_writing_both(activation, bias, pre_is_output, seed):
    inputs, h = layer(bias)
    act = ACTIVATIONS[activation](h)
    outputs = (act, h) if pre_is_output else (act, make("fused_elementwise", h, expr="tanh($0)"))
    graph = Graph("g", inputs, outputs)
    merged = keep_preactivations(graph)
    assert ops(merged) == ["gemm_pre_act"] + (["fused_elementwise"] if not pre_is_output else [])
    (both,) = [n for n in merged.nodes if n.op == "gemm_pre_act"]
    assert both.shape == (2, 2, 8, 16) and both.attr_map["activation"] == activation.removeprefix("fused ")
    same_values(merged, graph, seed)


def test_a_gemm_only_its_activation_reads_is_left_to_the_epilogue_rules():
    inputs, h = layer()
    graph = Graph("g", inputs, (make("gelu", h, approximate="none"),))
    assert keep_preactivations(graph) is graph


@pytest.mark.parametrize("attrs", [dict(activation="relu"), dict(has_residual=True)], ids=["activated", "residual"])
def test_a_gemm_with_an_epilogue_after_its_product_keeps_it(attrs):
    x, w, b = layer()[0]
    res = make_input("r", (2, 8, 16), F32)
    extra = (res,) if attrs.get("has_residual") else ()
    h = make("gemm", x, w, b, *extra, **(dict(scale=1.0, activation="none", has_bias=True, has_residual=False,
                                               accum_dtype=None, dtype=F32) | attrs))
    graph = Graph("g", (x, w, b, *extra), (make("silu", h), h))
    assert keep_preactivations(graph) is graph


def test_an_activation_reading_more_than_the_product_is_not_taken_in():
    inputs, h = layer()
    y = make("fused_elementwise", h, inputs[2], expr="relu(add($0,$1))")
    graph = Graph("g", inputs, (y, h))
    assert keep_preactivations(graph) is graph


def test_a_product_without_an_activation_has_no_pre_activation_to_keep():
    x, w, _ = layer()[0]
    with pytest.raises(AttributeValueError, match="activation must be one of") as e:
        make("gemm_pre_act", x, w, scale=1.0, activation="none", has_bias=False, accum_dtype=None, dtype=F32)
    assert "use gemm" in str(e.value)


def mlp_loss(x, w1, b1, w2, b2):
    y = op.gelu(x @ w1 + b1) @ w2 + b2
    return op.sum(y * y) * 0.5


def mlp_gradients(x, w1, b1, w2, b2):
    """dL/d(w1, b1, w2, b2) of mlp_loss, written out in numpy."""
    h = x @ w1 + b1
    a = h * special.ndtr(h)
    dy = a @ w2 + b2
    dh = (dy @ w2.T) * (special.ndtr(h) + h * np.exp(-0.5 * h * h) / np.sqrt(2 * np.pi))
    return x.T @ dh, dh.sum(0), a.T @ dy, dy.sum(0)


def test_a_gelu_mlps_backward_pass_writes_the_pre_activation_and_the_activation_from_one_gemm():
    grad = op.grad(mlp_loss, argnums=(1, 2, 3, 4))
    shapes = [(8192, 1024), (1024, 4096), (4096,), (4096, 1024), (1024,)]
    plan = grad.program(*(op.tensor(s, "bf16") for s in shapes)).plan
    kernels = [s.op for s in plan.steps]
    assert "gemm_pre_act" in kernels and "gelu" not in kernels and "fused_elementwise" not in kernels


def test_a_gelu_mlps_backward_pass_runs_right():
    grad = op.grad(mlp_loss, argnums=(1, 2, 3, 4))
    rng = np.random.default_rng(4)
    shapes = [(64, 32), (32, 96), (96,), (96, 32), (32,)]
    values = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]
    plan = grad.program(*values).plan
    assert "gemm_pre_act" in [s.op for s in plan.steps]
    want = mlp_gradients(*(v.astype(np.float64) for v in values))
    feeds = dict(zip(("x", "w1", "b1", "w2", "b2"), values))
    runs = [run_plan_on_cpu(plan, feeds)] + ([run_plan_emulated(plan, feeds)] if emulator.available() else [])
    for got in runs:
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
