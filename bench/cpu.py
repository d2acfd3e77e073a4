"""`python -m bench cpu`: host-side figures with their targets, in one table."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.console import Console
from rich.table import Table

from bench import models
from bench.timing import time_call
from tessera_rw.codegen.arch import arch_named
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite
from tessera_rw.tune.extract import extract_candidates

H100 = arch_named("H100-SXM")


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


def saturate_and_extract(graph) -> tuple[int, int]:
    """Rewrite with every built-in ruleset and extract the cost model's candidates (all fusion depths);
    (e-nodes, fused attentions in the chosen program)."""
    result = rewrite(graph, BUILTIN_RULESETS)
    chosen = extract_candidates(result, H100)[0]
    return result.report.enodes, chosen.graph.op_counts().get("flash_attention", 0)


def rewrite_figures() -> list[Figure]:
    bert12 = models.bert_encoder(models.BERT_BASE).trace(**models.placeholders(models.BERT_BASE, with_mask=True))
    cfg48 = replace(models.BERT_BASE, layers=48)
    bert48 = models.bert_encoder(cfg48).trace(**models.placeholders(cfg48, with_mask=True))
    enodes, fused = saturate_and_extract(bert12)
    t12 = time_call(lambda: saturate_and_extract(bert12), reps=5)
    t48 = time_call(lambda: saturate_and_extract(bert48), reps=3)
    ratio = t48.median_s / t12.median_s
    return [
        Figure(f"saturate + extract BERT-base 12 layers ({fused}/12 attentions fused)", t12.median_ms, "ms",
               "< 1000", t12.median_ms < 1000 and fused == 12),
        Figure("saturate + extract BERT-base 48 layers", t48.median_ms, "ms", "", None),
        Figure("48-layer / 12-layer rewrite time", ratio, "x", "< 4", ratio < 4),
        Figure("BERT-base 12-layer e-graph size", enodes, "e-nodes", "< 50000", enodes < 50_000),
    ]


def call_figures() -> list[Figure]:
    from bench.kernel_calls import first_call_of_attention, warm_call_overhead_us
    call, plan = warm_call_overhead_us()
    first = first_call_of_attention()
    return [
        Figure(f"warm @op.kernel call over its plan run ({call:.1f} vs {plan:.1f} µs)", call - plan, "µs", "< 20",
               call - plan < 20),
        Figure(f"first call, attention example, autotune on ({first['chosen_by']}, {first['kernels']} kernel(s), "
               f"imports {first['import_s']:.1f} s apart)", first["first_call_s"], "s", "< 10",
               first["first_call_s"] < 10 and first["finite"]),
    ]


def run() -> list[Figure]:
    figures = tracing_figures() + rewrite_figures() + call_figures()
    table = Table(title="tessera_rw CPU benchmark")
    for col in ("figure", "value", "unit", "target", "met"):
        table.add_column(col)
    for f in figures:
        met = "" if f.ok is None else ("yes" if f.ok else "NO")
        table.add_row(f.name, f"{f.value:.2f}" if f.value < 10 else f"{f.value:.0f}", f.unit, f.target, met)
    Console().print(table)
    return figures
