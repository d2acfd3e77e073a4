"""Bad invocations: one clear line on stderr, a usage hint, exit status 2, no traceback."""

from __future__ import annotations

import argparse

from tessera_rw.algebra.errors import TesseraError

USAGE = {
    None: "usage: tessera-rewrite --explain FILE.py[:FUNCTION] [--input NAME=4x16x64:bf16 ...] [--format text|json] "
          "[--emit-cuda DIR] [--arch sm_90] [--tune] [--run]",
    "tune": "usage: tessera-rewrite tune FILE.py:FUNCTION [--method auto|on_device|cost_model] [--max-trials N]",
    "rules": "usage: tessera-rewrite rules [--check] [PACK ...]",
    "cache": "usage: tessera-rewrite cache list|export FILE|import FILE|clear [--arch A] [--yes] [--name N]",
}


def positive_int(text: str) -> int:
    """An argparse type: an int of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


class UsageError(Exception):
    """A bad invocation: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UsageError(message)


def one_line(error: TesseraError) -> str:
    """A TesseraError as one line: what is wrong, the operands and where (its hint goes on the next)."""
    head = f"{error.op}: {error.detail}" if error.op else error.detail
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    # a listing after a colon reads on after it; other lines end with a semicolon
    parts = [" ".join(line if line.endswith(":") or i == len(lines) - 1 else line + ";"
                      for i, line in enumerate(lines))]
    if error.operands:
        parts.append(f"operands {error.operands}")
    if error.site:
        parts.append(f"at {error.site}")
    return " — ".join(parts)
