"""`python -m bench tune [--quick]`: the autotuner on the GPU.

Three parts, against references in the same run:

1. Tuned vs default: for gemm and flash_attention shapes (forward, and the backward kernel at the
   shape `bench gpu` times), the cost model's default schedule and the tuned one are timed by the
   same measurer (interleaved, L2 flushed, medians), beside torch (cuBLAS / SDPA, SDPA's backward
   on a kept forward). Then the tuning is asked again: it must come from the cache, measuring nothing.
2. Timing logs: every schedule of each op's space, measured, written to
   tests/data/tuning_logs/<op>-<arch>.json; tests/tune/test_replay.py compares search strategies
   on them without a GPU.
3. Schedule sweeps: a GEMM's default beside its variants (other walks over the output tiles, the
   persistent form: gemm_variants.py), an attention forward's beside its producer forms
   (attention_tma_cuda.py), then every schedule of the attention backward's spaces (on
   sm_90 its wgmma kernel's beside the mma.sync kernel's, ten to twelve schedules, and under `fast`
   the mma.sync form that sums dQ with atomics too), timed and printed beside the default the cost
   model picks.

Results go to bench/results/tune[-quick]-<device>-<date>.json and .md, written after each part (a run
stopped at its limit keeps the parts it finished, the others marked as not reached).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.gpu import preflight, protocol_for
from bench.gpu_rows import BF16, Row, attention_row, gemm_row, gemm_shape_row
from bench.gpu_backward import float64_attention_grads
from bench.gpu_results import error_line, gpu_machine, machine_lines, save
from bench.results_files import markdown_table, suite_name, wanted
from bench.gpu_timing import Protocol, time_torch
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.registry import templates_for

LOGS = Path(__file__).resolve().parent.parent / "tests" / "data" / "tuning_logs"
LOG_BATCH = 8


def tuning_rows(quick: bool):
    rows = [gemm_row(2048), attention_row(4, 16, 2048, 64, False)]
    if not quick:
        # and a GEMM off the square: 8192 tokens through a 4096 -> 1024 projection; shapes the cost
        # model was not fitted on: a skinny GEMM (256 tokens through an 8192-wide layer, fewer output
        # tiles than SMs) and attention with 96-wide heads over a ragged causal sequence
        rows += [attention_backward_row(4, 16, 4096, 128), gemm_row(4096), gemm_shape_row(8192, 4096, 1024),
                 attention_row(4, 16, 2048, 128, True), gemm_shape_row(256, 8192, 8192),
                 attention_row(2, 12, 1000, 96, True)]
    return rows


def attention_backward_row(b: int, h: int, s: int, d: int) -> Row:
    """flash_attention_bwd alone; torch's is SDPA's backward on a kept forward."""
    from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
    op = FlashAttentionBwdTemplate().sample(b, h, s, d, BF16, False)

    def make():
        import torch
        import torch.nn.functional as F
        leaves = tuple(torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
                       for _ in range(3))
        return F.scaled_dot_product_attention(*leaves), leaves, torch.randn_like(leaves[0])

    def backward(out, leaves, w):
        import torch
        return torch.autograd.grad(out, leaves, w, retain_graph=True)
    return Row(f"flash_attention_bwd bf16 B={b} H={h} S={s} D={d} vs SDPA backward", op, make, backward,
               lambda out, leaves, w: float64_attention_grads(*leaves, w, False),
               # the backward's five products of 2·S·S·D per head
               10 * b * h * s * s * d, 8 * b * h * s * d * 2)


def log_ops(quick: bool) -> dict[str, KernelOp]:
    from bench.gpu_rows import layernorm_row, softmax_row
    found = {"gemm-bf16-2048": gemm_row(2048).op, "attention-bf16-s2048-d64": attention_row(4, 16, 2048, 64, False).op}
    if not quick:
        found |= {"gemm-bf16-4096": gemm_row(4096).op,
                  "attention-bf16-s2048-d128-causal": attention_row(4, 16, 2048, 128, True).op,
                  "softmax-bf16-4096": softmax_row(4096).op, "layernorm-bf16-4096": layernorm_row(4096).op}
    return found


def sweep_ops() -> dict[str, KernelOp]:
    """Kernels whose every schedule is measured and printed beside the default (most of these
    spaces are too small for a replay log: tests/tune/test_replay.py wants 8 or more schedules)."""
    from dataclasses import replace
    from tessera_rw.codegen.numerics import Numerics
    from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
    backward = FlashAttentionBwdTemplate()
    ops = {"flash_attention_bwd bf16 B=2 H=8 S=2048 D=64 causal": backward.sample(2, 8, 2048, 64, BF16, True),
           "flash_attention_bwd bf16 B=2 H=8 S=2048 D=128": backward.sample(2, 8, 2048, 128, BF16, False)}
    return ops | {f"{name} fast": replace(op, numerics=Numerics.FAST) for name, op in ops.items()}


def variant_sweep_ops() -> dict[str, KernelOp]:
    """GEMMs whose default's variants (other walks, the persistent form) are timed beside it, and
    attention forwards whose default's producer forms (with and without turns) are."""
    return {"gemm bf16 4096^3 variants": gemm_row(4096).op,
            "gemm bf16 8192x4096x1024 variants": gemm_shape_row(8192, 4096, 1024).op,
            "flash_attention fwd bf16 B=4 H=16 S=2048 D=64 variants": attention_row(4, 16, 2048, 64, False).op,
            "flash_attention fwd bf16 B=4 H=16 S=2048 D=128 causal variants": attention_row(4, 16, 2048, 128, True).op}


def measure_space(op: KernelOp, arch, space=None) -> list:
    """(schedule, measurement) for every schedule of `space` (default: `op`'s whole space), each
    checked before it is timed."""
    from tessera_rw.tune.device_measure import DeviceMeasurer
    template = templates_for(op)[0]
    space = template.space(op, arch) if space is None else tuple(space)
    measurer = DeviceMeasurer(template, op, arch)
    measured = []
    for start in range(0, len(space), LOG_BATCH):
        batch = space[start:start + LOG_BATCH]
        measured += list(zip(batch, measurer.measure(batch)))
    return measured


def sweep(name: str, op: KernelOp, arch, variants: bool = False) -> list[str]:
    """A line per schedule of `op`'s space (with `variants`, of the default and its variants only),
    timed, the default schedule (the cost model's pick among the template's defaults) marked."""
    from tessera_rw.tune.cost import best_schedule
    template = templates_for(op)[0]
    default = best_schedule(template, op, arch)[0]
    space = (default, *template.variants(op, default, arch)) if variants else None
    lines = []
    for schedule, m in measure_space(op, arch, space):
        timing = f"{m.median_us:9.1f} µs" if m.ok else f"failed: {m.failure}"
        lines.append(f"  {name} [{schedule.describe()}]{' (default)' if schedule == default else ''}: {timing}")
    return lines


def record_log(name: str, op: KernelOp, arch, console: Console) -> str:
    """Measure every schedule of `op`'s space and write the timing log; a line saying what it holds."""
    import torch
    from tessera_rw.tune.space import schedule_config
    from tessera_rw.tune.timing_log import TimingLog
    measured = [(schedule_config(s), m) for s, m in measure_space(op, arch)]
    log = TimingLog.of(op, arch.name, torch.cuda.get_device_name(0), measured)
    LOGS.mkdir(parents=True, exist_ok=True)
    path = LOGS / f"{name}-{arch.name}.json"
    log.save(path)
    ok = [m for _, m in measured if m.ok]
    line = (f"{name}: {len(measured)} schedules, {len(ok)} ran, best {min(m.median_us for m in ok):.1f} µs "
            f"-> {path.relative_to(LOGS.parent.parent.parent)}")
    console.print(f"  {line}", markup=False)
    return line


def tuned_vs_default(row, arch, protocol: Protocol, cache_root: str, quick: bool) -> list[str]:
    from tessera_rw.tune.cache import TuneCache
    from tessera_rw.tune.device_measure import DeviceMeasurer
    from tessera_rw.tune.kernel_tuner import tune_kernel
    op = row.op
    template = templates_for(op)[0]
    cache = TuneCache("bench", cache_root)
    start = time.perf_counter()
    tuned = tune_kernel(op, arch, method="on_device", cache=cache, max_trials=16 if quick else 50)
    tuning_s = time.perf_counter() - start
    both = DeviceMeasurer(template, op, arch).measure([tuned.default, tuned.schedule])
    default, best = both
    inputs = row.make()
    torch_ms = time_torch(lambda: row.torch_fn(*inputs), protocol).median_ms
    start = time.perf_counter()
    again = tune_kernel(op, arch, method="on_device", cache=cache)
    hit_ms = (time.perf_counter() - start) * 1e3
    return [row.name.split(" vs ")[0], f"{default.median_us:.1f}", f"{best.median_us:.1f}",
            f"{default.median_us / best.median_us:.2f}x", f"{torch_ms * 1e3:.1f}",
            f"{torch_ms * 1e3 / best.median_us:.2f}", f"{len(tuned.trials)}/{tuned.space_size}",
            f"{tuning_s:.1f} s", f"{again.chosen_by} ({hit_ms:.1f} ms)", tuned.schedule.describe()]


def _or_error(what: str, make, lines: list[str]) -> dict:
    """make(), or {} with the error appended to `lines` (what was measured before is kept)."""
    try:
        return make()
    except Exception as e:
        lines.append(f"{what}: ERROR {type(e).__name__}: {e}")
        return {}


COLUMNS = ("kernel", "default µs", "tuned µs", "speed-up", "torch µs", "torch/tuned", "trials/space", "tuning",
           "second run", "tuned schedule")
STAGES = ("tuned vs default", "timing logs", "schedule sweeps")


def save_results(suite: str, machine: dict, header: list[str], quick: bool, tuned: list[list[str]], logs: list[str],
                 sweeps: list[str], reached: int):
    """The results files as they stand once the first `reached` STAGES have run: the run writes
    them after each stage, so one stopped at its time limit keeps what it measured."""
    missing = [f"{stage}: not reached (the run was stopped first)" for stage in STAGES[reached:]]
    document = {"suite": "tune", "quick": quick, "tuned": [dict(zip(COLUMNS, cells)) for cells in tuned],
                "timing_logs": logs, "sweeps": [line.strip() for line in sweeps], "not_reached": list(STAGES[reached:])}
    markdown = "\n\n".join([header[-1], markdown_table(COLUMNS, tuned), "timing logs:\n\n" + "\n".join(
        f"- {line}" for line in logs), "schedule sweeps (every schedule of the space, timed by the tuner's "
        "measurer):\n\n" + "\n".join(f"- {line.strip()}" for line in sweeps), *missing])
    return save(suite, machine, document, markdown)


def run(quick: bool = False, console: Console | None = None, only: str | None = None) -> int:
    """Every part on its kernels (or on those whose name holds `only`); 2 when this machine cannot
    run it, 1 when something failed, else 0."""
    console = console or Console(width=None if sys.stdout.isatty() else 220)
    reason = preflight()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from tessera_rw.codegen.arch import current_arch
    arch = current_arch()
    protocol = protocol_for(arch, quick)
    machine = gpu_machine()
    header = machine_lines(machine) + ["tuned vs default: both timed by the tuner's measurer (15 interleaved rounds, "
                                       "L2 flushed, medians); torch by bench.gpu_timing's protocol"]
    for line in header:
        console.print(line, markup=False)
    suite = suite_name("tune", quick, only)
    picked = lambda ops: {n: op for n, op in ops.items() if wanted(n, only)}   # noqa: E731
    tuned: list[list[str]] = []
    logs: list[str] = []
    sweeps: list[str] = []
    failed = False
    with tempfile.TemporaryDirectory() as cache_root:
        for row in [r for r in tuning_rows(quick) if wanted(r.name, only)]:
            try:
                tuned.append(tuned_vs_default(row, arch, protocol, cache_root, quick))
            except Exception as e:      # one broken row is reported and the rest still run
                failed = True
                tuned.append([row.name, f"ERROR {error_line(e, 100)}"] + [""] * (len(COLUMNS) - 2))
            console.print("  " + " | ".join(tuned[-1]), markup=False)   # the log keeps it if the run is stopped
    save_results(suite, machine, header, quick, tuned, logs, sweeps, reached=1)
    console.print("timing logs:")
    for name, op in _or_error("timing logs", lambda: picked(log_ops(quick)), logs).items():
        try:
            logs.append(record_log(name, op, arch, console))
        except Exception as e:
            logs.append(f"{name}: ERROR {type(e).__name__}: {e}")
            console.print(f"  {logs[-1]}", markup=False)
    save_results(suite, machine, header, quick, tuned, logs, sweeps, reached=2)
    for variants, ops in ((True, variant_sweep_ops), (False, sweep_ops)):
        for name, op in _or_error("schedule sweeps", lambda: picked(ops()), sweeps).items():
            try:
                sweeps += sweep(name, op, arch, variants)
            except Exception as e:
                sweeps.append(f"  {name}: ERROR {type(e).__name__}: {e}")
            save_results(suite, machine, header, quick, tuned, logs, sweeps, reached=2)
    failed = failed or any("ERROR" in line for line in logs + sweeps)
    table = Table(title=f"autotuning on {arch.name}")
    for col in COLUMNS:
        table.add_column(col)
    for cells in tuned:
        table.add_row(*cells)
    console.print(table)
    console.print("schedule sweeps (every schedule of the space, timed by the tuner's measurer):")
    for line in sweeps:
        console.print(line, markup=False)
    paths = save_results(suite, machine, header, quick, tuned, logs, sweeps, reached=3)
    console.print(f"written: {', '.join(map(str, paths))}")
    return 1 if failed else 0
