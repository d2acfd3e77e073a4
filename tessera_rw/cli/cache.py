"""`tessera-rewrite cache list|export|import|clear`: look at and move the autotune cache.

    tessera-rewrite cache list [--name N] [--arch A] [--format json]
    tessera-rewrite cache export FILE          # every arch, one JSON document
    tessera-rewrite cache import FILE          # validated in full first; merged by the cache's rules
    tessera-rewrite cache clear [--arch A] [--yes]

The cache lives under `$TESSERA_CACHE_DIR/autotune` (default `~/.tessera/autotune`). A cache file
found invalid is moved aside and reported as a warning on stderr; the command still succeeds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

from rich.console import Console

from tessera_rw.cli.usage import UsageError
from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.arch import KNOWN_ARCHS, ArchError, arch_named
from tessera_rw.report import compact_schedule, report_table
from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.records import TuneRecord, Versions, current_versions


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", metavar="{list,export,import,clear}", required=True)
    listing = actions.add_parser("list", help="show the records")
    listing.add_argument("--arch", help="only this architecture's records")
    export = actions.add_parser("export", help="write every record to FILE")
    export.add_argument("file", metavar="FILE")
    imports = actions.add_parser("import", help="merge the records of FILE")
    imports.add_argument("file", metavar="FILE")
    clear = actions.add_parser("clear", help="delete the records")
    clear.add_argument("--arch", help="only this architecture's records")
    clear.add_argument("--yes", action="store_true", help="delete the records (without it, clear says how many "
                                                             "it would delete and deletes none)")
    for sub in (listing, export, imports, clear):
        sub.add_argument("--name", default="default", help="which named cache (default: default)")
        sub.add_argument("--format", choices=["text", "json"], default="text")


def run(args: argparse.Namespace, console: Console) -> int:
    cache = TuneCache(args.name)
    if args.action in ("list", "export", "clear") and args.name != "default" and not cache.folder.is_dir():
        others = cache.names_beside()
        raise UsageError(f"there is no autotune cache named {args.name!r} in {cache.root}; caches there: "
                         f"{', '.join(others) or 'none'}")
    if getattr(args, "arch", None):
        _check_arch(cache, args.arch)
    return _ACTIONS[args.action](cache, args, console)     # a file set aside: one warning line (cli main)


def _check_arch(cache: TuneCache, arch: str) -> None:
    """An --arch tessera_rw does not know and the cache holds no records of is a typo, not an empty list."""
    try:
        arch_named(arch)
    except ArchError:
        if arch not in cache.archs():      # records of an arch tessera_rw does not know keep its name
            held = ", ".join(cache.archs()) or "none"
            raise UsageError(f"unknown architecture {arch!r}: the cache holds records of {held}; known: "
                             f"{', '.join(a.name for a in KNOWN_ARCHS)}") from None


def _list(cache: TuneCache, args: argparse.Namespace, console: Console) -> int:
    records = cache.records(args.arch)
    if args.format == "json":
        console.file.write(json.dumps([r.model_dump(mode="json") for r in records], indent=2) + "\n")
        return 0
    if not records:
        where = f" for {args.arch}" if args.arch else ""
        console.print(f"autotune cache '{cache.name}' ({cache.folder}) has no records{where}: tuning adds them "
                      "(tessera-rewrite tune FILE.py:FUNCTION, autotune(...), or kernel calls under "
                      "autotune.enable())", markup=False, highlight=False, soft_wrap=True)
        _name_the_others(cache, console)
        return 0
    table = report_table(f"autotune cache '{cache.name}' ({len(records)} records, {cache.folder})")
    here = current_versions()
    others = sum(not r.holds_under(here) for r in records)
    # records of one op, shapes and dtypes apart only in what the signature hashes (attributes,
    # numerics policy, a restricted search) would read as duplicates without it
    twins = len({(r.op_name, r.shapes, r.dtypes, r.arch) for r in records}) < len(records)
    columns = (("op",) + (("signature",) if twins else ()) + ("shapes", "dtypes", "arch", "config", "µs", "chosen by")
               + (("used here",) if others else ()))
    rows = [(r.op_name, *((r.signature_hash[:8],) if twins else ()), _shapes(r),
             _runs([DType.parse(d).short for d in r.dtypes]), r.arch, compact_schedule(_config(r)), f"{r.time_us:.2f}",
             r.chosen_by.value + (" (interpolated)" if r.interpolated else ""),
             *((_used_here(r, here),) if others else ())) for r in records]
    for i, col in enumerate(columns):
        # cells wrap between their words, never inside one (depth=epilogue-fused stays whole)
        widest_word = max((len(word) for row in rows for word in row[i].split()), default=0)
        table.add_column(col, justify="right" if col == "µs" else "left", overflow="fold",
                         no_wrap=col in ("op", "arch", "µs"), min_width=max(len(col), widest_word))
    for row in rows:
        table.add_row(*row)
    if twins:
        table.caption = ("signature: a hash of what else decides the kernel (its attributes, numerics policy, a "
                         "restricted search); --format json shows it whole")
    if not console.is_terminal:       # piped: whole rows, however wide, for the reader to grep
        needed = console.measure(table, options=console.options.update_width(10_000)).maximum
        console = Console(file=console.file, width=max(console.width, needed), no_color=True)
    console.print(table)
    _name_the_others(cache, console)
    if others:
        console.print(f"{others} record(s) hold for other versions than this machine's ({_describe(here)}): "
                      "lookups here never use them", markup=False, highlight=False)
    return 0


def _name_the_others(cache: TuneCache, console: Console) -> None:
    named = [n for n in cache.names_beside() if n != cache.name]
    if named:
        console.print(f"other caches in {cache.root}: {', '.join(named)} (list one with --name NAME)",
                      markup=False, highlight=False)


def _export(cache: TuneCache, args: argparse.Namespace, console: Console) -> int:
    n = cache.export(args.file)
    _say(console, args, {"exported": n, "file": args.file, "name": cache.name},
         f"exported {n} records of cache '{cache.name}' to {args.file}")
    return 0


def _import(cache: TuneCache, args: argparse.Namespace, console: Console) -> int:
    here = current_versions()
    before = {r.key for r in cache.records()}
    n = cache.import_(args.file)
    foreign = sum(not r.holds_under(here) for r in cache.records() if r.key not in before)
    note = (f"; {foreign} of them hold for other versions than this machine's ({_describe(here)}) and are "
            "never used here" if foreign else "")
    _say(console, args, {"imported": n, "other_versions": foreign, "file": args.file, "name": cache.name},
         f"imported {n} new or better records from {args.file} into cache '{cache.name}'{note}")
    return 0


def _clear(cache: TuneCache, args: argparse.Namespace, console: Console) -> int:
    what = f"cache '{cache.name}'" + (f" for {args.arch}" if args.arch else "")
    if not args.yes:
        count = len(cache.records(args.arch))
        if not count:                # nothing to ask about
            _say(console, args, {"removed": 0, "name": cache.name, "arch": args.arch}, f"{what} holds no records")
            return 0
        if not sys.stdin.isatty():   # nobody to ask: deleting must be asked for explicitly
            raise UsageError(f"cache clear would delete {count} records of {what}; add --yes to confirm")
        if console.input(f"delete {count} records of {what}? [y/N] ").strip().lower() not in ("y", "yes"):
            console.print("nothing deleted")
            return 1
    n = cache.clear(args.arch)
    _say(console, args, {"removed": n, "name": cache.name, "arch": args.arch}, f"deleted {n} records of {what}")
    return 0


_ACTIONS = {"list": _list, "export": _export, "import": _import, "clear": _clear}


def _say(console: Console, args: argparse.Namespace, data: dict, text: str) -> None:
    if args.format == "json":
        console.file.write(json.dumps(data) + "\n")
    else:
        console.print(text, markup=False, highlight=False, soft_wrap=True)   # a path stays whole


def _used_here(r: TuneRecord, here: Versions) -> str:
    """'yes', or which versions differ from this machine's ('no: driver')."""
    differ = r.versions_differing(here)
    return "yes" if not differ else "no: " + ", ".join(differ)


def _describe(v: Versions) -> str:
    return ", ".join(f"{field} {value}" for field, value in zip(Versions._fields, v))


def _shapes(r: TuneRecord) -> str:
    return _runs(["x".join(map(str, s)) if s else "scalar" for s in r.shapes])


def _runs(items: list[str]) -> str:
    """The operands' shapes or dtypes in order, a run of equal ones written once with its count.

    >>> _runs(["bf16", "bf16", "bf16"]), _runs(["512x512", "512x512", "512"])
    ('3 × bf16', '2 × 512x512, 512')
    """
    runs = [(item, sum(1 for _ in group)) for item, group in itertools.groupby(items)]
    return ", ".join(item if n == 1 else f"{n} × {item}" for item, n in runs)


def _config(r: TuneRecord) -> str:
    return " ".join(f"{k}={v}" for k, v in r.config.items())
