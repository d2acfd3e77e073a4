"""Whether `@op.kernel` calls tune, and into which autotune cache: on for the process
(`autotune.enable()`, or TESSERA_AUTOTUNE=1 in the environment before that) or for one block of one
thread or task (`with autotune.scoped(...)`, which wins inside it). Kernels read it on every call;
the `autotune` object (tuning.py) sets it.

>>> with scoped(cache="doc_switch"):
...     enabled(), cache()
(True, 'doc_switch')
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator

from tessera_rw.algebra.api.dispatch import is_flag
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.plan_tuner import TuneSettings

DEFAULT_CACHE = "default"

# (on, cache) within a `scoped(...)` block, for this thread or task only; None outside one
_SCOPED: contextvars.ContextVar[tuple[bool, str] | None] = contextvars.ContextVar("tessera_autotune", default=None)
_PROCESS: list[tuple[bool, str]] = []       # the process's (on, cache): read from the environment at first use

_ON, _OFF = ("1", "true", "on", "yes"), ("", "0", "false", "off", "no")


def _switch(variable: str) -> bool:
    """An on/off environment variable; a value that is neither says so, rather than leave it off unsaid."""
    value = os.environ.get(variable, "").strip().lower()
    if value not in _ON + _OFF:
        raise ArgumentError(f"{variable}={os.environ[variable]!r} is neither on nor off",
                            hint=f"set {variable}=1 to turn it on, or 0 (or unset it) to leave it off")
    return value in _ON


def _on_off(function: str, on: object) -> bool:
    """`on` as a bool (`is_flag`); a string such as "false", which is truthy, is refused rather than
    read as its truth."""
    if is_flag(on):
        return bool(on)
    raise ArgumentError(f"autotune.{function}(on={on!r}): `on` must be True or False",
                        hint=f"autotune.{function}(False) turns tuning off; autotune.{function}() turns it on")


def _process_state() -> tuple[bool, str]:
    if not _PROCESS:
        _PROCESS.append((_switch("TESSERA_AUTOTUNE"), DEFAULT_CACHE))
    return _PROCESS[0]


def _state() -> tuple[bool, str]:
    scoped_state = _SCOPED.get()
    return scoped_state if scoped_state is not None else _process_state()


def enabled() -> bool:
    return _state()[0]


def cache() -> str:
    return _state()[1]


def enable(on: bool = True, *, cache_name: str | None = None) -> None:
    """Tuning on (or off) for the whole process, into `cache_name` (None: the cache in force)."""
    if cache_name is not None:
        TuneCache(cache_name)        # checks the name
    state = (_on_off("enable", on), cache_name or _process_state()[1])
    _PROCESS[:] = [state]


@contextlib.contextmanager
def scoped(on: bool = True, *, cache: str | None = None) -> Iterator[None]:
    """Tuning on (or off) inside the block only, in this thread or task; the process's setting
    returns after it, even after an error."""
    if cache is not None:
        TuneCache(cache)
    token = _SCOPED.set((_on_off("scoped", on), cache or _state()[1]))
    try:
        yield
    finally:
        _SCOPED.reset(token)


def tuning_cache() -> str | None:
    """The cache calls tune into when tuning is on, else None: what keys a kernel's programs."""
    on, name = _state()
    return name if on else None


def settings() -> TuneSettings | None:
    """The settings a kernel call tunes with when tuning is on, else None."""
    name = tuning_cache()
    return None if name is None else TuneSettings(cache=name)
