"""Benchmark results on disk: bench/results/<machine>-<date>.json and .md, stamped with the commit.

The JSON (`"schema": "tessera_rw.bench/1"`) holds every figure with its unit and target and the
per-model tables; the markdown is the same tables for reading (and for the README).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from datetime import date
from pathlib import Path
from typing import Sequence

RESULTS = Path(__file__).parent / "results"
SCHEMA = "tessera_rw.bench/1"


def commit() -> str:
    """The checked-out commit (with '+dirty' when the tree has changes), or 'unknown'; $BENCH_COMMIT
    where set (a copy of a checkout on a GPU host, whose git metadata is not the tree's)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    root = Path(__file__).parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_machine() -> dict:
    """What the host figures depend on: the CPU, its cores, Python and the libraries doing the work."""
    from importlib.metadata import version
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            **{name: version(name) for name in ("numpy", "scipy", "egglog", "cuda-core", "nvidia-cuda-nvrtc")}}


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def suite_name(suite: str, quick: bool, only: str | None) -> str:
    """The results file's suite: 'gpu', 'gpu-quick', 'tune-only-gemm' (`--quick`, `--only gemm`)."""
    return f"{suite}{'-quick' if quick else ''}{f'-only-{slug(only)}' if only else ''}"


def wanted(name: str, only: str | None) -> bool:
    """Whether a row named `name` runs under `--only only` (every row without it)."""
    return only is None or only in name


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_atomically(path: Path, text: str) -> Path:
    """Write `path` through a temporary file beside it, so a reader never sees half of it."""
    path.parent.mkdir(exist_ok=True)
    staged = path.with_suffix(path.suffix + ".tmp")
    staged.write_text(text)
    os.replace(staged, path)
    return path


def write_results(name: str, document: dict, markdown: str) -> tuple[Path, Path]:
    """Write bench/results/<name>-<today>.json and .md (the document gains schema, date and commit)."""
    stem = f"{name}-{date.today().isoformat()}"
    document = {"schema": SCHEMA, "date": date.today().isoformat(), "commit": commit(), **document}
    paths = RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"
    header = f"# {name}, {document['date']}, commit {document['commit']}\n\n"
    for path, text in zip(paths, (json.dumps(document, indent=2) + "\n", header + markdown + "\n")):
        write_atomically(path, text)
    return paths
