"""Human summaries for --explain: the input graph, the rewrite, the candidates and their kernels."""

from __future__ import annotations

from rich.table import Table

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.rules.saturate import RewriteReport
from tessera_rw.tune.extract import Candidate


def node_flops(node: Node) -> int:
    """FLOPs of one node as written (a multiply-add counts 2)."""
    return OPS[node.op].flops(node.type, *(a.type for a in node.args), **node.attr_map)


def graph_summary(graph: Graph) -> Table:
    table = Table(title=f"{graph.name}: input graph", show_header=True)
    table.add_column("op")
    table.add_column("count", justify="right")
    table.add_column("GFLOP", justify="right")
    flops: dict[str, int] = {}
    for n in graph.nodes:
        flops[n.op] = flops.get(n.op, 0) + node_flops(n)
    for op, count in sorted(graph.op_counts().items(), key=lambda kv: -flops.get(kv[0], 0)):
        table.add_row(op, str(count), f"{flops.get(op, 0) / 1e9:.3f}")
    table.add_section()
    table.add_row("total", str(sum(graph.op_counts().values())), f"{sum(flops.values()) / 1e9:.3f}")
    return table


def rewrite_summary(report: RewriteReport) -> Table:
    """Rules fired (per ruleset, with matches) and how the e-graph grew, with the stop reason."""
    table = Table(title=f"rewrite: {report.stop_reason.value} after {len(report.iterations)} iteration(s), "
                        f"{report.enodes} e-nodes, {report.seconds * 1e3:.0f} ms")
    table.add_column("ruleset")
    table.add_column("rule")
    table.add_column("matches", justify="right")
    for rule, ruleset, matches in report.fired():
        table.add_row(ruleset, rule, str(matches))
    table.caption = "e-nodes per iteration: " + " → ".join(str(it.enodes) for it in report.iterations)
    return table


def _us(t: float) -> str:
    return "inf" if t == float("inf") else f"{t:,.1f}"


def candidates_table(candidates: tuple[Candidate, ...], arch: ArchSpec) -> Table:
    """One row per candidate, cheapest first: its depth, kernels, traffic, work and estimated time."""
    table = Table(title=f"candidates on {arch.name} ({arch.sm}, {arch.hbm_gbps:,.0f} GB/s, "
                        f"{arch.peak_tflops.get(MathUnit.BF16, 0):,.0f} bf16 TFLOP/s)")
    for column in ("#", "fusion depth", "kernels", "HBM MB", "GFLOP", "est µs"):
        table.add_column(column, justify="left" if column == "fusion depth" else "right")
    for rank, c in enumerate(candidates):
        table.add_row(str(rank), c.fusion_depth.label, str(len(c.kernels)), f"{c.hbm_bytes / 1e6:,.2f}",
                      f"{c.flops / 1e9:,.3f}", _us(c.est_us), style="bold" if rank == 0 else None)
    return table


def kernels_table(candidate: Candidate, title: str) -> Table:
    """The per-kernel breakdown: what each kernel fuses, its schedule, resources and time."""
    table = Table(title=title)
    numeric = ("regs", "smem KB", "occ", "HBM MB", "GFLOP", "compute µs", "memory µs", "est µs")
    for column in ("kernel", "fused", "schedule", *numeric, "bound"):
        table.add_column(column, justify="right" if column in numeric else "left")
    for k in candidate.kernels:
        table.add_row(k.kind if k.has_template else f"{k.kind} (no template)", ", ".join(k.fused) or "-",
                      k.schedule, str(k.registers), f"{k.smem_bytes / 1024:.0f}", f"{k.occupancy:.0%}",
                      f"{k.hbm_bytes / 1e6:,.2f}", f"{k.flops / 1e9:,.3f}", _us(k.compute_us), _us(k.memory_us),
                      _us(k.est_us), k.bound)
    return table


def choice_reason(candidates: tuple[Candidate, ...]) -> str:
    """Why the first candidate won, against the runner-up, in one sentence."""
    best = candidates[0]
    if len(candidates) == 1:
        return f"chosen: the only candidate ({best.fusion_depth.label}), {_us(best.est_us)} µs"
    other = candidates[1]
    parts = [f"{len(best.kernels)} vs {len(other.kernels)} kernels"]
    if best.hbm_bytes != other.hbm_bytes:
        parts.append(f"{best.hbm_bytes / 1e6:,.2f} vs {other.hbm_bytes / 1e6:,.2f} MB through HBM")
    if best.flops != other.flops:
        parts.append(f"{best.flops / 1e9:,.3f} vs {other.flops / 1e9:,.3f} GFLOP")
    ratio = other.est_us / best.est_us if best.est_us else float("inf")
    return (f"chosen: {best.fusion_depth.label}, {_us(best.est_us)} µs, {ratio:.2f}x faster than the "
            f"{other.fusion_depth.label} runner-up ({'; '.join(parts)})")
