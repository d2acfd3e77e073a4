"""Human summaries of graphs: op counts, FLOPs and bytes moved, as a rich table."""

from __future__ import annotations

from rich.table import Table

from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import OPS
from tessera_rw.rules.saturate import RewriteReport


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
