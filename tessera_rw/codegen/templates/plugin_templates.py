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

from functools import cache
from importlib import metadata
from typing import Callable, Iterable

from tessera_rw.codegen.templates.base import Template
from tessera_rw.rules.plugins import PluginError, distribution_of, installed_entry_points, plugins_disabled, skip

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
        except Exception as e:  # a broken plugin must not take the compiler down with it
            skip(f"template plugin from {dist!r} ({ep.name})", f"{type(e).__name__}: {e}", strict, cause=e)
            continue
        for t in offered:
            taken.update({op: f"{type(t).__name__} from {dist!r}" for op in t.ops})
        found += offered
    return tuple(found)


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
