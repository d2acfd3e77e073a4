"""torch's keyword names met where numpy's are taken: `dim=` and `keepdim=` get an error naming the
op and the call to write instead, not Python's bare "unexpected keyword argument".

>>> @numpy_keywords
... def softmax(x, axis=-1):
...     return x
>>> try:
...     softmax(1.0, dim=-1)
... except ArgumentError as e:
...     print(e.op, "|", e.detail, "|", e.hint)
softmax | takes numpy's keyword names: axis= for torch's dim= | softmax(..., axis=-1)
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from tessera_rw.algebra.errors import ArgumentError

F = TypeVar("F", bound=Callable)
NUMPY_NAMES = {"dim": "axis", "keepdim": "keepdims"}


def numpy_keywords(fn: F) -> F:
    """`fn`, refusing torch's `dim=` / `keepdim=` with the numpy names to use instead."""
    name = fn.__name__

    @functools.wraps(fn)
    def call(*args, **kwargs):
        torch = [k for k in NUMPY_NAMES if k in kwargs]
        if torch:
            from tessera_rw.algebra.builder import user_site      # builder imports the ops, which import this
            given = ", ".join(f"{NUMPY_NAMES[k]}={kwargs[k]!r}" for k in torch)
            raise ArgumentError("takes numpy's keyword names: " + ", ".join(f"{NUMPY_NAMES[k]}= for torch's {k}="
                                                                           for k in torch),
                                op=name, hint=f"{name}(..., {given})", site=user_site())
        return fn(*args, **kwargs)
    return call  # type: ignore[return-value]
