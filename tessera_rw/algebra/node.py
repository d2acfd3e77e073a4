"""The graph IR's one node type: frozen and interned, so structural equality is identity.

>>> from tessera_rw.algebra.dtypes import DType
>>> t = TensorType((2, 3), DType.float32)
>>> Node("input", (), (("name", "x"),), t) is Node("input", (), (("name", "x"),), t)
True
"""

from __future__ import annotations

import hashlib
import math
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from tessera_rw.algebra.dtypes import DType


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(map(str, self.shape))}]"


class ArrayLiteral:
    """A constant array held by a node; hashed by content so equal literals intern together."""

    __slots__ = ("array", "_digest")

    def __init__(self, array: np.ndarray):
        self.array = np.array(array, copy=True)
        self.array.flags.writeable = False
        h = hashlib.blake2b(self.array.tobytes(), digest_size=16)
        h.update(repr((self.array.shape, str(self.array.dtype))).encode())
        self._digest = h.digest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArrayLiteral) and other._digest == self._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        a = self.array
        return f"array{list(a.shape)}" if a.size > 8 else np.array2string(a, separator=",")


def _canonical(value: Any) -> Any:
    """An intern key in which 1, 1.0, True and -0.0 vs 0.0 stay distinct and NaN equals NaN."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, float):
        return ("f", value.hex())
    if isinstance(value, tuple):
        return ("t",) + tuple(_canonical(v) for v in value)
    return value


Attrs = tuple[tuple[str, Any], ...]
_INTERNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class Node:
    """One op application: `op` names an OpDef, `args` are nodes, `attrs` sorted (key, value) pairs."""

    __slots__ = ("op", "args", "attrs", "type", "_attr_map", "__weakref__")
    op: str
    args: tuple[Node, ...]
    attrs: Attrs
    type: TensorType

    def __new__(cls, op: str, args: Iterable[Node], attrs: Attrs | Mapping[str, Any], type: TensorType):
        args = tuple(args)
        items = attrs.items() if isinstance(attrs, Mapping) else attrs
        attrs = tuple(sorted(items))
        key = (op, args, tuple((k, _canonical(v)) for k, v in attrs), type)
        found = _INTERNED.get(key)
        if found is not None:
            return found
        self = object.__new__(cls)
        for name, value in (("op", op), ("args", args), ("attrs", attrs), ("type", type),
                            ("_attr_map", dict(attrs))):
            object.__setattr__(self, name, value)
        _INTERNED[key] = self
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Node is immutable; use replace()")

    def __reduce__(self):
        return (Node, (self.op, self.args, self.attrs, self.type))

    def attr(self, name: str, default: Any = None) -> Any:
        return self._attr_map.get(name, default)

    @property
    def attr_map(self) -> Mapping[str, Any]:
        return self._attr_map

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    def replace(self, *, op: str | None = None, args: Iterable[Node] | None = None,
                attrs: Mapping[str, Any] | None = None, type: TensorType | None = None) -> Node:
        return Node(self.op if op is None else op, self.args if args is None else args,
                    self.attrs if attrs is None else attrs, self.type if type is None else type)

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs)
        return f"Node({self.op}, {len(self.args)} args{', ' + attrs if attrs else ''}) -> {self.type}"
