"""Rule packs the plugin tests install through fake entry points."""

import numpy as np

from tessera_rw import op
from tessera_rw.plugin import Rule, RulePack, Ruleset, TermBuilder

t = TermBuilder()
x, s, d = t.vars("x s d")

# Deliberately unsound: exp(x) is not 1 + x.
WRONG = Rule("exp-is-linear", "exp(x) = 1 + x (false)",
             lhs=t.exp(x, of=(s, d)),
             rhs=t.add(x, t.constant(value=1.0, dtype=d, of=((), d)), of=(s, d)),
             when=("(= (dt x) d)",),
             example=lambda rng: ((lambda x: op.exp(x)), {"x": rng.standard_normal((3, 4)).astype(np.float32)}))


def wrong_pack() -> RulePack:
    return RulePack(name="wrong-example", version="1.0", rulesets=(Ruleset("wrong_algebra", (WRONG,)),))


def duplicate_pack() -> RulePack:
    return RulePack(name="dupe", version="1.0", rulesets=(Ruleset("algebra", ()),))


def future_pack() -> RulePack:
    return RulePack(name="future", version="1.0", tessera_rw=">=9", rulesets=(Ruleset("future", ()),))


def unparsable_pack() -> RulePack:
    """A rule whose guard names a function egglog does not know."""
    bad = Rule("unknown-guard", "tanh(x) = tanh(x) when nonsense", lhs=t.tanh(x, of=(s, d)), rhs=t.tanh(x, of=(s, d)),
               when=("(= (nonsense x) 1)",))
    return RulePack(name="unparsable", version="1.0", rulesets=(Ruleset("unparsable", (bad,)),))


def broken_pack() -> RulePack:
    raise RuntimeError("this plugin is broken on purpose")


not_a_pack = 42
