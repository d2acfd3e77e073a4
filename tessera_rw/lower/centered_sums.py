"""Sums that add up deviations from a mean over the same axes, which are zero, left out.

Σ_A c · (x − mean_A(x)) = c · (Σ_A x − n · mean_A(x)) = 0 for any c constant along the axes A. The
gradient of a variance, (x − μ)² averaged, sends this term to μ's gradient: a batch norm's
backward sums g·(x − μ) over (N, H, W) for each channel, a pass over x whose result is zero up
to rounding and whose only effect is to make dx wait for the sums before it (the multi_reduction of
the others cannot take it in, as it reads one of theirs). Each sum (or mean) of an expression that
is, among the terms it adds, such a product leaves that term out; where nothing else is left, the
reduction stays as it is.

>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x, g, c = (make_input(n, s, DType.float32) for n, s in (("x", (8, 4)), ("g", (8, 4)), ("c", (1, 4))))
>>> mu = make("mean", x, axes=(0,), keepdims=True)
>>> total = make("fused_reduction", g, c, x, mu, expr="add($0,mul($1,sub($2,$3)))", reduce="sum", axes=(0,),
...             keepdims=False)
>>> [(n.op, n.attr_map.get("expr")) for n in without_centered_terms(Graph("g", (x, g, c), (total,))).nodes][-1]
('fused_reduction', '$0')
"""

from __future__ import annotations

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import expr_leaves, parse_expr, respelled, spell_expr
from tessera_rw.lower.expression_spelling import expression_tree, is_elementwise, values_of
from tessera_rw.lower.output_groups import with_replacements

SUMMED = ("sum", "mean")


def without_centered_terms(graph: Graph) -> Graph:
    """`graph` with each sum or mean of an expression left without its terms that are zero."""
    replaced: dict[Node, Node] = {}
    for node in graph.nodes:
        if node.op == "fused_reduction" and node.attr_map["reduce"] in SUMMED:
            if (kept := _kept(node)) is not None:
                replaced[node] = kept
    return with_replacements(graph, replaced) if replaced else graph


def _kept(node: Node) -> Node | None:
    """`node` without its centered terms, None where it has none (or nothing else)."""
    shape = values_of(node).shape
    axes = tuple(sorted(a % len(shape) for a in node.attr_map["axes"]))
    terms = _terms(parse_expr(node.attr_map["expr"]), 1)
    kept = [(sign, t) for sign, t in terms if not _centered(t, node.args, axes, shape)]
    if len(kept) == len(terms) or not kept:
        return None
    sign, tree = kept[0]
    tree = tree if sign > 0 else ("neg", tree)
    for sign, term in kept[1:]:
        tree = ("add" if sign > 0 else "sub", tree, term)
    used = sorted(expr_leaves(tree))
    tree = respelled(tree, used.index)
    try:
        smaller = make("fused_reduction", *(node.args[i] for i in used), **(node.attr_map | {"expr": spell_expr(tree)}))
    except TesseraError:
        return None
    # the same type of result over the same values: terms of per-channel constants alone would
    # sum one value per channel, not N·H·W of them
    return smaller if smaller.type == node.type and values_of(smaller).shape == shape else None


def _terms(tree, sign: int) -> list[tuple[int, object]]:
    """The terms an expression adds up, each with its sign."""
    if isinstance(tree, tuple) and tree[0] == "add":
        return _terms(tree[1], sign) + _terms(tree[2], sign)
    if isinstance(tree, tuple) and tree[0] == "sub":
        return _terms(tree[1], sign) + _terms(tree[2], -sign)
    if isinstance(tree, tuple) and tree[0] == "neg":
        return _terms(tree[1], -sign)
    return [(sign, tree)]


def _factors(tree) -> list[tuple[object, bool]]:
    """The factors a term multiplies, each with whether it divides."""
    if isinstance(tree, tuple) and tree[0] == "mul":
        return _factors(tree[1]) + _factors(tree[2])
    if isinstance(tree, tuple) and tree[0] == "div":
        return _factors(tree[1]) + [(tree[2], True)]
    if isinstance(tree, tuple) and tree[0] == "neg":
        return _factors(tree[1])
    return [(tree, False)]


def _centered(term, args: tuple[Node, ...], axes: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether `term` is a product of one deviation x − mean(x) over `axes` and factors constant
    along them (none of which divides the deviation's factor away)."""
    factors = _factors(term)
    deviations = [f for f, divides in factors if not divides and _is_deviation(f, args, axes, shape)]
    if len(deviations) != 1:
        return False
    rest = [f for f, _ in factors if f is not deviations[0]]
    return all(_constant_along(f, args, axes, shape) for f in rest)


def _is_deviation(tree, args: tuple[Node, ...], axes: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether `tree` is v − μ, μ a float32 or float64 mean over `axes` of the values v (of the
    values' shape) that the left side computes: a mean of a tensor, or a fused mean of an
    expression (a 16-bit μ is rounded: v − μ then sums to n times its rounding, not to 0)."""
    if not (isinstance(tree, tuple) and tree[0] == "sub" and isinstance(tree[2], int)):
        return False
    mu = args[tree[2]]
    if mu.op == "reshape" and mu.args[0].op in ("mean", "fused_reduction") and not mu.args[0].attr_map["keepdims"]:
        mu = mu.args[0]
    if mu.op == "mean":
        values = mu.args[0]
    elif mu.op == "fused_reduction" and mu.attr_map["reduce"] == "mean":
        values = _over(parse_expr(mu.attr_map["expr"]), mu.args)
    else:
        return False
    if mu.dtype not in (DType.float32, DType.float64) or _shape_of(mu) != shape:
        return False
    return tuple(sorted(a % len(shape) for a in mu.attr_map["axes"])) == axes and _same(_over(tree[1], args), values)


def _shape_of(mean: Node) -> tuple[int, ...]:
    return values_of(mean).shape if mean.op == "fused_reduction" else mean.args[0].shape


def _over(tree, args: tuple[Node, ...]):
    """An expression with each input the node it reads."""
    return respelled(tree, lambda i: args[i])


def _same(a, b) -> bool:
    """Whether two expressions over nodes compute the same: the same nodes, or the same ops over
    the same (a node that is one elementwise op, or a fused one, read as its expression)."""
    a, b = _opened(a), _opened(b)
    if isinstance(a, Node) or isinstance(b, Node):
        return a is b
    if isinstance(a, tuple) and isinstance(b, tuple):
        return a[0] == b[0] and len(a) == len(b) and all(_same(x, y) for x, y in zip(a[1:], b[1:]))
    return a == b


def _opened(value):
    """A node that is one elementwise op or a fused expression, as that expression over its
    operands; anything else as it is."""
    if isinstance(value, Node) and is_elementwise(value):
        return _over(expression_tree(value), value.args)
    return value


def _constant_along(tree, args: tuple[Node, ...], axes: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether every leaf of `tree` is a constant or broadcast along each of `axes` (its size there 1)."""
    for i in expr_leaves(tree):
        leaf = args[i].shape
        lead = len(shape) - len(leaf)            # numpy broadcasting aligns shapes on the right
        if any(a >= lead and leaf[a - lead] != 1 for a in axes):
            return False
    return True
