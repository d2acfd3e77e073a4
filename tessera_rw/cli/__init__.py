"""`tessera-rewrite`: `--explain` a function, `tune` it, `rules` to list and check rulesets, `cache` for the autotune cache."""

from __future__ import annotations

import sys
from typing import Sequence

from rich.console import Console

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.cli import cache, explain, rules, tune
from tessera_rw.cli.usage import USAGE, Parser, UsageError, one_line

SUBCOMMANDS = {"rules": rules, "cache": cache, "tune": tune}


PIPED_WIDTH = 100       # piped output reads at 100 columns, whatever the terminal


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    try:
        parser = Parser(prog="tessera-rewrite" + (f" {name}" if name else ""))
        module = SUBCOMMANDS[name] if name else explain
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:] if name else argv)
        return module.run(args, console)
    except UsageError as e:
        print(f"tessera-rewrite: {e}\n{USAGE[name]}", file=sys.stderr)
        return 2
    except TesseraError as e:
        print(f"tessera-rewrite: {one_line(e)}\n{'hint: ' + e.hint if e.hint else USAGE[name]}", file=sys.stderr)
        return 2
