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

Called as a plain statement, `numerics.policy("fast")` sets the policy from there on (in this
thread or task), as torch.set_grad_enabled does; a `with` block restores what was in force before.
"""

from __future__ import annotations

from tessera_rw.codegen.numerics import Numerics, NumericsError, compensated_sum, current_numerics, set_numerics

__all__ = ["policy", "current", "Numerics", "NumericsError", "compensated_sum"]


class policy:
    """Numerics policy `name` ("fast", "deterministic" or "kahan_sum") from here on, or, used as
    `with policy(name):`, for the block only.

    >>> with policy("kahan_sum") as p:
    ...     p.value
    'kahan_sum'
    """

    def __init__(self, name: Numerics | str):
        self._restore = set_numerics(name)
        self.policy = current_numerics()

    def __enter__(self) -> Numerics:
        return self.policy

    def __exit__(self, *exc) -> None:
        self._restore()

    def __repr__(self) -> str:
        return f"numerics.policy({self.policy.value!r})"


def current() -> Numerics:
    """The policy in force here: the innermost `policy` block's, else the last one set by a plain
    `policy(...)` call, else DETERMINISTIC."""
    return current_numerics()
