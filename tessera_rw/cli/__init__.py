"""`tessera-rewrite`: `--explain` a function, `tune` it, `rules` to list and check rulesets, `cache` for the autotune cache."""

from __future__ import annotations

import sys
from typing import Sequence

from rich.console import Console

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.cli import cache, explain, rules, tune
from tessera_rw.cli.usage import USAGE, Parser, UsageError

SUBCOMMANDS = {"rules": rules, "cache": cache, "tune": tune}


WIDE_OUTPUT = 200


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = Console() if sys.stdout.isatty() else Console(width=WIDE_OUTPUT)  # piped: do not wrap at 80
    try:
        command = SUBCOMMANDS.get(argv[0]) if argv else None
        parser = Parser(prog="tessera-rewrite" + (f" {argv[0]}" if command else ""))
        module = command or explain
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:] if command else argv)
        return module.run(args, console)
    except UsageError as e:
        print(f"tessera-rewrite: {e}\n{USAGE}", file=sys.stderr)
        return 2
    except TesseraError as e:
        print(f"tessera-rewrite: {e}", file=sys.stderr)
        return 2
