"""`graph.profile(step_fn)`: run a step under the profiler and print one line per kernel launch.

    gemm+bias+gelu[4096x4096x4096]  latency=196µs  occupancy=50%  efficiency=71%
    flash_attention+scale+softmax[4x16x2048x64]  latency=112µs  occupancy=25%  efficiency=62%

Occupancy (resident warps over the SM's maximum, from the resources of the schedule that ran) is
shown for GPU launches; efficiency is against the roofline `profiler` names in its report.

>>> import numpy as np
>>> from tessera_rw import graph, op
>>> @op.kernel
... def double(x):
...     return x * 2.0
>>> p = graph.profile(double, np.ones(8, np.float32))     # doctest: +ELLIPSIS
elementwise[8]  latency=...
>>> len(p.records)
1
"""

from __future__ import annotations

from typing import Any, Callable

from tessera_rw.profiler import Session, session

__all__ = ["profile"]


def profile(step_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Session:
    """Run `step_fn(*args, **kwargs)` under a profiler session, print one line per kernel launch,
    and return the session (`.records`, `.report()`, `.timeline(path)`).

    >>> profile(lambda: None).records
    ()
    """
    with session() as p:
        step_fn(*args, **kwargs)
    for line in p.lines():
        print(line)
    return p
