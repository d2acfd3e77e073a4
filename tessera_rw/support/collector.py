"""Python's cyclic garbage collector, paused while a pass builds a large acyclic structure.

Rewriting and extraction allocate tens of thousands of small objects (e-graph views, interned
nodes, choice maps) that form no reference cycles; each full collection the allocations trigger
walks every live object, so on a 48-layer model the collector took about 15% of compile time.
Reference counting still frees everything as usual; the collector resumes (if it was running) when
the outermost pause ends.

>>> import gc
>>> with collector_paused():
...     gc.isenabled()
False
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def with_collector_paused(fn: F) -> F:
    """`fn`, run with the collector paused."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        with collector_paused():
            return fn(*args, **kwargs)
    return paused  # type: ignore[return-value]
