"""Every rule of every built-in ruleset computes what it replaces, on random shapes and values."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.soundness import check_rule

CASES = [(rs, r) for rs in BUILTIN_RULESETS for r in rs.rules]


@pytest.mark.parametrize("ruleset, rule", CASES, ids=[f"{rs.name}/{r.name}" for rs, r in CASES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_rule_is_sound(ruleset, rule, seed):
    result = check_rule(rule, ruleset, np.random.default_rng(seed))
    assert result.ok, result.detail
    assert result.variants >= 1


def test_every_rule_has_an_example_and_a_comment():
    for rs, r in CASES:
        assert r.example is not None and r.algebra, f"{rs.name}/{r.name}"
