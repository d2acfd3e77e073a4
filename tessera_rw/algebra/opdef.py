"""An op is declared once, here, as an OpDef; everything else is derived from the declaration.

The shape rule, numpy reference and FLOP count take the operands positionally and the attributes
as keywords, so a declaration reads like the op's signature:

>>> from tessera_rw.algebra.ops import OPS
>>> OPS["matmul"].operands
('a', 'b')
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.node import TensorType


class OpKind(enum.Enum):
    """How an op moves data; lowering and the cost model group ops by it."""
    SOURCE = "source"              # graph inputs, constants, literals, creation ops
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"   # row-wise softmax / layernorm / rmsnorm
    LAYOUT = "layout"              # transposes, reshapes, slices, pads: no arithmetic
    MATMUL = "matmul"
    CONV = "conv"
    SPECTRAL = "spectral"
    ATTENTION = "attention"


InferFn = Callable[..., TensorType]
ReferenceFn = Callable[..., np.ndarray]
FlopsFn = Callable[..., int]
# vjp(g, out, *operands, **attrs) -> one cotangent per operand (None where none flows), given the
# output cotangent g, the result and the operands as symbolic tensors (see algebra.autodiff).
VjpFn = Callable[..., tuple]


def no_flops(out: TensorType, *operands: TensorType, **attrs) -> int:
    return 0


@dataclass(frozen=True, eq=False)
class OpDef:
    """One op: its operands, shape/dtype rule (which is also its verifier), reference and cost.

    `infer(*operand_types, **attrs)` returns the result type or raises a TesseraError naming what
    is wrong; `reference(*arrays, **attrs)` computes the result on the host from arrays already in
    their compute type (float32 for 16- and 8-bit floats); `flops(out, *operand_types, **attrs)`
    counts a multiply-add as 2. `variadic` ops (concatenate) take any number of operands.
    `exact` ops only move or select values, so they run in the storage type. `vjp` is the op's
    reverse-mode rule, from which `op.grad` builds backward graphs; None: the op declares none.
    """
    name: str
    operands: tuple[str, ...]
    kind: OpKind
    infer: InferFn
    reference: ReferenceFn
    flops: FlopsFn = no_flops
    variadic: bool = False
    exact: bool = False
    doc: str = ""
    vjp: VjpFn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ArgumentError(f"op name {self.name!r} is not a Python identifier, as op.apply and pattern "
                                "builders need", hint="use letters, digits and _, not starting with a digit: "
                                                      "'fused_swish'")

    @cached_property
    def attr_names(self) -> tuple[str, ...]:
        """The attributes the shape rule takes after its operands, sorted by name."""
        params = list(inspect.signature(self.infer).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        attrs = positional[len(self.operands):] if not self.variadic else []
        attrs += [p for p in params if p.kind is p.KEYWORD_ONLY]
        return tuple(sorted(p.name for p in attrs))

    @cached_property
    def attr_defaults(self) -> dict[str, object]:
        """The attributes the shape rule gives a default (gemm's `trans_a=False`): a node or kernel
        built without them gets the default, so equal ops are spelled, hashed and encoded alike."""
        params = inspect.signature(self.infer).parameters.values()
        return {p.name: p.default for p in params if p.name in self.attr_names and p.default is not p.empty}

    def __repr__(self) -> str:
        return f"OpDef({self.name})"
