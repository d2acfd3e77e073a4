"""The rulesets in force: the built-in ones plus those of installed rule plugins.

>>> [rs.name for rs in rulesets(plugins=False)]
['algebra', 'attention', 'spectral', 'epilogue', 'gradient']
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from tessera_rw.algebra.ops import register
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.plugins import LoadedPack, check_unique, discover
from tessera_rw.rules.rule import Ruleset


def rulesets(plugins: bool = True, strict: bool | None = None,
             entry_points: Callable[[], Iterable] | None = None) -> tuple[Ruleset, ...]:
    packs = discover(strict, entry_points) if plugins else ()
    return BUILTIN_RULESETS + plugin_rulesets(packs)


def plugin_rulesets(packs: Iterable[LoadedPack]) -> tuple[Ruleset, ...]:
    """Check the packs against each other and the built-ins, declare their ops, tag their rulesets."""
    packs = tuple(packs)
    check_unique(BUILTIN_RULESETS, packs)
    found = []
    for lp in packs:
        for op in lp.pack.ops:
            register(op)
        found += [dataclasses.replace(rs, origin=lp.distribution) for rs in lp.pack.rulesets]
    return tuple(found)
