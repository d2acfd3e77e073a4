"""`python -m bench registers`: the register model against ptxas, for every template's samples at
every default schedule on sm_80 and sm_90 (NVRTC; no GPU needed)."""

from __future__ import annotations

import sys
import statistics

from rich.console import Console
from rich.table import Table

from tessera_rw.codegen.calibration import register_rows
from tessera_rw.codegen.templates.registry import templates

BOUND = 0.25


def run(console: Console | None = None) -> bool:
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    rows = register_rows(templates())
    table = Table(title="register estimate vs ptxas (bound ±25%, spills must match)")
    for column in ("kind", "op", "schedule", "arch", "estimate", "ptxas", "error", "spill est/ptxas B"):
        table.add_column(column, justify="right" if column in ("estimate", "ptxas", "error") else "left")
    for r in rows:
        ok = r.within(BOUND) and r.spill_agrees
        table.add_row(r.kind, str(r.op), r.schedule, r.arch, str(r.estimate), str(r.ptxas), f"{r.error:+.0%}",
                      f"{r.predicted_spill_bytes}/{r.spill_bytes}", style=None if ok else "red")
    console.print(table)
    errors = [abs(r.error) for r in rows]
    passed = all(r.within(BOUND) and r.spill_agrees for r in rows)
    console.print(f"{len(rows)} kernels: median |error| {statistics.median(errors):.0%}, max {max(errors):.0%}, "
                  f"spill predictions {'all exact' if all(r.spill_agrees for r in rows) else 'WRONG'} "
                  f"-> {'PASS' if passed else 'FAIL'}")
    return passed
