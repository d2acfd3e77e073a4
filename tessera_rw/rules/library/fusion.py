"""Elementwise fusion rules (part of the `epilogue` ruleset): chains of elementwise ops become one
`fused_elementwise` node whose `expr` spells the chain over its inputs, e.g. `mul(relu($0),$1)`.

Each fusible op lifts into a one-op fused node; a fused node that feeds input $k of another is
substituted into it (its inputs taking the place of $k), up to MAX_FUSED_INPUTS inputs and
MAX_FUSED_OPS ops: where the e-graph holds a cycle (x = log(exp(x)), from a plugin's rule, say)
substitution could otherwise nest the expression without end, doubling it each iteration. A node
in its own operand's class (x · 1 = x puts mul(x, 1) in x's class) is never substituted into itself.
Where an intermediate has other users the e-graph keeps both forms; extraction weighs the recompute.
"""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.ops.fused_expr import COMPARISONS, FUSIBLE, MAX_FUSED_INPUTS, MAX_FUSED_OPS, expression_op
from tessera_rw.algebra.ops.fused_norm import NO_EPILOGUE
from tessera_rw.rules.library.algebra import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule
from tessera_rw.rules.schema import egg_string

t = TermBuilder()
s, d, e_in, e_out = t.vars("s d e_in e_out")
T = (s, d)

API = {"neg": op.negative, "sub": op.subtract, "mul": op.multiply, "div": op.divide, "pow": op.power,
       "eq": op.equal, "ne": op.not_equal, "lt": op.less, "le": op.less_equal, "gt": op.greater,
       "ge": op.greater_equal, "gelu_tanh": lambda x: op.gelu(x, approximate="tanh")} | {
    f"cast_{d}": (lambda x, d=d: op.cast(x, d)) for d in ("float32", "bfloat16", "float16")}


def _op_fn(name: str):
    return API.get(name) or getattr(op, name)


def _lift_example(name: str, arity: int):
    def example(rng: np.random.Generator):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=2))
        # in every op's domain; bf16 for a cast to float32 (one to its own dtype is no cast)
        dtype = ml_dtypes.bfloat16 if name == "cast_float32" else np.float32
        inputs = {n: (np.abs(rand(rng, *shape)) + 0.5).astype(dtype) for n in "ab"[:arity]}
        fn = _op_fn(name)
        return ((lambda a, fn=fn: fn(a) * 1.5) if arity == 1 else (lambda a, b, fn=fn: fn(a, b) * 1.5)), inputs
    return example


def _lift_rules():
    for arity, names in FUSIBLE.items():
        xs = t.vars(" ".join(f"x{i}" for i in range(arity)))
        for name in names:
            expr = f"{name}({','.join(f'${i}' for i in range(arity))})"
            computed, attrs = expression_op(name)        # gelu_tanh: gelu(approximate="tanh")
            # a cast to x's own dtype is x (cast-to-own-dtype): its class would read itself, and
            # lifting it would nest cast(cast(…)) in it without end
            yield Rule(f"fuse-{name}", f"{name}(…) = fused_elementwise(…, '{expr}')",
                       lhs=t.term(computed, *xs, **attrs, of=T),
                       rhs=t.fused_elementwise(*xs, expr=expr, of=T),
                       when=("(!= (dt x0) d)",) if computed == "cast" else (),
                       example=_lift_example(name, arity))


def _selection_rules():
    """where(x ≶ c, y, z) = one fused_elementwise over x, c, y, z: reverse mode's gradient of a relu
    (or a clamp), where(x > 0, g, 0), reads x and g once instead of a comparison kernel writing a
    mask and a selection kernel reading it back."""
    x, c, y, z, b = t.vars("x c y z b")
    for name in COMPARISONS:
        fn = _op_fn(name)

        def example(rng: np.random.Generator, fn=fn):
            shape = tuple(int(v) for v in rng.integers(1, 6, size=2))
            return (lambda x, g: op.where(fn(x, 0.0), g, 0.0) * 1.5), {"x": rand(rng, *shape), "g": rand(rng, *shape)}
        yield Rule(f"fuse-where-{name}", f"where({name}(x, c), y, z) = fused_elementwise(x, c, y, z)",
                   lhs=t.where(t.term(name, x, c, of=(Expr("sb"), b)), y, z, of=T),
                   rhs=t.fused_elementwise(x, c, y, z, expr=f"where({name}($0,$1),$2,$3)", of=T),
                   example=example)


    def given_mask(rng: np.random.Generator):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=2))
        return ((lambda m, g: op.where(m, g * 3.0, 0.0) * 1.5),
                {"m": rng.random(shape) < 0.5, "g": rand(rng, *shape)})
    yield Rule("fuse-where", "where(m, y, z) = fused_elementwise(m, y, z), m a mask the caller passes",
               lhs=t.where(x, y, z, of=T), rhs=t.fused_elementwise(x, y, z, expr="where($0,$1,$2)", of=T),
               when=('(= (dt x) "bool")',), example=given_mask)


def _renumber(text: str, mapping: dict[int, str]) -> str:
    """egglog text replacing each `$i` of `text` by mapping[i] (markers `#j` avoid collisions)."""
    for i, replacement in mapping.items():
        text = f"(replace {text} {egg_string(f'${i}')} {replacement})"
    return text


def renumbered(text: str, mapping: dict[int, str]) -> Expr:
    """egglog text of expression `text` with each `$i` renamed mapping[i], a "#j" marker (the
    markers become "$j" after every replacement, so no renaming sees another's result)."""
    return Expr(f'(replace {_renumber(text, {i: egg_string(m) for i, m in mapping.items()})} "#" "$")')


def _substituted(n: int, m: int, k: int) -> str:
    """The merged expression: the inner inputs take the place of input k, so inputs stay in the
    left-to-right order of the leaves they feed."""
    inner = _renumber("e_in", {j: egg_string(f"#{k + j}") for j in range(m)})
    outer = _renumber("e_out", {i: (inner if i == k else egg_string(f"#{i if i < k else i + m - 1}"))
                                for i in range(n)})
    return f'(replace {outer} "#" "$")'


def expression_over(args):
    """An expression over `args` using each once: tanh(a), a·b, a·b + c, (a·b + c) − d."""
    if len(args) == 1:
        return op.tanh(args[0])
    out = args[0] * args[1]
    for i, extra in enumerate(args[2:]):
        out = out + extra if i % 2 == 0 else out - extra
    return out


def with_parameters(fn, names: list[str]):
    """`fn(*args)` presented as taking parameters `names` (an example's inputs are passed by name)."""
    fn.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    return fn


def _merge_example(n: int, m: int, k: int):
    def example(rng: np.random.Generator):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=2))
        names = [f"x{i}" for i in range(n + m - 1)]
        inputs = {name: rand(rng, *shape) for name in names}

        def body(*args):
            vals = list(args)
            inner = op.exp(vals[n - 1]) if m == 1 else expression_over(vals[n - 1:])
            outer_args = vals[:k] + [inner] + vals[k:n - 1]
            return expression_over(outer_args) * 2.0
        return with_parameters(body, names), inputs
    return example


def _merge_rules():
    for n in range(1, MAX_FUSED_INPUTS + 1):
        for m in range(1, MAX_FUSED_INPUTS + 2 - n):
            for k in range(n):
                xs = t.vars(" ".join(f"x{i}" for i in range(n)))
                ys = t.vars(" ".join(f"y{j}" for j in range(m)))
                inner = t.fused_elementwise(*ys, expr=e_in)
                outer_args = [inner if i == k else xs[i] for i in range(n)]
                merged = [*xs[:k], *ys, *xs[k + 1:]]
                yield Rule(f"fuse-into-input-{k}-of-{n}-from-{m}", "f(…, g(…), …) = (f∘g)(…)",
                           lhs=t.fused_elementwise(*outer_args, expr=e_out, of=T),
                           rhs=t.fused_elementwise(*merged, expr=Expr(_substituted(n, m, k)), of=T),
                           when=(f'(< (+ (count-matches e_in "(") (count-matches e_out "(")) {MAX_FUSED_OPS})',),
                           example=_merge_example(n, m, k), needs=ALL_FUSION_RULE_NAMES,
                           apart=(inner,))    # where x · 1 = x put a node in its operand's class


def _names() -> tuple[str, ...]:
    names = [f"fuse-{name}" for names in FUSIBLE.values() for name in names] + [f"fuse-where-{c}" for c in COMPARISONS] \
        + ["fuse-where"]
    return tuple(names + [f"fuse-into-input-{k}-of-{n}-from-{m}" for n in range(1, MAX_FUSED_INPUTS + 1)
                          for m in range(1, MAX_FUSED_INPUTS + 2 - n) for k in range(n)])


ALL_FUSION_RULE_NAMES = _names()
FUSION_RULES = tuple(_lift_rules()) + tuple(_selection_rules()) + tuple(_merge_rules())


# ---- row-wise normalizations absorb their elementwise prologue ----------------------------

def _norm_example(norm: str, n: int, params: int):
    """norm(prologue(x0..x{n-1}), *params) with a prologue over exactly n tensors."""
    def example(rng: np.random.Generator):
        rows, width = (int(v) for v in rng.integers(1, 6, size=2))
        names = [f"x{i}" for i in range(n)] + ["w", "c"][:params]
        inputs = {nm: rand(rng, rows, width) for nm in names[:n]} | {nm: rand(rng, width) for nm in names[n:]}

        def body(*args):
            row = expression_over(list(args[:n]))
            if norm in ("softmax", "log_softmax"):
                return getattr(op, norm)(row, axis=-1)
            return getattr(op, norm)(row, *args[n:])
        return with_parameters(body, names), inputs
    return example


def _normalization_rules():
    ax, eps, hw, hb = t.vars("ax eps hw hb")
    for n in range(1, MAX_FUSED_INPUTS + 1):
        xs = t.vars(" ".join(f"x{i}" for i in range(n)))
        prologue = t.fused_elementwise(*xs, expr=e_in)
        for norm in ("softmax", "log_softmax"):
            yield Rule(f"{norm}-of-fused-{n}", f"{norm}(f(…)) = fused_normalization(…; f, {norm})",
                       lhs=t.term(norm, prologue, axis=ax, of=T),
                       rhs=t.fused_normalization(*xs, expr=e_in, norm=norm, axes=Expr("(vec-of ax)"), eps=0.0,
                                                 has_weight=False, has_bias=False, post=NO_EPILOGUE, of=T),
                       example=_norm_example(norm, n, 0), needs=ALL_FUSION_RULE_NAMES)
        for norm in ("layernorm", "rmsnorm"):
            for params in range(3):
                ps = t.vars("p0 p1")[:params]
                yield Rule(f"{norm}-of-fused-{n}-{params}", f"{norm}(f(…), …) = fused_normalization(…; f, {norm})",
                           lhs=t.term(norm, prologue, *ps, axes=ax, eps=eps, has_weight=hw, has_bias=hb, of=T),
                           rhs=t.fused_normalization(*xs, *ps, expr=e_in, norm=norm, axes=ax, eps=eps,
                                                     has_weight=hw, has_bias=hb, post=NO_EPILOGUE, of=T),
                           example=_norm_example(norm, n, params), needs=ALL_FUSION_RULE_NAMES)


FUSION_RULES = FUSION_RULES + tuple(_normalization_rules())


def _bare_norm_example(norm: str, params: int):
    """norm(x, *params) of a random x, times 2 (the lift is checked alone: the epilogue rules that
    would then take the product in are checked with their own examples)."""
    def example(rng: np.random.Generator):
        rows, width = (int(v) for v in rng.integers(1, 6, size=2))
        names = ["x", "w", "c"][:1 + params]
        inputs = {"x": rand(rng, rows, width)} | {nm: rand(rng, width) for nm in names[1:]}

        def body(*args):
            if norm in ("softmax", "log_softmax"):
                return getattr(op, norm)(args[0], axis=-1) * 2.0
            return getattr(op, norm)(*args) * 2.0
        return with_parameters(body, names), inputs
    return example


def _bare_normalization_rules():
    """A normalization of a plain tensor is a fused_normalization whose prologue reads it as it is,
    so the elementwise ops after it can join it as they join one with a prologue."""
    ax, eps, hw, hb, x0 = t.vars("ax eps hw hb x0")
    for norm in ("softmax", "log_softmax"):
        yield Rule(f"{norm}-as-fused", f"{norm}(x) = fused_normalization(x; {norm})",
                   lhs=t.term(norm, x0, axis=ax, of=T),
                   rhs=t.fused_normalization(x0, expr=NO_EPILOGUE, norm=norm, axes=Expr("(vec-of ax)"), eps=0.0,
                                             has_weight=False, has_bias=False, post=NO_EPILOGUE, of=T),
                   example=_bare_norm_example(norm, 0))
    for norm in ("layernorm", "rmsnorm"):
        for params in range(3):
            ps = t.vars("p0 p1")[:params]
            yield Rule(f"{norm}-as-fused-{params}", f"{norm}(x, …) = fused_normalization(x, …; {norm})",
                       lhs=t.term(norm, x0, *ps, axes=ax, eps=eps, has_weight=hw, has_bias=hb, of=T),
                       rhs=t.fused_normalization(x0, *ps, expr=NO_EPILOGUE, norm=norm, axes=ax, eps=eps,
                                                 has_weight=hw, has_bias=hb, post=NO_EPILOGUE, of=T),
                       example=_bare_norm_example(norm, params))


FUSION_RULES = FUSION_RULES + tuple(_bare_normalization_rules())


# ---- ... and the elementwise ops after them -----------------------------------------------

def _epilogue_example(n: int, k: int, p: int):
    """post(x…, softmax(prologue(y0..y{p-1})) at position k, …x) with the norm feeding input k."""
    def example(rng: np.random.Generator):
        rows, width = (int(v) for v in rng.integers(1, 6, size=2))
        names = [f"y{i}" for i in range(p)] + [f"x{i}" for i in range(n - 1)]
        inputs = {nm: rand(rng, rows, width) for nm in names}

        def body(*args):
            normed = op.softmax(expression_over(list(args[:p])), axis=-1)
            rest = list(args[p:])
            return expression_over(rest[:k] + [normed] + rest[k:])
        return with_parameters(body, names), inputs
    return example


def _epilogue_rules():
    """fused_elementwise(…, fused_normalization(…) at input k, …) = fused_normalization(…; post)."""
    ax, eps, hw, hb, norm = t.vars("ax eps hw hb norm")
    for n in range(1, MAX_FUSED_INPUTS + 1):
        for k in range(n):
            post = renumbered("e_out", {i: "#0" if i == k else f"#{i + 1 if i < k else i}" for i in range(n)})
            for p in range(1, MAX_FUSED_INPUTS + 1):
                xs = t.vars(" ".join(f"x{i}" for i in range(n)))
                ys = t.vars(" ".join(f"y{j}" for j in range(p)))
                # the normalized rows are the result's rows: an epilogue that broadcasts them (a
                # softmax over a size-1 axis, added to a wider tensor) stays a kernel of its own
                normed = t.fused_normalization(*ys, expr=e_in, norm=norm, axes=ax, eps=eps, has_weight=hw,
                                               has_bias=hb, post=NO_EPILOGUE, of=(s, None))
                outer = [normed if i == k else xs[i] for i in range(n)]
                yield Rule(f"normalization-into-input-{k}-of-{n}-from-{p}", "f(…, norm(…), …) = norm(…; post=f)",
                           lhs=t.fused_elementwise(*outer, expr=e_out, of=T),
                           rhs=t.fused_normalization(*ys, *(xs[i] for i in range(n) if i != k), expr=e_in, norm=norm,
                                                     axes=ax, eps=eps, has_weight=hw, has_bias=hb,
                                                     post=post, of=T),
                           example=_epilogue_example(n, k, p),
                           needs=ALL_FUSION_RULE_NAMES + tuple(f"softmax-of-fused-{q}" for q in range(1, 5)))


FUSION_RULES = FUSION_RULES + tuple(_epilogue_rules())
