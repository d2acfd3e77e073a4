"""Plugin rules are used only once their own examples show them sound, a verdict holds for
exactly the code it was reached on, and plugin ops are checked where they are declared and run."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.plugin import OpDef, OpKind, Rule, RulePack, Ruleset, TermBuilder
from tessera_rw.rules import plugin_vetting
from tessera_rw.rules.plugins import LoadedPack, PluginError, PluginWarning
from tessera_rw.rules.registry import rulesets
from tessera_rw.rules.saturate import rewrite
from tests.rules.test_plugins import FIXTURES, fake


@pytest.fixture
def fresh_vetting(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_vetting, "_VETTED", {})
    monkeypatch.setattr(plugin_vetting, "_IN_MEMORY", {})


def test_a_rule_whose_example_fails_or_does_not_match_is_left_out(fresh_vetting):
    with pytest.warns(PluginWarning) as warned:
        found = rulesets(entry_points=fake(f"{FIXTURES}:unverifiable_pack"))
    assert next(rs for rs in found if rs.name == "unverifiable").rules == ()
    said = " ".join(str(w.message) for w in warned)
    assert "'tanh-is-silu'" in said and "its example failed: AttributeError" in said
    assert "'sigmoid-is-gelu'" in said and "does not match its own example" in said
    graph = op.kernel(lambda x: x * op.tanh(x)).trace(op.tensor((4,), "float32"))
    result = rewrite(graph, found)
    assert "silu" not in result.view.ops_in(result.output_classes()[0])      # x·tanh(x) never became silu(x)
    plugin_vetting._VETTED.clear()
    with pytest.raises(PluginError, match="tanh-is-silu"):
        rulesets(strict=True, entry_points=fake(f"{FIXTURES}:unverifiable_pack"))


def _pack_with_example(example) -> LoadedPack:
    t = TermBuilder()
    x, s, d = t.vars("x s d")
    rule = Rule("r", "x σ(x) = silu(x)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)), rhs=t.silu(x, of=(s, d)),
                example=example)
    return LoadedPack(RulePack(name="p", version="1.0", rulesets=(Ruleset("rs", (rule,)),)), "dist")


def test_examples_that_differ_only_in_a_name_they_read_are_different_versions():
    def version(lp):
        rs = lp.pack.rulesets[0]
        return plugin_vetting.rule_version(rs.rules[0], rs, lp)
    tanh = _pack_with_example(lambda rng: ((lambda x: x * op.tanh(x)), {"x": rng.standard_normal(3)}))
    sigmoid = _pack_with_example(lambda rng: ((lambda x: x * op.sigmoid(x)), {"x": rng.standard_normal(3)}))
    assert version(tanh) != version(sigmoid)


def test_editing_a_plugin_module_makes_its_rules_a_new_version(tmp_path, monkeypatch):
    """An op's reference lives in the plugin's modules: a verdict reached before an edit to it no
    longer holds after."""
    package = tmp_path / "edited_plugin"
    package.mkdir()
    source = ("import numpy as np\nfrom tessera_rw.plugin import TensorType\n"
              "def infer(x):\n    return TensorType(x.shape, x.dtype)\n"
              "def reference(x):\n    return x / (1 + np.exp(-x)){}\n")
    (package / "__init__.py").write_text(source.format(""))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_plugin")
    try:
        swish = OpDef("edited_swish", ("x",), OpKind.ELEMENTWISE, module.infer, module.reference)
        lp = LoadedPack(RulePack(name="p", version="1.0", rulesets=(Ruleset("rs", ()),), ops=(swish,)), "dist")
        before = plugin_vetting.pack_source(lp)
        (package / "__init__.py").write_text(source.format(" * 0"))
        plugin_vetting._module_source.cache_clear()
        assert plugin_vetting.pack_source(lp) != before
    finally:
        sys.modules.pop("edited_plugin", None)
        plugin_vetting._module_source.cache_clear()


def test_a_plugin_reference_returning_another_shape_than_its_shape_rule_is_an_error():
    from tessera_rw.algebra.errors import ResultError
    from tessera_rw.algebra.evaluate import evaluate
    from tessera_rw.algebra.ops import register, unregister
    from tessera_rw.plugin import TensorType
    rowwise = OpDef("first_row_only", ("x",), OpKind.ELEMENTWISE, lambda x: TensorType(x.shape, x.dtype),
                    lambda x: x[:1])               # (1, n) where the shape rule says (m, n)
    register(rowwise)
    try:
        graph = op.kernel(lambda x: op.apply("first_row_only", (x,))).trace(op.tensor((4, 8), "float32"))
        x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
        with pytest.raises(ResultError, match=r"first_row_only: its reference returned an array of shape \(1, 8\), "
                                              r"but its shape rule gives f32\[4,8\]"):
            evaluate(graph, {graph.inputs[0].attr("name"): x})
    finally:
        unregister(rowwise)


@pytest.mark.parametrize("name", ["my op!", "2x", "", None])
def test_an_op_name_that_is_not_an_identifier_is_refused_where_it_is_declared(name):
    from tessera_rw.algebra.errors import ArgumentError
    with pytest.raises(ArgumentError, match="is not a Python identifier"):
        OpDef(name, ("x",), OpKind.ELEMENTWISE, lambda x: x, lambda x: x)
