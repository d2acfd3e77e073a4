"""A matmul and its epilogue reach one gemm node carrying everything it absorbed."""

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.rules.choice import smallest_choice
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite

RNG = np.random.default_rng(9)


def fused_forms(fn, inputs):
    graph = op.kernel(fn).trace(**inputs)
    result = rewrite(graph, BUILTIN_RULESETS)
    view, root = result.view, result.output_classes()[0]
    return graph, view, root, [n for n in view.classes[root] if n.op == "gemm"]


def test_linear_bias_gelu_residual_cast_is_one_gemm():
    x, w = RNG.standard_normal((2, 4, 16)).astype(np.float32), RNG.standard_normal((16, 8)).astype(np.float32)
    bias, res = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal((2, 4, 8)).astype(np.float32)
    fn = lambda x, w, bias, res: op.cast(op.gelu((x @ w) * 0.5 + bias) + res, "bfloat16")  # noqa: E731
    graph, view, root, gemms = fused_forms(fn, {"x": x, "w": w, "bias": bias, "res": res})
    full = [g for g in gemms if dict(g.attrs)["has_bias"] and dict(g.attrs)["has_residual"]]
    assert full, view.ops_in(root)
    attrs = dict(full[0].attrs)
    assert attrs["activation"] == "gelu" and attrs["scale"] == 0.5 and str(attrs["dtype"]) == "bfloat16"
    fused = Graph("g", graph.inputs, (view.decode(smallest_choice(view) | {root: full[0]}, root),)).verify()
    assert fused.op_counts() == {"gemm": 1}
    feeds = {"x": x, "w": w, "bias": bias, "res": res}
    np.testing.assert_array_equal(evaluate(fused, feeds)[0], evaluate(graph, feeds)[0])


def test_a_cast_widening_a_rounded_product_stays_a_cast():
    # a bf16 product cast to f32 keeps its bf16 rounding, so a quantization round trip survives
    x, w = RNG.standard_normal((4, 16)).astype(np.float32), RNG.standard_normal((16, 8)).astype(np.float32)
    for fn in (lambda x, w: op.cast(op.cast(x, "bf16") @ op.cast(w, "bf16"), "float32"),
               lambda x, w: op.cast(op.cast(x @ w, "bf16"), "float32") - x @ w):
        graph = op.kernel(fn).trace(x, w)
        y = op.kernel(fn)(x, w)
        np.testing.assert_array_equal(y, evaluate(graph, {"x": x, "w": w})[0])
    assert np.abs(y).max() > 0


def test_plain_matmul_is_a_gemm_with_an_empty_epilogue():
    x, w = RNG.standard_normal((8, 4)).astype(np.float32), RNG.standard_normal((4, 3)).astype(np.float32)
    _, _, _, gemms = fused_forms(lambda x, w: x @ w, {"x": x, "w": w})
    assert [dict(g.attrs)["activation"] for g in gemms] == ["none"]


def test_elementwise_chain_is_one_fused_node():
    x, y = RNG.standard_normal((4, 6)).astype(np.float32), RNG.standard_normal((1, 6)).astype(np.float32)
    fn = lambda x, y: op.tanh(x * op.sigmoid(x) + y) * 0.5  # noqa: E731
    graph = op.kernel(fn).trace(x=x, y=y)
    result = rewrite(graph, BUILTIN_RULESETS)
    view, root = result.view, result.output_classes()[0]
    whole = [n for n in view.classes[root] if n.op == "fused_elementwise"
             and all(view.classes[c][0].op in ("input", "constant") for c in n.operands)]
    assert whole, [dict(n.attrs) for n in view.classes[root]]
    fused = Graph("f", graph.inputs, (view.decode(smallest_choice(view) | {root: whole[0]}, root),)).verify()
    assert fused.op_counts() == {"fused_elementwise": 1}, str(fused)
    np.testing.assert_allclose(evaluate(fused, {"x": x, "y": y})[0], evaluate(graph, {"x": x, "y": y})[0],
                               rtol=1e-6)


def test_normalizations_absorb_their_elementwise_prologue():
    x, r = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal((4, 8)).astype(np.float32)
    w, b = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
    feeds = {"x": x, "r": r, "w": w, "b": b}
    for fn in (lambda x, r, w, b: op.layernorm(x + r, w, b), lambda x, r, w, b: op.rmsnorm(op.relu(x) * r, w),
               lambda x, r, w, b: op.softmax(x * r, axis=-1)):
        graph = op.kernel(fn).trace(**feeds)
        result = rewrite(graph, BUILTIN_RULESETS)
        view, root = result.view, result.output_classes()[0]
        fused_nodes = [n for n in view.classes[root] if n.op == "fused_normalization"
                       and all(view.classes[c][0].op == "input" for c in n.operands)]
        assert fused_nodes, view.ops_in(root)
        fused = Graph("f", graph.inputs, (view.decode(smallest_choice(view) | {root: fused_nodes[0]}, root),))
        assert set(fused.verify().op_counts()) == {"fused_normalization"}, str(fused)
        np.testing.assert_allclose(evaluate(fused, feeds)[0], evaluate(graph, feeds)[0], rtol=1e-5, atol=1e-6)


def test_a_normalization_absorbs_the_elementwise_ops_on_both_sides():
    x, r = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal((4, 8)).astype(np.float32)
    feeds = {"x": x, "r": r}
    graph = op.kernel(lambda x, r: op.tanh(op.softmax(x * r, axis=-1)) * r).trace(**feeds)
    result = rewrite(graph, BUILTIN_RULESETS)
    view, root = result.view, result.output_classes()[0]
    whole = [n for n in view.classes[root] if n.op == "fused_normalization"
             and all(view.classes[c][0].op == "input" for c in n.operands)]
    assert whole, view.ops_in(root)
    fused = Graph("f", graph.inputs, (view.decode(smallest_choice(view) | {root: whole[0]}, root),)).verify()
    assert fused.op_counts() == {"fused_normalization": 1}, str(fused)
    np.testing.assert_allclose(evaluate(fused, feeds)[0], evaluate(graph, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spelling", ["softmax(x) * w", "log_softmax(x) - x", "layernorm(x) * w",
                                      "relu(layernorm(x, w)) + 1", "rmsnorm(x, w, w) * x"])
def test_a_normalization_of_a_plain_tensor_absorbs_the_elementwise_ops_after_it(spelling):
    x, w = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
    fn = {"softmax(x) * w": lambda x, w: op.softmax(x, axis=-1) * w,
          "log_softmax(x) - x": lambda x, w: op.log_softmax(x, axis=-1) - x,
          "layernorm(x) * w": lambda x, w: op.layernorm(x) * w,
          "relu(layernorm(x, w)) + 1": lambda x, w: op.relu(op.layernorm(x, w)) + 1.0,
          "rmsnorm(x, w, w) * x": lambda x, w: op.rmsnorm(x, w, w) * x}[spelling]
    program = op.kernel(fn).program(x, w)
    assert [s.op for s in program.plan.steps] == ["fused_normalization"], spelling
    graph = op.kernel(fn).trace(x=x, w=w)
    np.testing.assert_allclose(op.kernel(fn)(x, w), evaluate(graph, {"x": x, "w": w})[0], rtol=1e-5, atol=1e-6)


def test_a_cast_to_the_products_own_dtype_is_no_kernel():
    x, w = (RNG.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((64, 32), (32, 16)))
    b = RNG.standard_normal(16).astype(ml_dtypes.bfloat16)
    for fn in (lambda x, w, b: op.cast(op.gelu(x @ w + b), "bfloat16"),
               lambda x, w, b: op.cast(op.matmul(x, w, accum_dtype="float32"), "bfloat16") + b):
        plan = op.kernel(fn).program(x, w, b).plan
        assert [s.node.op for s in plan.steps] == ["gemm"], plan


RESIDUAL_SPELLINGS = {
    "x + (a@w + b)": (lambda x, a, w, b: x + (a @ w + b), ("bias", "residual")),
    "(a@w + b) + x": (lambda x, a, w, b: (a @ w + b) + x, ("bias", "residual")),
    "a@w + x + b": (lambda x, a, w, b: a @ w + x + b, ("bias", "residual")),
    "x + a@w + b": (lambda x, a, w, b: x + a @ w + b, ("bias", "residual")),
    "x + a@w": (lambda x, a, w, b: x + a @ w, ("residual",)),
    "x + gelu(a@w + b)": (lambda x, a, w, b: x + op.gelu(a @ w + b), ("bias", "gelu", "residual")),
}


@pytest.mark.parametrize("spelling", list(RESIDUAL_SPELLINGS))
def test_a_residual_is_absorbed_on_either_side_and_named_so(spelling):
    fn, fused = RESIDUAL_SPELLINGS[spelling]
    x, w, b = op.tensor((4, 128, 256), "bf16"), op.tensor((256, 256), "bf16"), op.tensor((256,), "bf16")
    report = op.kernel(fn).explain(x, x, w, b)
    assert [(k.kind, k.fused) for k in report.candidates[report.chosen].kernels] == [("gemm", fused)]
    xs, ws, bs = (RNG.standard_normal(s) for s in ((2, 3, 16), (16, 8), (8,)))
    resid = RNG.standard_normal((2, 3, 8))
    np.testing.assert_allclose(op.kernel(fn)(resid, xs, ws, bs), fn(resid, xs, ws, bs), rtol=1e-12)


@pytest.mark.parametrize("order", ["silu(gate) * up", "up * silu(gate)"])
def test_a_gated_units_product_takes_its_gate_in_the_epilogue(order):
    """LLaMA's MLP: silu(x W_gᵀ) · (x W_uᵀ), then W_d: the gate's GEMM applies silu, the up
    projection's multiplies by the gate, and no elementwise pass is left."""
    x = RNG.standard_normal((32, 48)).astype(np.float32)
    w_gate, w_up = (RNG.standard_normal((64, 48)).astype(np.float32) * 0.2 for _ in range(2))
    w_down = RNG.standard_normal((48, 64)).astype(np.float32) * 0.2

    def mlp(x, w_gate, w_up, w_down):
        gate, up = op.silu(x @ w_gate.T), x @ w_up.T
        return ((gate * up) if order.startswith("silu") else (up * gate)) @ w_down.T
    k = op.kernel(mlp)
    steps = k.program(x, w_gate, w_up, w_down).plan.steps
    assert sorted(s.op for s in steps) == ["gated_gemm", "gemm", "gemm"]
    gate = x.astype(np.float64) @ w_gate.T.astype(np.float64)
    want = (gate / (1 + np.exp(-gate)) * (x.astype(np.float64) @ w_up.T)) @ w_down.T
    np.testing.assert_allclose(k(x, w_gate, w_up, w_down), want, rtol=1e-4, atol=1e-4)
