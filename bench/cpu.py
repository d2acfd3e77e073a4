"""`python -m bench cpu`: host-side figures with their targets, in one table."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from bench import models
from bench.timing import time_call


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    target: str
    ok: bool | None  # None: recorded, no target


def trace_fresh(kernel_factory, inputs) -> int:
    """Trace a new kernel object (no per-signature cache) and return its node count."""
    return len(kernel_factory().trace(**inputs).nodes)


def tracing_figures() -> list[Figure]:
    bert_inputs = models.placeholders(models.BERT_BASE, with_mask=True)
    nodes = trace_fresh(models.bert_encoder, bert_inputs)
    t = time_call(lambda: trace_fresh(models.bert_encoder, bert_inputs), reps=7)
    gpt_inputs = models.placeholders(models.GPT_48, with_mask=False)
    gpt_nodes = trace_fresh(models.gpt_stack, gpt_inputs)
    t48 = time_call(lambda: trace_fresh(models.gpt_stack, gpt_inputs), reps=5)
    return [
        Figure(f"trace BERT-base 12 layers ({nodes} nodes)", t.median_ms, "ms", "< 200", t.median_ms < 200),
        Figure(f"trace GPT 48 layers ({gpt_nodes} nodes)", t48.median_ms, "ms", "", None),
    ]


def run() -> list[Figure]:
    figures = tracing_figures()
    table = Table(title="tessera_rw CPU benchmark")
    for col in ("figure", "value", "unit", "target", "met"):
        table.add_column(col)
    for f in figures:
        met = "" if f.ok is None else ("yes" if f.ok else "NO")
        table.add_row(f.name, f"{f.value:.1f}", f.unit, f.target, met)
    Console().print(table)
    return figures
