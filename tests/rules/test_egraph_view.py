"""The e-graph view read from egglog's frozen rows is the one its JSON serialization describes: the
same classes, e-nodes, ids and order, with the same names (extraction breaks ties by order and
class name, so any difference could change the program it picks)."""

import json
import math

import pytest

from tessera_rw import op
from tessera_rw.rules import saturate
from tessera_rw.rules.egraph import EGraphView, ENode, _Constructors
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite
from tessera_rw.rules.schema import attr_names, codec


def _decoder_layer(x, g, beta, wqkv, wo, w1, b1):
    """attention (a causal -inf mask), epilogue (bias, GELU, residual into GEMMs), algebra (the
    1/sqrt scale), layernorm and views."""
    h = op.layernorm(x, g, beta)
    qkv = (h @ wqkv).reshape(2, 16, 3, 2, 8)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    scores = op.where(op.tril(op.ones((16, 16), "bool")), q @ k.mT / math.sqrt(8), -math.inf)
    a = x + (op.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(2, 16, 16) @ wo
    return a + op.gelu(a @ w1 + b1, approximate="tanh") @ w1.mT * 0.5


def _linear_loss(x, w, b, dy):
    """gradient: op.grad's weight and bias gradients, which pack into one GEMM."""
    return op.sum((x @ w + b) * dy)


PROGRAMS = {
    "decoder layer": lambda: op.kernel(_decoder_layer).trace(
        op.tensor((2, 16, 16), "bf16"), op.tensor((16,), "bf16"), op.tensor((16,), "bf16"),
        op.tensor((16, 48), "bf16"), op.tensor((16, 16), "bf16"), op.tensor((16, 64), "bf16"),
        op.tensor((64,), "bf16")),
    "linear backward": lambda: op.grad(_linear_loss, argnums=(1, 2)).trace(
        op.tensor((64, 32), "float32"), op.tensor((32, 16), "float32"), op.tensor((16,), "float32"),
        op.tensor((64, 16), "float32")),
}


def _primitive(nodes: dict, node_id: str):
    """A primitive as egglog's JSON writes it: a vector, a quoted string, true / false, a number."""
    node = nodes[node_id]
    text = node["op"]
    if text == "vec-of":
        return tuple(_primitive(nodes, c) for c in node["children"])
    if text in ("vec-empty", "[]"):
        return ()
    if text.startswith('"'):
        return json.loads(text)
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return float(text)


def _serialized_view(egraph) -> tuple[dict[int, str], dict[str, list[ENode]]]:
    """(ids, classes) as egglog's serialize() -> JSON describes the e-graph: the way views were read
    before the frozen rows, kept here as the reference."""
    nodes = json.loads(egraph.serialize([], max_functions=None, max_calls_per_function=None,
                                        include_temporary_functions=False).to_json())["nodes"]
    by_constructor = _Constructors()
    ids, classes = {}, {}
    for nid, node in nodes.items():
        if node["op"] == "Id":
            ids[_primitive(nodes, node["children"][0])] = node["eclass"]
            continue
        found = by_constructor.get(node["op"])
        if found is None or not nid.startswith("function-"):
            continue
        op_name, arity = found
        children = node["children"]
        attrs = tuple((n, codec(op_name, n).decode(_primitive(nodes, c)))
                      for n, c in zip(attr_names(op_name), children[arity:]))
        classes.setdefault(node["eclass"], []).append(
            ENode(nid, op_name, node["eclass"], tuple(nodes[c]["eclass"] for c in children[:arity]), attrs,
                  _primitive(nodes, children[-2]), _primitive(nodes, children[-1])))
    return ids, classes


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_view_is_the_one_egglog_serializes(name, monkeypatch):
    both = []

    def read_both_ways(egraph, literals):
        view = EGraphView(egraph, literals)
        both.append((view, _serialized_view(egraph)))
        return view

    monkeypatch.setattr(saturate, "EGraphView", read_both_ways)
    result = rewrite(PROGRAMS[name](), BUILTIN_RULESETS)
    ((view, (ids, classes)),) = both
    assert len({ruleset for _, ruleset, _ in result.report.fired()}) >= 2     # rules of several kinds matched
    assert view.ids == ids
    assert list(view.classes) == list(classes)
    assert view.classes == classes                       # e-nodes in order, names and all
    assert repr(view.classes) == repr(classes)           # attribute values of the same types (1.0, not 1)
