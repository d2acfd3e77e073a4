"""Every rule of every built-in ruleset computes what it replaces, on random shapes and values."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tessera_rw import op
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.soundness import check_rule

t = TermBuilder()

CASES = [(rs, r) for rs in BUILTIN_RULESETS for r in rs.rules]


@pytest.mark.parametrize("ruleset, rule", CASES, ids=[f"{rs.name}/{r.name}" for rs, r in CASES])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_rule_is_sound(ruleset, rule, seed):
    result = check_rule(rule, ruleset, np.random.default_rng(seed))
    assert result.ok, result.detail
    assert result.variants >= 1


def test_every_rule_has_an_example_and_a_comment():
    for rs, r in CASES:
        assert r.example is not None and r.algebra, f"{rs.name}/{r.name}"


def _cancelling_micro_batch():
    """x, dy [3, 1, 1] whose Σ_i x_i dy_i cancels to rounding noise: any summation order is right."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1, 1)).astype(np.float32)
    dy = rng.standard_normal((3, 1, 1)).astype(np.float32)
    dy[2] = -(x[0] * dy[0] + x[1] * dy[1]) / x[2]
    return x, dy


def _with_inputs(rule, **inputs):
    fn = rule.example(np.random.default_rng(0))[0]
    return dataclasses.replace(rule, example=lambda rng: (fn, inputs))


def test_a_result_that_cancels_is_judged_against_its_terms_not_its_small_total():
    gradient = next(rs for rs in BUILTIN_RULESETS if rs.name == "gradient")
    rule = next(r for r in gradient.rules if r.name == "micro-batch-weight-grad-1d")
    x, dy = _cancelling_micro_batch()
    assert abs(float(np.sum(x * dy))) < 1e-6 * float(np.sum(np.abs(x * dy)))
    result = check_rule(_with_inputs(rule, x=x, dy=dy), gradient, np.random.default_rng(0))
    assert result.ok, result.detail


def test_a_wrong_rewrite_is_still_caught_where_the_result_cancels():
    x, dy = _cancelling_micro_batch()
    a, b, s, r, d, ax, kd = t.vars("a b s r d ax kd")
    wrong = Rule("square-instead", "Σ a b ≠ Σ a a",
                 lhs=t.sum(t.mul(a, b, of=(s, d)), axes=ax, keepdims=kd, of=(r, d)),
                 rhs=t.sum(t.mul(a, a, of=(s, d)), axes=ax, keepdims=kd, of=(r, d)),
                 when=("(= (shp b) s)",),
                 example=lambda rng: (lambda x, dy: op.sum(x * dy, axis=0), {"x": x, "dy": dy}))
    result = check_rule(wrong, Ruleset("authored", (wrong,)), np.random.default_rng(0))
    assert result.verdict.value == "unsound", result.detail


def test_the_scale_of_a_cancelling_sum_is_its_terms_and_a_jump_does_not_widen_it():
    from tessera_rw.rules.soundness import _scales
    spec = op.tensor((3,), "float32")
    dot = op.kernel(lambda x, y: op.sum(x * y, axis=0)).trace(spec, spec)
    terms = {"x": np.array([1e3, 1e3, 1.0], np.float32), "y": np.array([1.0, -1.0, 1.0], np.float32)}
    assert _scales(dot, terms)[0] >= 1e3                 # the total is 1, its terms 1000
    step = op.kernel(lambda x: op.where(x > 1.0, x + 100.0, x)).trace(op.tensor((5,), "float32"))
    at_the_edge = {"x": np.array([1.0, 0.5, 0.25, -2.0, 0.75], np.float32)}   # 1.0 flips under any nudge
    assert _scales(step, at_the_edge) == [2.0]


def test_a_rule_whose_rewrite_adds_nothing_to_evaluate_is_unchecked_not_sound():
    a, s, d = t.vars("a s d")
    same = Rule("exp-is-exp", "exp a = exp a", lhs=t.exp(a, of=(s, d)), rhs=t.exp(a, of=(s, d)),
                example=lambda rng: (lambda x: op.exp(x), {"x": rng.standard_normal(3).astype(np.float32)}))
    result = check_rule(same, Ruleset("authored", (same,)), np.random.default_rng(0))
    assert result.verdict.value == "unchecked" and "right-hand side went unchecked" in result.detail, result


def test_16_bit_inputs_are_nudged_too_in_measuring_a_cancelling_result_s_scale():
    """bfloat16 operands (ml_dtypes: numpy kind 'V') move the result as float32 ones do: the
    attention check whose two terms cancel to 1% of themselves is judged against the terms."""
    from tessera_rw.rules.soundness import _scales
    spec = op.tensor((3,), "bfloat16")
    dot = op.kernel(lambda x, y: op.sum(op.cast(x, "float32") * op.cast(y, "float32"), axis=0)).trace(spec, spec)
    terms = {"x": np.array([1e3, 1e3, 1.0], ml_dtypes.bfloat16), "y": np.array([1.0, -1.0, 1.0], ml_dtypes.bfloat16)}
    assert _scales(dot, terms)[0] >= 1e3
    attention = next(rs for rs in BUILTIN_RULESETS if rs.name == "attention")
    rule = next(r for r in attention.rules if r.name == "flash-attention-upcast-scores-where-masked-float32-result")
    assert check_rule(rule, attention, np.random.default_rng(66095121)).ok          # a draw whose terms cancel
