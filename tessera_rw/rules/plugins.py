"""Rule plugins: third-party rulesets (and the ops they fuse into) found through entry points.

A distribution declares, in its pyproject.toml,

    [project.entry-points."tessera_rw.rules"]
    my_pack = "my_package:rule_pack"         # a RulePack, or a function returning one

A plugin that fails to load, or is built for another tessera_rw, is skipped with a warning that
names its distribution and the error; `strict=True` (or TESSERA_STRICT_PLUGINS=1) raises instead.
TESSERA_DISABLE_PLUGINS=1 turns discovery off. A pack repeating a ruleset or op name is skipped
the same way, the warning naming both providers.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Iterable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from tessera_rw.algebra.builder import warn_at_user_line
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.opdef import OpDef
from tessera_rw.algebra.ops import BUILTIN_OPS, OPS
from tessera_rw.rules.rule import Ruleset
from tessera_rw.rules.schema import camel
from tessera_rw.support.version import package_version

ENTRY_POINT_GROUP = "tessera_rw.rules"


class PluginError(TesseraError):
    """A plugin that cannot be used (in strict mode), or two providers of one name."""


class PluginWarning(UserWarning):
    """A plugin was skipped; everything else keeps working."""


class RulePack(BaseModel):
    """What a plugin provides: validated metadata, its rulesets and any new ops they rewrite into."""
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    version: str
    tessera_rw: str = ">=0.1"                 # the tessera_rw versions it supports (PEP 440 specifier)
    rulesets: tuple[Ruleset, ...]
    ops: tuple[OpDef, ...] = ()
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", value):
            raise ValueError(f"pack name {value!r} must start with a letter and use letters, digits, _ . -")
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        Version(value)
        return value

    @field_validator("tessera_rw")
    @classmethod
    def _specifier(cls, value: str) -> str:
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError(f"{value!r} is not a version range such as '>=0.1,<0.2'") from None
        return value

    @field_validator("ops")
    @classmethod
    def _ops(cls, value: tuple[OpDef, ...]) -> tuple[OpDef, ...]:
        for op in value:
            missing = [part for part in ("infer", "reference") if not callable(getattr(op, part, None))]
            if missing:
                raise ValueError(f"op {op.name!r} needs {' and '.join(missing)} (a function): the shape rule and the "
                                 "numpy reference that executors, the rule checks and the kernel checks evaluate")
        return value

    @field_validator("rulesets")
    @classmethod
    def _examples(cls, value: tuple[Ruleset, ...]) -> tuple[Ruleset, ...]:
        for rs in value:
            for rule in rs.rules:
                if rule.example is not None and not callable(rule.example):
                    raise ValueError(f"rule {rule.name!r}: example must be a function rng -> (fn, inputs), "
                                     f"got {type(rule.example).__name__}")
        return value

    def supports(self, version: str | None = None) -> bool:
        """Whether the pack's range holds `version` (default: the installed tessera_rw's; a bare
        checkout's unknown version takes every pack)."""
        version = version or package_version()
        return version == "unknown" or Version(version) in SpecifierSet(self.tessera_rw)


@dataclass(frozen=True)
class LoadedPack:
    pack: RulePack
    distribution: str


def distribution_of(ep: metadata.EntryPoint) -> str:
    """The name of the package an entry point comes from, for messages."""
    return ep.dist.name if getattr(ep, "dist", None) is not None else ep.value.split(":")[0]


_FROM_FACTORY: dict[Callable[[], object], object] = {}


def _load_one(ep: metadata.EntryPoint) -> RulePack:
    """The entry point's pack; a factory runs once per process (each run would make new ops of the
    same names, which the first run already declared)."""
    provided = ep.load()
    if callable(provided) and not isinstance(provided, RulePack):
        if provided not in _FROM_FACTORY:
            _FROM_FACTORY[provided] = provided()
        pack = _FROM_FACTORY[provided]
    else:
        pack = provided
    if not isinstance(pack, RulePack):
        raise TypeError(f"entry point {ep.name!r} gave a {type(pack).__name__}, not a tessera_rw RulePack")
    return pack


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def installed_entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    """The installed distributions' entry points of `group`, read once per process (reading the
    installed metadata took some 4 ms, at every compile)."""
    return tuple(metadata.entry_points(group=group))


def plugins_disabled() -> bool:
    """TESSERA_DISABLE_PLUGINS=1: no rule pack and no plugin template is loaded."""
    return _env_flag("TESSERA_DISABLE_PLUGINS")


def discover(strict: bool | None = None,
             entry_points: Callable[[], Iterable[metadata.EntryPoint]] | None = None) -> tuple[LoadedPack, ...]:
    """Load every installed rule pack. `entry_points` replaces discovery (tests inject packs)."""
    if plugins_disabled():
        return ()
    found = entry_points() if entry_points else installed_entry_points(ENTRY_POINT_GROUP)
    loaded = []
    for ep in found:
        dist = distribution_of(ep)
        try:
            pack = _load_one(ep)
            if not pack.supports():
                raise PluginError(f"supports tessera_rw {pack.tessera_rw}, this is {package_version()}",
                                  hint="upgrade the plugin or tessera_rw")
        except Exception as e:  # a broken plugin must not take the compiler down with it
            skip(f"rule plugin from {dist!r} ({ep.name})", load_failure(e), strict, cause=e)
            continue
        loaded.append(LoadedPack(pack, dist))
    return tuple(loaded)


def skip(plugin: str, why: str, strict: bool | None, hint: str | None = None, cause: Exception | None = None) -> None:
    """Warn that `plugin` is skipped and why, or raise PluginError under strict mode
    (TESSERA_STRICT_PLUGINS=1). The warning points at the user's line that loaded the plugins."""
    if _env_flag("TESSERA_STRICT_PLUGINS") if strict is None else strict:
        raise PluginError(f"{plugin} failed to load (TESSERA_STRICT_PLUGINS is set): {why}", hint=hint) from cause
    warn_at_user_line(PluginWarning(f"{plugin} was skipped: {why}" + (f" ({hint})" if hint else "")))


def load_failure(e: Exception) -> str:
    """What went wrong loading a plugin's entry point, in a line or two: a pydantic error without
    its documentation links."""
    if isinstance(e, ValidationError):
        problems = e.errors(include_url=False, include_input=False)
        return f"{e.title}: " + "; ".join(f"{'.'.join(map(str, p['loc'])) or 'value'}: {p['msg']}" for p in problems)
    return f"{type(e).__name__}: {e}"


_BOTH_HINT = ("rename it in one package, uninstall one (pip uninstall {}), or set TESSERA_DISABLE_PLUGINS=1 "
              "to run without plugins")


# egglog rulesets the saturation driver declares itself
RESERVED_RULESETS = ("insert", "types")


def unique_packs(builtin: Iterable[Ruleset], packs: Iterable[LoadedPack], strict: bool | None = None
                 ) -> tuple[LoadedPack, ...]:
    """The packs whose ruleset and op names are their own. A pack repeating a name (a built-in one,
    one of the driver's, or one of a pack kept before it; an op's differing only in case, as
    egglog spells both alike) is skipped with a warning naming both providers, or raises under
    strict mode: one package's clash leaves the others, and the compiler, working."""
    owners: dict[str, str] = {name: "tessera_rw" for name in RESERVED_RULESETS}
    owners.update((unit.name, "tessera_rw") for rs in builtin for unit in rs.units())
    op_owners: dict[str, tuple[str, str]] = {camel(name): (name, "tessera_rw") for name in BUILTIN_OPS}
    kept = []
    for lp in packs:
        if clash := _clash(lp, owners, op_owners):
            skip(f"rule plugin from {lp.distribution!r} ({lp.pack.name})", clash, strict,
                 hint=_BOTH_HINT.format(lp.distribution))
            continue
        owners.update((unit.name, lp.distribution) for rs in lp.pack.rulesets for unit in rs.units())
        op_owners.update((camel(op.name), (op.name, lp.distribution)) for op in lp.pack.ops)
        kept.append(lp)
    return tuple(kept)


def _clash(lp: LoadedPack, owners: dict[str, str], op_owners: dict[str, tuple[str, str]]) -> str | None:
    for rs in lp.pack.rulesets:
        for unit in rs.units():
            if unit.name in owners:
                return f"ruleset {unit.name!r} is provided by both {owners[unit.name]!r} and {lp.distribution!r}"
    for op in lp.pack.ops:
        name, owner = op_owners.get(camel(op.name), (op.name, None))
        if owner is not None and OPS.get(op.name) is not op:
            alike = "" if name == op.name else f" (as {name!r}: egglog spells both {camel(op.name)!r})"
            return f"op {op.name!r} is provided by both {owner!r}{alike} and {lp.distribution!r}"
    return None
