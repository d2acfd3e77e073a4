"""The rulesets in force: the built-in ones plus those of installed rule plugins.

>>> [rs.name for rs in rulesets(plugins=False)]
['algebra', 'attention', 'spectral', 'epilogue', 'gradient']
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Iterable

from tessera_rw.algebra.ops import OPS, on_unknown_op, register, unregister
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.plugins import LoadedPack, PluginWarning, discover, skip, unique_packs
from tessera_rw.rules.rule import Ruleset
from tessera_rw.rules.saturate import setup_error


def rulesets(plugins: bool = True, strict: bool | None = None,
             entry_points: Callable[[], Iterable] | None = None) -> tuple[Ruleset, ...]:
    packs = discover(strict, entry_points) if plugins else ()
    return BUILTIN_RULESETS + plugin_rulesets(packs, strict)


# Loading the rulesets declares the accepted plugins' ops: an op may be looked up by name before any
# program was rewritten (op.apply("my_fused_op", ...)).
on_unknown_op(rulesets)


def plugin_rulesets(packs: Iterable[LoadedPack], strict: bool | None = None) -> tuple[Ruleset, ...]:
    """Check the packs against each other and the built-ins (unique_packs), declare their ops, tag
    their rulesets; a pack whose rules egglog refuses, alone or beside the packs accepted before
    it, is skipped with a warning (raised when strict) and its ops are taken back, as discovery
    skips one that fails to load."""
    packs = unique_packs(BUILTIN_RULESETS, packs, strict)
    found: list[Ruleset] = []
    accepted: list[tuple[str, str, str]] = []
    for lp in packs:
        added = [op for op in lp.pack.ops if OPS.get(op.name) is not op]
        for op in added:
            register(op)
        tagged = tuple(dataclasses.replace(rs, origin=lp.distribution) for rs in lp.pack.rulesets)
        key = (lp.distribution, lp.pack.name, lp.pack.version)
        if error := _refusal(tuple(accepted), key, (*found, *tagged)):
            for op in added:
                unregister(op)
            skip(f"rule plugin from {lp.distribution!r} ({lp.pack.name})", "egglog refuses its rules"
                 f"{' beside those of ' + ', '.join(repr(d) for d, _, _ in accepted) if accepted else ''}: {error}",
                 strict, hint="fix the rule's pattern or its `when` guard, and give its functions and ops "
                              "names of the plugin's own")
            continue
        found += tagged
        accepted.append(key)
        if untested := [r.name for rs in tagged for r in rs.rules if r.example is None]:
            warnings.warn(f"rule plugin from {lp.distribution!r} ({lp.pack.name}): rules {untested} have no "
                          "example, so `tessera-rewrite rules --check` cannot test them", PluginWarning, stacklevel=3)
    return tuple(found)


_REFUSALS: dict[tuple, str | None] = {}


def _refusal(accepted: tuple[tuple[str, str, str], ...], pack: tuple[str, str, str],
             rulesets: tuple[Ruleset, ...]) -> str | None:
    """egglog's objection to declaring a pack's rulesets beside the built-ins and the packs accepted
    before it, once per process for each such combination."""
    key = (accepted, pack)
    if key not in _REFUSALS:
        _REFUSALS[key] = setup_error(BUILTIN_RULESETS + rulesets)
    return _REFUSALS[key]
