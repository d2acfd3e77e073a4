"""Boolean masks in one form: part of the `algebra` ruleset.

A mask is written as what to keep, where(keep, x, fill), or as what to drop, torch's
masked_fill(drop, fill) = where(drop, fill, x). Swapping a where's branches under the negated
condition turns the one into the other, and the negation then folds into the condition:

    where(m, a, b) = where(¬m, b, a)        ¬¬m = m        ¬(x = y) = (x ≠ y)        ¬(x ≠ y) = (x = y)
    ¬triu(1, k) = tril(1, k − 1)            (the causal mask written as the keys to drop)
    tril(1, k) ≠ 0 = tril(True, k)          (a float causal mask compared)
    triu(full(c), k) = where(tril(True, k − 1), 0, c)     (an additive mask, as transformers build it)
    cast(where(m, 0, −∞), f) = where(m, 0, −∞) in f        (an additive mask cast to the scores' type)
    tril(full(c, N×N), k)[:a, :b] = tril(full(c, a×b), k)  (a mask buffer cut to the sequence)
    reshape(x, (1, 1, n, p))[:, :, :a, :b] = reshape(x[:a, :b], (1, 1, a, b))
    reshape(x, (1, 1, n, p)) = c  =  reshape(x = c, (1, 1, n, p))    (and ≠)

so where(triu(ones, 1), −∞, s), where(tril(ones) == 0, −∞, s), where(bias == 0, −∞, s),
nanoGPT's where(tril(ones(N, N)).view(1, 1, N, N)[:, :, :T, :T] == 0, −∞, s) and
where(~keep, −∞, s) reach the where(keep, s, −∞) the attention rules fuse. An upcast between the
mask and the scores moves out: where(m, cast(x, f), −∞) = cast(where(m, x, −∞), f), exact where x's
type has a −∞ (every float type but float8_e4m3).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
a, b, m, x, y, k, fs, ms, s, d, dx = t.vars("a b m x y k fs ms s d dx")
T = (s, d)
BOOL = (s, "bool")
# the dtypes with no −∞ of their own (e4m3 has no infinity; −∞ as a bool is True), which an upcast's
# mask cannot move before
WITHOUT_INFINITY = ("bool", "int32", "int64", "float8_e4m3", "complex64", "complex128")


def _bools(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.random(shape) > 0.5


def _swap_example(rng: np.random.Generator):
    n, p = (int(v) for v in rng.integers(1, 7, size=2))
    return (lambda keep, a, b: op.where(keep, a, b) * 2.0), {"keep": _bools(rng, n, p), "a": rand(rng, n, p),
                                                          "b": rand(rng, 1, p)}


def _triangle_example(rng: np.random.Generator):
    n, k0 = int(rng.integers(1, 7)), int(rng.integers(-2, 3))
    return (lambda x: op.where(~op.triu(op.ones((n, n), "bool"), k=k0), x, -1.0)), {"x": rand(rng, n, n)}


def _masked(rng: np.random.Generator, body, dtype=np.float32):
    """`body(keep, x)` on a random bool mask and values of one random shape."""
    n, p = (int(v) for v in rng.integers(1, 7, size=2))
    return body, {"keep": _bools(rng, n, p), "x": rand(rng, n, p, dtype=dtype)}


def _float_tril_example(rng: np.random.Generator):
    n, k0 = int(rng.integers(1, 7)), int(rng.integers(-2, 3))
    return (lambda x: op.where(op.tril(op.ones((n, n)), k=k0) != 0, x, -1.0)), {"x": rand(rng, n, n)}


def _additive_triangle_example(rng: np.random.Generator):
    n, k0 = int(rng.integers(1, 7)), int(rng.integers(-2, 3))
    fill = float(rng.choice([-np.inf, -1e9, 2.5]))
    return (lambda x: x + op.triu(op.full((n, n), fill), k=k0)), {"x": rand(rng, n, n)}


def _corner_example(lifted: bool):
    """nanoGPT's mask buffer, tril(ones(N, N)).view(1, 1, N, N), cut to the sequence's T < N (or
    the buffer left 2-D)."""
    def example(rng: np.random.Generator):
        n, k0 = int(rng.integers(2, 8)), int(rng.integers(-2, 3))
        cut = int(rng.integers(1, n))

        def body(x):
            buffer = op.tril(op.ones((n, n)), k=k0)
            corner = op.reshape(buffer, (1, 1, n, n))[:, :, :cut, :cut] if lifted else buffer[:cut, :cut]
            return op.where(corner == 0, -np.inf, x)
        return body, {"x": rand(rng, 2, 3, cut, cut)}
    return example


def _lifted_comparison_example(name: str):
    def example(rng: np.random.Generator):
        n, p = (int(v) for v in rng.integers(1, 7, size=2))
        x = rng.integers(0, 3, size=(n, p)).astype(np.float32)
        compare = op.equal if name == "eq" else op.not_equal
        return (lambda x, y: op.where(compare(op.reshape(x, (1, 1, n, p)), 1.0), y, 0.0)), \
            {"x": x, "y": rand(rng, 2, 1, n, p)}
    return example


def _comparison_example(negated: str):
    def example(rng: np.random.Generator):
        n = int(rng.integers(1, 7))
        x, y = rng.integers(0, 3, size=(n, n)).astype(np.float32), rng.integers(0, 3, size=(1, n)).astype(np.float32)
        compare = op.equal if negated == "eq" else op.not_equal
        return (lambda x, y, z: op.where(~compare(x, y), z, 0.0)), {"x": x, "y": y, "z": rand(rng, n, n)}
    return example


RULES = (
    Rule("where-negated", "where(m, a, b) = where(¬m, b, a)",
         lhs=t.where(m, a, b, of=T), rhs=t.where(t.logical_not(m, of=(ms, "bool")), b, a, of=T),
         when=("(= ms (shp m))",), example=_swap_example),
    Rule("not-not", "¬¬m = m", lhs=t.logical_not(t.logical_not(m), of=BOOL), rhs=m,
         example=lambda rng: _masked(rng, lambda keep, x: op.where(~~keep, x, 0.0))),
    Rule("not-equal", "¬(x = y) = (x ≠ y)", lhs=t.logical_not(t.eq(x, y), of=BOOL), rhs=t.ne(x, y, of=BOOL),
         example=_comparison_example("eq")),
    Rule("not-not-equal", "¬(x ≠ y) = (x = y)", lhs=t.logical_not(t.ne(x, y), of=BOOL), rhs=t.eq(x, y, of=BOOL),
         example=_comparison_example("ne")),
    Rule("not-triu-is-tril", "¬triu(1, k) = tril(1, k − 1)",
         lhs=t.logical_not(t.triu(t.full(shape=fs, value=True, dtype="bool"), k=k), of=BOOL),
         rhs=t.tril(t.full(shape=fs, value=True, dtype="bool", of=(fs, "bool")), k=Expr("(- k 1)"), of=BOOL),
         example=_triangle_example),
    Rule("nonzero-of-tril-of-ones", "tril(1, k) ≠ 0 = tril(True, k) (a float tril mask made bool)",
         lhs=t.ne(t.tril(t.full(shape=fs, value=Expr("c"), dtype=Expr("fd")), k=k),
                  t.constant(value=0.0, dtype=Expr("fd")), of=BOOL),
         rhs=t.tril(t.full(shape=fs, value=True, dtype="bool", of=(fs, "bool")), k=k, of=BOOL),
         when=("(= c 1.0)", "(= s fs)"),
         example=_float_tril_example),
    Rule("triu-of-full-is-where", "triu(full(c), k) = where(tril(True, k − 1), 0, c)",
         lhs=t.triu(t.full(shape=fs, value=Expr("c"), dtype=d), k=k, of=T),
         rhs=t.where(t.tril(t.full(shape=fs, value=True, dtype="bool", of=(fs, "bool")), k=Expr("(- k 1)"),
                            of=(fs, "bool")),
                     t.constant(value=0.0, dtype=d, of=((), d)), t.constant(value=Expr("c"), dtype=d, of=((), d)),
                     of=T),
         when=('(!= d "bool")', '(!= d "complex64")', '(!= d "complex128")'),
         example=_additive_triangle_example),
    Rule("corner-of-a-triangle", "tril(full(c, N×M), k)[:a, :b] = tril(full(c, a×b), k) (a mask buffer cut to T)",
         lhs=t.slice(t.tril(t.full(shape=fs, value=Expr("c"), dtype=d), k=k), starts=Expr("(vec-of 0 0)"),
                     stops=Expr("st"), steps=Expr("(vec-of 1 1)"), of=T),
         rhs=t.tril(t.full(shape=Expr("st"), value=Expr("c"), dtype=d, of=T), k=k, of=T),
         when=("(= (vec-length fs) 2)",),
         example=_corner_example(lifted=False)),
    *(Rule(f"{name}-of-a-lifted-mask",
           f"reshape(x, (1, 1) + shape(x)) {sign} c = reshape(x {sign} c, (1, 1) + shape(x))",
           lhs=t.term(name, t.reshape(x, shape=Expr("rs")), Expr("cst"), of=BOOL),
           rhs=t.reshape(t.term(name, x, Expr("cst"), of=(Expr("sx"), "bool")), shape=Expr("rs"), of=BOOL),
           when=("(= sx (shp x))", "(= (vec-length sx) 2)", "(= (shp cst) (vec-empty))",
                 "(= rs (vec-of 1 1 (vec-get sx 0) (vec-get sx 1)))"),
           example=_lifted_comparison_example(name))
      for name, sign in (("eq", "="), ("ne", "≠"))),
    Rule("corner-of-a-lifted-mask", "reshape(x, (1, 1) + shape(x))[:, :, :a, :b] = reshape(x[:a, :b], (1, 1, a, b))",
         lhs=t.slice(t.reshape(x, shape=Expr("rs")), starts=Expr("(vec-of 0 0 0 0)"), stops=Expr("st"),
                     steps=Expr("(vec-of 1 1 1 1)"), of=T),
         rhs=t.reshape(t.slice(x, starts=Expr("(vec-of 0 0)"), stops=Expr("(vec-of (vec-get st 2) (vec-get st 3))"),
                               steps=Expr("(vec-of 1 1)"), of=(Expr("(vec-of (vec-get st 2) (vec-get st 3))"), d)),
                       shape=s, of=T),
         when=("(= sx (shp x))", "(= (vec-length sx) 2)", "(= rs (vec-of 1 1 (vec-get sx 0) (vec-get sx 1)))",
               "(= (vec-get st 0) 1)", "(= (vec-get st 1) 1)"),
         example=_corner_example(lifted=True)),
    Rule("cast-of-an-additive-mask",
         "cast(where(m, 0, −∞), f) = where(m, 0, −∞) in f (a causal mask's .type_as)",
         lhs=t.cast(t.where(m, t.constant(value=0.0, dtype=dx), t.constant(value=float("-inf"), dtype=dx)), dtype=d,
                    of=T),
         rhs=t.where(m, t.constant(value=0.0, dtype=d, of=((), d)),
                     t.constant(value=float("-inf"), dtype=d, of=((), d)), of=T),
         when=tuple(f'(!= d "{t}")' for t in WITHOUT_INFINITY),
         example=lambda rng: _masked(rng, lambda keep, x: x + op.cast(op.where(keep, 0.0, -np.inf), "bfloat16"),
                                     ml_dtypes.bfloat16)),
    Rule("upcast-after-mask", "where(m, cast(x, f), −∞) = cast(where(m, x, −∞), f)",
         lhs=t.where(m, t.cast(x, dtype=d), t.constant(value=float("-inf"), dtype=d), of=T),
         rhs=t.cast(t.where(m, x, t.constant(value=float("-inf"), dtype=dx, of=((), dx)), of=(s, dx)), dtype=d, of=T),
         when=("(= dx (dt x))", "(= (shp x) s)", *(f'(!= dx "{t}")' for t in WITHOUT_INFINITY)),
         example=lambda rng: _masked(rng, lambda keep, x: op.where(keep, op.cast(x, "float32"), -np.inf) * 2.0,
                                     np.float16)),
)
