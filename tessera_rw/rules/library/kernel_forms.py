"""Forms the GPU templates take, for ops written otherwise: part of the `algebra` ruleset.

- A softmax (or log-softmax) over an axis other than the last is one over the last axis between
  two transposes that swap it there: the row-wise kernels walk the last axis, and the copies are
  what a GPU plan pays for the other layout.
- A product with a vector operand is the product with that vector as a one-row (or one-column)
  matrix, its result reshaped back: the GEMM template takes rank ≥ 2, and the reshapes are views.
"""

from __future__ import annotations


from tessera_rw.algebra import api as op
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
a, b, x, acc, ax, s, d = t.vars("a b x acc ax s d")
T = (s, d)


def _swap_to_last(norm: str) -> Rule:
    """`norm`(x, ax) = `norm`(x with ax and the last axis swapped, last), swapped back."""
    swapped = Expr("(vec-set (vec-set s ax (vec-get s last)) last (vec-get s ax))")
    inner = t.transpose(x, axes=Expr("p"), of=(swapped, d))
    term = getattr(t, norm)
    return Rule(f"{norm.replace('_', '-')}-on-the-last-axis",
                f"{norm}(x, k) = {norm}(x with k and the last axis swapped, last), swapped back",
                lhs=term(x, axis=ax, of=T),
                rhs=t.transpose(term(inner, axis=Expr("last"), of=(swapped, d)), axes=Expr("p"), of=T),
                when=("(= last (- (vec-length s) 1))", "(< ax last)", "(= ip (identity-perm (vec-length s)))",
                      "(= p (vec-set (vec-set ip ax last) last ax))", "(= (dt x) d)"),
                example=lambda rng: ((lambda x: getattr(op, norm)(x, axis=int(rng.integers(0, 2)))),
                                     {"x": rand(rng, 0, 0, 0)}))


def _vector_products() -> tuple[Rule, ...]:
    row = t.reshape(a, shape=Expr("(vec-of 1 n)"), of=(Expr("(vec-of 1 n)"), Expr("da")))
    column = t.reshape(b, shape=Expr("(vec-of n 1)"), of=(Expr("(vec-of n 1)"), Expr("db")))
    with_row = Expr("(vec-set (vec-push s (vec-get s (- (vec-length s) 1))) (- (vec-length s) 1) 1)")  # (.., 1, m)
    with_column = Expr("(vec-push s 1)")                                                               # (.., m, 1)
    shapes = ("(= a_s (shp a))", "(= b_s (shp b))", "(= da (dt a))", "(= db (dt b))")

    def example(a_shape, b_shape):
        """A product of operands of these shapes, `n` the vector's length (one random length for
        both), 0 any dim."""
        def inputs(rng):
            n = int(rng.integers(1, 9))
            shaped = {"a": [n if d == "n" else d for d in a_shape], "b": [n if d == "n" else d for d in b_shape]}
            return (lambda a, b: a @ b), {k: rand(rng, *dims) for k, dims in shaped.items()}
        return inputs
    n = "n"
    return (
        Rule("vector-times-matrix-as-a-row", "v A = (v as a 1×n matrix) A, reshaped",
             lhs=t.matmul(a, b, accum_dtype=acc, of=T),
             rhs=t.reshape(t.matmul(row, b, accum_dtype=acc, of=(with_row, d)), shape=s, of=T),
             when=(*shapes, "(= (vec-length a_s) 1)", "(>= (vec-length b_s) 2)", "(= n (vec-get a_s 0))"),
             example=example((n,), (0, n, 0))),
        Rule("matrix-times-vector-as-a-column", "A v = A (v as an n×1 matrix), reshaped",
             lhs=t.matmul(a, b, accum_dtype=acc, of=T),
             rhs=t.reshape(t.matmul(a, column, accum_dtype=acc, of=(with_column, d)), shape=s, of=T),
             when=(*shapes, "(= (vec-length b_s) 1)", "(>= (vec-length a_s) 2)", "(= n (vec-get b_s 0))"),
             example=example((0, 0, n), (n,))),
        Rule("dot-as-a-one-by-one-product", "u · v = (u as 1×n)(v as n×1), reshaped to a scalar",
             lhs=t.matmul(a, b, accum_dtype=acc, of=T),
             rhs=t.reshape(t.matmul(row, column, accum_dtype=acc, of=(Expr("(vec-of 1 1)"), d)), shape=s, of=T),
             when=(*shapes, "(= (vec-length a_s) 1)", "(= (vec-length b_s) 1)", "(= n (vec-get a_s 0))"),
             example=example((n,), (n,))),
    )


RULES = (_swap_to_last("softmax"), _swap_to_last("log_softmax"), *_vector_products())
