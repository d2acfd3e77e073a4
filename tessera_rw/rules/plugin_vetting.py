"""Plugin rules are checked on their own examples before they rewrite anyone's program.

A rule a plugin ships computes what it replaces only if its author got it right; a wrong one would
change every result it matches, silently. So the first time a rule (of a given version: its
patterns, guards and example, and the source of the plugin's modules, where its ops' references
and shape rules live) is loaded, its example is rewritten and evaluated as `tessera-rewrite rules
--check` does, on as many random instances. A rule the check finds unsound, or cannot check (no
example, one that fails or that the rule does not match), is left out, with a PluginWarning
naming its package, pack and what went wrong (an error under TESSERA_STRICT_PLUGINS=1). The
verdicts are kept in `<cache root>/plugins/rule_checks.json`, so each rule version is checked once
per machine, and again after any edit to the plugin.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from tessera_rw.rules.plugins import LoadedPack, skip
from tessera_rw.rules.rule import WILDCARD, Rule, Ruleset
from tessera_rw.rules.soundness import INSTANCES, Verdict, check_rule
from tessera_rw.support.atomic_files import write_atomically
from tessera_rw.support.cache_dir import cache_root
from tessera_rw.support.version import package_version

CHECK_SEEDS = tuple(range(INSTANCES))   # as `rules --check` draws: random shapes and values, each seed its own
LOCK_SECONDS = 10          # waited for the verdicts file's lock before keeping a verdict in memory only


_VETTED: dict[tuple[str, ...], tuple[Rule, ...]] = {}     # this process's: a pack is loaded once


def vetted(ruleset: Ruleset, lp: LoadedPack, strict: bool | None = None) -> Ruleset:
    """`ruleset` without the rules its own examples show unsound."""
    key = (lp.distribution, lp.pack.name, lp.pack.version, ruleset.name)
    if key not in _VETTED:
        _VETTED[key] = _sound_rules(ruleset, lp, strict)
    kept = _VETTED[key]
    return ruleset if len(kept) == len(ruleset.rules) else replace(ruleset, rules=kept)


def _sound_rules(ruleset: Ruleset, lp: LoadedPack, strict: bool | None) -> tuple[Rule, ...]:
    verdicts = _Verdicts.load()
    kept = []
    for rule in ruleset.rules:
        key = rule_version(rule, ruleset, lp)
        detail = verdicts.get(key)
        if detail is None:
            detail = verdicts.put(key, _unsound_because(rule, ruleset))
        if detail:
            skip(f"rule {rule.name!r} of plugin {lp.distribution!r} ({lp.pack.name})", detail, strict,
                 hint=f"run `tessera-rewrite rules --check {lp.pack.name}`; fix the rule, or uninstall "
                      f"{lp.distribution}")
            continue
        kept.append(rule)
    return tuple(kept)


def _unsound_because(rule: Rule, ruleset: Ruleset) -> str:
    """Why the rule is left out: what the check found wrong, or why it could not check it; '' for a
    rule that holds on every instance."""
    for seed in CHECK_SEEDS:
        try:
            result = check_rule(rule, ruleset, np.random.default_rng(seed))
        except Exception as e:  # noqa: BLE001  a check that cannot run proves nothing
            return f"its check could not run ({type(e).__name__}: {e})".replace("\n", " ")
        if result.verdict is Verdict.UNSOUND:
            return f"its example shows it unsound: {result.detail.splitlines()[0]}"
        if result.verdict is Verdict.UNCHECKED:
            return f"it cannot be checked, so it is not trusted: {result.detail.splitlines()[0]}"
    return ""


def rule_version(rule: Rule, ruleset: Ruleset, lp: LoadedPack) -> str:
    """What a verdict holds for: tessera_rw's version, the package and pack versions, the rule's own text (its patterns'
    wildcards numbered in order, as they differ from process to process) and example, and the
    source of the modules the pack's functions come from (an op's reference or shape rule may
    change what the rule computes)."""
    numbering: dict[str, str] = {}
    text = " ".join((rule.lhs.text, rule.rhs.text, *rule.when, ruleset.facts))
    canonical = WILDCARD.sub(lambda m: numbering.setdefault(m.group(0), f"w{len(numbering)}"), text)
    code = getattr(rule.example, "__code__", None)
    example = b"" if code is None else _code_bytes(code)
    parts = (package_version(), lp.distribution, lp.pack.name, lp.pack.version, ruleset.name, rule.name, canonical,
             pack_source(lp))
    return hashlib.sha256("\0".join(parts).encode() + example).hexdigest()


def _code_bytes(code: types.CodeType) -> bytes:
    """A function's bytecode, constants and the names it reads, its nested functions' too, without
    the addresses a code object's repr carries."""
    consts = (_code_bytes(c) if isinstance(c, types.CodeType) else repr(c).encode() for c in code.co_consts)
    return code.co_code + b"\0".join(consts) + "\0".join(code.co_names).encode()


def pack_source(lp: LoadedPack) -> str:
    """A hash of the source files of the top-level packages (or modules) that the pack's rule
    examples and op functions are defined in (a module without a file counts by its name)."""
    functions = [r.example for rs in lp.pack.rulesets for r in rs.rules if r.example is not None]
    functions += [f for op in lp.pack.ops for f in (op.infer, op.reference, op.flops, op.vjp) if f is not None]
    tops = sorted({m.split(".")[0] for f in functions if isinstance(m := getattr(f, "__module__", None), str)})
    return hashlib.sha256("\0".join(_module_source(top) for top in tops).encode()).hexdigest()


@functools.cache
def _module_source(top: str) -> str:
    """A hash of a top-level module's source: every .py file of a package, or the module's file."""
    module = sys.modules.get(top)
    if module is None or top == "tessera_rw":       # the built-in functions a plugin uses are the versioned package
        return top
    folders = [Path(p) for p in getattr(module, "__path__", ())]
    files = sorted(f for d in folders for f in d.rglob("*.py")) if folders else \
        [Path(module.__file__)] if getattr(module, "__file__", None) else []
    digest = hashlib.sha256(top.encode())
    for f in files:
        try:
            digest.update(f.read_bytes())
        except OSError:
            digest.update(f"{f}: unreadable".encode())
    return digest.hexdigest()


_IN_MEMORY: dict[str, str] = {}      # this process's verdicts, kept when the folder cannot be written


def _read(path: Path) -> dict[str, str]:
    """The verdicts a file holds; an unreadable or malformed file holds none."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(found, dict) else {}


class _Verdicts:
    """The verdicts file: rule version -> '' (sound or uncheckable) or why it is unsound. An
    unreadable file is as good as none; an unwritable folder keeps the verdicts in memory.
    Processes checking rules at once each merge theirs into the file under its lock."""

    def __init__(self, path: Path, found: dict[str, str]):
        self.path, self.found = path, found

    @classmethod
    def load(cls) -> _Verdicts:
        path = cache_root() / "plugins" / "rule_checks.json"
        return cls(path, {**_read(path), **_IN_MEMORY})

    def get(self, key: str) -> str | None:
        return self.found.get(key)

    def put(self, key: str, detail: str) -> str:
        self.found[key] = _IN_MEMORY[key] = detail
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{self.path}.lock", timeout=LOCK_SECONDS):
                merged = {**_read(self.path), **self.found}      # another process's verdicts stay
                write_atomically(self.path, json.dumps(merged).encode())   # readers see the old file or the new
        except (OSError, Timeout):
            pass          # kept in memory: the next process checks the rule again
        return detail
