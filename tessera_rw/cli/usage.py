"""Bad invocations: one clear line on stderr, a usage hint, exit status 2, no traceback."""

from __future__ import annotations

import argparse

USAGE = ("usage: tessera-rewrite --explain FILE.py:FUNCTION [--input NAME=4x16x64:bf16 ...]\n"
         "       tessera-rewrite tune FILE.py:FUNCTION [--method auto|on_device|cost_model] [--max-trials N]\n"
         "       tessera-rewrite rules [--check] [PACK ...]\n"
         "       tessera-rewrite cache list|export FILE|import FILE|clear [--arch A] [--yes] [--name N]")


class UsageError(Exception):
    """A bad invocation: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UsageError(message)
