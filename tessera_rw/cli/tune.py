"""`tessera-rewrite tune FILE.py[:FUNCTION]`: tune a kernel's program (the one named, or a file's only
kernel) and keep the result in the cache.

    tessera-rewrite tune examples/attention.py:attention [--input q=4x16x2048x64:bf16 ...]
        [--method auto|on_device|cost_model] [--max-trials 50] [--time-budget 60] [--cache NAME]
        [--arch A100-SXM] [--format json]

Prints the chosen candidate, each kernel's schedule and how it was chosen (the cache, the cost
model or the GPU), then per tuned kernel the schedules weighed: time and % of the best.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from tessera_rw.cli.targets import load_target, target_inputs
from tessera_rw.cli.usage import positive_float, positive_int
from tessera_rw.tune.progress import describe


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="FILE.py[:FUNCTION]")
    p.add_argument("--input", action="append", default=[], metavar="NAME=DIMS[:DTYPE]",
                   help="a tensor argument, e.g. q=4x16x2048x64:bf16, or one inside a dict or list argument by its "
                        "path, p.w=1024x1024:bf16 (default: the module's example_inputs())")
    p.add_argument("--method", choices=["auto", "on_device", "cost_model"], default="auto",
                   help="on_device times on the GPU; cost_model ranks by the roofline model; auto: on_device "
                        "when this machine's GPU is the arch tuned for, else cost_model")
    p.add_argument("--max-trials", type=positive_int, default=50,
                   help="schedules measured per kernel on the GPU (default 50); the cost model, costing "
                        "microseconds a schedule, ranks them all")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                   help="the whole tuning's time budget, shared by its kernels")
    p.add_argument("--cache", default=None, help="the named cache to read and write (default: the kernel's "
                                                 "@op.autotune(cache=...), else 'default')")
    p.add_argument("--arch", metavar="NAME", default=None,
                   help="tune for this GPU, e.g. A100-SXM or sm_80 (default: TESSERA_ARCH, else this machine's GPU); "
                        "another GPU than this machine's is tuned by the cost model")
    p.add_argument("--format", choices=["text", "json"], default="text")


def run(args: argparse.Namespace, console: Console) -> int:
    kernel, module = load_target(args.target)
    inputs = target_inputs(kernel, module, args.input, command="tune")
    values = [inputs[name] for name in kernel.parameter_names if name in inputs]   # containers included
    own = kernel.tuning.cache if kernel.tuning is not None else None
    cfg = kernel.schedule.autotune(*values, method=args.method, cache=args.cache or own or "default",
                                   max_trials=args.max_trials, time_budget_s=args.time_budget, arch=args.arch)
    program = cfg.program
    if args.format == "json":
        console.file.write(json.dumps({
            "schema": "tessera_rw.tune/2", "function": kernel.name, "summary": str(cfg),
            "arch": program.arch.name, "candidate": program.chosen, "fusion_depth": int(program.candidate.fusion_depth),
            "fusion": program.candidate.fusion_depth.label,
            "chosen_by": program.chosen_by,
            "kernels": [{"op": k.op.op, "kind": k.kind, "schedule": describe(k.schedule), "default": describe(k.default),
                         "time_us": k.time_us, "noise_us": k.noise_us, "chosen_by": k.chosen_by,
                         "trials": len(k.trials), "space": k.space_size} for k in cfg.kernels]}, indent=2) + "\n")
        return 0
    console.print(f"[bold]{kernel.name}[/] on {program.arch.name}: {cfg}")
    console.print(f"candidate {program.chosen} ({program.candidate.fusion_depth.label}), chosen by {program.chosen_by}")
    table = Table(title="kernels")
    for col in ("kernel", "kind", "schedule", "default", "µs", "chosen by", "trials / space"):
        table.add_column(col)
    for k in cfg.kernels:
        table.add_row(k.op.op, k.kind, describe(k.schedule), describe(k.default), f"{k.time_us:.2f}", k.chosen_by,
                      f"{len(k.trials)} / {k.space_size}" if k.trials else "-")
    console.print(table)
    console.print(cfg.table())
    return 0
