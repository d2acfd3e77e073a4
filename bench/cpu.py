"""`python -m bench cpu`: host-side figures with their targets, in one table, written to bench/results.

- the pipeline's stages (trace, saturate, extract, lower, emit, NVRTC compile) on seven model
  graphs: BERT-base, a 48-layer GPT stack, a Hyena long-conv block, a ResNet conv stack and a ResNet
  block's training step by `op.grad`, an MLP's backward by `op.grad` and a GPT-2-small block's
  training step by `op.value_and_grad`; e-graph
  sizes; ptxas's registers beside the estimates, and its spills;
- depth scaling: BERT's rewrite at 12 and 48 layers, a GPT training step's at 3 and 12;
- extraction's programs against the exact optimum an integer linear program finds;
- the numpy executor against numpy / scipy on the same inputs: blockwise attention's peak memory
  at S = 8192 against the naive S×S form, the FFT convolution against scipy.signal's direct one;
- the cost of a call: warm-call overhead and the first call of the attention example.

Everything runs against a fresh cache folder (TESSERA_CACHE_DIR), so compile times are cold ones.
Results: bench/results/cpu-<machine>-<date>.json and .md.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace

from rich.console import Console
from rich.table import Table

from bench import host_executor, models
from bench.pipeline_stages import StageTimes, median_abs, run_model
from bench.results_files import host_machine, markdown_table, slug, write_results
from bench.timing import time_interleaved
from tessera_rw.codegen.arch import arch_named
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite
from tessera_rw.tune.extract import extract_candidates

H100 = arch_named("H100-SXM")
MB = 1e6
BF16_AGREEMENT = 1e-2     # bf16 outputs against the float64 reference: 2^-8 rounding, relative to the largest


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    target: str
    ok: bool | None  # None: recorded, no target

    @property
    def met(self) -> str:
        return "" if self.ok is None else ("yes" if self.ok else "NO")

    @property
    def shown(self) -> str:
        whole = abs(self.value) >= 10 or float(self.value).is_integer()
        return f"{self.value:,.0f}" if whole else f"{self.value:.2f}"


MODELS = {
    "BERT-base, 12 layers": lambda: (models.bert_encoder(models.BERT_BASE),
                                     models.placeholders(models.BERT_BASE, with_mask=True)),
    "GPT, 48 layers": lambda: (models.gpt_stack(models.GPT_48), models.placeholders(models.GPT_48, with_mask=False)),
    "Hyena long-conv block": models.hyena_block,
    "ResNet, 4 basic blocks": models.resnet_stack,
    "ResNet basic block, training step (op.grad)": models.resnet_training_step,
    "MLP backward (op.grad)": models.mlp_backward,
    "GPT-2-small block, training step (op.value_and_grad)": models.gpt_training_step,
}


def stage_figures(stages: list[StageTimes]) -> list[Figure]:
    bert = stages[0]
    errors = tuple(e for s in stages for e in s.register_errors)
    traded = list(dict.fromkeys(name for s in stages for name in s.occupancy_spills))
    worst = max(errors, key=abs)
    return [
        Figure(f"trace BERT-base 12 layers ({bert.graph_nodes} nodes)", bert.trace_s * 1e3, "ms", "< 200",
               bert.trace_s < 0.2),
        Figure("BERT-base 12-layer e-graph size", bert.enodes, "e-nodes", "< 50000", bert.enodes < 50_000),
        Figure(f"register estimate vs ptxas, the models' {len(errors)} kernels: median absolute error",
               median_abs(errors) * 100, "%", "", None),
        Figure("register estimate vs ptxas, the models' kernels: worst error", worst * 100, "%", "within ±25",
               abs(worst) <= 0.25),
        Figure("ptxas spills for want of registers in the models' kernels", sum(s.spills for s in stages), "kernels",
               "0", all(s.spills == 0 for s in stages)),
        Figure(f"ptxas's trades of spilled bytes for occupancy, below the register ceiling{_listed(traded)}",
               len(traded), "kernels", "", None),
    ]


def _listed(names: list[str]) -> str:
    return f" ({'; '.join(names)})" if names else ""


def saturate_and_extract(graph) -> tuple[int, int]:
    """Rewrite with every built-in ruleset and extract the cost model's candidates (all fusion depths);
    (e-nodes, fused attentions in the chosen program)."""
    result = rewrite(graph, BUILTIN_RULESETS)
    chosen = extract_candidates(result, H100)[0]
    counts = chosen.graph.op_counts()
    return result.report.enodes, counts["flash_attention"] + counts["strided_attention"]


def depth_figures() -> list[Figure]:
    bert12 = models.bert_encoder(models.BERT_BASE).trace(**models.placeholders(models.BERT_BASE, with_mask=True))
    cfg48 = replace(models.BERT_BASE, layers=48)
    bert48 = models.bert_encoder(cfg48).trace(**models.placeholders(cfg48, with_mask=True))
    _, fused = saturate_and_extract(bert12)
    runs = {12: lambda: saturate_and_extract(bert12), 48: lambda: saturate_and_extract(bert48)}
    wall = time_interleaved(runs, rounds=5)
    cpu = time_interleaved(runs, rounds=3, warmup=0, clock=time.process_time)   # the ratio: load-free
    t12, t48 = wall[12], wall[48]
    ratio = cpu[48].min_s / cpu[12].min_s
    steps = {n: _training_step(n) for n in (3, 12)}
    step_cpu = time_interleaved({n: (lambda g=g: saturate_and_extract(g)) for n, g in steps.items()}, rounds=2,
                                clock=time.process_time)
    step_ratio = step_cpu[12].min_s / step_cpu[3].min_s
    return [
        Figure(f"saturate + extract BERT-base 12 layers ({fused}/12 attentions fused)", t12.median_ms, "ms",
               "< 1000", t12.median_ms < 1000 and fused == 12),
        Figure("saturate + extract BERT-base 48 layers", t48.median_ms, "ms", "", None),
        Figure("48-layer / 12-layer rewrite time (CPU time)", ratio, "x", "< 4", ratio < 4),
        # a training step's gradients share its forward across the layers: linear is 4x
        Figure("12-layer / 3-layer GPT training step rewrite + extract (CPU time)", step_ratio, "x", "< 6",
               step_ratio < 6),
    ]


def _training_step(layers: int):
    kernel, inputs = models.gpt_training_step(replace(models.GPT2_SMALL_BLOCK, layers=layers))
    return kernel.trace(**inputs)


def optimum_figures() -> list[Figure]:
    """Extraction against the exact ILP optimum at every fusion depth."""
    from bench.extraction_optimum import optimum_gaps, rule_example_gaps
    gaps = rule_example_gaps(H100)
    for name in ("BERT-base, 12 layers", "Hyena long-conv block", "ResNet, 4 basic blocks", "MLP backward (op.grad)",
                 "GPT-2-small block, training step (op.value_and_grad)", "ResNet basic block, training step (op.grad)"):
        kernel, inputs = MODELS[name]()
        gaps += optimum_gaps(name, kernel.trace(**inputs), H100)
    worst = max(gaps, key=lambda g: abs(g.gap))
    return [Figure(f"extraction vs exact ILP optimum (HiGHS), {len(gaps)} programs (BERT-base 12 layers, Hyena, "
                   f"ResNet and its training step, MLP backward, the GPT training step and every rule example, "
                   f"at each fusion depth): "
                   f"largest difference ({worst.model}, {worst.depth})", abs(worst.gap) * 100, "%", "0",
                   all(g.matches for g in gaps))]


def executor_figures() -> tuple[list[Figure], list[host_executor.Versus]]:
    attention = host_executor.attention_versus_naive()
    direct, fft = host_executor.conv_versus_scipy()
    figures = [
        Figure(f"{attention.what}: peak memory, blockwise ({attention.plan}) / naive S×S",
               attention.ours_peak / attention.baseline_peak * 100, "%", "< 10",
               attention.ours_peak < 0.1 * attention.baseline_peak and attention.max_rel_error < BF16_AGREEMENT),
        Figure(f"{attention.what}: time, naive / blockwise", attention.speedup, "x", "", None),
        Figure(f"{direct.what} ({direct.plan})", direct.speedup, "x faster", "> 1",
               direct.speedup > 1 and direct.max_rel_error < 1e-4),
        Figure(fft.what, fft.speedup, "x faster", "", None),
    ]
    return figures, [attention, direct, fft]


def call_figures() -> list[Figure]:
    from bench.kernel_calls import first_call_of_attention, warm_call_overhead_us
    call, plan, overhead = warm_call_overhead_us()
    first = first_call_of_attention()
    return [
        Figure(f"warm @op.kernel call over its plan run, median of paired differences ({call:.1f} vs {plan:.1f} µs)",
               overhead, "µs", "< 20", overhead < 20),
        Figure(f"first call, attention example, autotune on ({first['chosen_by']}, {first['kernels']} kernel(s), "
               f"imports {first['import_s']:.1f} s apart)", first["first_call_s"], "s", "< 10",
               first["first_call_s"] < 10 and first["finite"]),
    ]


STAGE_COLUMNS = ("model", "nodes", "e-nodes", "e-classes", "iters", "kernels", "compiled", "trace ms",
                 "saturate ms", "extract ms", "lower ms", "emit ms", "NVRTC s", "regs error (median)")


def stage_row(s: StageTimes) -> list[str]:
    compiled = f"{s.distinct_sources}" + (f" (+{s.library_steps} cuFFT)" if s.library_steps else "")
    return [s.model, str(s.graph_nodes), str(s.enodes), str(s.eclasses), str(s.iterations), str(s.kernels), compiled,
            f"{s.trace_s * 1e3:.1f}", f"{s.saturate_s * 1e3:.0f}", f"{s.extract_s * 1e3:.0f}",
            f"{s.lower_s * 1e3:.1f}", f"{s.emit_s * 1e3:.0f}", f"{s.compile_s:.1f}",
            f"{median_abs(s.register_errors):.0%}"]


def versus_row(v: host_executor.Versus) -> list[str]:
    return [v.what, v.plan, f"{v.ours_s * 1e3:.0f}", f"{v.baseline_s * 1e3:.0f}", f"{v.speedup:.2f}x",
            f"{v.ours_peak / MB:.1f}", f"{v.baseline_peak / MB:.1f}", f"{v.max_rel_error:.1e}"]


VERSUS_COLUMNS = ("comparison", "our plan", "ours ms", "baseline ms", "speedup", "ours peak MB",
                  "baseline peak MB", "max rel err")
FIGURE_COLUMNS = ("figure", "value", "unit", "target", "met")


def rich_table(title: str, header, rows) -> Table:
    table = Table(title=title)
    for column in header:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


def measure() -> tuple[list[Figure], list[StageTimes], list[host_executor.Versus]]:
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as cache:
        previous = os.environ.get("TESSERA_CACHE_DIR")
        os.environ["TESSERA_CACHE_DIR"] = cache
        try:
            stages = [run_model(name, make, H100) for name, make in MODELS.items()]
            executor, versus = executor_figures()
            figures = stage_figures(stages) + depth_figures() + optimum_figures() + executor
        finally:
            if previous is None:
                os.environ.pop("TESSERA_CACHE_DIR", None)
            else:
                os.environ["TESSERA_CACHE_DIR"] = previous
    return figures + call_figures(), stages, versus


def run(console: Console | None = None) -> list[Figure]:
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    figures, stages, versus = measure()
    figure_rows = [(f.name, f.shown, f.unit, f.target, f.met) for f in figures]
    stage_rows = [stage_row(s) for s in stages]
    versus_rows = [versus_row(v) for v in versus]
    console.print(rich_table("tessera_rw CPU benchmark", FIGURE_COLUMNS, figure_rows))
    console.print(rich_table(f"pipeline stages, for {H100.name} ({H100.sm})", STAGE_COLUMNS, stage_rows))
    console.print(rich_table("numpy executor vs numpy / scipy, same inputs", VERSUS_COLUMNS, versus_rows))
    machine = host_machine()
    markdown = "\n\n".join([
        f"Machine: {machine['cpu']}, {machine['cores']} cores; Python {machine['python']}, numpy "
        f"{machine['numpy']}, scipy {machine['scipy']}, egglog {machine['egglog']}, NVRTC "
        f"{machine['nvidia-cuda-nvrtc']}.",
        markdown_table(FIGURE_COLUMNS, figure_rows),
        f"Pipeline stages, for {H100.name} ({H100.sm}); NVRTC compiles each distinct kernel cold:",
        markdown_table(STAGE_COLUMNS, stage_rows),
        "The numpy executor against numpy / scipy, same random inputs, agreement checked first:",
        markdown_table(VERSUS_COLUMNS, versus_rows)])
    document = {"suite": "cpu", "machine": machine, "figures": [asdict(f) for f in figures],
                "models": [asdict(s) | {"total_s": s.total_s} for s in stages], "executor": [asdict(v) for v in versus]}
    json_path, md_path = write_results(f"cpu-{slug(machine['cpu'])}-{machine['cores']}core", document, markdown)
    console.print(f"written: {json_path}, {md_path}")
    return figures
