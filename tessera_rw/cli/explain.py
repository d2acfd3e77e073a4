"""`tessera-rewrite --explain`: what tessera_rw does with a function in a Python file.

    tessera-rewrite --explain examples/attention.py:attention --input q=4x16x2048x64:bf16 ...
    tessera-rewrite --explain examples/*.py --format json --emit-cuda out/ --arch sm_90 --tune

Targets and their inputs: cli/targets.py; `--run`'s check: cli/plan_check.py. Bad invocations print
one line and a usage hint on stderr and exit with 2.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tessera_rw.algebra.errors import ArgumentError, TesseraError
from tessera_rw.algebra.pytree import flatten
from tessera_rw.bound_call import is_static
from tessera_rw.codegen.arch import ArchSpec, arch_named, target_arch
from tessera_rw.codegen.calibration import spilled_for_occupancy
from tessera_rw.codegen.plan_binding import NoTemplateError
from tessera_rw.explain_report import ExplainReport, explain_report
from tessera_rw.kernel import Kernel
from tessera_rw.kernel_sources import emit_cuda
from tessera_rw.pipeline import CompiledProgram, compile_program
from tessera_rw.report import Printable, explain_renderables, report_table
from tessera_rw.text_console import default_console
from tessera_rw.tune.plan_tuner import TuneSettings

from tessera_rw.cli.plan_check import run_once
from tessera_rw.cli.targets import load_targets, source_file, target_inputs, user_line
from tessera_rw.cli.usage import UsageError, one_line


def explain(kernel: Kernel, inputs: dict[str, Any], arch: ArchSpec, tune: bool) -> ExplainReport:
    """Trace, rewrite, extract and lower (and tune, when asked) one kernel at these inputs."""
    try:
        call = kernel.bind(**inputs)
    except ArgumentError as e:   # its site would be this command's own frame: the inputs' origin says more
        raise UsageError(e.detail + (f"; {e.hint}" if e.hint else "")) from None
    try:
        traced = kernel.traced(call)
    except TesseraError:
        raise
    except Exception as e:   # the user's function failed while tracing: one line, pointing at it
        nested = isinstance(e, (KeyError, IndexError)) and any(isinstance(v, (dict, list, tuple)) for v in inputs.values())
        hint = ("; an argument's container lacks what the function reads there: give it with --input, "
                "as --input p.b=64:f32 or --input p.layers[1].w=64x64:bf16") if nested else ""
        raise UsageError(f"tracing {kernel.name} raised {type(e).__name__}: {e}"
                         f"{user_line(e, source_file(kernel.fn))}{hint}") from None
    program = compile_program(traced.graph, arch, _tuning(kernel, tune), traced.pins)
    return explain_report(program)


def _tuning(kernel: Kernel, tune: bool) -> TuneSettings | None:
    """--tune: the kernel's own settings (its cache, its space), tuning where none are set. Without
    it, what a call would choose from the kernel's cache where it has one, measuring and writing nothing."""
    if tune:
        return kernel.tune_settings(default=TuneSettings(method="auto"))
    settings = kernel.tune_settings()
    return None if settings is None else replace(settings, method="cost_model", read_only=True)


def _graph_inputs(kernel: Kernel, inputs: dict[str, Any]) -> dict[str, Any]:
    """The program's inputs by name: arguments, the arrays of container arguments by their paths
    (`p.w`), placeholders among them, and the arrays the function captured."""
    call = kernel.bind(**inputs)
    leaves: dict[str, Any] = {}
    for name, value in inputs.items():
        pairs = flatten(value, name, stop=is_static)[0] if name in call.trees else [(name, value)]
        leaves.update((n, v) for n, v in pairs if n in call.tensors)
    return kernel.traced(call).feeds(leaves)


def emitted_table(program: CompiledProgram, directory: Path) -> Table:
    """Write the program's kernels under `directory` and list them with ptxas's registers and spills."""
    table = report_table(f"CUDA written to {directory} (compiled for {program.arch.sm})")
    for column in ("file", "regs", "spill B", "smem KB"):
        table.add_column(column, justify="left" if column == "file" else "right", overflow="fold")
    traded = False
    for kernel, path, facts in emit_cuda(program, directory):
        trade = spilled_for_occupancy(facts.registers, facts.spill_bytes, kernel.source.threads, program.arch)
        traded |= trade
        table.add_row(path.name, str(facts.registers), f"{facts.spill_bytes}{'*' if trade else ''}",
                      f"{(facts.smem_bytes + kernel.source.dynamic_smem) / 1024:.0f}")
    if traded:
        table.caption = ("* spilled below the register ceiling: ptxas's own trade of a few spilled bytes for "
                         "another resident block, not a spill for want of registers")
    return table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--explain", metavar="FILE.py[:FUNCTION]", nargs="+", action="extend", required=True,
                   help="the function(s) to explain; FILE.py alone explains every @op.kernel it makes (not those it imports)")
    p.add_argument("--input", metavar="NAME=DIMS[:DTYPE]", action="append", default=[],
                   help="an input placeholder, e.g. q=4x16x2048x64:bf16 (the dtype defaults to float32); an array inside "
                        "a dict or list argument by its path, p.layers[0].w=1024x1024:bf16 (default: the module's "
                        "example_inputs())")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="json: one tessera_rw.explain/1 document (a list of them for several functions)")
    p.add_argument("--emit-cuda", metavar="DIR", type=Path, default=None,
                   help="also write each generated kernel to DIR/FUNCTION/NN_name.cu and report ptxas's registers")
    p.add_argument("--arch", metavar="NAME", default=None,
                   help="plan for this GPU, e.g. sm_90 or H100-SXM (default: TESSERA_ARCH, else this machine's GPU, "
                        "else H100-SXM)")
    p.add_argument("--tune", action="store_true",
                   help="tune the kernels' schedules: timed on the GPU when there is one, else by the cost model")
    p.add_argument("--run", action="store_true",
                   help="also run the chosen plan on random inputs (the GPU, else the numpy executor) "
                        "and check it against the unfused reference")


def writable_directory(path: Path) -> Path:
    """`path`, created if need be, or a UsageError saying why it cannot hold the .cu files."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"--emit-cuda {path}: not a directory; give a directory for the .cu files") from None
    except OSError as e:
        raise UsageError(f"--emit-cuda {path}: cannot create it ({e.strerror})") from None
    return path


def run(args: argparse.Namespace, console: Console) -> int:
    arch = arch_named(args.arch) if args.arch else target_arch()
    if args.emit_cuda is not None:
        writable_directory(args.emit_cuda)
    targets = [(kernel, module) for target in args.explain
               for kernels, module in [load_targets(target)] for kernel in kernels]
    if args.input and len(targets) > 1:
        raise UsageError("--input names one function's arguments: give a single FILE.py:FUNCTION with it")
    side = console if args.format == "text" else default_console(stderr=True)   # stdout holds only the JSON
    documents, failed = [], []
    for kernel, module in targets:
        inputs = target_inputs(kernel, module, args.input)
        report = explain(kernel, inputs, arch, args.tune)
        if args.format == "json":
            documents.append(report.model_dump(mode="json", by_alias=True))
        else:
            if aliases := [name for name, v in vars(module).items() if v is kernel and name != kernel.name]:
                console.print(f"{', '.join(aliases)}: the kernel {kernel.name}", markup=False, highlight=False)
            Printable(*explain_renderables(report)).print_to(console)
        if args.emit_cuda is not None:
            try:
                side.print(emitted_table(report.program, args.emit_cuda / kernel.name))
            except NoTemplateError as e:     # the host runs it; the other functions still get their CUDA
                side.print(f"no CUDA written for {kernel.name}: {one_line(e)}")
        if args.run and not run_once(report.program, _graph_inputs(kernel, inputs), side):
            failed.append(kernel.name)
    if args.format == "json":
        console.file.write(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2) + "\n")
    if failed:
        side.print(f"[bold red]the plans of {', '.join(failed)} disagree with their unfused references[/]")
        return 1
    return 0
