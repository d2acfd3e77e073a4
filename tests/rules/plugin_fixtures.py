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


def unversioned_pack() -> RulePack:
    """Metadata pydantic refuses: no version."""
    return RulePack(name="unversioned", rulesets=())


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


def _elementwise_op(name: str):
    from tessera_rw.plugin import OpDef, OpKind
    return OpDef(name, ("a",), OpKind.ELEMENTWISE, infer=lambda a: a, reference=lambda a: a)


FACTORY_CALLS = []


def factory_pack() -> RulePack:
    """A factory (which entry points may name) whose every run makes a new op of one name."""
    FACTORY_CALLS.append(1)
    return RulePack(name="factory", version="1.0", rulesets=(Ruleset("factory_rules", ()),),
                    ops=(_elementwise_op("factory_fused"),))


def refused_with_op_pack() -> RulePack:
    """An op, and a rule egglog refuses: the op must not outlive the skipped pack."""
    bad = Rule("unknown-guard-2", "tanh(x) = tanh(x) when nonsense", lhs=t.tanh(x, of=(s, d)),
               rhs=t.tanh(x, of=(s, d)), when=("(= (nonsense2 x) 1)",))
    return RulePack(name="refused-op", version="1.0", rulesets=(Ruleset("refused_op_rules", (bad,)),),
                    ops=(_elementwise_op("refused_fused"),))


def helper_pack_a() -> RulePack:
    return RulePack(name="helper-a", version="1.0",
                    rulesets=(Ruleset("helper_a", (), facts="(function plugin_helper (i64) i64 :merge old)"),))


def helper_pack_b() -> RulePack:
    """Declares the same egglog function as helper_pack_a: fine alone, refused beside it."""
    return RulePack(name="helper-b", version="1.0",
                    rulesets=(Ruleset("helper_b", (), facts="(function plugin_helper (i64) i64 :merge old)"),))


def reserved_name_pack() -> RulePack:
    return RulePack(name="reserved", version="1.0", rulesets=(Ruleset("insert", ()),))


def case_clash_pack() -> RulePack:
    """An op spelled like the built-in matmul's egglog constructor."""
    return RulePack(name="case-clash", version="1.0", rulesets=(Ruleset("case_clash", ()),),
                    ops=(_elementwise_op("Matmul"),))


def untested_pack() -> RulePack:
    """A sound rule with no example to check it on."""
    idle = Rule("tanh-is-tanh", "tanh(x) = tanh(x)", lhs=t.tanh(x, of=(s, d)), rhs=t.tanh(x, of=(s, d)))
    return RulePack(name="untested", version="1.0", rulesets=(Ruleset("untested", (idle,)),))


def _double_tanh_pack(name: str, vjp) -> RulePack:
    """An op 2·tanh(x) with the given VJP, and the rule that finds it."""
    from tessera_rw.plugin import OpDef, OpKind
    double = OpDef(name, ("x",), OpKind.ELEMENTWISE, lambda x: x, lambda x: 2 * np.tanh(x),
                   lambda out, x: 2 * x.numel, vjp=vjp)
    b = TermBuilder(extra_ops=(double,))
    rule = Rule(f"{name}-fold", "tanh(x) · 2 = double_tanh(x)",
                lhs=b.mul(b.tanh(x), b.constant(value=2.0), of=(s, d)), rhs=b.term(name, x, of=(s, d)),
                example=lambda rng: ((lambda x: op.tanh(x) * 2.0), {"x": rng.standard_normal((3, 4))}))
    return RulePack(name=name.replace("_", "-"), version="1.0", rulesets=(Ruleset(name, (rule,)),), ops=(double,))


def right_vjp_pack() -> RulePack:
    return _double_tanh_pack("double_tanh_right", lambda g, out, x: (g * 2 * (1 - op.tanh(x) ** 2),))


def wrong_vjp_pack() -> RulePack:          # forgets tanh's own derivative
    return _double_tanh_pack("double_tanh_wrong", lambda g, out, x: (g * 2,))


# Template entry points: a broken one, a non-template, and one claiming a built-in op.
def broken_templates():
    raise RuntimeError("this template plugin is broken on purpose")


def not_a_template():
    return 42


def matmul_template():
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

    class Hijack(RmsnormMatmulTemplate):
        ops = frozenset({"matmul"})
    return Hijack()


def string_ops_template():
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

    class Sloppy(RmsnormMatmulTemplate):
        ops = "my_fused_op"            # a string, which `in` would read as its substrings
    return Sloppy()


def someone_elses_op_template():
    """A template for an op another package's rule pack declares (the example plugin's)."""
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate
    return RmsnormMatmulTemplate()


def undeclared_op_template():
    """A template for an op no rule pack that loaded declares (as when its own pack was skipped)."""
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

    class Orphan(RmsnormMatmulTemplate):
        ops = frozenset({"orphan_fused"})
    return Orphan()


def builtin_op_template():
    """A template for one of tessera_rw's own ops."""
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

    class Reshape(RmsnormMatmulTemplate):
        ops = frozenset({"reshape"})
    return Reshape()


def _sigmoid_times_x(rng):
    return (lambda x: op.sigmoid(x) * x), {"x": rng.standard_normal((3, 4)).astype(np.float32)}


def unverifiable_pack() -> RulePack:
    """Wrong rules whose examples cannot show it: one fails to run (a misspelt op), one the rule
    does not match."""
    raises = Rule("tanh-is-silu", "x tanh(x) = silu(x) (false)", lhs=t.mul(x, t.tanh(x), of=(s, d)),
                  rhs=t.silu(x, of=(s, d)),
                  example=lambda rng: ((lambda x: x * op.tanhh(x)), {"x": rng.standard_normal((3, 4))}))
    unmatched = Rule("sigmoid-is-gelu", "x σ(x) = gelu(x) (false)", lhs=t.mul(x, t.sigmoid(x), of=(s, d)),
                     rhs=t.gelu(x, approximate="none", of=(s, d)), example=_sigmoid_times_x)
    return RulePack(name="unverifiable", version="1.0", rulesets=(Ruleset("unverifiable", (raises, unmatched)),))
