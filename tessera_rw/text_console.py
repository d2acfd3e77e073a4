"""Where the command line's text goes: rich on a terminal; piped, plain lines to grep and diff.

Piped output is TEXT_WIDTH columns wide (rich's 80 would fold a kernel's name in two) and no line
ends in the spaces rich pads tables and wrapped sentences with.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console

TEXT_WIDTH = 100          # columns of the text forms


class TrimmedLines:
    """A text stream that writes each line without its trailing spaces."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        self._stream.write("".join(line.rstrip() + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        """Write what a print with end="" left, as is: the line goes on after it."""
        self._stream.write(self._partial)
        self._partial = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str):      # encoding, fileno, ...: the stream's own
        return getattr(self._stream, name)


def default_console(stderr: bool = False) -> Console:
    """The terminal at its width, or, piped (not a terminal, no COLUMNS), TEXT_WIDTH columns of
    lines without trailing spaces."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console(stderr=stderr)
    return Console(file=TrimmedLines(stream), width=TEXT_WIDTH)
