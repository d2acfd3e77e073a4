"""A small builder for egglog terms over our constructors, so rules read like the math.

    t = TermBuilder()
    a, b, s = t.vars("a b s")
    t.matmul(t.mul(a, t.constant(value=s)), b)     # (Matmul (Mul a (Constant w0 s w1 w2) w3 w4) b w5 w6 w7)
    t.mul(a, b, of=("s", "d"))                     # a term of shape s and dtype d

Attributes and the type (`of=(shape, dtype)`) left out of a pattern become fresh wildcards; in a
rule's right-hand side they must be given. Attribute values are Python values (encoded like the
encoder does), variables, or raw egglog expressions (`Expr("(/ 1.0 c)")`).
"""

from __future__ import annotations

import difflib
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.opdef import OpDef
from tessera_rw.algebra.trace import trace
from tessera_rw.rules.schema import codec, constructor_name


@dataclass(frozen=True)
class Expr:
    """Raw egglog text: a term, a variable or an expression over them."""
    text: str

    def __str__(self) -> str:
        return self.text


class TermBuilder:
    """`t.<op>(*operands, **attrs, of=(shape, dtype))` builds the egglog text of a term; `of` names its
    type (pattern variables or literals), which every right-hand-side term needs."""

    # wildcard names are unique across builders: a rule may take its two sides from two builders,
    # and a name shared by chance would bind the right side's open type to the left side's
    _fresh = itertools.count()

    def __init__(self, extra_ops: tuple[OpDef, ...] = ()) -> None:
        """`extra_ops`: ops declared by a plugin, usable in its patterns before they are registered."""
        self._extra = {op.name: op for op in extra_ops}

    def vars(self, names: str) -> list[Expr]:
        return [Expr(n) for n in names.split()]

    def wildcard(self) -> Expr:
        return Expr(f"w{next(self._fresh)}")

    def _value(self, op: str, attr: str, value: Any) -> str:
        if isinstance(value, Expr):
            return value.text
        return codec(op, attr).encode(value)

    def term(self, op: str, *operands: Expr, of: tuple[Any, Any] = (None, None), **attrs: Any) -> Expr:
        """`of=(shape, dtype)` is the term's type; attributes go by name (reshape's `shape=`...)."""
        shape, dtype = of
        opdef = self._extra.get(op) or OPS.get(op)
        if opdef is None:
            raise TesseraError(unknown_pattern_op(op, (*OPS, *self._extra)))
        unknown = set(attrs) - set(opdef.attr_names)
        if unknown:
            raise TesseraError(f"pattern gives {op} attributes {sorted(unknown)}; it has {opdef.attr_names}")
        parts = [constructor_name(opdef, len(operands)), *(o.text for o in operands)]
        for attr in opdef.attr_names:
            parts.append(self._value(op, attr, attrs[attr]) if attr in attrs else self.wildcard().text)
        parts.append(shape.text if isinstance(shape, Expr) else self.wildcard().text if shape is None
                     else codec("input", "shape").encode(shape))
        parts.append(dtype.text if isinstance(dtype, Expr) else self.wildcard().text if dtype is None
                     else codec("input", "dtype").encode(dtype))
        return Expr("(" + " ".join(parts) + ")")

    def traced(self, fn: Callable[..., Any], *operands: Expr, dtype: Expr, of: tuple[Any, Any] = (None, None)) -> Expr:
        """The term `fn(*operands)` builds, as tracing it records the ops: a rule then matches a
        program built by the same function (a VJP, say) without spelling its ops out again.

        Every float term, constants included, gets the dtype `dtype` (the operands are traced as
        float32 scalars); other dtypes (a comparison's bool) stay as traced; shapes are left open but
        for the result's, `of`."""
        params = list(inspect.signature(fn).parameters)[:len(operands)]
        graph = trace(fn, {name: TensorType((), DType.float32) for name in params}, {}).graph
        terms: dict[Node, Expr] = dict(zip(graph.inputs, operands))

        def typed(value: Any) -> Any:
            return dtype if value is DType.float32 else value

        for node in graph.nodes:
            if node not in terms:
                attrs = {name: typed(value) for name, value in node.attrs}
                node_of = of if node is graph.outputs[0] else (None, typed(node.dtype))
                terms[node] = self.term(node.op, *(terms[a] for a in node.args), of=node_of, **attrs)
        return terms[graph.outputs[0]]

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)
        if op not in OPS and op not in self._extra:
            raise AttributeError(unknown_pattern_op(op, (*OPS, *self._extra)))
        return lambda *operands, **kw: self.term(op, *operands, **kw)


# numpy's names of the ops whose graph names are short (op.multiply applies "mul")
NUMPY_NAMES = {"multiply": "mul", "subtract": "sub", "divide": "div", "negative": "neg", "power": "pow",
               "equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt",
               "greater_equal": "ge", "true_divide": "div"}


def unknown_pattern_op(name: str, known: Iterable[str]) -> str:
    """What a pattern naming an op that does not exist is told: the graph's name for a numpy name,
    else the closest names.

    >>> unknown_pattern_op("multiply", ["mul", "add"])
    "pattern op 'multiply' is not an op: patterns use the graph's op names, here 'mul'"
    """
    if name in NUMPY_NAMES:
        return f"pattern op {name!r} is not an op: patterns use the graph's op names, here {NUMPY_NAMES[name]!r}"
    close = difflib.get_close_matches(name, list(known), n=3)
    return f"pattern op {name!r} is not an op" + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                                                  ": `tessera-rewrite rules --ops` lists the ops; a plugin's own "
                                                  "op is named once its builder has it: TermBuilder(extra_ops="
                                                  "(its OpDef,))")
