"""Numerics policies, the public face: `with numerics.policy("kahan_sum"): ...`.

Three policies:

    "deterministic"  (the default) bitwise-identical results on every run: fixed reduction order,
                     no atomics.
    "fast"           fp32 matrix products on tensor cores in tf32, and fast-math exp/tanh/division.
    "kahan_sum"      compensated (Neumaier) summation in sums, means, softmax and normalizations.

The policy in force when a kernel is planned is part of that kernel, so the cost model, the
compiled-binary cache and the autotune cache keep policies apart. Blocks nest, and each thread or
asyncio task sees its own policy:

>>> from tessera_rw import numerics
>>> with numerics.policy("fast"):
...     numerics.current()
<Numerics.FAST: 'fast'>
>>> numerics.current()
<Numerics.DETERMINISTIC: 'deterministic'>
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from tessera_rw.codegen.numerics import Numerics, NumericsError, compensated_sum, current_numerics, numerics_policy

__all__ = ["policy", "current", "Numerics", "NumericsError", "compensated_sum"]


def policy(name: Numerics | str) -> AbstractContextManager[Numerics]:
    """A block run under numerics policy `name`: "fast", "deterministic" or "kahan_sum".

    >>> with policy("kahan_sum") as p:
    ...     p.value
    'kahan_sum'
    """
    return numerics_policy(name)


def current() -> Numerics:
    """The policy in force here (DETERMINISTIC outside any `policy` block)."""
    return current_numerics()
