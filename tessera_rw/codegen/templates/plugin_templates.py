"""Kernel templates from plugin packages, through the `tessera_rw.templates` entry-point group.

A rule pack can offer an op no built-in template implements (a fused op of its own); a template
entry point gives that op a kernel. The entry point names a Template instance, or a function
returning one or several; each is checked (a Template, implementing ops of its own, not a
built-in's) and a broken one is skipped with a PluginWarning naming its distribution (an error
under TESSERA_STRICT_PLUGINS=1), as a broken rule pack is. TESSERA_DISABLE_PLUGINS=1 turns
plugin templates off with the rules.

    [project.entry-points."tessera_rw.templates"]
    rmsnorm_matmul = "tessera_rw_rmsnorm_matmul.template:templates"
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from functools import cache
from importlib import metadata
from typing import Callable, Iterable

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.ops import BUILTIN_OPS
from tessera_rw.codegen.templates.base import Template
from tessera_rw.rules.plugins import (PluginError, PluginWarning, distribution_of, installed_entry_points,
                                     load_failure, plugins_disabled, skip)
from tessera_rw.rules.registry import plugin_op_owner

TEMPLATE_ENTRY_POINT_GROUP = "tessera_rw.templates"


def plugin_templates(builtin: tuple[Template, ...]) -> tuple[Template, ...]:
    """The installed plugins' templates (discovered once per process)."""
    return () if plugins_disabled() else _installed(builtin)


@cache
def _installed(builtin: tuple[Template, ...]) -> tuple[Template, ...]:
    return load_templates(builtin, lambda: installed_entry_points(TEMPLATE_ENTRY_POINT_GROUP))


def load_templates(builtin: tuple[Template, ...], entry_points: Callable[[], Iterable[metadata.EntryPoint]],
                   strict: bool | None = None) -> tuple[Template, ...]:
    """Every template the entry points provide that passes its checks (tests inject entry points)."""
    taken = {op: type(t).__name__ for t in builtin for op in t.ops}
    found: list[Template] = []
    for ep in entry_points():
        dist = distribution_of(ep)
        try:
            provided = ep.load()
            provided = provided() if callable(provided) and not isinstance(provided, Template) else provided
            offered = tuple(provided) if isinstance(provided, (tuple, list)) else (provided,)
            for t in offered:
                _check(t, taken)
                _check_own(t, dist)
        except Exception as e:  # a broken plugin must not take the compiler down with it
            skip(f"template plugin from {dist!r} ({ep.name})", load_failure(e), strict, cause=e)
            continue
        for t in offered:
            taken.update({op: f"{type(t).__name__} from {dist!r}" for op in t.ops})
        found += (guarded(t, dist) for t in offered)
    return tuple(found)


def guarded(t: Template, dist: str) -> Template:
    """`t` with its methods kept from taking a compile down: a template that raises in accepts,
    schedules, space or resources is taken not to implement the op (a PluginWarning names it once,
    and the op runs unfused or on the host); a failing emit is a PluginError naming the plugin, and
    a kernel it emits carries the plugin's name, for NVRTC's errors."""
    who = f"{type(t).__name__} from {dist!r}"
    warned: set[str] = set()

    def fails(method: str, e: Exception) -> None:
        if method not in warned:
            warned.add(method)
            warnings.warn(f"kernel template {who} raised in {method}: {type(e).__name__}: {e}; its ops run "
                          "without it", PluginWarning, stacklevel=4)

    inner = {name: getattr(t, name) for name in ("accepts", "schedules", "space", "resources", "emit")}

    def accepts(op):
        try:
            return bool(inner["accepts"](op))
        except Exception as e:  # noqa: BLE001  a plugin's fault, not the program's
            fails("accepts", e)
            return False

    def with_resources(method: str, op, arch) -> tuple:
        """The method's schedules whose resources the template can state (the cost model asks), and
        states believably: a kernel writes its whole result at least, so it cannot move fewer bytes."""
        try:
            schedules = tuple(inner[method](op, arch))
            written = op.result.nbytes
            for schedule in schedules:
                if (moved := inner["resources"](op, schedule, arch).hbm_bytes) < written:
                    raise PluginError(f"resources({op}, {schedule}) says the kernel moves {moved:,} bytes, fewer than "
                                      f"the {written:,} of the result it writes")
            return schedules
        except Exception as e:  # noqa: BLE001
            fails(f"{method} or resources", e)
            return ()

    def emit(op, schedule, arch):
        try:
            return replace(inner["emit"](op, schedule, arch), origin=dist)    # a compile error names the plugin
        except TesseraError:
            raise
        except Exception as e:  # noqa: BLE001
            raise PluginError(f"kernel template {who} failed to emit {op}: {type(e).__name__}: {e}",
                              hint=f"the fault is in the plugin package {dist!r}: report it to its authors") from e
    try:
        for name, method in (("accepts", accepts), ("schedules", lambda op, arch: with_resources("schedules", op, arch)),
                             ("space", lambda op, arch: with_resources("space", op, arch)), ("emit", emit)):
            object.__setattr__(t, name, method)
    except (AttributeError, TypeError):       # an instance that takes no attributes (slots) runs unguarded
        pass
    return t


def _check(t: object, taken: dict[str, str]) -> None:
    if not isinstance(t, Template):
        raise PluginError(f"{t!r} is not a tessera_rw Template", hint="subclass tessera_rw.plugin.Template")
    if not isinstance(t.ops, (set, frozenset)) or not t.ops or not all(isinstance(op, str) for op in t.ops) \
            or not isinstance(t.kind, str):
        raise PluginError(f"{type(t).__name__} needs `kind` (a string) and `ops` (a frozenset of the op names "
                          f"it implements), got kind={t.kind!r}, ops={t.ops!r}")
    if clash := sorted(op for op in t.ops if op in taken):
        raise PluginError(f"{type(t).__name__} implements {clash}, which {taken[clash[0]]} already does",
                          hint="a plugin template implements the plugin's own ops")


def _check_own(t: Template, dist: str) -> None:
    """A plugin template implements ops its own package's accepted rule pack declares: not those of
    a pack that was skipped, nor another package's op of the same name."""
    owners = {op: plugin_op_owner(op) for op in sorted(t.ops)}
    foreign = {op: owner for op, owner in owners.items() if owner != dist}
    if not foreign:
        return
    op, owner = next(iter(foreign.items()))
    if op in BUILTIN_OPS:
        raise PluginError(f"{type(t).__name__} implements {sorted(foreign)}, but {op!r} is one of tessera_rw's own "
                          "ops, which its own templates run", hint="declare an op of the plugin's own in its rule "
                                                                   "pack, rewrite into it, and implement that")
    if owner:
        raise PluginError(f"{type(t).__name__} implements {sorted(foreign)}, but {owner!r} declares {op!r}",
                          hint="a plugin's templates implement the ops its own rule pack declares")
    raise PluginError(f"{type(t).__name__} implements {sorted(foreign)}, but no rule pack of {dist!r} that loaded "
                      f"declares {op!r}", hint=f"declare it in the pack's `ops`; if it is declared, see why the pack "
                                               f"of {dist!r} was skipped (`tessera-rewrite rules`)")
