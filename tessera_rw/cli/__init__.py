"""`tessera-rewrite`: `--explain` a function, `tune` it, `rules` to list and check rulesets, `cache` for the autotune cache."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path
from typing import Iterator, Sequence

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.cli import cache, explain, rules, tune
from tessera_rw.cli.usage import USAGE, Parser, UsageError, one_line
from tessera_rw.support.version import package_version
from tessera_rw.text_console import default_console

SUBCOMMANDS = {"rules": rules, "cache": cache, "tune": tune}


OTHER_COMMANDS = """other commands (each takes --help):
  tessera-rewrite tune FILE.py:FUNCTION     autotune a kernel's schedules into the cache
  tessera-rewrite rules [--check] [PACK]    list the rulesets, built-in and plugins; check their soundness
  tessera-rewrite cache list|export|import|clear   look at and move the autotune cache"""


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Warnings printed as one line each once the command is done, 'tessera-rewrite: warning: …',
    with the user's file and line where one of theirs raised it, not Python's source location."""
    package = str(Path(__file__).resolve().parents[1])
    with warnings.catch_warnings(record=True) as caught:      # the filters stay the user's (-W error, -W ignore)
        try:
            yield
        finally:
            for w in caught:
                theirs = w.filename.endswith(".py") and not str(Path(w.filename).resolve()).startswith(package)
                print(f"tessera-rewrite: warning: {w.message}" + (f" ({w.filename}:{w.lineno})" if theirs else ""),
                      file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = default_console()
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        if argv and name is None and not argv[0].startswith("-"):
            target = next((a for a in argv if ".py" in a), None)     # `explain f.py` for `--explain f.py`
            raise UsageError(f"unknown command {argv[0]!r}: the commands are {', '.join(SUBCOMMANDS)}; "
                             f"to explain a file, --explain {target or 'FILE.py'}")
        parser = Parser(prog="tessera-rewrite" + (f" {name}" if name else ""),
                        epilog=None if name else OTHER_COMMANDS, formatter_class=argparse.RawDescriptionHelpFormatter)
        module = SUBCOMMANDS[name] if name else explain
        module.add_arguments(parser)
        if name is None:
            parser.add_argument("--version", action="version", version=f"tessera-rewrite {package_version()}")
        args = parser.parse_args(argv[1:] if name else argv)
        with warnings_as_lines():
            return module.run(args, console)
    except UsageError as e:
        print(f"tessera-rewrite: {e}\n{USAGE[name]}", file=sys.stderr)
        return 2
    except TesseraError as e:      # what went wrong and what to do (no usage line: the invocation was fine)
        print(f"tessera-rewrite: {one_line(e)}" + (f"\nhint: {e.hint}" if e.hint else ""), file=sys.stderr)
        return 2
    finally:
        console.file.flush()      # a line printed with end="" and nothing after it
