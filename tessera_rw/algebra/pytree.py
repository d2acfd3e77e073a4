"""Nested arguments and results: dicts, lists, tuples and namedtuples of tensors (a model's
parameters, a layer list, results by name), flattened into named leaves and built back.

A leaf is named by its path from the parameter, as it reads in source: `params.w1` for a str key,
`layers[0]` for a position, `state.mean` for a namedtuple field, `table[(1, 2)]` for another key.
The structure (`TreeDef`) is hashable, so a kernel's signature holds it: the same arrays in
another structure trace apart.

>>> leaves, tree = flatten({"w": 1.0, "layers": [2, 3]}, "params")
>>> leaves
[('params.w', 1.0), ('params.layers[0]', 2), ('params.layers[1]', 3)]
>>> tree.build(["a", "b", "c"])
{'w': 'a', 'layers': ['b', 'c']}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Iterator

LEAF = None  # a leaf's place in a TreeDef


@dataclass(frozen=True)
class TreeDef:
    """A container's structure: its type, its keys (dict keys, or positions) and each child's
    structure (LEAF for a leaf)."""
    kind: type
    keys: tuple[Hashable, ...]
    children: tuple[TreeDef | None, ...]

    def leaf_names(self, name: str) -> list[str]:
        """The path names of the leaves, in order, for a container named `name`."""
        names = []
        for key, child in zip(self.keys, self.children):
            path = child_name(name, self.kind, key)
            names.extend([path] if child is LEAF else child.leaf_names(path))
        return names

    def build(self, leaves: Iterable[Any]) -> Any:
        """The container of this structure holding `leaves` in order."""
        return unflatten(self, iter(leaves))


def is_container(value: Any) -> bool:
    """A dict, list or tuple (a namedtuple included): what `flatten` opens."""
    return isinstance(value, (dict, list, tuple))


def _is_namedtuple(kind: type) -> bool:
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


def child_name(parent: str, kind: type, key: Hashable) -> str:
    if _is_namedtuple(kind):
        return f"{parent}.{kind._fields[key]}"
    if issubclass(kind, dict) and isinstance(key, str) and key.isidentifier():
        return f"{parent}.{key}"
    return f"{parent}[{key!r}]"


def _items(value: Any) -> list[tuple[Hashable, Any]]:
    return list(value.items()) if isinstance(value, dict) else list(enumerate(value))


def flatten(value: Any, name: str, stop: Callable[[Any], bool] = lambda v: False) -> tuple[list[tuple[str, Any]], TreeDef]:
    """The leaves of container `value` as (path name, leaf), depth first in key order, and its
    structure. A value `stop` accepts is a leaf even if it is a container (a tuple of numbers
    kept whole, say)."""
    leaves: list[tuple[str, Any]] = []

    def walk(node: Any, path: str, seen: tuple[int, ...]) -> TreeDef:
        if id(node) in seen:
            raise ValueError(f"{path} contains itself")
        kind = dict if isinstance(node, dict) else type(node)
        keys, children = [], []
        for key, child in _items(node):
            child_path = child_name(path, kind, key)
            keys.append(key)
            if is_container(child) and not stop(child):
                children.append(walk(child, child_path, (*seen, id(node))))
            else:
                leaves.append((child_path, child))
                children.append(LEAF)
        return TreeDef(kind, tuple(keys), tuple(children))

    tree = walk(value, name, ())
    names = [n for n, _ in leaves]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"has two keys that both read {twice!r}: give them keys that print apart")
    return leaves, tree


def unflatten(tree: TreeDef, leaves: Iterator[Any]) -> Any:
    """The container of structure `tree` with the next values of `leaves` at its leaves."""
    items = [next(leaves) if child is LEAF else unflatten(child, leaves) for child in tree.children]
    if tree.kind is dict:
        return dict(zip(tree.keys, items))
    if _is_namedtuple(tree.kind):
        return tree.kind(*items)
    return tree.kind(items)


def leaves_of(value: Any, _seen: frozenset[int] = frozenset()) -> Iterable[Any]:
    """Every leaf of `value` (itself when it is not a container; a container inside itself is
    visited once)."""
    if not is_container(value):
        yield value
        return
    if id(value) not in _seen:
        for _, child in _items(value):
            yield from leaves_of(child, _seen | {id(value)})
