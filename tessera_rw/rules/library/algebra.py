"""The `algebra` ruleset: identities that bring differently written programs to one form.

Each rule keeps the type of what it rewrites; new intermediate terms get their types from the
`shp` / `dt` analyses and the shape helpers in `tables`.
"""

from __future__ import annotations


import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library import (activation_forms, kept_dims, kernel_forms, logsumexp_forms, masks, norm_forms,
                                     promotions, selections)
from tessera_rw.rules.library.example_inputs import SIXTEEN_BIT_FLOATS, rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.tables import rank, swapped_last, with_dim

t = TermBuilder()
a, b, x, m, c, cd, s, d, sa, da, acc, ax, axes, s1, s2, dx = t.vars("a b x m c cd s d sa da acc ax axes s1 s2 dx")
T = (s, d)                          # "of the rewritten term's type"
NEG_INF = float("-inf")
NARROW_RANGE_FLOATS = ("float16", "float8_e4m3", "float8_e5m2")     # a sum of two in-range values can overflow


def const(value=c, dtype=cd) -> Expr:
    return t.constant(value=value, dtype=dtype, of=((), dtype))


def matmul_pair(rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray]:
    m, k, n = (int(v) for v in rng.integers(1, 7, size=3))
    lead = tuple(int(v) for v in rng.integers(1, 4, size=batch))
    return rand(rng, *lead, m, k), rand(rng, *lead, k, n)


def mT(term: Expr) -> tuple[Expr, tuple[str, ...]]:
    """`term.mT` and the conditions that bind its type (`<v>_s`, `<v>_d`) and permutation (`<v>_p`):
    egglog evaluates table lookups in a rule's query, never in its right-hand side."""
    v = term.text
    facts = (f"(= {v}_s (shp {v}))", f"(= {v}_d (dt {v}))", f"(= {v}_p (swap-last {rank(v + '_s')}))")
    return t.transpose(term, axes=Expr(f"{v}_p"), of=(Expr(swapped_last(f"{v}_s")), Expr(f"{v}_d"))), facts


def _reduced(shape: str, axis: str) -> Expr:
    return Expr(with_dim(shape, axis, "1"))


def _explicit_softmax(x: Expr, axis: Expr, stats: Expr | str = d) -> Expr:
    """exp(x − max x) / Σ exp(x − max x), computed in `stats` (d, x's dtype, or "float32": a 16-bit
    softmax's max and sum kept in fp32, as torch keeps them, and the quotient cast back to d)."""
    if stats == d:
        keep = dict(axes=Expr(f"(vec-of {axis})"), keepdims=True, of=(_reduced("s", axis.text), d))
        shifted = t.exp(t.sub(x, t.max(x, **keep), of=T), of=T)
        return t.div(shifted, t.sum(shifted, **keep), of=T)
    wide = (s, Expr('"float32"'))
    keep = dict(axes=Expr(f"(vec-of {axis})"), keepdims=True, of=(_reduced("s", axis.text), Expr('"float32"')))
    x32 = t.cast(x, dtype="float32", of=wide)
    shifted = t.exp(t.sub(x32, t.max(x32, **keep), of=wide), of=wide)
    return t.cast(t.div(shifted, t.sum(shifted, **keep), of=wide), dtype=d, of=T)


def _same_batch(*shapes: str) -> tuple[str, ...]:
    """Facts: equal ranks and equal batch dims (everything but the last two axes)."""
    first = shapes[0]
    return tuple(f"(= (vec-pop (vec-pop {first})) (vec-pop (vec-pop {other})))" for other in shapes[1:]) + tuple(
        f"(= (vec-length {first}) (vec-length {other}))" for other in shapes[1:]) + (f"(>= (vec-length {first}) 2)",)


def _with_last(shape: str, last: str) -> Expr:
    return Expr(f"(vec-set {shape} (- (vec-length {shape}) 1) {last})")


def _last(shape: str) -> str:
    return f"(vec-get {shape} (- (vec-length {shape}) 1))"


MATMUL_TYPES = ("(= sa (shp a))", "(= sb (shp b))", "(= sc (shp c2))",
                "(= (dt a) d)", "(= (dt b) d)", "(= (dt c2) d)") + _same_batch("sa", "sb", "sc")
c2 = Expr("c2")


def _chain(rng: np.random.Generator):
    m, k, n, p = (int(v) for v in rng.integers(1, 7, size=4))
    batch = tuple(int(v) for v in rng.integers(1, 3, size=int(rng.integers(0, 2))))
    return {"a": rand(rng, *batch, m, k), "b": rand(rng, *batch, k, n), "c": rand(rng, *batch, n, p)}


def _permutations(rank: int):
    def example(rng: np.random.Generator):
        perms = []
        while len(perms) < 2:  # identity permutations are dropped when traced: draw real ones
            p = tuple(int(i) for i in rng.permutation(rank))
            if p != tuple(range(rank)):
                perms.append(p)
        dims = tuple(int(v) for v in rng.integers(1, 4, size=rank))
        return (lambda x: op.transpose(op.transpose(x, perms[0]), perms[1]) + 1.0), {"x": rand(rng, *dims)}
    return example


def _compose_rules():
    """transpose∘transpose = one transpose, for each rank (egglog has no loops over a vector)."""
    p, q = Expr("p"), Expr("q")
    for n in range(2, 7):
        composed = Expr("(vec-of " + " ".join(f"(vec-get p (vec-get q {i}))" for i in range(n)) + ")")
        yield Rule(f"compose-permutations-{n}d", "transpose(transpose(x, p), q) = transpose(x, p∘q)",
                   lhs=t.transpose(t.transpose(x, axes=p), axes=q, of=T),
                   rhs=t.transpose(x, axes=composed, of=T),
                   when=(f"(= (vec-length p) {n})",),
                   example=_permutations(n))


BROADCASTING_OPS = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q, "mul": lambda p, q: p * q,
                    "div": lambda p, q: p / q, "maximum": op.maximum, "minimum": op.minimum}


def _broadcast_example(name: str, left: bool):
    fn = BROADCASTING_OPS[name]

    def example(rng: np.random.Generator):
        x = rand(rng, 0, 0, 0)
        # fewer dims than x (a broadcast to its own shape is no broadcast), some of them 1
        y = rand(rng, *(int(n) if rng.random() < 0.5 else 1 for n in x.shape[int(rng.integers(1, 3)):]))
        if left:
            return (lambda x, y: fn(op.broadcast_to(y, x.shape), x)), {"x": x, "y": y}
        return (lambda x, y: fn(x, op.broadcast_to(y, x.shape))), {"x": x, "y": y}
    return example


def _broadcast_rules():
    """An elementwise op broadcasts its operands itself: an operand spread to the other's shape
    beforehand (as the VJP of a sum spreads its cotangent) need not be materialized."""
    y = Expr("y")
    for name in BROADCASTING_OPS:
        build = getattr(t, name)
        yield Rule(f"broadcast-into-{name}-rhs", f"{name}(x, broadcast_to(y, shape(x))) = {name}(x, y)",
                   lhs=build(x, t.broadcast_to(y, shape=s1), of=T), rhs=build(x, y, of=T),
                   when=("(= (shp x) s1)",), example=_broadcast_example(name, left=False))
        yield Rule(f"broadcast-into-{name}-lhs", f"{name}(broadcast_to(y, shape(x)), x) = {name}(y, x)",
                   lhs=build(t.broadcast_to(y, shape=s1), x, of=T), rhs=build(y, x, of=T),
                   when=("(= (shp x) s1)",), example=_broadcast_example(name, left=True))


def _power_rules():
    """Small constant powers need no pow kernel. (Arithmetic on constants, and reshapes and
    broadcasts of them, are folded while tracing, in numpy's arithmetic of the dtype: egglog's f64
    would skip the rounding of each step.)"""
    one, two = Expr("1.0"), Expr("2.0")
    yield Rule("pow-one", "x ** 1 = x (when the 1 broadcasts nothing)",
               lhs=t.pow(x, const(value=one, dtype=d), of=T), rhs=x,
               when=("(= (shp x) s)", "(= (dt x) d)"),
               example=lambda rng: ((lambda x: x ** 1.0 * 2.0), {"x": rand(rng, 0, 0)}))
    yield Rule("pow-two", "x ** 2 = x · x",
               lhs=t.pow(x, const(value=two, dtype=d), of=T), rhs=t.mul(x, x, of=T),
               when=("(= (shp x) s)", "(= (dt x) d)"),
               example=lambda rng: ((lambda x: x ** 2.0 + 1.0), {"x": rand(rng, 0, 0)}))


RULES = (
    *_power_rules(),
    Rule("div-by-constant", "x / c = x · (1/c)",
         lhs=t.div(x, const(), of=T),
         rhs=t.mul(x, const(value=Expr("(/ 1.0 c)")), of=T),
         when=("(= cd d)", "(!= c 0.0)"),
         example=lambda rng: (lambda x: x / 3.0, {"x": rand(rng, 0, 0)})),
    Rule("constant-to-the-right", "c · x = x · c",
         lhs=t.mul(const(), x, of=T),
         rhs=t.mul(x, const(), of=T),
         example=lambda rng: (lambda x: 0.5 * x, {"x": rand(rng, 0, 0)})),
    # a value read twice under scales: reverse mode's cotangent of x · x (0.5 x + 0.5 x is x, and no kernel)
    Rule("scales-added", "x · c1 + x · c2 = x · (c1 + c2) (scalar constants of x's dtype)",
         lhs=t.add(t.mul(x, const(value=Expr("c1")), of=T), t.mul(x, const(value=Expr("c2")), of=T), of=T),
         rhs=t.mul(x, const(value=Expr("(+ c1 c2)")), of=T),
         when=("(= (shp x) s)", "(= (dt x) d)", "(= cd d)"),
         example=lambda rng: (lambda x: x * 0.25 + x * 0.5, {"x": rand(rng, 0, 0)})),
    Rule("scales-multiplied", "(x · c1) · c2 = x · (c1 c2) (scalar constants of x's dtype)",
         lhs=t.mul(t.mul(x, const(value=Expr("c1")), of=T), const(value=Expr("c2")), of=T),
         rhs=t.mul(x, const(value=Expr("(* c1 c2)")), of=T),
         when=("(= (shp x) s)", "(= (dt x) d)", "(= cd d)"),
         example=lambda rng: (lambda x: x * 0.25 * 3.0 + 1.0, {"x": rand(rng, 0, 0)})),
    # reverse mode's relu′ reads the pre-activation, where(x > 0, g, 0); reading relu(x), which the
    # forward computes anyway, leaves x unwritten where nothing else reads it (a conv or gemm
    # epilogue then writes relu(x) alone)
    Rule("positive-through-relu", "x > c = relu(x) > c for c ≥ 0, where relu(x) is computed anyway",
         lhs=t.gt(x, const(), of=T), rhs=t.gt(Expr("r"), const(), of=T),
         when=(f"(= r {t.relu(x)})", "(>= c 0.0)"),
         example=lambda rng: (lambda x, g: op.where(x > 0.0, g, 0.0) + op.relu(x),
                              dict(zip("xg", rand(rng, 2, 0, 0))))),
    Rule("scale-out-of-matmul-lhs", "(sA)B = s(AB)",
         lhs=t.matmul(t.mul(a, const(), of=(sa, da)), b, accum_dtype=acc, of=T),
         rhs=t.mul(t.matmul(a, b, accum_dtype=acc, of=T), const(), of=T),
         when=("(= (dt a) da)", "(= cd da)"),
         example=lambda rng: (lambda a, b: (a * 0.25) @ b, dict(zip("ab", matmul_pair(rng, 1))))),
    Rule("scale-out-of-matmul-rhs", "A(sB) = s(AB)",
         lhs=t.matmul(a, t.mul(b, const(), of=(sa, da)), accum_dtype=acc, of=T),
         rhs=t.mul(t.matmul(a, b, accum_dtype=acc, of=T), const(), of=T),
         when=("(= (dt b) da)", "(= cd da)"),
         example=lambda rng: (lambda a, b: a @ (b * 0.25), dict(zip("ab", matmul_pair(rng, 2))))),
    Rule("mT-of-mT", "(Aᵀ)ᵀ = A",
         lhs=t.transpose(t.transpose(x, axes=m, of=(s1, None)), axes=m),
         rhs=x,
         when=(f"(= m (swap-last {rank('s1')}))",),
         example=lambda rng: (lambda x: x.mT.mT + 1.0, {"x": rand(rng, 0, 0, 0)})),
    *_compose_rules(),
    *_broadcast_rules(),
    Rule("identity-permutation", "transpose(x, id) = x",
         lhs=t.transpose(x, axes=m, of=T), rhs=x,
         when=("(= m (identity-perm (vec-length s)))",),
         example=lambda rng: (lambda x: op.transpose(x.mT, (0, 2, 1)) * 2.0, {"x": rand(rng, 0, 0, 0)}),
         needs=("compose-permutations-3d",)),
    Rule("matmul-associates-right", "(AB)C = A(BC)",
         lhs=t.matmul(t.matmul(a, b, accum_dtype=acc), c2, accum_dtype=acc, of=T),
         rhs=t.matmul(a, t.matmul(b, c2, accum_dtype=acc, of=(_with_last("sb", _last("sc")), d)),
                      accum_dtype=acc, of=T),
         when=MATMUL_TYPES, explosive=True,
         example=lambda rng: ((lambda a, b, c: (a @ b) @ c), _chain(rng))),
    Rule("matmul-associates-left", "A(BC) = (AB)C",
         lhs=t.matmul(a, t.matmul(b, c2, accum_dtype=acc), accum_dtype=acc, of=T),
         rhs=t.matmul(t.matmul(a, b, accum_dtype=acc, of=(_with_last("sa", _last("sb")), d)), c2,
                      accum_dtype=acc, of=T),
         when=MATMUL_TYPES, explosive=True,
         example=lambda rng: ((lambda a, b, c: a @ (b @ c)), _chain(rng))),
    # not in the narrow-range floats: B + C overflows float16's 65504 (or fp8's range) where A B and
    # A C, each scaled down by A, do not
    Rule("matmul-distributes", "AB + AC = A(B + C)",
         lhs=t.add(t.matmul(a, b, accum_dtype=acc), t.matmul(a, c2, accum_dtype=acc), of=T),
         rhs=t.matmul(a, t.add(b, c2, of=(Expr("sb"), d)), accum_dtype=acc, of=T),
         when=("(= sb (shp b))", "(= (shp c2) sb)", "(= (dt b) d)", "(= (dt c2) d)", "(= (dt a) d)",
               *(f'(!= d "{narrow}")' for narrow in NARROW_RANGE_FLOATS)),
         example=lambda rng: ((lambda a, b, c: a @ b + a @ c),
                              (lambda i: {"a": i["a"], "b": i["b"], "c": rand(rng, *i["b"].shape)})(_chain(rng)))),
    Rule("cast-to-own-dtype", "cast(x, dtype(x)) = x",
         lhs=t.cast(x, dtype=d, of=T), rhs=x,
         when=("(= (dt x) d)",),
         example=lambda rng: ((lambda x: op.cast(x, "float32") * 2.0), {"x": rand(rng, 0, 0)})),
    Rule("stop-gradient-is-x", "stop_gradient(x) = x (gradients are taken before the rewrites)",
         lhs=t.stop_gradient(x, of=T), rhs=x,
         example=lambda rng: ((lambda x: op.stop_gradient(x) * 2.0), {"x": rand(rng, 0, 0)})),
    Rule("times-one", "x · 1 = x (when the 1 broadcasts nothing)",
         lhs=t.mul(x, const(value=1.0), of=T), rhs=x,
         when=("(= (shp x) s)", "(= (dt x) d)"),
         example=lambda rng: ((lambda x: x * 1.0 + 2.0), {"x": rand(rng, 0, 0)})),
    Rule("times-ones", "x · ones = x (ones of x's shape and dtype)",
         lhs=t.mul(x, t.full(shape=s, value=1.0, dtype=d), of=T), rhs=x,
         when=("(= (shp x) s)", "(= (dt x) d)"),
         example=lambda rng: ((lambda x: x * op.ones(x.shape) + 2.0), {"x": rand(rng, 0, 0)})),
    Rule("ones-times", "ones · x = x (ones of x's shape and dtype)",
         lhs=t.mul(t.full(shape=s, value=1.0, dtype=d), x, of=T), rhs=x,
         when=("(= (shp x) s)", "(= (dt x) d)"),
         example=lambda rng: ((lambda x: op.ones(x.shape) * x + 2.0), {"x": rand(rng, 0, 0)})),
    # exact but for the sign of a zero (-0.0 + 0.0 is +0.0), as XLA's and Inductor's x + 0 folds:
    # autodiff's cotangent sums start from zeros, and these terms would otherwise each be a kernel
    Rule("plus-zero", "x + 0 = x (when the 0 broadcasts nothing; a -0.0 keeps its sign)",
         lhs=t.add(x, const(value=0.0), of=T), rhs=x,
         when=("(= (shp x) s)", "(= (dt x) d)"),
         example=lambda rng: ((lambda x: (x + 0.0) * 2.0), {"x": rand(rng, 0, 0)})),
    Rule("reshape-of-reshape", "reshape(reshape(x, s1), s2) = reshape(x, s2)",
         lhs=t.reshape(t.reshape(x, shape=s1), shape=s2, of=T),
         rhs=t.reshape(x, shape=s2, of=T),
         example=lambda rng: (lambda x: op.reshape(op.reshape(x, (-1,)), (x.shape[1], x.shape[0])) * 2.0,
                              {"x": rand(rng, 0, 0)})),
    Rule("reshape-to-own-shape", "reshape(x, shape(x)) = x",
         lhs=t.reshape(x, shape=s, of=T), rhs=x,
         when=("(= (shp x) s)",),
         example=lambda rng: (lambda x: op.reshape(op.reshape(x, (-1,)), x.shape) * 2.0, {"x": rand(rng, 0, 0)}),
         needs=("reshape-of-reshape",)),
    Rule("flip-of-flip", "flip(flip(x, axes), axes) = x",
         lhs=t.flip(t.flip(x, axes=m), axes=m, of=T), rhs=x,
         example=lambda rng: (lambda x: op.flip(x[::-1], 0) * 2.0,
                              {"x": rand(rng, int(rng.integers(2, 7)), 0)})),  # a length-1 axis flips to itself
    Rule("mT-of-matmul", "(AB)ᵀ = BᵀAᵀ",
         lhs=t.transpose(t.matmul(a, b, accum_dtype=acc, of=(s1, None)), axes=m, of=T),
         rhs=t.matmul(mT(b)[0], mT(a)[0], accum_dtype=acc, of=T),
         when=(f"(= m (swap-last {rank('s1')}))", *mT(a)[1], *mT(b)[1], "(>= (vec-length a_s) 2)",
               "(= (vec-length a_s) (vec-length b_s))"),
         example=lambda rng: (lambda a, b: (a @ b).mT, dict(zip("ab", matmul_pair(rng, 1))))),
    Rule("softmax-from-exp-max-sum", "exp(x − max x) / Σ exp(x − max x) = softmax(x)",
         lhs=t.div(t.exp(t.sub(x, t.max(x, axes=axes, keepdims=True))),
                   t.sum(t.exp(t.sub(x, t.max(x, axes=axes, keepdims=True))), axes=axes, keepdims=True), of=T),
         rhs=t.softmax(x, axis=ax, of=T),
         when=("(= (vec-length axes) 1)", "(= ax (vec-get axes 0))", "(= (dt x) d)"),
         example=lambda rng: (lambda x: op.exp(x - x.max(-1, keepdims=True))
                              / op.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
                              {"x": rand(rng, 0, 0)})),
    Rule("log-softmax-from-max-sum-exp", "(x − max x) − log Σ exp(x − max x) = log_softmax(x)",
         lhs=t.sub(t.sub(x, t.max(x, axes=axes, keepdims=True)),
                   t.log(t.sum(t.exp(t.sub(x, t.max(x, axes=axes, keepdims=True))), axes=axes, keepdims=True)), of=T),
         rhs=t.log_softmax(x, axis=ax, of=T),
         when=("(= (vec-length axes) 1)", "(= ax (vec-get axes 0))", "(= (dt x) d)"),
         example=lambda rng: (lambda x: (x - x.max(-1, keepdims=True))
                              - op.log(op.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
                              {"x": rand(rng, 0, 0)})),
    Rule("softmax-to-exp-max-sum", "softmax(x) = exp(x − max x) / Σ exp(x − max x)",
         lhs=t.softmax(x, axis=ax, of=T),
         rhs=_explicit_softmax(x, ax),
         when=tuple(f'(!= d "{narrow}")' for narrow in SIXTEEN_BIT_FLOATS),
         example=lambda rng: (lambda x: op.softmax(x, axis=0), {"x": rand(rng, 0, 0)})),
    *(Rule(f"softmax-to-exp-max-sum-{narrow}", f"softmax(x) = exp(x − max x) / Σ exp(x − max x), {narrow} x's "
           "max and sum in fp32 (over a middle axis: the row kernel takes a trailing one)",
           lhs=t.softmax(x, axis=ax, of=T),
           rhs=_explicit_softmax(x, ax, stats="float32"),
           when=(f'(= d "{narrow}")', "(!= ax (- (vec-length s) 1))"),
           example=lambda rng, narrow=narrow: (lambda x: op.softmax(x, axis=0),
                                               {"x": rand(rng, 0, 0, dtype=SIXTEEN_BIT_FLOATS[narrow])}))
      for narrow in SIXTEEN_BIT_FLOATS),
    Rule("softmax-in-wider-type", "cast(softmax(cast(x, f32)), d) = softmax(x) when x is d",
         lhs=t.cast(t.softmax(t.cast(x, dtype="float32"), axis=ax), dtype=dx, of=T),
         rhs=t.softmax(x, axis=ax, of=T),
         when=("(= (dt x) d)",),
         example=lambda rng: (lambda x: op.cast(op.softmax(op.cast(x, "float32"), axis=-1), "bf16"),
                              {"x": rand(rng, 0, 0, dtype=ml_dtypes.bfloat16)})),
)

NOT_FLOATS = ("bool", "int32", "int64")     # no negation (bool), or one that wraps (−INT_MIN) before a wider sum


def _of_a_product(reduced):
    """An example: reduced(x · y, axis) of random x and y of one random matrix shape, axis 0 or 1."""
    def example(rng: np.random.Generator):
        x, axis = rand(rng, 0, 0), int(rng.integers(0, 2))
        return (lambda x, y: reduced(x * y, axis)), {"x": x, "y": rand(rng, *x.shape)}
    return example


def _negation_into(reduce: str) -> Rule:
    """−Σ x = Σ (−x) (and the mean's), in floating point: the same value but for the sign of a zero
    result (−(1 + −1) is −0.0, −1 + 1 is +0.0); the negation then fuses into the expression the
    reduction reads instead of being a kernel over its result (a loss's leading minus). Integers
    keep their order: −x wraps at the type's minimum before a wider sum or mean would."""
    kd, sx = Expr("kd"), Expr("sx")
    return Rule(f"negation-into-{reduce}", f"−{reduce}(x) = {reduce}(−x)",
                lhs=t.neg(t.term(reduce, x, axes=axes, keepdims=kd), of=T),
                rhs=t.term(reduce, t.neg(x, of=(sx, dx)), axes=axes, keepdims=kd, of=T),
                when=("(= sx (shp x))", "(= dx (dt x))", *(f'(!= dx "{kind}")' for kind in NOT_FLOATS)),
                example=_of_a_product(lambda v, axis: -getattr(op, reduce)(v, axis=axis)))


RULES += tuple(_negation_into(reduce) for reduce in ("sum", "mean"))


def _reduced_twice(outer: str, inner: str) -> Rule:
    """A reduction of a matrix's per-row reductions is one reduction over the matrix (a loss averaged
    over its rows): Σ_i Σ_j x = Σ x, mean_i mean_j x = mean x, and mean_i Σ_j x = mean (x · n_j)
    where the row length n_j is exact in x's dtype (float32 and wider), in floating point (the order
    of the additions is the kernel's, as in any reduction)."""
    both = Expr("(vec-of 0 1)")
    inner_type = (Expr("(vec-of (vec-get sx 0))"), d)
    exact_width = ()
    if (outer, inner) == ("mean", "sum"):        # n_j, a constant of x's dtype: exact in float32 and wider
        exact_width = tuple(f'(!= d "{narrow}")' for narrow in ("bfloat16", *NARROW_RANGE_FLOATS))
        width = t.constant(value=Expr("(to-f64 (vec-get sx 1))"), dtype=d, of=((), d))
        reduced = t.mean(t.mul(x, width, of=(Expr("sx"), d)), axes=both, keepdims=False, of=T)
    else:
        reduced = t.term(outer, x, axes=both, keepdims=False, of=T)
    return Rule(f"{outer}-of-row-{inner}s", f"{outer}_i {inner}_j x_ij = one reduction over x",
                lhs=t.term(outer, t.term(inner, x, axes=Expr("(vec-of 1)"), keepdims=False, of=inner_type),
                           axes=Expr("(vec-of 0)"), keepdims=False, of=T),
                rhs=reduced,
                when=("(= sx (shp x))", "(= (vec-length sx) 2)", "(= (dt x) d)",
                      *(f'(!= d "{kind}")' for kind in NOT_FLOATS), *exact_width),
                example=_of_a_product(lambda v, _: getattr(op, outer)(getattr(op, inner)(v, axis=-1))))


RULES += tuple(_reduced_twice(outer, inner) for outer, inner in (("sum", "sum"), ("mean", "mean"), ("mean", "sum")))

ALGEBRA = Ruleset("algebra", RULES + kernel_forms.RULES + masks.RULES + norm_forms.RULES + promotions.RULES
                  + activation_forms.RULES + selections.RULES + logsumexp_forms.RULES + kept_dims.RULES,
                  doc="scalars, divisions, transposes, flips, softmax and logsumexp forms, reductions with and without "
                      "kept dims, casts, masks in one form, forms the kernels take, weighted norms, GELUs and type "
                      "promotions written out")
