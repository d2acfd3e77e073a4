"""The text of an ExplainReport: rich tables that read at 100 columns.

In order: the input graph (ops, counts, GFLOP, then the graph as source), the rewrite (rules fired
per ruleset, e-nodes per iteration, why saturation stopped), the candidates the cost model weighed,
each candidate's kernels, the chosen program and why it won, its KernelPlan and the kernels it
generates. A report read back from JSON has no program: it shows what the schema holds.
"""

from __future__ import annotations

import math
import re
from io import StringIO
from typing import TYPE_CHECKING, Iterator

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import BUILTIN_OPS, opdef
from tessera_rw.codegen.arch import MathUnit
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.registry import refusal, templates
from tessera_rw.tune.cost import KernelCost
from tessera_rw.text_console import TEXT_WIDTH, TrimmedLines
from tessera_rw.tune.extract import FUSED_OP_DEPTH, FusionDepth

if TYPE_CHECKING:
    from tessera_rw.explain_report import CandidateInfo, ExplainReport
    from tessera_rw.pipeline import CompiledProgram


def node_flops(node: Node) -> int:
    """FLOPs of one node as written (a multiply-add counts 2)."""
    return opdef(node.op).flops(node.type, *(a.type for a in node.args), **node.attr_map)


def _us(t: float | None) -> str:
    return "-" if t is None or not math.isfinite(t) else f"{t:,.1f}"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}"


def _gflop(n: int) -> str:
    return f"{n / 1e9:,.3f}"


class Listing(Text):
    """Program text (a graph, a plan): printed one line per line however long, as code reads."""


class Printable(Group):
    """Rich renderables that print as text with Python's print too (rich's print shows them styled)."""

    def text(self, width: int = TEXT_WIDTH) -> str:
        """Tables at `width` columns, listings (graphs, plans) one line per line however long, no
        trailing spaces: text to read, grep and copy."""
        text = StringIO()
        console = Console(file=TrimmedLines(text), width=width, color_system=None, force_terminal=False)
        self.print_to(console)
        console.file.flush()
        return text.getvalue()

    def print_to(self, console: Console) -> None:
        """Print to `console`, each Listing's lines whole: a wrapped graph line splits its comment."""
        for item in self.renderables:
            console.print(item, soft_wrap=isinstance(item, Listing))

    def __str__(self) -> str:
        return self.text()


def report_table(title: str, caption: str | None = None) -> Table:
    """A table that reads at 100 columns: a light box, and never narrower than its title."""
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, min_width=min(len(title), 100),
                 title_justify="left", caption_justify="left")


def graph_summary(graph: Graph) -> Table:
    table = report_table(f"{graph.name}: input graph")
    table.add_column("op")
    table.add_column("count", justify="right")
    table.add_column("GFLOP", justify="right")
    flops: dict[str, int] = {}
    for n in graph.nodes:
        flops[n.op] = flops.get(n.op, 0) + node_flops(n)
    for op, count in sorted(graph.op_counts().items(), key=lambda kv: -flops.get(kv[0], 0)):
        table.add_row(op, str(count), _gflop(flops.get(op, 0)))
    table.add_section()
    table.add_row("total", str(sum(graph.op_counts().values())), _gflop(sum(flops.values())))
    return table


def rewrite_summary(report: ExplainReport, program: CompiledProgram | None) -> Table:
    """Rules fired (per ruleset, with matches) and how the e-graph grew, with the stop reason."""
    e = report.egraph
    setup = program.rewrite.report.setup_seconds if program is not None else 0.0
    took = f"{(e.seconds - setup) * 1e3:.0f} ms" + (f" (+{setup * 1e3:.0f} ms declaring the rules, once per process)"
                                                    if setup >= 0.01 else "")
    table = report_table(f"rewrite: {e.stop_reason} after {e.iterations} iteration(s), {e.enodes} e-nodes, "
                         f"{e.eclasses} e-classes, {took}")
    table.add_column("ruleset")
    table.add_column("rule")
    table.add_column("matches", justify="right")
    for rule in sorted(report.rules, key=lambda r: (r.ruleset, -r.matches, r.name)):
        table.add_row(rule.ruleset, rule.name, str(rule.matches))
    if program is not None:
        assumed = [f"{name} assumes {what}" for name, what in program.rewrite.report.assumed.items()]
        table.caption = "\n".join((iteration_lines(program), *assumed, *unbuildable_lines(program)))
    return table


def unbuildable_lines(program: CompiledProgram) -> list[str]:
    """A line per fused op the rewrites reached that extraction cannot choose, so no candidate shows
    it: an op no kernel template implements (a plugin's fused op without a template), or one whose
    templates refuse its types (fp32 attention), with the templates' reason."""
    view = program.rewrite.view
    every = templates()
    implemented = {name for template in every for name in template.ops}
    reached = {enode.op for nodes in view.classes.values() for enode in nodes}
    missing = sorted(reached - implemented - BUILTIN_OPS)
    lines = [f"{name}: the rewrites reached it, but no kernel template implements it, so no candidate uses it "
             "(a plugin that declares a fused op also needs a template for it)" for name in missing]
    refused: dict[str, str] = {}
    for enode in (n for nodes in view.classes.values() for n in nodes):
        if enode.op in FUSED_OP_DEPTH and enode.op in implemented:
            op = KernelOp(enode.op, tuple(view.types[c] for c in enode.operands), enode.attrs,
                          view.types[enode.eclass])
            if (why := refusal(op)) is not None:
                refused.setdefault(f"{enode.op} {op.result}", why)
    lines += [f"{what}: the rewrites reached it, but no candidate can use it: {why}" for what, why in refused.items()]
    return lines


def iteration_lines(program: CompiledProgram) -> str:
    """Per saturation iteration: the e-graph's size, the matches it applied, its time, rules banned."""
    lines = []
    for it in program.rewrite.report.iterations:
        line = (f"iteration {it.index}: {it.enodes} e-nodes, {sum(it.matches.values())} matches, "
                f"{it.seconds * 1e3:.0f} ms")
        if it.banned:
            line += f"; backed off: {', '.join(it.banned)}"
        lines.append(line)
    return "\n".join(lines)


def candidates_table(report: ExplainReport, program: CompiledProgram | None) -> Table:
    """One row per candidate, cheapest estimate first; the chosen one is marked. The title gives
    the GPU's bandwidth and the peaks of the math units the candidates' kernels run on."""
    arch = program.arch if program is not None else None
    where = ""
    if arch is not None:
        units = dict.fromkeys(k.unit for c in program.candidates for k in c.kernels if k.has_template)
        peaks = ", ".join(f"{arch.peak_tflops[MathUnit(u)]:,.0f} {u}" for u in units if MathUnit(u) in arch.peak_tflops)
        where = f" on {arch.name} ({arch.sm}, {arch.hbm_gbps:,.0f} GB/s" + (f", {peaks} TFLOP/s)" if peaks else ")")
    table = report_table("candidates" + where, caption="* chosen; registers, µs: the cost model's estimates "
                                                       "(--emit-cuda lists ptxas's registers)")
    for column in ("#", "fusion depth", "kernels", "HBM MB", "GFLOP", "max regs", "est µs"):
        table.add_column(column, justify="left" if column == "fusion depth" else "right")
    for rank, c in enumerate(report.candidates):
        chosen = rank == report.chosen
        table.add_row(f"{'*' if chosen else ''}{rank}", candidate_label(report, rank), str(len(c.kernels)),
                      _mb(c.hbm_bytes), _gflop(c.flops), str(max((k.registers for k in c.kernels), default=0)),
                      _us(c.est_us), style="bold" if chosen else None)
    return table


KERNEL_NAME_WIDTH = 22


def _broken_at_plus(name: str, width: int = KERNEL_NAME_WIDTH) -> str:
    """A kernel's name in lines of at most `width` characters where it can, broken after a '+'.

    >>> print(_broken_at_plus("flash_attention+scale+causal+softmax"))
    flash_attention+scale+
    causal+softmax
    """
    lines = [""]
    for part in name.split("+"):
        piece = part if not lines[-1] else "+" + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += "+"
            lines.append(part)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def kernels_table(candidate: CandidateInfo, costs: tuple[KernelCost, ...] | None, title: str) -> Table:
    """The per-kernel breakdown: each kernel with what it fused, its resources and time. `costs` (the
    cost model's records, when the program is at hand) add the schedule, occupancy and what bounds it."""
    table = report_table(title)
    table.pad_edge = False      # ten columns: a space apiece more would wrap them at 100 columns
    numeric = ("regs", "smem KB", "occ", "HBM MB", "GFLOP", "est µs")
    columns = ("kernel", "schedule", *numeric, "bound") if costs else ("kernel", *numeric)
    for column in columns:
        # a long kernel name is broken after its '+'s (_broken_at_plus) and the schedule at its
        # spaces; nothing else wraps, and no header breaks inside its word
        table.add_column(column, justify="right" if column in numeric else "left", overflow="fold",
                         no_wrap=column != "schedule",
                         min_width=len("compute") if column == "bound" else len(column))
    for i, k in enumerate(candidate.kernels):
        cost = costs[i] if costs else None
        name = _broken_at_plus("+".join((k.kind, *k.fused))) + ("" if cost is None or cost.has_template else
                                                                 f" (no template: {cost.op.op})")
        numbers = [str(k.registers), f"{k.smem_bytes / 1024:.0f}", f"{cost.occupancy:.0%}" if cost else "-",
                   _mb(k.hbm_bytes), _gflop(k.flops), _us(k.est_us)]
        if cost:
            table.add_row(name, compact_schedule(cost.schedule), *numbers, cost.bound if cost.has_template else "host")
        else:
            table.add_row(name, *numbers)
    return table


def compact_schedule(schedule: str) -> str:
    """'bm=128 bn=128 bk=32 warps_m=2 warps_n=2 stages=3' -> '128x128x32 w2x2 s3': tiles and knobs,
    compact; a tuple value stays whole ('tile=(1, 1024)' -> 'tile=(1,1024)'), a bare word ('tma')
    is kept.

    >>> compact_schedule("tma bm=64 bn=128 bk=64 stages=4"), compact_schedule("tile=(1, 1024) threads=256")
    ('tma 64x128x64 s4', 'tile=(1,1024) t=256')
    """
    parts = _SCHEDULE_PART.findall(schedule)
    knobs = {k: v.replace(" ", "") for k, v, _ in parts if k}
    if not knobs:
        return schedule
    words = [w for k, _, w in parts if not k]
    tile = "x".join(knobs.pop(k) for k in ("bm", "bn", "bk") if k in knobs)
    warps = "x".join(knobs.pop(k) for k in ("warps_m", "warps_n") if k in knobs) or knobs.pop("warps", "")
    stages = knobs.pop("stages", "")
    rest = [f"{k.replace('rows_per_block', 'rows').replace('threads', 't').replace('fusion_depth', 'depth')}={v}"
            for k, v in knobs.items()]
    return " ".join(p for p in (*words, tile, f"w{warps}" if warps else "", f"s{stages}" if stages else "", *rest)
                    if p)


_SCHEDULE_PART = re.compile(r"(\w+)=(\([^)]*\)|\S+)|(\S+)")     # key=value (a tuple whole), or a bare word


FFT_KINDS = ("fft", "ifft")


def takes_fft(report: ExplainReport) -> list[bool]:
    """Whether each candidate takes the FFT path."""
    return [any(k.kind in FFT_KINDS for k in c.kernels) for c in report.candidates]


def candidate_label(report: ExplainReport, rank: int) -> str:
    """A candidate's fusion depth, and where the candidates differ in it, whether it takes the FFT
    path ("unfused, FFT" beside "unfused, direct conv")."""
    c = report.candidates[rank]
    label = FusionDepth(c.fusion_depth).label
    spectral = takes_fft(report)
    if len(set(spectral)) < 2:
        return label
    if spectral[rank]:
        return f"{label}, FFT"
    return f"{label}, direct conv" if any(k.kind == "conv" for k in c.kernels) else f"{label}, no FFT"


def _how_cached(program: CompiledProgram | None) -> str:
    """How the cached records of a program's kernels were made: 'timed on the GPU', 'ranked by the
    cost model', or both."""
    kernels = program.tuning.tuning.kernels if program is not None and program.tuning is not None else ()
    ways = {k.record.chosen_by.value for k in kernels if k.record is not None}
    words = {"on_device": "timed on the GPU", "cost_model": "ranked by the cost model"}
    return " and ".join(words[w] for w in sorted(ways, reverse=True) if w in words) or "tuned"


def choice_reason(report: ExplainReport, program: CompiledProgram | None = None) -> str:
    """Why the chosen candidate won, in one sentence: against the runner-up by the cost model,
    by timing on the GPU, or from the cache."""
    best = report.candidates[report.chosen]
    label = candidate_label(report, report.chosen)
    if report.chosen_by == "cache":
        return (f"chosen: {label} (candidate {report.chosen}), from the autotune cache: "
                f"{_how_cached(program)} earlier for this signature")
    if report.chosen_by == "on_device":
        return f"chosen: {label} (candidate {report.chosen}), timed fastest on the GPU{_timings(program)}"
    if len(report.candidates) == 1:      # an unfused program's chains may still be merged as it is lowered
        merged = any(len(k.fused) > 1 for k in best.kernels) and not best.fusion_depth
        return (f"chosen: the only candidate ({label}{', its elementwise kernels merged' if merged else ''}), "
                f"{_us(best.est_us)} µs by the cost model{_on_host(report, program)}")
    other_rank = 1 if report.chosen == 0 else 0
    other = report.candidates[other_rank]
    parts = [f"{len(best.kernels)} vs {len(other.kernels)} kernels"]
    if best.hbm_bytes != other.hbm_bytes:
        parts.append(f"{_mb(best.hbm_bytes)} vs {_mb(other.hbm_bytes)} MB through HBM")
    if best.flops != other.flops:
        parts.append(f"{_gflop(best.flops)} vs {_gflop(other.flops)} GFLOP")
    if best.est_us and other.est_us:
        speed = f"{other.est_us / best.est_us:.2f}x faster than"
    else:
        speed = "preferred to"
    return (f"chosen: {label}, {_us(best.est_us)} µs by the cost model, {speed} the "
            f"{candidate_label(report, other_rank)} runner-up ({'; '.join(parts)}){_other_form(report)}"
            f"{_on_host(report, program)}")


def _other_form(report: ExplainReport) -> str:
    """Where the candidates take the FFT path or not, and the runner-up took the chosen one's: the
    best candidate of the other form, which is the decision the reader looks for."""
    spectral = takes_fft(report)
    if len(set(spectral)) < 2:
        return ""
    ranks = [r for r in range(len(report.candidates)) if spectral[r] != spectral[report.chosen]]
    other = min(ranks, key=lambda r: report.candidates[r].est_us or math.inf)
    if other == (1 if report.chosen == 0 else 0):       # the runner-up already is
        return ""
    return f"; the best {candidate_label(report, other)} candidate takes {_us(report.candidates[other].est_us)} µs"


def _on_host(report: ExplainReport, program: CompiledProgram | None) -> str:
    """The chosen kernels no GPU template implements: their estimate is a generic kernel's, and the
    host runs them."""
    if program is None:
        return ""
    hosted = sum(not k.has_template for k in program.candidates[report.chosen].kernels)
    return (f" ({hosted} of its kernels {'has' if hosted == 1 else 'have'} no GPU template: the estimate counts "
            f"a generic kernel for "
            f"{'it' if hosted == 1 else 'them'}, and the host runs the plan)" if hosted else "")


def _timings(program: CompiledProgram | None) -> str:
    if program is None or program.tuning is None or not program.tuning.weighed:
        return ""
    times = [f"#{w.index} {w.measurement.median_us:,.1f} ± {w.measurement.noise_us:,.1f} µs"
             for w in program.tuning.weighed]
    return f" ({', '.join(times)})"


def pinned_text(program: CompiledProgram) -> Text:
    """One line per step whose schedule a user's tile_shape fixed, and where it was asked for."""
    lines = [f"pinned: step {p.step} {p.tuning.kind} runs {compact_schedule(p.tuning.schedule.describe())} "
             f"for {p.pin.describe()}{p.pin.where()}, not tuned" for p in program.pinned]
    return Text("\n".join(lines))


def _grid(grid: tuple[int, ...]) -> str:
    """A launch grid as '1024' or '32x64' (trailing extents of 1 left out), so a kernel's name fits.

    >>> _grid((1024, 1, 1)), _grid((32, 64, 1)), _grid((1, 1, 1)), _grid((4, 1, 2))
    ('1024', '32x64', '1', '4x1x2')
    """
    shown = list(grid)
    while len(shown) > 1 and shown[-1] == 1:
        shown.pop()
    return "x".join(map(str, shown))


def generated_kernels_table(program: CompiledProgram) -> RenderableType:
    """The plan's kernels as the GPU runs them: CUDA function, schedule, launch, source size."""
    from tessera_rw.kernel_sources import generated_kernels
    try:
        kernels = generated_kernels(program)
    except TesseraError as e:
        return Text(f"generated kernels: none for the GPU: {e.detail}")
    rows = [(str(k.index), k.name, "-", "-", "-", "-") if k.source is None else
            (str(k.index), k.source.name, _grid(k.source.grid), str(k.source.threads),
             f"{k.smem_bytes / 1024:.0f}", str(k.source.source.count("\n") + 1)) for k in kernels]
    table = report_table(f"generated kernels ({program.arch.sm}; --emit-cuda DIR writes them)")
    numeric = ("step", "threads", "smem KB", "lines")
    for i, column in enumerate(("step", "kernel (its name spells the schedule)", "grid", "threads", "smem KB", "lines")):
        widest = max([len(column if i != 1 else "kernel")] + [len(r[i]) for r in rows])   # a long name folds
        table.add_column(column, justify="right" if column in numeric else "left",
                         min_width=widest if i != 1 else None, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def explain_renderables(report: ExplainReport) -> Iterator[RenderableType]:
    """The report's text, section by section, for a rich Console."""
    program = report.program
    if program is not None:
        yield graph_summary(program.graph)
        yield Listing(str(program.graph))
    else:
        yield Listing(f"{report.function}(" + ", ".join(f"{i.name}: {i.dtype}{list(i.shape)}" for i in report.inputs)
                      + ")")
    yield rewrite_summary(report, program)
    yield candidates_table(report, program)
    for rank, candidate in enumerate(report.candidates):
        costs = program.candidates[rank].kernels if program else None
        yield kernels_table(candidate, costs, f"candidate {rank}: {candidate_label(report, rank)}")
    if program is not None:
        yield Listing(str(program.candidate.graph))
    yield Text(choice_reason(report, program), style="bold")
    if program is not None:
        yield Listing(str(program.plan))
        if program.pinned:
            yield pinned_text(program)
        yield generated_kernels_table(program)
