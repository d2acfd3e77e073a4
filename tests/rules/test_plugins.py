"""Rule plugins: discovery, the example package, broken and hostile packs, and `rules --check`."""

import json
from importlib import metadata

import numpy as np
import pytest
from pydantic import ValidationError

from tessera_rw import TesseraError, op
from tessera_rw.cli import main
from tessera_rw.rules import plugins
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.plugins import PluginError, PluginWarning, RulePack, discover
from tessera_rw.plugin import Rule, Ruleset, TermBuilder
from tessera_rw.rules.registry import rulesets
from tessera_rw.rules.saturate import rewrite
from tessera_rw.rules.soundness import check_rule


def fake(*targets: str):
    eps = [metadata.EntryPoint(name=t.split(":")[1], value=t, group=plugins.ENTRY_POINT_GROUP) for t in targets]
    return lambda: eps


FIXTURES = "tests.rules.plugin_fixtures"


def test_example_plugin_is_installed_and_fuses():
    found = {rs.name: rs for rs in rulesets()}
    assert found["rmsnorm_matmul"].origin == "tessera-rw-rmsnorm-matmul"
    fn = lambda x, g, w: op.rmsnorm(x, g) @ w  # noqa: E731
    graph = op.kernel(fn).trace(op.tensor((2, 8, 16), "float32"), op.tensor((16,), "float32"),
                                op.tensor((16, 32), "float32"))
    result = rewrite(graph, rulesets())
    assert "rmsnorm_matmul" in result.view.ops_in(result.output_classes()[0])


def test_explain_says_when_a_fused_op_has_no_template(monkeypatch):
    from tessera_rw.codegen.templates import registry
    from tessera_rw.report import unbuildable_lines
    monkeypatch.setattr(registry, "plugin_templates", lambda builtin: ())   # the rules without the kernel
    k = op.kernel(lambda x, g, w: op.rmsnorm(x, g) @ w)
    report = k.explain(op.tensor((64, 32), "bf16"), op.tensor((32,), "bf16"), op.tensor((32, 16), "bf16"))
    assert any(line.startswith("rmsnorm_matmul: the rewrites reached it, but no kernel template")
               for line in unbuildable_lines(report.program))
    assert "rmsnorm_matmul" in str(report)


# every rule of every installed pack (the example package's among them)
PLUGIN_RULES = [(rs, r) for rs in rulesets() if rs not in BUILTIN_RULESETS for r in rs.rules]


def test_the_example_package_is_among_the_plugin_rules():
    assert "rmsnorm_matmul" in {rs.name for rs, _ in PLUGIN_RULES}


@pytest.mark.parametrize("ruleset, rule", PLUGIN_RULES, ids=[f"{rs.name}/{r.name}" for rs, r in PLUGIN_RULES])
def test_plugin_rules_are_sound(ruleset, rule):
    for seed in range(3):
        result = check_rule(rule, ruleset, np.random.default_rng(seed))
        assert result.ok, result.detail


def test_broken_plugins_warn_with_their_name_and_the_rest_works():
    with pytest.warns(PluginWarning, match="this plugin is broken on purpose"):
        loaded = discover(entry_points=fake(f"{FIXTURES}:broken_pack", f"{FIXTURES}:wrong_pack"))
    assert [lp.pack.name for lp in loaded] == ["wrong-example"]
    with pytest.warns(PluginWarning, match="int, not a tessera_rw RulePack"):
        discover(entry_points=fake(f"{FIXTURES}:not_a_pack"))
    with pytest.warns(PluginWarning, match="supports tessera_rw >=9"):
        assert discover(entry_points=fake(f"{FIXTURES}:future_pack")) == ()


def test_a_pack_pydantic_refuses_says_which_field_in_a_line_at_the_users_line():
    with pytest.warns(PluginWarning) as warned:
        assert discover(entry_points=fake(f"{FIXTURES}:unversioned_pack")) == ()
    (w,) = warned
    assert "(unversioned_pack) was skipped: RulePack: version: Field required" in str(w.message)
    assert "pydantic.dev" not in str(w.message) and w.filename == __file__


def test_a_pack_whose_rules_egglog_refuses_is_skipped_and_kernels_still_compile(monkeypatch):
    from tessera_rw.rules import plugin_vetting
    monkeypatch.setattr(plugin_vetting, "_VETTED", {})        # vetted anew in this process: it warns here
    with pytest.warns(PluginWarning, match=r"\(unparsable\) was skipped: egglog refuses its rule 'unknown-guard' "
                                          r"\(ruleset unparsable\): .*Unbound function nonsense"), \
            pytest.warns(PluginWarning, match="exp-is-linear"):      # the other pack's unsound rule is left out
        found = rulesets(entry_points=fake(f"{FIXTURES}:unparsable_pack", f"{FIXTURES}:wrong_pack"))
    assert "unparsable" not in {rs.name for rs in found} and "wrong_algebra" in {rs.name for rs in found}
    graph = op.kernel(lambda x: op.exp(x) * 2).trace(op.tensor((4,), "float32"))
    assert rewrite(graph, found).report.stop_reason
    with pytest.raises(PluginError, match=r"\(unparsable\) failed to load \(TESSERA_STRICT_PLUGINS is set\): egglog "
                                          r"refuses its rule 'unknown-guard' .*nonsense") as e:
        rulesets(strict=True, entry_points=fake(f"{FIXTURES}:unparsable_pack"))
    assert "skipped" not in str(e.value)


def test_an_unsound_plugin_rule_is_left_out_before_it_rewrites_anything(tmp_path, monkeypatch):
    from tessera_rw.rules import plugin_vetting
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_vetting, "_VETTED", {})
    monkeypatch.setattr(plugin_vetting, "_IN_MEMORY", {})
    with pytest.warns(PluginWarning, match=r"rule 'exp-is-linear' of plugin 'tests.rules.plugin_fixtures' "
                                           r"\(wrong-example\) was skipped: its example shows it unsound"):
        found = rulesets(entry_points=fake(f"{FIXTURES}:wrong_pack"))
    wrong = next(rs for rs in found if rs.name == "wrong_algebra")
    assert wrong.rules == ()
    graph = op.kernel(lambda x: op.exp(x)).trace(op.tensor((4,), "float32"))
    result = rewrite(graph, found)
    assert "add" not in result.view.ops_in(result.output_classes()[0])      # exp(x) never became 1 + x
    (detail,) = json.loads((tmp_path / "plugins" / "rule_checks.json").read_text()).values()
    assert "changes the result" in detail                 # kept on disk: checked once per machine
    monkeypatch.setattr(plugin_vetting, "_VETTED", {})
    monkeypatch.setattr(plugin_vetting, "check_rule", lambda *a: pytest.fail("a verdict on disk is not checked again"))
    with pytest.raises(PluginError, match="exp-is-linear"):
        rulesets(strict=True, entry_points=fake(f"{FIXTURES}:wrong_pack"))


def test_verdicts_of_processes_checking_at_once_are_merged_not_overwritten(tmp_path, monkeypatch):
    from tessera_rw.rules import plugin_vetting
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_vetting, "_IN_MEMORY", {})
    first, second = plugin_vetting._Verdicts.load(), plugin_vetting._Verdicts.load()   # both read an empty file
    first.put("rule-a", "")
    monkeypatch.setattr(plugin_vetting, "_IN_MEMORY", {})        # the second is another process
    second.put("rule-b", "changes the result")
    on_disk = json.loads((tmp_path / "plugins" / "rule_checks.json").read_text())
    assert on_disk == {"rule-a": "", "rule-b": "changes the result"}


def test_a_skipped_pack_takes_its_ops_back_and_later_kernels_compile():
    from tessera_rw.algebra.ops import OPS
    from tessera_rw.pipeline import compile_program
    with pytest.warns(PluginWarning, match=r"\(refused-op\) was skipped"):
        rulesets(entry_points=fake(f"{FIXTURES}:refused_with_op_pack"))
    assert "refused_fused" not in OPS
    graph = op.kernel(lambda x: op.exp(x) * 2).trace(op.tensor((4,), "float32"))
    assert compile_program(graph).candidates


def test_packs_are_checked_together_the_later_of_two_clashing_ones_is_skipped():
    with pytest.warns(PluginWarning, match=r"\(helper-b\) was skipped: egglog refuses its rules beside those of "
                                           r"'tests.rules.plugin_fixtures'"):
        found = rulesets(entry_points=fake(f"{FIXTURES}:helper_pack_a", f"{FIXTURES}:helper_pack_b"))
    names = {rs.name for rs in found}
    assert "helper_a" in names and "helper_b" not in names
    graph = op.kernel(lambda x: op.exp(x) * 2).trace(op.tensor((4,), "float32"))
    assert rewrite(graph, found).report.stop_reason


def test_a_factory_runs_once_so_its_ops_are_not_declared_twice():
    from tests.rules import plugin_fixtures
    first = rulesets(entry_points=fake(f"{FIXTURES}:factory_pack"))
    again = rulesets(entry_points=fake(f"{FIXTURES}:factory_pack"))
    assert [rs.name for rs in first] == [rs.name for rs in again] and "factory_rules" in {rs.name for rs in again}
    assert len(plugin_fixtures.FACTORY_CALLS) == 1


@pytest.mark.parametrize("pack, clash", [("reserved_name_pack", "ruleset 'insert'"),
                                         ("case_clash_pack", "op 'Matmul' is provided by both 'tessera_rw' "
                                                             "(as 'matmul'")])
def test_names_the_driver_or_egglog_already_use_are_refused(pack, clash):
    with pytest.raises(PluginError, match=clash.replace("(", r"\(")):
        rulesets(strict=True, entry_points=fake(f"{FIXTURES}:{pack}"))
    with pytest.warns(PluginWarning, match=clash.replace("(", r"\(")):      # skipped, the rest works
        found = rulesets(entry_points=fake(f"{FIXTURES}:{pack}"))
    assert [rs.name for rs in found] == ["algebra", "attention", "spectral", "epilogue", "gradient"]   # it alone left


def test_strict_mode_raises():
    with pytest.raises(PluginError, match="broken on purpose"):
        discover(strict=True, entry_points=fake(f"{FIXTURES}:broken_pack"))


def test_discovery_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_PLUGINS", "1")
    assert discover() == ()
    assert "rmsnorm_matmul" not in {rs.name for rs in rulesets()}


def test_duplicate_ruleset_names_name_both_providers():
    with pytest.raises(PluginError) as info:
        rulesets(strict=True, entry_points=fake(f"{FIXTURES}:duplicate_pack"))
    assert "'algebra'" in str(info.value) and "tessera_rw" in str(info.value) and FIXTURES in str(info.value)
    with pytest.warns(PluginWarning, match="ruleset 'algebra' is provided by both 'tessera_rw'"):
        found = rulesets(entry_points=fake(f"{FIXTURES}:duplicate_pack"))
    assert sum(rs.name == "algebra" for rs in found) == 1


def test_pack_metadata_is_validated():
    with pytest.raises(ValidationError):
        RulePack(name="9bad", version="1.0", rulesets=())
    with pytest.raises(ValidationError):
        RulePack(name="ok", version="not a version", rulesets=())
    with pytest.raises(ValidationError):
        RulePack(name="ok", version="1.0", tessera_rw="whenever", rulesets=())


def test_rules_check_catches_a_wrong_plugin_rule(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "installed_entry_points",
                        lambda group: fake(f"{FIXTURES}:wrong_pack")() if group == plugins.ENTRY_POINT_GROUP else [])
    assert main(["rules", "--check", "wrong-example", "--seeds", "2"]) == 1
    out = capsys.readouterr().out
    assert "exp-is-linear" in out and "UNSOUND" in out and "changes the result" in out and "x: f32[3,4]" in out


def test_rules_check_warns_once_of_a_broken_plugin(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "installed_entry_points",
                        lambda group: fake("no_such_module_here:pack")() if group == plugins.ENTRY_POINT_GROUP else [])
    assert main(["rules", "--check", "spectral", "--seeds", "1"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tessera-rewrite: warning:")]
    assert len(warned) == 1 and "no_such_module_here" in warned[0]


def test_rules_check_passes_on_a_builtin_ruleset(capsys):
    # every built-in rule's soundness is test_rule_soundness.py's; this is the command's path
    assert main(["rules", "--check", "spectral", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "UNSOUND" not in out and "spectral" in out


def test_rules_listing_and_unknown_pack(capsys):
    assert main(["rules"]) == 0
    assert "rmsnorm_matmul" in capsys.readouterr().out
    assert main(["rules", "--check", "no-such-pack"]) == 2
    err = capsys.readouterr().err
    assert "no loaded rule pack or ruleset named no-such-pack" in err and "rmsnorm_matmul" in err
    assert main(["rules", "rmsnorm-matmul"]) == 0               # a named pack: its rules and their algebra
    assert "rmsnorm(x, g) W = rmsnorm_matmul(x, g, W)" in capsys.readouterr().out


def test_a_pack_is_selected_by_its_own_name_and_a_distribution_by_its_own():
    from tessera_rw.cli.rules import _select
    from tessera_rw.rules.plugins import LoadedPack
    packs = [LoadedPack(RulePack(name=n, version="1.0", rulesets=(Ruleset(f"{n}_rules", ()),)), "two-packs")
             for n in ("alpha", "beta")]
    assert [rs.name for rs in _select(["alpha"], packs)] == ["alpha_rules"]
    assert [rs.name for rs in _select(["two-packs"], packs)] == ["alpha_rules", "beta_rules"]
    assert [rs.name for rs in _select(["beta_rules", "tessera_rw"], packs)][-1] == "beta_rules"


def test_rules_ops_lists_what_patterns_can_name(capsys):
    assert main(["rules", "--ops", "--format", "json"]) == 0
    ops = {row["op"]: row for row in json.loads(capsys.readouterr().out)}
    assert ops["mul"]["operands"] == ["a", "b"] and ops["mul"]["egglog"] == "Mul"
    assert ops["softmax"]["attributes"] == ["axis"] and ops["rmsnorm_matmul"]["from"] == "plugin"
    assert ops["concatenate"]["operands"] == ["xs", "..."]


def test_a_plugin_op_is_declared_on_its_first_lookup_by_name():
    from tessera_rw.algebra.ops import OPS, opdef, unregister
    rulesets()                                           # whatever ran before, the plugin's op is declared
    declared = OPS["rmsnorm_matmul"]
    unregister(declared)                                 # as in a process that compiled nothing yet
    assert opdef("rmsnorm_matmul").name == "rmsnorm_matmul"
    with pytest.raises(TesseraError, match="unknown op 'rmsnorm_matmull'; did you mean 'rmsnorm_matmul'"):
        opdef("rmsnorm_matmull")


def test_a_rule_without_an_example_is_left_out_as_it_cannot_be_checked(tmp_path, monkeypatch):
    from tessera_rw.rules import plugin_vetting
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_vetting, "_VETTED", {})
    with pytest.warns(PluginWarning, match=r"rule 'tanh-is-tanh' .* was skipped: it cannot be checked, so it is not "
                                           r"trusted: the rule has no example to check it on"):
        found = rulesets(entry_points=fake(f"{FIXTURES}:untested_pack"))
    assert next(rs for rs in found if rs.name == "untested").rules == ()
    monkeypatch.setattr(plugin_vetting, "_VETTED", {})
    with pytest.raises(PluginError, match="tanh-is-tanh"):
        rulesets(strict=True, entry_points=fake(f"{FIXTURES}:untested_pack"))


@pytest.mark.parametrize("pack, says, code", [("right_vjp_pack", "ok", 0), ("wrong_vjp_pack", "UNSOUND", 1)])
def test_rules_check_checks_a_plugin_ops_vjp_against_finite_differences(monkeypatch, capsys, pack, says, code):
    monkeypatch.setattr(plugins, "installed_entry_points",
                        lambda group: fake(f"{FIXTURES}:{pack}")() if group == plugins.ENTRY_POINT_GROUP else [])
    name = pack.replace("_pack", "").replace("_vjp", "")
    assert main(["rules", "--check", f"double-tanh-{name}", "--seeds", "1"]) == code
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "VJP of double_tanh" in line)
    assert says in row
    if code:
        assert "disagrees with float64 finite differences" in out and "f64[3,4]" in out


def test_a_pack_with_an_op_lacking_its_reference_or_a_rule_with_a_bad_example_is_refused():
    from tessera_rw.plugin import OpDef, OpKind
    no_reference = OpDef("silu_times", ("a",), OpKind.ELEMENTWISE, infer=lambda a: a, reference=None)
    with pytest.raises(ValidationError, match="op 'silu_times' needs reference"):
        RulePack(name="refless", version="1.0", rulesets=(), ops=(no_reference,))
    t = TermBuilder()
    a, s, d = t.vars("a s d")
    bad = Rule("exp-of", "exp a = exp a", lhs=t.exp(a, of=(s, d)), rhs=t.exp(a, of=(s, d)), example=42)
    with pytest.raises(ValidationError, match="rule 'exp-of': example must be a function"):
        RulePack(name="badexample", version="1.0", rulesets=(Ruleset("bad_examples", (bad,)),))
