"""An op's VJP against central finite differences of its numpy reference, in float64.

For random operand values x, an output cotangent R and a direction δ, reverse mode must agree with

    d/dε  Re Σ conj(R) · op(x + ε δ)  ≈  (L(x + ε δ) − L(x − ε δ)) / 2ε,  ε = 1e-6

relative to Σ |cotangent| · |δ|. The tests run this on every built-in op; `tessera-rewrite rules
--check` runs it on a plugin's ops.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> x = TensorType((3, 4), DType.float64)
>>> vjp_disagreement("tanh", (x,)) < VJP_TOLERANCE
True
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tessera_rw.algebra.api import tracing
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.tensor import SymbolicTensor

EPS = 1e-6
VJP_TOLERANCE = 1e-6

Sampler = Callable[[np.random.Generator, tuple[int, ...], DType], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    """Standard normal values (complex for a complex dtype; a bool mask keeps 60%)."""
    if dtype is DType.bool:
        return rng.random(shape) < 0.6
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy)


def vjp_graph(op: str, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> tuple[Graph, tuple[int, ...]]:
    """Inputs x0.. (the operands) and g (the output cotangent); outputs: the differentiable
    operands' cotangents, by their positions. A cotangent missing or of the wrong type is an
    AssertionError naming the op."""
    inputs = tuple(make_input(f"x{i}", o.shape, o.dtype) for i, o in enumerate(operand_types))
    node = make(op, *inputs, **attrs)
    g = make_input("g", node.shape, node.dtype)
    with tracing():
        cts = opdef(op).vjp(SymbolicTensor(g), SymbolicTensor(node), *map(SymbolicTensor, inputs), **node.attr_map)
    if len(cts) != len(inputs):               # raised, not asserted: python -O keeps the check
        raise AssertionError(f"{op}: {len(cts)} cotangents for {len(inputs)} operands")
    wanted = tuple(i for i, o in enumerate(operand_types) if o.dtype.is_float or o.dtype.is_complex)
    for i, ct in enumerate(cts):
        if i in wanted and ct is None:
            raise AssertionError(f"{op}: no cotangent for operand {i}")
        if i in wanted and ct.node.type != inputs[i].type:
            raise AssertionError(f"{op}: operand {i} is {inputs[i].type}, cotangent {ct.node.type}")
    return Graph(f"vjp_{op}", inputs + (g,), tuple(cts[i].node for i in wanted)), wanted


def vjp_disagreement(op: str, operand_types: Sequence[TensorType], attrs: dict[str, Any] | None = None,
                     sample: Sampler | Sequence[Sampler] = normal, rng: np.random.Generator | None = None,
                     directions: int = 2) -> float:
    """The largest relative disagreement between `op`'s VJP and finite differences of its reference
    along random directions (see the module); operand types should be float64 (or complex128)."""
    rng = rng or np.random.default_rng(0)
    attrs = attrs or {}
    samplers = sample if isinstance(sample, (tuple, list)) else [sample] * len(operand_types)
    values = [s(rng, o.shape, o.dtype) for s, o in zip(samplers, operand_types)]
    graph, wanted = vjp_graph(op, operand_types, attrs)
    out_type = graph.inputs[-1].type
    r = normal(rng, out_type.shape, out_type.dtype)
    cts = evaluate(graph, {f"x{i}": v for i, v in enumerate(values)} | {"g": r})

    def loss(vals) -> float:
        y = np.asarray(opdef(op).reference(*vals, **attrs))
        return float(np.real(np.sum(np.conj(r) * y)))

    worst = 0.0
    for _ in range(directions):
        dirs = {i: normal(rng, operand_types[i].shape, operand_types[i].dtype) for i in wanted}
        plus = [v + EPS * dirs[i] if i in dirs else v for i, v in enumerate(values)]
        minus = [v - EPS * dirs[i] if i in dirs else v for i, v in enumerate(values)]
        numeric = (loss(plus) - loss(minus)) / (2 * EPS)
        analytic = sum(float(np.real(np.sum(np.conj(ct) * dirs[i]))) for i, ct in zip(wanted, cts))
        scale = sum(float(np.sum(np.abs(ct) * np.abs(dirs[i]))) for i, ct in zip(wanted, cts))
        worst = max(worst, abs(numeric - analytic) / max(scale, 1e-12))
    return worst


def in_float64(t: TensorType) -> TensorType:
    """The type finite differences need: float operands in float64, complex in complex128."""
    if t.dtype.is_complex:
        return TensorType(t.shape, DType.complex128)
    return TensorType(t.shape, DType.float64) if t.dtype.is_float else t
