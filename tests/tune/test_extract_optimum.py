"""Extraction finds the cheapest program the e-graph holds: at every fusion depth its program costs
what an exact integer linear program (scipy's HiGHS, bench/extraction_optimum.py) proves optimal,
on the benchmark models at small depth and on every rule's example."""

import math
from dataclasses import replace

import numpy as np
import pytest

from bench import models
from bench.extraction_optimum import exact_optimum, optimum_gaps, rule_example_gaps
from tessera_rw.codegen.arch import arch_named
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.soundness import example_graph
from tessera_rw.tune.extract import candidate_of
from tests.hand_built_egraphs import enode, view_of

H100 = arch_named("H100-SXM")


def test_the_exact_optimum_pays_a_shared_class_once_and_chooses_no_cycle():
    # b read from a (which the program computes anyway) costs 1 more; b from x costs 3 more
    costs = {"input": 0.0, "exp": 5.0, "from_x": 3.0, "from_a": 1.0, "cheap": 0.0, "back": 0.0, "dear": 7.0}
    shared = view_of(enode("x", "input"), enode("a", "exp", "x"), enode("b", "from_x", "x"), enode("b", "from_a", "a"))
    assert exact_optimum(shared, ("a", "b"), lambda e: costs[e.op]).cost == pytest.approx(6.0)
    # y -> z -> y is free but cyclic: the only program computes y from x
    cyclic = view_of(enode("x", "input"), enode("y", "cheap", "z"), enode("z", "back", "y"), enode("y", "dear", "x"))
    assert exact_optimum(cyclic, ("y",), lambda e: costs[e.op]).cost == pytest.approx(7.0)


def test_a_longer_cycle_is_refused_and_a_dominated_enode_never_wins():
    costs = {"input": 0.0, "free": 0.0, "dear": 7.0, "plain": 2.0, "wide": 2.0, "dearer": 9.0}
    # y -> z -> w -> y is free but cyclic, three classes round: only levels refuse it
    ring = view_of(enode("x", "input"), enode("y", "free", "z"), enode("z", "free", "w"), enode("w", "free", "y"),
                   enode("y", "dear", "x"))
    assert exact_optimum(ring, ("y",), lambda e: costs[e.op]).cost == pytest.approx(7.0)
    assert exact_optimum(ring, ("w",), lambda e: costs[e.op]).cost == pytest.approx(7.0)
    # "wide" reads a superset of what "plain" reads at the same cost; the optimum is plain's, and a
    # program needing b anyway still pays b once
    wide = view_of(enode("x", "input"), enode("b", "dearer", "x"), enode("a", "plain", "x"),
                   enode("a", "wide", "x", "b"))
    assert exact_optimum(wide, ("a",), lambda e: costs[e.op]).cost == pytest.approx(2.0)
    assert exact_optimum(wide, ("a", "b"), lambda e: costs[e.op]).cost == pytest.approx(11.0)


def _small_models():
    bert, gpt = replace(models.BERT_BASE, layers=2), replace(models.GPT_48, layers=2)
    yield "BERT-base 2 layers", models.bert_encoder(bert), models.placeholders(bert, with_mask=True)
    yield "GPT 2 layers", models.gpt_stack(gpt), models.placeholders(gpt, with_mask=False)
    for make in (models.mlp_backward, models.hyena_block, models.resnet_training_step):
        yield (make.__name__, *make())
    yield "resnet_stack 2 blocks", *models.resnet_stack(blocks=2)     # 4 take HiGHS ten times as long


@pytest.mark.parametrize("name, kernel, inputs", list(_small_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_extraction_is_optimal_on_the_benchmark_models(name, kernel, inputs):
    for gap in optimum_gaps(name, kernel.trace(**inputs), H100):
        assert gap.optimum.proven, f"{name} {gap.depth}: HiGHS did not prove its optimum"
        assert gap.matches, f"{name} {gap.depth}: extraction {gap.ours:.6f} µs, optimum {gap.optimum.cost:.6f} µs"


RULES_PER_TEST = 20      # a ruleset's examples in slices of a few seconds each, which xdist spreads


def _rule_slices():
    for ruleset in BUILTIN_RULESETS:
        rules = tuple(rule for rule in ruleset.rules if rule.example is not None)
        for start in range(0, len(rules), RULES_PER_TEST):
            yield pytest.param(replace(ruleset, rules=rules[start:start + RULES_PER_TEST]),
                               id=f"{ruleset.name}-{start // RULES_PER_TEST}")


def test_the_slices_hold_every_rule_example_once():
    sliced = [rule.name for p in _rule_slices() for rule in p.values[0].rules]
    assert sorted(sliced) == sorted(rule.name for ruleset in BUILTIN_RULESETS for rule in ruleset.rules
                                    if rule.example is not None)


@pytest.mark.parametrize("ruleset", list(_rule_slices()))
def test_extraction_is_optimal_on_every_rule_example(ruleset):
    gaps = rule_example_gaps(H100, rulesets=(ruleset,))
    dearer = [f"{g.model} {g.depth}: {g.ours:.6f} vs {g.optimum.cost:.6f} µs" for g in gaps if not g.matches]
    assert not dearer, dearer
    # an example written with a fused op no template takes (float32 attention at head dim 3) has no
    # program of finite cost at any depth: nothing to extract, nothing to compare; every other is compared
    compared = {g.model for g in gaps}
    uncompared = [rule.name for rule in ruleset.rules if rule.name not in compared and
                  math.isfinite(candidate_of(example_graph(rule, np.random.default_rng(0))[0], H100).est_us)]
    assert not uncompared, uncompared
