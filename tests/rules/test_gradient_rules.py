"""The `gradient` ruleset: a weight-gradient GEMM and the bias gradient beside it become two row
blocks of one matmul_bias_grad, directly and after micro-batch sums are flattened into one GEMM.

Every rule's example is also checked by tests/rules/test_rule_soundness.py (which runs every rule
of BUILTIN_RULESETS); here the whole library is saturated on the ways backward passes are written.
"""

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.rules.choice import smallest_choice
from tessera_rw.rules.egraph import EGraphView, ENode
from tessera_rw.rules.library import BUILTIN_RULESETS, GRADIENT
from tessera_rw.rules.saturate import rewrite
from tessera_rw.rules.soundness import check_rule

RNG = np.random.default_rng(11)


def _linear(x, dy):
    return x.T @ dy, op.sum(dy, axis=0)


def _linear_keepdims(x, dy):
    return x.T @ dy, op.sum(dy, axis=0, keepdims=True)


def _micro_batch(x, dy):
    return op.sum(x.mT @ dy, axis=0), op.sum(dy, axis=(0, 1))


def _two_batch_dims(x, dy):
    return op.sum(x.mT @ dy, axis=(0, 1)), op.sum(dy, axis=(0, 1, 2))


def _through_grad(x, w, b, dy):
    """A linear layer's backward as op.grad derives it: dW = xᵀ g, db = Σ_rows g."""
    return op.sum((x @ w + b) * dy)


def _packed_choice(view: EGraphView, roots: tuple[str, ...]) -> tuple[dict[str, ENode], str]:
    """The smallest choice with each root computed from a view of one shared matmul_bias_grad class."""
    choice = smallest_choice(view)
    packed = {cid for cid, ns in view.classes.items() if any(n.op == "matmul_bias_grad" for n in ns)}
    for root in roots:
        found = [n for n in view.classes[root] if _reads_packed(view, n, packed)]
        assert found, f"no view of a packed gemm in {view.ops_in(root)}"
        choice[root] = found[0]
    for cid in packed:
        choice[cid] = next(n for n in view.classes[cid] if n.op == "matmul_bias_grad")
    (shared,) = packed
    return choice, shared


def _reads_packed(view: EGraphView, enode: ENode, packed: set[str]) -> bool:
    """Whether `enode` is slice(P) or reshape(slice(P)) of a packed class P."""
    if enode.op == "slice":
        return enode.operands[0] in packed
    if enode.op == "reshape":
        return any(n.op == "slice" and n.operands[0] in packed for n in view.classes[enode.operands[0]])
    return False


def _check_packed(fn, inputs: dict[str, np.ndarray], rtol: float = 1e-5, graph: Graph | None = None) -> Graph:
    """Saturate fn's graph with every built-in ruleset, choose the packed form for all outputs and
    check it has one matmul_bias_grad, no sum, and the original's values."""
    graph = graph or op.kernel(fn).trace(**inputs)
    result = rewrite(graph, BUILTIN_RULESETS)
    view, roots = result.view, result.output_classes()
    choice, _ = _packed_choice(view, roots)
    for root in roots:   # the slice (and the reshape under db) are the chosen views
        if choice[root].op == "reshape":
            choice[choice[root].operands[0]] = next(n for n in view.classes[choice[root].operands[0]]
                                                    if n.op == "slice")
    packed = Graph("packed", graph.inputs, tuple(view.decode(choice, r) for r in roots)).verify()
    assert packed.op_counts().get("matmul_bias_grad") == 1, str(packed)
    assert "sum" not in packed.op_counts(), str(packed)
    for got, want in zip(evaluate(packed, inputs), evaluate(graph, inputs)):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol)
    return packed


def test_linear_backward_is_one_packed_gemm():
    _check_packed(_linear, {"x": RNG.standard_normal((12, 5)).astype(np.float32),
                            "dy": RNG.standard_normal((12, 7)).astype(np.float32)})


def test_keepdims_bias_is_the_packed_row_itself():
    packed = _check_packed(_linear_keepdims, {"x": RNG.standard_normal((9, 4)).astype(ml_dtypes.bfloat16),
                                              "dy": RNG.standard_normal((9, 6)).astype(ml_dtypes.bfloat16)},
                           rtol=3e-2)
    assert packed.outputs[1].op == "slice" and packed.outputs[1].shape == (1, 6)


@pytest.mark.parametrize("fn, lead", [(_micro_batch, (3,)), (_two_batch_dims, (2, 3))])
def test_micro_batches_flatten_into_one_packed_gemm(fn, lead):
    inputs = {"x": RNG.standard_normal((*lead, 5, 4)).astype(np.float32),
              "dy": RNG.standard_normal((*lead, 5, 6)).astype(np.float32)}
    packed = _check_packed(fn, inputs)
    (mbg,) = [n for n in packed.nodes if n.op == "matmul_bias_grad"]
    rows = int(np.prod(lead)) * 5          # K of the one GEMM: every micro-batch's rows
    assert mbg.args[0].shape == (4, rows) and mbg.args[1].shape == (rows, 6)


@pytest.mark.parametrize("lead", [(), (2,)], ids=["tokens", "micro-batches"])
def test_the_backward_op_grad_derives_is_one_packed_gemm(lead):
    x, w = RNG.standard_normal((*lead, 10, 4)).astype(np.float32), RNG.standard_normal((4, 3)).astype(np.float32)
    b, dy = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal((*lead, 10, 3)).astype(np.float32)
    inputs = {"x": x, "w": w, "b": b, "dy": dy}
    graph = op.grad(_through_grad, argnums=(1, 2)).trace(**inputs)
    packed = _check_packed(None, inputs, graph=graph)
    dw, db = evaluate(packed, inputs)
    np.testing.assert_allclose(dw, x.reshape(-1, 4).T @ dy.reshape(-1, 3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, dy.reshape(-1, 3).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x, dy: x.T @ dy,                                   # no bias gradient beside the product
    lambda x, dy: op.sum(dy, axis=0) * 2.0,                   # no product reading dy
    lambda x, dy: (x.T @ dy, op.sum(dy, axis=1)),             # a sum over columns is no bias gradient
    lambda x, dy: (dy.T @ x, op.sum(dy, axis=0)),             # dy is the left operand
], ids=["product-only", "sum-only", "other-axis", "left-operand"])
def test_nothing_is_packed_without_both_halves(fn):
    inputs = {"x": RNG.standard_normal((8, 8)).astype(np.float32), "dy": RNG.standard_normal((8, 8)).astype(np.float32)}
    result = rewrite(op.kernel(fn).trace(**inputs), BUILTIN_RULESETS)
    assert not any(n.op == "matmul_bias_grad" for ns in result.view.classes.values() for n in ns)
    assert not any(n for n, count in result.report.matches.items() if n.startswith("gradient/") and count)


def test_the_micro_batch_rules_are_sound_on_more_instances():
    # the soundness test draws a few instances per rule; the micro-batch shapes get more here
    for rule in (r for r in GRADIENT.rules if r.name.startswith("micro-batch")):
        for seed in range(3):
            outcome = check_rule(rule, GRADIENT, np.random.default_rng(100 + seed))
            assert outcome.ok, f"{rule.name}: {outcome.detail}"


def test_every_rule_comment_and_example():
    assert GRADIENT.name == "gradient" and GRADIENT in BUILTIN_RULESETS
    for rule in GRADIENT.rules:
        assert rule.algebra and rule.example is not None, rule.name
