"""`tessera-rewrite --explain`: what tessera_rw does with a function in a Python file.

    tessera-rewrite --explain examples/attention.py:attention --input q=4x16x2048x64:bf16 ...
    tessera-rewrite --explain examples/*.py --format json --emit-cuda out/ --arch sm_90 --tune

A target is FILE.py:FUNCTION, or FILE.py for every @op.kernel the file defines. A target module
may define `example_inputs()` returning a dict of arrays or op.tensor placeholders (one dict for
all its kernels: each takes the entries its parameters name), so `--input` can be left out. Bad
invocations print one line and a usage hint on stderr and exit with 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError, TesseraError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.codegen.arch import ArchSpec, arch_named, target_arch
from tessera_rw.codegen.kernel_check import tolerance
from tessera_rw.codegen.numerics import Numerics, current_numerics
from tessera_rw.codegen.plan_binding import NoTemplateError
from tessera_rw.execute import run_program, where_to_run
from tessera_rw.explain_report import ExplainReport, explain_report
from tessera_rw.kernel import Kernel
from tessera_rw.kernel_sources import emit_cuda
from tessera_rw.pipeline import CompiledProgram, compile_program
from tessera_rw.report import explain_renderables, node_flops, report_table
from tessera_rw.tune.plan_tuner import TuneSettings

from tessera_rw.cli.usage import UsageError, one_line


def parse_input(text: str) -> tuple[str, TensorSpec]:
    """'q=4x16x2048x64:bf16' -> ('q', op.tensor((4, 16, 2048, 64), 'bf16')); dtype defaults to float32."""
    name, eq, spec = text.partition("=")
    if not eq or not name.isidentifier():
        raise UsageError(f"malformed --input {text!r}: expected NAME=DIMS[:DTYPE], e.g. q=4x16x2048x64:bf16")
    dims, _, dtype = spec.partition(":")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        return name, TensorSpec(shape, dtype or "float32")
    except (ValueError, TesseraError) as e:
        detail = e.detail if isinstance(e, TesseraError) else "dimensions must be integers joined by 'x'"
        raise UsageError(f"malformed --input {text!r}: {detail}") from None


def _import(file: Path) -> Any:
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"{file} is not a Python file: give a .py file (or FILE.py:FUNCTION)")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except TesseraError:
        raise
    except Exception as e:  # the user's module failed to import: say so in one line
        raise UsageError(f"importing {file} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    return module


def load_targets(target: str) -> tuple[list[Kernel], Any]:
    """'path.py:func' -> ([func as a Kernel], module); 'path.py' -> (every @op.kernel it defines, module)."""
    path, colon, func = target.rpartition(":")
    if not colon:
        path = target
    elif not path or not func:
        raise UsageError(f"target {target!r} must be FILE.py:FUNCTION or FILE.py")
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no such file: {path}")
    module = _import(file)
    if not colon:
        kernels = [v for v in vars(module).values() if isinstance(v, Kernel) and v.fn.__module__ == module.__name__]
        if not kernels:
            raise UsageError(f"{path} defines no @op.kernel function: name one as {path}:FUNCTION")
        return kernels, module
    fn = getattr(module, func, None)
    if fn is None or not callable(fn):
        raise UsageError(f"{path} has no function {func!r}")
    return [fn if isinstance(fn, Kernel) else Kernel(fn)], module


def load_target(target: str) -> tuple[Kernel, Any]:
    """'path.py:func' -> (the function as a Kernel, the module)."""
    if ":" not in target:
        raise UsageError(f"target {target!r} must be FILE.py:FUNCTION")
    kernels, module = load_targets(target)
    return kernels[0], module


def target_inputs(kernel: Kernel, module: Any, given: Sequence[str]) -> dict[str, Any]:
    """The kernel's tensor arguments by name, placeholders or arrays: from --input, else the module's
    example_inputs() (the entries this kernel's parameters name)."""
    if given:
        parsed = [parse_input(t) for t in given]
        names = [name for name, _ in parsed]
        if repeated := next((n for n in names if names.count(n) > 1), None):
            raise UsageError(f"--input {repeated}=... is given twice: give each argument once")
        inputs = dict(parsed)
        unknown = [n for n in inputs if n not in kernel.parameter_names]
        if unknown:
            raise UsageError(f"kernel {kernel.name} has no parameter {unknown[0]!r}; its parameters are "
                             f"{', '.join(kernel.parameter_names)}")
        missing = [n for n in _required(kernel) if n not in inputs]
        if missing:
            raise UsageError(f"kernel {kernel.name} takes {', '.join(kernel.parameter_names)}; no --input for "
                             f"{', '.join(missing)}")
    elif callable(getattr(module, "example_inputs", None)):
        where = f"example_inputs() of {module.__file__}"
        try:
            given_inputs = module.example_inputs()
        except Exception as e:
            raise UsageError(f"{where} raised {type(e).__name__}: {e}{user_line(e, module.__file__)}") from None
        if not isinstance(given_inputs, dict):
            raise UsageError(f"{where} returned a {type(given_inputs).__name__}: it should return a dict of "
                             "arrays or op.tensor placeholders by parameter name")
        inputs = {n: v for n, v in given_inputs.items() if n in kernel.parameter_names}
        missing = [n for n in _required(kernel) if n not in inputs]
        if missing:
            raise UsageError(f"kernel {kernel.name} takes {', '.join(kernel.parameter_names)}; {where} has no "
                             f"{', '.join(missing)} (it gives {', '.join(given_inputs) or 'nothing'}): add them, "
                             "or pass --input")
    else:
        raise UsageError(f"{kernel.name} needs --input for each tensor argument (or define example_inputs() "
                         "in its module)")
    return inputs


def _required(kernel: Kernel) -> list[str]:
    return [p.name for p in inspect.signature(kernel.fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def user_line(error: BaseException, filename: str) -> str:
    """' at FILE:LINE: source' of the deepest frame of `error`'s traceback in the user's file."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" — at {frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"


REFERENCE_LIMIT_BYTES = 1 << 30     # the unfused reference holds every intermediate at once
REFERENCE_LIMIT_FLOPS = 10 ** 11    # and runs every op the plain way (a direct convolution is O(L²))


def random_inputs(inputs: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays for a run: the given arrays as they are, random ones for placeholders (never all
    zeros): normal floats, random ints and bools."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, value in inputs.items():
        if not isinstance(value, TensorSpec):
            arrays[name] = np.asarray(value)
            continue
        t = value.type
        if t.dtype.name == "bool":
            arrays[name] = rng.random(t.shape) < 0.5
        elif t.dtype.is_float:
            arrays[name] = rng.standard_normal(t.shape).astype(t.dtype.numpy)
        else:
            arrays[name] = rng.integers(-100, 100, t.shape).astype(t.dtype.numpy)
    return arrays


# The plan against the unfused reference, relative to the output's largest value: a few roundings
# of the output dtype past one kernel's bound (the plan reorders sums, fuses, keeps other
# intermediates in fp32).
PLAN_AGREEMENT = 4
REDUCTION_BOUND = 4096      # the sums' length the bound allows for (a product's K, a softmax row)


def plan_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got − want| over the output's scale; NaN where both are NaN counts as agreement, NaN on
    one side only as infinite error."""
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64
    got, want = np.asarray(got, wide), np.asarray(want, wide)
    both = np.isnan(got) & np.isnan(want)
    if (np.isnan(got) ^ np.isnan(want)).any():
        return math.inf
    with np.errstate(invalid="ignore"):
        diff = np.where(both | (got == want), 0.0, np.abs(got - want))   # equal infinities agree
    scale = max(float(np.abs(np.where(np.isfinite(want), want, 0.0)).max(initial=0.0)), 1e-30)
    return float(np.nan_to_num(diff, nan=math.inf).max(initial=0.0)) / scale


def _allowed(dtype: DType, fast: bool) -> float:
    """The plan's bound for an output of `dtype` (integers and bools agree exactly)."""
    if not (dtype.is_float or dtype.is_complex):
        return 0.0
    return PLAN_AGREEMENT * tolerance(dtype, REDUCTION_BOUND, fast=fast)


DEVICE_LABELS = {"gpu": "GPU", "cpu": "CPU (numpy executor)", "emulator": "CPU emulator of its CUDA kernels"}


def run_once(program: CompiledProgram, inputs: dict[str, Any], console: Console) -> bool:
    """Run the chosen plan (on the given arrays, random ones for placeholders) and check it against
    the unfused reference when that fits in memory and time: False when it disagrees."""
    arrays = random_inputs(inputs)
    device = where_to_run(program, arrays)
    start = time.perf_counter()
    outputs = run_program(program, arrays)
    seconds = time.perf_counter() - start
    line = f"ran the plan on the {DEVICE_LABELS.get(device, device)} in {seconds:.2f} s"
    need = sum(n.type.nbytes for n in program.graph.nodes)
    work = sum(node_flops(n) for n in program.graph.nodes)
    if need > REFERENCE_LIMIT_BYTES or work > REFERENCE_LIMIT_FLOPS:
        console.print(f"[bold]{line}[/]; the reference check is skipped (the unfused graph needs "
                      f"{need / 2**30:.1f} GiB and {work / 1e9:,.0f} GFLOP)")
        return True
    reference = evaluate(program.graph, arrays)
    fast = current_numerics() is Numerics.FAST
    checks = [(plan_error(got, want), _allowed(node.dtype, fast))
              for got, want, node in zip(outputs, reference, program.graph.outputs)]
    worst, bound = max(checks, key=lambda c: c[0] / c[1] if c[1] else math.inf * c[0] if c[0] else 0.0)
    ok = worst <= bound
    verdict = "" if ok else f" [bold red]FAILED[/]: over the bound {bound:.1e} for its dtype"
    console.print(f"[bold]{line}[/]; max error vs the unfused reference {worst:.2e} of the output's scale{verdict}")
    return ok


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
        raise UsageError(f"tracing {kernel.name} raised {type(e).__name__}: {e}"
                         f"{user_line(e, kernel.fn.__code__.co_filename)}") from None
    settings = kernel.tune_settings(default=TuneSettings(method="auto")) if tune else None   # its own cache, space
    program = compile_program(traced.graph, arch, settings, traced.pins)
    return explain_report(program)


def emitted_table(program: CompiledProgram, directory: Path) -> Table:
    """Write the program's kernels under `directory` and list them with ptxas's registers and spills."""
    table = report_table(f"CUDA written to {directory} (compiled for {program.arch.sm})")
    for column in ("file", "regs", "spill B", "smem KB"):
        table.add_column(column, justify="left" if column == "file" else "right", overflow="fold")
    for kernel, path, facts in emit_cuda(program, directory):
        table.add_row(path.name, str(facts.registers), str(facts.spill_bytes),
                      f"{(facts.smem_bytes + kernel.source.dynamic_smem) / 1024:.0f}")
    return table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--explain", metavar="FILE.py[:FUNCTION]", nargs="+", action="extend", required=True,
                   help="the function(s) to explain; FILE.py alone explains every @op.kernel in it")
    p.add_argument("--input", metavar="NAME=DIMS:DTYPE", action="append", default=[],
                   help="an input placeholder, e.g. q=4x16x2048x64:bf16 (default: the module's example_inputs())")
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
    side = console if args.format == "text" else Console(stderr=True)   # stdout holds only the JSON
    documents, failed = [], []
    for kernel, module in targets:
        inputs = target_inputs(kernel, module, args.input)
        report = explain(kernel, inputs, arch, args.tune)
        if args.format == "json":
            documents.append(report.model_dump(mode="json", by_alias=True))
        else:
            for item in explain_renderables(report):
                console.print(item)
        if args.emit_cuda is not None:
            try:
                side.print(emitted_table(report.program, args.emit_cuda / kernel.name))
            except NoTemplateError as e:     # the host runs it; the other functions still get their CUDA
                side.print(f"no CUDA written for {kernel.name}: {one_line(e)}")
        if args.run and not run_once(report.program, kernel.traced(kernel.bind(**inputs)).feeds(inputs), side):
            failed.append(kernel.name)
    if args.format == "json":
        console.file.write(json.dumps(documents[0] if len(documents) == 1 else documents, indent=2) + "\n")
    if failed:
        side.print(f"[bold red]the plans of {', '.join(failed)} disagree with their unfused references[/]")
        return 1
    return 0
