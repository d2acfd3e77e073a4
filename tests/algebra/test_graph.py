"""The graph IR: interning, immutability, topological order, verifier."""

import pickle

import numpy as np
import pytest

from tessera_rw import DType, VerifyError, op
from tessera_rw.algebra.builder import make, make_constant, make_input
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node, TensorType

F32 = DType.float32


def test_interning_makes_structural_equality_identity():
    x = make_input("x", (3,), F32)
    assert make("exp", x) is make("exp", make_input("x", (3,), F32))
    assert make("add", x, make_constant(1.0, F32)) is make("add", x, make_constant(1.0, F32))


def test_constants_of_different_value_kinds_stay_apart():
    assert make_constant(0.0, F32) is not make_constant(-0.0, F32)
    assert make_constant(1, DType.int32) is not make_constant(1.0, F32)
    nan = make_constant(float("nan"), F32)
    assert make_constant(float("nan"), F32) is nan


def test_nodes_are_immutable_and_replace_returns_a_new_node():
    x = make_input("x", (3,), F32)
    e = make("exp", x)
    with pytest.raises(AttributeError):
        e.op = "log"
    lg = e.replace(op="log")
    assert lg.op == "log" and lg.args == (x,) and e.op == "exp"


def test_nodes_survive_pickling_as_the_same_interned_node():
    x = make_input("x", (3,), F32)
    e = make("exp", x)
    assert pickle.loads(pickle.dumps(e)) is e


def test_topological_order_is_deep_safe():
    x = make_input("x", (4,), F32)
    y = x
    for _ in range(5000):  # deeper than Python's recursion limit
        y = make("add", y, x)
    g = Graph("deep", (x,), (y,))
    assert len(g.nodes) == 5001 and g.nodes[0] is x and g.nodes[-1] is y
    assert g.users[x][0].op == "add"


def test_verifier_accepts_traced_graphs_and_rejects_bad_ones():
    x = make_input("x", (2, 3), F32)
    good = Graph("g", (x,), (make("sum", x, axes=(1,), keepdims=False),))
    assert good.verify() is good
    mistyped = Node("exp", (x,), (), TensorType((3, 2), F32))
    with pytest.raises(VerifyError, match="typed"):
        Graph("bad", (x,), (mistyped,)).verify()
    stray = make_input("y", (2, 3), F32)
    with pytest.raises(VerifyError, match="not among its inputs"):
        Graph("bad", (x,), (make("add", x, stray),)).verify()
    bad_rule = Node("matmul", (x, x), (("accum_dtype", None),), TensorType((2, 3), F32))
    with pytest.raises(VerifyError, match="shape rule"):
        Graph("bad", (x,), (bad_rule,)).verify()


def test_traced_examples_verify():
    @op.kernel
    def block(x, w, g):
        h = op.layernorm(x, g) @ w
        return op.gelu(h, approximate="tanh").sum(axis=-1)

    graph = block.trace(op.tensor((2, 8, 16), "bf16"), op.tensor((16, 32), "bf16"), op.tensor((16,), "bf16"))
    graph.verify()
    out = block(np.ones((2, 8, 16), np.float32), np.ones((16, 32), np.float32), np.ones(16, np.float32))
    assert out.shape == (2, 8)
