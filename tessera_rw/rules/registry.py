"""The rulesets in force: the built-in ones plus those of installed rule plugins.

>>> [rs.name for rs in rulesets(plugins=False)]
['algebra', 'attention', 'spectral', 'epilogue', 'gradient']
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from tessera_rw.algebra.ops import OPS, register, unregister
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.plugin_vetting import vetted
from tessera_rw.rules.plugins import LoadedPack, discover, skip, unique_packs
from tessera_rw.rules.rule import Ruleset
from tessera_rw.rules.saturate import setup_error


def rulesets(plugins: bool = True, strict: bool | None = None,
             entry_points: Callable[[], Iterable] | None = None) -> tuple[Ruleset, ...]:
    packs = discover(strict, entry_points) if plugins else ()
    return BUILTIN_RULESETS + plugin_rulesets(packs, strict)


def plugin_rulesets(packs: Iterable[LoadedPack], strict: bool | None = None, vet: bool = True) -> tuple[Ruleset, ...]:
    """Check the packs against each other and the built-ins (unique_packs), declare their ops, tag
    their rulesets; a pack whose rules egglog refuses, alone or beside the packs accepted before
    it, is skipped with a warning (raised when strict) and its ops are taken back, as discovery
    skips one that fails to load. With `vet`, a rule its own example does not show sound is left
    out (plugin_vetting.py); `rules --check` takes them all, to report on each."""
    packs = unique_packs(BUILTIN_RULESETS, packs, strict)
    found: list[Ruleset] = []
    accepted: list[tuple[str, str, str]] = []
    for lp in packs:
        added = [op for op in lp.pack.ops if OPS.get(op.name) is not op]
        for op in added:
            register(op)
        _OP_OWNERS.update((op.name, lp.distribution) for op in lp.pack.ops)
        tagged = tuple(dataclasses.replace(rs, origin=lp.distribution) for rs in lp.pack.rulesets)
        key = (lp.distribution, lp.pack.name, lp.pack.version)
        if error := _refusal(tuple(accepted), key, (*found, *tagged)):
            part = _refused_part(tagged, accepted)        # while the pack's ops are declared
            for op in added:
                unregister(op)
            for op in lp.pack.ops:
                _OP_OWNERS.pop(op.name, None)
            skip(f"rule plugin from {lp.distribution!r} ({lp.pack.name})",
                 f"egglog refuses {part}: {error}",
                 strict, hint="fix the rule's pattern or its `when` guard, and give its functions and ops "
                              "names of the plugin's own")
            continue
        found += tuple(vetted(rs, lp, strict) for rs in tagged) if vet else tagged    # fewer rules: still accepted
        accepted.append(key)
    return tuple(found)


def _refused_part(rulesets: tuple[Ruleset, ...], accepted: list[tuple[str, str, str]]) -> str:
    """Which of a refused pack's rules egglog refuses, each tried alone beside the built-ins: 'its
    rule 'x' (ruleset r)'; or, when each declares cleanly alone, that it clashes with the packs
    accepted before it."""
    alone = [f"{r.name!r} (ruleset {rs.name})" for rs in rulesets for r in rs.rules
             if setup_error(BUILTIN_RULESETS + (dataclasses.replace(rs, rules=(r,)),))]
    if alone:
        return f"its rule{'s' if len(alone) > 1 else ''} {', '.join(alone)}"
    if accepted and not setup_error(BUILTIN_RULESETS + rulesets):
        return f"its rules beside those of {', '.join(dict.fromkeys(repr(d) for d, _, _ in accepted))}"
    return "its rules"


# the package whose accepted rule pack declared each plugin op: only its templates may implement it
_OP_OWNERS: dict[str, str] = {}


def plugin_op_owner(op_name: str) -> str | None:
    """The distribution whose accepted rule pack declares `op_name`, None for a built-in op or one
    no accepted pack declares (its pack was skipped)."""
    rulesets()
    return _OP_OWNERS.get(op_name)


_REFUSALS: dict[tuple, str | None] = {}


def _refusal(accepted: tuple[tuple[str, str, str], ...], pack: tuple[str, str, str],
             rulesets: tuple[Ruleset, ...]) -> str | None:
    """egglog's objection to declaring a pack's rulesets beside the built-ins and the packs accepted
    before it, once per process for each such combination."""
    key = (accepted, pack)
    if key not in _REFUSALS:
        _REFUSALS[key] = setup_error(BUILTIN_RULESETS + rulesets)
    return _REFUSALS[key]
