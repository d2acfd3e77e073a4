"""One call of a kernel, its arguments sorted out: tensor types and values, the Python values a
trace bakes in (statics), the structure of container arguments, and the signature a trace is
kept under.

>>> is_static((1, 2.0, "x")), is_static([1.0])
(True, False)
"""

from __future__ import annotations

import enum
import functools
import numbers
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.pytree import TreeDef, leaves_of
from tessera_rw.algebra.tensor import SymbolicTensor

Signature = tuple[tuple[str, Hashable], ...]


def is_static(value: Any) -> bool:
    """Python values a kernel bakes into its trace (part of the signature): numbers, strings,
    None, enums and tuples of them. Tensors, arrays and placeholders are inputs."""
    if isinstance(value, (numbers.Number, np.generic, str, type(None), enum.Enum)):
        return True
    return isinstance(value, tuple) and all(is_static(v) for v in value)


@dataclass(frozen=True)
class BoundCall:
    """One call's arguments sorted out: tensor types, their values (if any), static scalars, and
    the structure of each container argument (whose leaves are among the others, by path name:
    `params.w1`)."""
    tensors: dict[str, TensorType]
    values: dict[str, Any]
    statics: dict[str, Any]
    placeholders: bool
    trees: dict[str, TreeDef]

    @functools.cached_property
    def signature(self) -> Signature:
        return tuple((n, t) for n, t in self.tensors.items()) + tuple(
            (n, ("static", type(v).__name__, static_key(v))) for n, v in self.statics.items()) + tuple(
            (n, ("tree", tree)) for n, tree in self.trees.items())


def static_key(value: Any) -> Any:
    """A static value as a signature holds it: floats by their bits, so that -0.0 and 0.0 trace apart
    and a NaN finds its own trace again.

    >>> static_key(-0.0) == static_key(0.0), static_key(float("nan")) == static_key(float("nan"))
    (False, True)
    """
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, complex):
        return value.real.hex(), value.imag.hex()
    if isinstance(value, tuple):
        return tuple(static_key(v) for v in value)
    return value


def holds_symbolic(args: tuple, kwargs: dict) -> bool:
    """Whether a call's arguments hold a symbolic tensor (the call is inside another's trace)."""
    return any(isinstance(leaf, SymbolicTensor) for leaf in leaves_of((args, kwargs)))
