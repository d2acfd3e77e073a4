"""`tessera-rewrite rules [--check | --ops] [PACK ...]`: list rulesets (with their rules when packs
are named); check their rules' soundness; list the ops patterns can name.

--check evaluates every rule of the named packs (tessera_rw's own when none is named: give a
plugin's pack name or distribution) on random instances of its example, before and after
rewriting, and prints each failing rule with its counterexample: UNSOUND where the rewrite changes
the result, UNCHECKED where the rule has no example, its example fails or the rule does not match
it; and each VJP a plugin op declares, against float64 finite differences at the shapes its
pack's examples rewrite to. Exit 1 when one fails. --ops lists every op a pattern can name
(`t.<op>(...)`), with its operands, attributes and the egglog constructor a `when` fact spells it
with.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from rich.console import Console
from rich.table import Table

from tessera_rw.algebra.autodiff.vjp_check import VJP_TOLERANCE, in_float64, vjp_disagreement
from tessera_rw.algebra.ops import BUILTIN_OPS, OPS
from tessera_rw.cli.usage import UsageError, positive_int
from tessera_rw.rules.plugins import discover
from tessera_rw.rules.registry import BUILTIN_RULESETS, plugin_rulesets
from tessera_rw.rules.schema import camel
from tessera_rw.rules.soundness import INSTANCES, RuleCheck, Verdict, check_rule, op_instances


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("packs", nargs="*", metavar="PACK", help="pack or distribution names (default: all)")
    p.add_argument("--check", action="store_true", help="run the soundness check on every rule")
    p.add_argument("--ops", action="store_true", help="list the ops patterns can name, with their attributes")
    p.add_argument("--seeds", type=positive_int, default=INSTANCES,
                   help=f"random instances per rule (default {INSTANCES})")
    p.add_argument("--format", choices=["text", "json"], default="text")


def _select(packs: list[str], loaded) -> tuple:
    """The rulesets named among the built-ins and the `loaded` packs: by rule pack (a plugin's pack
    name, its distribution's for all of its packs, or tessera_rw for the built-ins) or by ruleset
    name (e.g. gradient)."""
    everything = BUILTIN_RULESETS + plugin_rulesets(loaded, vet=False)     # the unsound too: --check names them
    if not packs:
        return everything
    present = {(rs.origin, rs.name) for rs in everything}
    # each name a user may give -> the (origin, ruleset) pairs it stands for
    named: dict[str, set[tuple[str, str]]] = {"tessera_rw": {(rs.origin, rs.name) for rs in BUILTIN_RULESETS}}
    for lp in loaded:
        pairs = {(lp.distribution, rs.name) for rs in lp.pack.rulesets}
        named.setdefault(lp.pack.name, set()).update(pairs)
        named.setdefault(lp.distribution, set()).update(pairs)
    for rs in everything:
        named.setdefault(rs.name, set()).add((rs.origin, rs.name))
    skipped = [p for p in packs if p in named and not named[p] & present]
    if skipped:
        raise UsageError(f"rule pack {skipped[0]} is installed but was skipped: its rulesets did not load "
                         "(the warning above says why)")
    if unknown := [p for p in packs if p not in named]:
        loaded_names = sorted(n for n, pairs in named.items() if pairs & present)
        raise UsageError(f"no loaded rule pack or ruleset named {', '.join(unknown)} (a plugin that failed to "
                         f"load is named in the warnings above); loaded: {', '.join(loaded_names)}")
    wanted = set().union(*(named[p] for p in packs))
    return tuple(rs for rs in everything if (rs.origin, rs.name) in wanted)


VERDICT_TEXT = {Verdict.OK: "ok", Verdict.UNSOUND: "[bold red]UNSOUND[/]",
                Verdict.UNCHECKED: "[bold yellow]UNCHECKED[/]"}


def _plugin_vjp_checks(selected, loaded) -> list[RuleCheck]:
    """Each VJP a selected plugin's ops declare, against finite differences in float64 at the shapes
    and attributes its pack's rule examples rewrite to (a built-in op's is checked by the tests)."""
    by_origin = {lp.distribution: lp.pack for lp in loaded}
    checks = []
    for origin in dict.fromkeys(rs.origin for rs in selected):
        pack = by_origin.get(origin)
        ops = [op for op in (pack.ops if pack else ()) if op.vjp is not None and op.name not in BUILTIN_OPS]
        rulesets = [rs for rs in selected if rs.origin == origin]
        for op in ops:
            found = next((inst for rs in rulesets for rule in rs.rules
                          for inst in op_instances(rule, rs, frozenset({op.name}), np.random.default_rng(0))), None)
            name = f"VJP of {op.name}"
            if found is None:
                checks.append(RuleCheck(name, rulesets[0].name, False, detail="no rule's example rewrites to the op, "
                                        "so there is nothing to check its VJP at", unchecked=True))
                continue
            _, types, attrs = found
            try:
                error = vjp_disagreement(op.name, [in_float64(t) for t in types], attrs)
            except Exception as e:           # noqa: BLE001  a VJP that raises is a wrong VJP
                checks.append(RuleCheck(name, rulesets[0].name, False,
                                        detail=f"the VJP raised {type(e).__name__}: {e}"))
                continue
            ok = error < VJP_TOLERANCE
            where = ", ".join(str(t) for t in types)
            checks.append(RuleCheck(name, rulesets[0].name, ok, 1, "" if ok else
                                    f"disagrees with float64 finite differences by {error:.2e} (relative) at {where}"))
    return checks


OPS_TABLE_WIDTH = 150   # wide enough for every column of the longest op; a narrow terminal wraps lines


def _ops(console: Console, as_json: bool) -> int:
    rows = [{"op": d.name, "operands": list(d.operands) + (["..."] if d.variadic else []),
             "attributes": list(d.attr_names), "kind": d.kind.value,
             "egglog": camel(d.name) + ("<n operands>" if d.variadic else ""),
             "from": "tessera_rw" if d.name in BUILTIN_OPS else "plugin"}
            for d in sorted(OPS.values(), key=lambda d: d.name)]
    if as_json:
        console.file.write(json.dumps(rows, indent=2) + "\n")
        return 0
    table = Table(title="ops (t.<op>(*operands, **attributes, of=(shape, dtype)) in a pattern)")
    for col in ("op", "operands", "attributes", "kind", "egglog", "from"):
        table.add_column(col, no_wrap=col in ("op", "egglog"))
    for r in rows:
        table.add_row(r["op"], ", ".join(r["operands"]), ", ".join(r["attributes"]), r["kind"], r["egglog"], r["from"])
    wide = Console(file=console.file, width=max(console.width, OPS_TABLE_WIDTH), no_color=console.no_color,
                   force_terminal=console.is_terminal)      # the names are typed: never cut them
    wide.print(table)
    return 0


def run(args: argparse.Namespace, console: Console) -> int:
    loaded = discover()             # once: a broken plugin is warned about once
    selected = _select(args.packs, loaded)
    if args.ops:
        return _ops(console, args.format == "json")
    if not args.check:
        rows = [{"ruleset": rs.name, "origin": rs.origin, "rules": [r.name for r in rs.rules], "doc": rs.doc}
                for rs in selected]
        if args.format == "json":
            console.file.write(json.dumps(rows, indent=2) + "\n")
            return 0
        table = Table(title="rulesets")
        for col in ("ruleset", "from", "rules", "what"):
            table.add_column(col)
        for row in rows:
            table.add_row(row["ruleset"], row["origin"], str(len(row["rules"])), row["doc"])
        console.print(table)
        if args.packs:                      # the rules of the packs asked for, each with its algebra
            rules = Table(title="rules")
            for col in ("ruleset", "rule", "algebra"):
                rules.add_column(col)
            for rs in selected:
                for r in rs.rules:
                    rules.add_row(rs.name, r.name, r.algebra)
            console.print(rules)
        return 0
    results = []
    for rs in selected:
        for rule in rs.rules:
            outcome = None
            for seed in range(args.seeds):
                outcome = check_rule(rule, rs, np.random.default_rng(seed))
                if not outcome.ok:
                    break
            results.append(outcome)
    results += _plugin_vjp_checks(selected, loaded)
    failures = [r for r in results if not r.ok]
    if args.format == "json":
        console.file.write(json.dumps([r.__dict__ | {"verdict": r.verdict.value} for r in results], indent=2) + "\n")
    else:
        table = Table(title=f"rule soundness ({args.seeds} random instances each)")
        for col in ("ruleset", "rule", "result"):
            table.add_column(col)
        for r in results:
            table.add_row(r.ruleset, r.rule, VERDICT_TEXT[r.verdict])
        console.print(table)
        for f in failures:
            console.print(f"[bold red]{f.ruleset}/{f.rule}[/]: ", end="")
            console.file.write(f.detail + "\n")
    return 1 if failures else 0
