"""What tuning shows while it runs: a progress bar on stderr once it has taken a second, then a
closing table per kernel (schedule, time, % of the best). Nothing is shown when stderr is not a
terminal (CI logs, pipes) or when tuning finishes within the second.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.tune.search import Trial

SHOW_AFTER_S = 1.0
TABLE_ROWS = 8


def trials_table(title: str, trials: Sequence[Trial], chosen: Trial | None = None) -> Table:
    """Schedule, measured time (± noise, when measured) and time as % of the best, fastest first; failures last
    with their reason; the chosen one marked."""
    table = Table(title=title, title_justify="left")
    table.add_column("schedule")
    table.add_column("time", justify="right")
    table.add_column("% of best", justify="right")
    ok = sorted((t for t in trials if t.measurement.ok), key=lambda t: t.measurement.median_us)
    failed = [t for t in trials if not t.measurement.ok]
    best = ok[0].measurement.median_us if ok else math.nan
    for t in ok[:TABLE_ROWS]:
        mark = " ◀" if chosen is not None and t.number == chosen.number else ""
        m = t.measurement
        noise = f" ± {m.noise_us:.2f}" if m.noise_us else ""       # an estimate has none
        table.add_row(describe(t.schedule) + mark, f"{m.median_us:.2f} µs{noise}",
                      f"{100 * m.median_us / best:.0f}%")
    if len(ok) > TABLE_ROWS:
        table.add_row(f"… {len(ok) - TABLE_ROWS} more", "", "")
    for t in failed[:3]:
        table.add_row(describe(t.schedule), "failed", (t.measurement.failure or "")[:60])
    return table


def describe(schedule: object) -> str:
    return schedule.describe() if hasattr(schedule, "describe") else str(schedule)


class TuningProgress:
    """Counts trials; draws the bar once SHOW_AFTER_S has passed and stderr is a terminal."""

    def __init__(self, name: str, console: Console | None = None, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.console = console or Console(stderr=True)
        self.clock = clock
        self.start = clock()
        self.trials = 0
        self.progress: Progress | None = None
        self.task = None
        self.results: list[tuple[KernelOp, list[Trial]]] = []

    @property
    def shown(self) -> bool:
        return self.progress is not None

    def on_trial(self, op: KernelOp, trial: Trial) -> None:
        self.trials += 1
        if not self.results or self.results[-1][0] != op:
            self.results.append((op, []))
        self.results[-1][1].append(trial)
        if self.progress is None and self.console.is_terminal and self.clock() - self.start >= SHOW_AFTER_S:
            self.progress = Progress(TextColumn("tuning {task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(self.name, total=None)
        if self.progress is not None:
            self.progress.update(self.task, completed=self.trials, description=f"{self.name}: {op.op}")

    def close(self, chosen: Mapping[KernelOp, object] | None = None) -> None:
        """Stop the bar; when it was shown, print each kernel's table, marking its `chosen` schedule."""
        if self.progress is None:
            return
        self.progress.stop()
        self.progress = None
        for op, trials in self.results:
            pick = next((t for t in trials if (chosen or {}).get(op) == t.schedule), None)
            self.console.print(trials_table(f"{op.op} ({len(trials)} schedules measured)", trials, pick))
