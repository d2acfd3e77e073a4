"""torch's keyword names met where numpy's are taken: `dim=`, `keepdim=`, `unbiased=` / `correction=`
(numpy's ddof), and SDPA's `is_causal=` / `attn_mask=` get an error naming the op and the call to
write instead, not Python's bare "unexpected keyword argument".

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
import inspect
from typing import Any, Callable, TypeVar

from tessera_rw.algebra.errors import ArgumentError

F = TypeVar("F", bound=Callable)
NUMPY_NAMES = {"dim": "axis", "keepdim": "keepdims", "unbiased": "ddof", "correction": "ddof", "is_causal": "causal",
               "attn_mask": "mask"}


def _value(torch_name: str, value: Any) -> str:
    """The numpy-named argument's value for torch's as the hint spells it (unbiased=True is ddof=1;
    a tensor is `...`)."""
    if torch_name == "unbiased":
        return repr(int(bool(value)))
    return repr(value) if isinstance(value, (bool, int, float, str, tuple, list, type(None))) else "..."


def _named(params: set[str]) -> dict[str, str]:
    """torch's names for `params`: dim= is `axes` where a function takes axes, not an axis."""
    found = {k: v for k, v in NUMPY_NAMES.items() if v in params}
    if "axes" in params and "axis" not in params:
        found["dim"] = "axes"
    return found


def takes_torch_names(fn: Callable) -> bool:
    """Whether `fn` has a parameter one of torch's names stands for."""
    return bool(_named(set(inspect.signature(fn).parameters)))


def numpy_keywords(fn: F) -> F:
    """`fn`, refusing torch's keyword names (those whose numpy name `fn` takes) with the numpy names
    to use instead."""
    name = fn.__name__
    names = _named(set(inspect.signature(fn).parameters))

    @functools.wraps(fn)
    def call(*args, **kwargs):
        torch = [k for k in names if k in kwargs]
        if torch:
            from tessera_rw.algebra.builder import user_site      # builder imports the ops, which import this
            given = ", ".join(f"{names[k]}={_value(k, kwargs[k])}" for k in torch)
            raise ArgumentError("takes numpy's keyword names: " + ", ".join(f"{names[k]}= for torch's {k}="
                                                                           for k in torch),
                                op=name, hint=f"{name}(..., {given})", site=user_site())
        return fn(*args, **kwargs)
    return call  # type: ignore[return-value]
