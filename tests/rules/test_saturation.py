"""The saturation driver: limits, back-off, per-iteration statistics, round trips."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.rules.choice import smallest_choice
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.saturate import Limits, StopReason, rewrite

t = TermBuilder()
a, b, c, s, d = t.vars("a b c s d")
# Associativity and commutativity of + on a long chain: the classic e-graph explosion.
AC = Ruleset("ac", (
    Rule("add-commutes", "a + b = b + a", lhs=t.add(a, b, of=(s, d)), rhs=t.add(b, a, of=(s, d))),
    Rule("add-associates", "(a + b) + c = a + (b + c)",
         lhs=t.add(t.add(a, b, of=(s, d)), c, of=(s, d)),
         rhs=t.add(a, t.add(b, c, of=(s, d)), of=(s, d)), when=("(= (shp b) s)", "(= (shp c) s)")),
), explosive=True)


def chain(n: int) -> Graph:
    def f(x):
        total = x
        for i in range(1, n):
            total = total + x * float(i)
        return total
    return op.kernel(f).trace(op.tensor((4,), "float32"))


def test_round_trip_without_rules_is_the_same_graph():
    fn = lambda q, k, v: op.softmax(q @ k.mT / 8.0, axis=-1) @ v  # noqa: E731
    g = op.kernel(fn).trace(*(op.tensor((2, 4, 16, 8), "bf16") for _ in range(3)))
    result = rewrite(g, ())
    assert result.report.stop_reason is StopReason.saturated
    view = result.view
    decoded = view.decode(smallest_choice(view), result.output_classes()[0])
    assert decoded is g.outputs[0]  # interning: the very same node comes back


def test_pathological_input_stops_at_the_node_limit_with_a_report():
    start = time.perf_counter()
    result = rewrite(chain(14), [AC], Limits(iterations=50, enodes=3_000, seconds=30, backoff_matches=10**9))
    assert time.perf_counter() - start < 30
    report = result.report
    assert report.stop_reason is StopReason.node_limit
    assert report.iterations[-1].enodes > 3_000
    assert [it.enodes for it in report.iterations] == sorted(it.enodes for it in report.iterations)
    assert report.matches["ac/add-commutes"] > 0


def test_iteration_and_time_limits():
    assert rewrite(chain(10), [AC], Limits(iterations=2)).report.stop_reason is StopReason.iteration_limit
    assert rewrite(chain(10), [AC], Limits(seconds=0.0)).report.stop_reason is StopReason.time_limit


def test_explosive_rulesets_are_backed_off():
    report = rewrite(chain(10), [AC], Limits(iterations=12, enodes=200_000, backoff_matches=50)).report
    banned = [it.banned for it in report.iterations if it.banned]
    assert banned and all(b == ("ac",) for b in banned)


def test_rewritten_terms_still_compute_the_same():
    g = chain(6)
    result = rewrite(g, [AC], Limits(iterations=3))
    view = result.view
    x = {"x": np.random.default_rng(0).standard_normal(4).astype(np.float32)}
    got = evaluate(Graph("c", g.inputs, (view.decode(smallest_choice(view), result.output_classes()[0]),)), x)
    np.testing.assert_allclose(got[0], evaluate(g, x)[0], rtol=1e-5)


def test_report_lists_fired_rules_per_ruleset():
    fn = lambda q, k, v: op.softmax(q @ k.mT / 4.0, axis=-1) @ v  # noqa: E731
    report = rewrite(op.kernel(fn).trace(*(op.tensor((3, 8, 16), "float32") for _ in range(3))),
                     BUILTIN_RULESETS).report
    fired = {(rule, ruleset) for rule, ruleset, n in report.fired()}
    assert ("flash-attention-unmasked", "attention") in fired and ("div-by-constant", "algebra") in fired
    assert report.stop_reason is StopReason.saturated and report.seconds > 0


@pytest.mark.parametrize("layers", [1, 2])
def test_transformer_layers_fuse_every_attention(layers):
    from bench import models
    cfg = models.TransformerShape(layers=layers, hidden=64, heads=4, ffn=128, batch=2, seq=16, dtype="float32")
    g = models.bert_encoder(cfg).trace(**models.placeholders(cfg, with_mask=True))
    result = rewrite(g, BUILTIN_RULESETS)
    assert result.report.matches["attention/flash-attention"] == layers


def test_matrix_chains_reach_every_parenthesization():
    from tessera_rw.rules.library import ALGEBRA
    shapes = [(3, 5), (5, 2), (2, 7), (7, 4), (4, 6), (6, 3)]
    names = "abcdef"
    fn = lambda a, b, c, d, e, f: ((((a @ b) @ c) @ d) @ e) @ f  # noqa: E731
    graph = op.kernel(fn).trace(**{n: op.tensor(s, "float32") for n, s in zip(names, shapes)})
    result = rewrite(graph, [ALGEBRA], Limits(iterations=30, enodes=20_000))
    assert result.report.stop_reason is StopReason.saturated
    view = result.view
    root = result.output_classes()[0]
    input_class = {dict(n.attrs)["name"]: cid for cid, ns in view.classes.items() for n in ns if n.op == "input"}
    memo: dict[str, int] = {}

    def count(cid):  # number of distinct parenthesizations an e-class holds
        if cid not in memo:
            memo[cid] = sum(count(n.operands[0]) * count(n.operands[1]) if n.op == "matmul" else 1
                            for n in view.classes[cid])
        return memo[cid]
    assert count(root) == 42  # Catalan(5): every way to multiply six matrices
    assert any(n.operands[0] == input_class["a"] for n in view.classes[root])


def test_chains_with_a_vector_keep_their_vector_products():
    # a 1-d operand has no batch dims to line up: reassociating it would mistype the inner product
    rng = np.random.default_rng(3)
    cases = [(lambda a, b, c: (a @ b) @ c, [(4, 2), (2, 3), (3,)]),
             (lambda a, b, c: a @ (b @ c), [(4, 3), (3, 3), (3,)]),
             (lambda a, b, c: (a @ b) @ c, [(1, 3), (3,), (1, 2)])]
    for fn, shapes in cases:
        args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        np.testing.assert_allclose(op.kernel(fn)(*args), fn(*args), rtol=1e-5)


def test_head_split_and_merge_round_trip_is_the_input():
    from tessera_rw.rules.library import ALGEBRA

    def heads(x):  # (B, S, D) -> (B, H, S, Dh) -> back to (B, S, D)
        b, s, d = x.shape
        h = op.transpose(op.reshape(x, (b, s, 4, d // 4)), (0, 2, 1, 3))
        return op.reshape(op.transpose(h, (0, 2, 1, 3)), (b, s, d)) + 1.0

    g = op.kernel(heads).trace(op.tensor((2, 8, 32), "float32"))
    result = rewrite(g, [ALGEBRA])
    view = result.view
    out = view.decode(smallest_choice(view), result.output_classes()[0])
    assert Graph("h", g.inputs, (out,)).op_counts() == {"add": 1}


def test_a_cycle_from_an_extra_rule_keeps_fused_expressions_bounded(monkeypatch):
    """log(exp(x)) = x puts x in its own e-class's operands: elementwise fusion must not nest the
    expression without end (it doubled each iteration until Python's recursion limit)."""
    import tessera_rw.pipeline as pipeline
    from tessera_rw.rules.library.fusion import MAX_FUSED_OPS

    t = TermBuilder()
    x, s, d = t.vars("x s d")
    cycle = Ruleset("cycle", (Rule("log-of-exp", "log(exp(x)) = x", lhs=t.log(t.exp(x, of=(s, d)), of=(s, d)), rhs=x),))
    builtin = pipeline.rulesets
    monkeypatch.setattr(pipeline, "rulesets", lambda: builtin() + (cycle,))
    f = op.kernel(lambda x: op.log(op.exp(x)) + 1.0)
    report = f.explain(op.tensor((4, 5), "f32"))
    assert report.egraph.stop_reason == "saturated"
    assert all(str(a).count("(") <= MAX_FUSED_OPS for k in report.program.plan.steps for a in k.node.attr_map.values())
    xs = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(f(xs), xs + 1.0, atol=1e-5)


def test_a_fused_node_in_its_own_operand_class_is_not_merged_into_itself():
    """x · 1 = x puts mul(x, 1) in x's class: its fused form must not take itself in, nesting
    'mul(mul(mul($0,$1),$2),$3)' of x and ones, each nesting another spelling of x."""
    from tessera_rw.pipeline import rulesets
    from tessera_rw.rules.library.fusion import FUSION_RULES

    assert any("(!= rewritten__ " in r.egglog("epilogue") for r in FUSION_RULES if r.apart)
    g = op.kernel(lambda x: op.tanh(x) * 1.0 * 3.0).trace(op.tensor((4, 5), "f32"))
    view = rewrite(g, rulesets()).view
    own = [e for cls, enodes in view.classes.items() for e in enodes
           if e.op == "fused_elementwise" and cls in e.operands]
    assert own and all(dict(e.attrs)["expr"].count("(") == 1 for e in own)


def test_an_op_registered_after_the_rulesets_were_prepared_is_declared_for_its_graph(monkeypatch):
    """Rewrites reuse an e-graph with the rulesets declared; an op registered since (a plugin's, when
    its rules were refused and the built-in rulesets' e-graph is reused) is declared with the graph."""
    import dataclasses

    from tessera_rw.algebra.builder import make, make_input
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.ops import OPS, register

    rewrite(chain(2), ())                                   # prepares the e-graph of no rulesets
    monkeypatch.setitem(OPS, "late_exp", None)               # removed again after the test
    register(dataclasses.replace(OPS["exp"], name="late_exp"))
    x = make_input("x", (4,), DType.float32)
    late = Graph("late", (x,), (make("late_exp", x),))
    result = rewrite(late, ())
    assert result.view.decode(smallest_choice(result.view), result.output_classes()[0]) is late.outputs[0]
    assert rewrite(chain(2), ()).report.stop_reason is StopReason.saturated   # the prepared e-graph still serves


def test_a_variadic_op_of_any_arity_reads_back_from_the_e_graph():
    # a concatenation of 40 tensors is the constructor Concatenate40: its class must be in the view
    # (before, arities above 32 were not read back and extraction fell back to the input graph)
    from tessera_rw.rules.egraph import _Constructors
    parts = 40
    graph = op.kernel(lambda x: op.concatenate([op.softmax(x * 2.0, axis=-1)] * parts, axis=0)).trace(
        op.tensor((8, 16), "float32"))
    result = rewrite(graph, BUILTIN_RULESETS)
    root = result.output_classes()[0]
    assert root in result.view.classes and "concatenate" in result.view.ops_in(root)
    assert _Constructors().get("Concatenate40") == ("concatenate", 40)
    assert _Constructors().get("Matmul") == ("matmul", 2) and _Constructors().get("NoSuchOp3") is None


def test_rulesets_checked_by_declaring_them_are_the_prepared_e_graph_of_their_rewrites(monkeypatch):
    """Declaring a plugin's rulesets to check them is the work a first rewrite would repeat: the
    clean declaration is kept, and the rewrite with those rulesets starts from it."""
    from tessera_rw.rules import saturate
    from tessera_rw.rules.saturate import setup_error
    rulesets = (AC,)
    monkeypatch.setattr(saturate, "_prepared", saturate._PreparedEGraphs())
    assert setup_error(rulesets) is None
    checked = saturate._prepared.by_rulesets[rulesets]

    def no_new_egraph():
        raise AssertionError("the rewrite declared its rulesets again")
    monkeypatch.setattr(saturate.bindings, "EGraph", no_new_egraph)
    assert rewrite(chain(3), rulesets).report.stop_reason is not None
    assert saturate._prepared.by_rulesets[rulesets] is checked
    bad = Ruleset("bad", (Rule("unknown-guard", "a = a", lhs=t.add(a, b, of=(s, d)), rhs=t.add(a, b, of=(s, d)),
                               when=("(= (no-such-function a) s)",)),))
    monkeypatch.undo()
    assert "no-such-function" in setup_error((bad,)) and (bad,) not in saturate._prepared.by_rulesets


def test_small_rulesets_take_turns_in_one_layered_e_graph_each_with_its_own_rules_alone(monkeypatch):
    """Rulesets of a few rules (a rule checked alone) are declared in a pushed layer over one e-graph
    of the declarations: a turn pops the last layer, so no rule of it fires in the next rewrite."""
    from tessera_rw.rules import saturate
    monkeypatch.setattr(saturate, "_prepared", saturate._PreparedEGraphs())
    made, real = [], saturate.bindings.EGraph
    monkeypatch.setattr(saturate.bindings, "EGraph", lambda: made.append(1) or real())
    commute, associate = Ruleset("commute", AC.rules[:1]), Ruleset("associate", AC.rules[1:])

    def classes(rulesets):
        return len(rewrite(chain(4), rulesets).view.classes)
    alone = classes(())                   # commuting a sum makes no new class; associating one does
    for _ in range(2):
        assert classes((associate,)) > alone and classes((commute,)) == alone
    assert len(made) == 1
    bad = Ruleset("bad", (Rule("unknown-guard", "a = a", lhs=t.add(a, b, of=(s, d)), rhs=t.add(a, b, of=(s, d)),
                               when=("(= (no-such-function a) s)",)),))
    with pytest.raises(Exception, match="no-such-function"):
        rewrite(chain(2), (bad,))
    assert classes((commute,)) == alone and classes((associate,)) > alone    # on a new layered e-graph
    assert len(made) == 2


def test_iteration_matches_count_the_rules_the_report_lists_and_setup_is_apart():
    fn = lambda q, k, v: op.softmax(q @ k.mT / 8.0, axis=-1) @ v  # noqa: E731
    g = op.kernel(fn).trace(*(op.tensor((2, 4, 16, 8), "bf16") for _ in range(3)))
    report = rewrite(g, BUILTIN_RULESETS).report
    per_iteration = sum(n for it in report.iterations for n in it.matches.values())
    assert per_iteration == sum(report.matches.values()) > 0           # the type analyses are not rules
    assert all("/" in name for it in report.iterations for name in it.matches)
    assert 0 <= report.setup_seconds <= report.seconds


THREADED_CALLS = """
import sys, threading
import numpy as np
from tessera_rw import op

@op.kernel
def scaled_softmax(x):
    return op.softmax(x * 2.0, axis=-1)

def calls(i):
    for j in range(4):
        x = np.ones((2, 3 + (i + j) % 4), np.float32)
        assert np.allclose(scaled_softmax(x), 1.0 / x.shape[-1])

threads = [threading.Thread(target=calls, args=(i,)) for i in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_kernels_traced_on_many_threads_drop_each_e_graph_on_its_own_thread():
    """egglog's e-graphs may only be dropped on the thread that made them: nothing the rewrite keeps
    may hold one in a reference cycle, for the collector to drop wherever it runs (it printed
    'EGraph is unsendable, but is being dropped on another thread')."""
    env = dict(os.environ, TESSERA_DISABLE_PLUGINS="1")
    done = subprocess.run([sys.executable, "-c", THREADED_CALLS], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "unsendable" not in done.stderr and "Error" not in done.stderr, done.stderr
