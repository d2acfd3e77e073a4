"""How an op call on user values becomes a result: symbolic, placeholder or eager.

- any operand is a SymbolicTensor (inside a trace): the result is a SymbolicTensor; numpy arrays
  met there become inputs the trace captures (algebra/captures.py);
- else any operand is a TensorSpec placeholder: the result is a placeholder of the inferred type;
- else (arrays and scalars): the op runs now and returns an array: on the host by the numpy
  reference, unless the eager runner the package installs (`set_eager_runner`) takes the call, as
  it does for GPU arrays and pinned schedules (it compiles and runs the one-op graph).
Python and numpy scalars take the dtype of the tensors they meet (as torch does), so `x * 0.5`
and `x / np.sqrt(d)` keep x's bfloat16.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import numbers
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tessera_rw.algebra.captures import captured_input
from tessera_rw.algebra.builder import describe_operands, make, make_constant, make_input, user_site
from tessera_rw.algebra.constant_folding import folded
from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import ArgumentError, AttributeValueError, TesseraError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import ArrayLiteral, Node, TensorType
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.schedule_pin import SchedulePin, record_pin
from tessera_rw.algebra.tensor import SymbolicTensor, TensorSpec

# (graph, input values by name, pins) -> the result, or None to leave the call to the numpy reference
EagerRunner = Callable[[Graph, dict[str, Any], tuple[SchedulePin, ...]], Any]
_EAGER_RUNNER: list[EagerRunner] = []

_TRACE_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("tessera_trace_depth", default=0)


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """While active, ops without tensor operands (op.ones, op.arange) build graph nodes."""
    token = _TRACE_DEPTH.set(_TRACE_DEPTH.get() + 1)
    try:
        yield
    finally:
        _TRACE_DEPTH.reset(token)


def is_tracing() -> bool:
    return _TRACE_DEPTH.get() > 0


class Mode(enum.Enum):
    SYMBOLIC = "symbolic"
    PLACEHOLDER = "placeholder"
    EAGER = "eager"


def is_scalar(value: Any) -> bool:
    return isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray)


def type_of(value: Any) -> TensorType | None:
    """The tensor type of an operand, or None for a Python scalar (typed by what it meets)."""
    if isinstance(value, SymbolicTensor):
        return value.node.type
    if isinstance(value, TensorSpec):
        return value.type
    if is_scalar(value):
        return None  # numpy scalars too: np.sqrt(d) must not turn a bf16 graph into float64
    if isinstance(value, np.ma.MaskedArray):
        raise ArgumentError("got a numpy masked array: its mask would be ignored, every value computed on",
                            hint="pass value.filled(fill) for the values to compute on, and the mask "
                                 "(np.ma.getmaskarray(value)) as an argument of its own to use in op.where")
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return TensorType(tuple(value.shape), _dtype_of(value))
    if isinstance(value, (list, tuple)):
        raise ArgumentError(f"got a Python {type(value).__name__} where a tensor was expected",
                            hint="wrap it with numpy.asarray(...) first")
    raise ArgumentError(f"got a {type(value).__name__} where a tensor was expected",
                        hint="pass a numpy array, a CuPy/torch tensor, a scalar or op.tensor(shape, dtype)")


def _dtype_of(value: Any) -> DType:
    dtype = value.dtype
    if hasattr(dtype, "is_floating_point") or type(dtype).__module__.startswith("torch"):
        dtype = str(dtype).removeprefix("torch.")
    return DType.parse(dtype)


def tensor_operand(value: Any) -> Any:
    """A scalar given where an op needs a tensor's shape (reshape, sum, ...) becomes a 0-d array."""
    return np.asarray(value) if is_scalar(value) else value


def mode_of(operands: Sequence[Any]) -> Mode:
    if any(isinstance(v, SymbolicTensor) for v in operands) or is_tracing():
        return Mode.SYMBOLIC
    if any(isinstance(v, TensorSpec) for v in operands):
        return Mode.PLACEHOLDER
    return Mode.EAGER


def scalar_dtype(value: Any, tensor_dtypes: Sequence[DType]) -> DType:
    """A Python scalar's dtype: that of the tensors it meets, widened only across kinds."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return DType.bool  # a condition or mask; arithmetic with it promotes as numpy does
    like = None
    for d in tensor_dtypes:
        like = d if like is None else promote(like, d)
    if isinstance(value, numbers.Integral):
        return like if like not in (None, DType.bool) else DType.int64
    if isinstance(value, numbers.Real):
        return like if like is not None and (like.is_float or like.is_complex) else DType.float32
    return like if like is not None and like.is_complex else DType.complex64


@contextlib.contextmanager
def op_context(op_name: str, operands: Sequence[Any], names: Sequence[str] = ()) -> Iterator[None]:
    """Give a bare TesseraError raised while preparing an op call its op, operands and user line."""
    try:
        yield
    except TesseraError as e:
        types = [t for t in (_safe_type(v) for v in operands) if t is not None]
        raise e.with_context(op=op_name, operands=describe_operands(tuple(names), types),
                             site=user_site()) from None


def is_flag(value: Any) -> bool:
    """Whether `value` says yes or no: True, False, numpy's bools, or 0 and 1 (not a string such as
    "no", which is truthy)."""
    return isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1))


def flag(name: str, value: Any) -> bool:
    """A yes/no attribute (`causal`, `keepdims`) as a bool (`is_flag`); anything else is refused,
    not read as its truth."""
    if is_flag(value):
        return bool(value)
    raise AttributeValueError(f"{name} must be True or False, got {value!r}")


def integer(name: str, value: Any) -> int:
    """An int attribute (a diagonal's offset): an int or numpy int, not a float or a string read as one."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise AttributeValueError(f"{name} must be an int, got {value!r}")


def _safe_type(value: Any) -> TensorType | None:
    try:
        return type_of(value)
    except TesseraError:
        return None


def array_node(value: Any, t: TensorType) -> Node:
    """An array met inside a trace: an input the trace captures (read at each call), or a literal
    copy where no kernel's trace is capturing."""
    captured = captured_input(value, t)
    return captured if captured is not None else make("literal", value=ArrayLiteral(np.asarray(value)), dtype=t.dtype)


def set_eager_runner(runner: EagerRunner) -> None:
    """Install what runs eager calls it wants to (the package's compile-and-run path)."""
    _EAGER_RUNNER[:] = [runner]


def apply(op_name: str, operands: Sequence[Any], tile_shape: tuple[int, ...] | None = None, **attrs: Any) -> Any:
    """Apply op `op_name` to user operands (tensors, arrays, scalars) with normalized attrs;
    `tile_shape` (a parsed tile) pins the schedule of the product's GEMM kernel."""
    names = opdef(op_name).operands
    with op_context(op_name, operands, names):
        types = [type_of(v) for v in operands]
    mode = mode_of(operands)
    tensor_dtypes = [t.dtype for t in types if t is not None]
    feeds: dict[str, Any] = {}
    inputs: list[Node] = []
    nodes = []
    for i, (value, t) in enumerate(zip(operands, types)):
        if t is None:
            with op_context(op_name, operands, names):
                nodes.append(make_constant(value.item() if isinstance(value, np.generic) else value,
                                           scalar_dtype(value, tensor_dtypes)))
        elif isinstance(value, SymbolicTensor):
            nodes.append(value.node)
        elif isinstance(value, TensorSpec):
            if mode is Mode.SYMBOLIC:
                raise ArgumentError(f"{op_name}: a placeholder {value!r} cannot be used inside a traced function",
                                    hint="pass it as an argument of the kernel instead", site=user_site())
            inputs.append(make_input(f"arg{i}", t.shape, t.dtype))
            nodes.append(inputs[-1])
        elif mode is Mode.SYMBOLIC:
            nodes.append(array_node(value, t))
        else:
            inputs.append(make_input(f"arg{i}", t.shape, t.dtype))
            nodes.append(inputs[-1])
            feeds[f"arg{i}"] = value
    node = make(op_name, *nodes, **attrs)
    if mode is Mode.SYMBOLIC:
        node = folded(node)
    pins = () if tile_shape is None else (SchedulePin.of([a.type for a in node.args], tile_shape, user_site()),)
    if mode is Mode.SYMBOLIC:
        for pin in pins:
            record_pin(pin)
        return SymbolicTensor(node)
    if mode is Mode.PLACEHOLDER:
        return TensorSpec(node.shape, node.dtype)
    graph = Graph(op_name, tuple(inputs), (node,))
    if _EAGER_RUNNER:
        result = _EAGER_RUNNER[0](graph, feeds, pins)
        if result is not None:
            return result
    return evaluate(graph, {n: np.asarray(v) for n, v in feeds.items()})[0]
