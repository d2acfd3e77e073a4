"""`tessera-rewrite --explain`: what tessera_rw does with a function in a Python file.

    tessera-rewrite --explain examples/attention.py:attention --input q=4x16x2048x64:bf16 ...

A target module may define `example_inputs()` returning a dict of arrays or op.tensor
placeholders, so `--input` can be left out. Bad invocations print one line and exit with 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.console import Console

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.codegen.arch import ArchSpec, arch_named, target_arch
from tessera_rw.execute import run_program, where_to_run
from tessera_rw.kernel import Kernel
from tessera_rw.pipeline import CompiledProgram, compile_program
from tessera_rw.report import candidates_table, choice_reason, graph_summary, kernels_table, rewrite_summary

from tessera_rw.cli.usage import UsageError

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


def load_target(target: str) -> tuple[Kernel, Any]:
    """'path.py:func' -> (the function as a Kernel, the module)."""
    path, colon, func = target.rpartition(":")
    if not colon or not path or not func:
        raise UsageError(f"target {target!r} must be FILE.py:FUNCTION")
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except TesseraError:
        raise
    except Exception as e:  # the user's module failed to import: say so in one line
        raise UsageError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    fn = getattr(module, func, None)
    if fn is None or not callable(fn):
        raise UsageError(f"{path} has no function {func!r}")
    return (fn if isinstance(fn, Kernel) else Kernel(fn)), module


def target_inputs(kernel: Kernel, module: Any, given: Sequence[str]) -> dict[str, Any]:
    if given:
        inputs = dict(parse_input(t) for t in given)
    elif callable(getattr(module, "example_inputs", None)):
        inputs = module.example_inputs()
    else:
        raise UsageError(f"{kernel.name} needs --input for each tensor argument (or define example_inputs() "
                         "in its module)")
    return {n: (v if isinstance(v, TensorSpec) else TensorSpec(v.shape, v.dtype)) for n, v in inputs.items()}


REFERENCE_LIMIT_BYTES = 1 << 30     # the unfused reference holds every intermediate at once


def random_inputs(specs: dict[str, TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for placeholders (never all zeros): normal floats, random ints and bools."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, spec in specs.items():
        t = spec.type
        if t.dtype.name == "bool":
            arrays[name] = rng.random(t.shape) < 0.5
        elif t.dtype.is_float:
            arrays[name] = rng.standard_normal(t.shape).astype(t.dtype.numpy)
        else:
            arrays[name] = rng.integers(-100, 100, t.shape).astype(t.dtype.numpy)
    return arrays


def run_once(program: CompiledProgram, specs: dict[str, TensorSpec], console: Console) -> None:
    """Run the chosen plan on random inputs and check it against the unfused reference."""
    arrays = random_inputs(specs)
    device = where_to_run(program, arrays)
    start = time.perf_counter()
    outputs = run_program(program, arrays)
    seconds = time.perf_counter() - start
    line = f"ran the plan on the {'GPU' if device == 'gpu' else 'CPU (numpy executor)'} in {seconds:.2f} s"
    need = sum(n.type.nbytes for n in program.graph.nodes)
    if need > REFERENCE_LIMIT_BYTES:
        console.print(f"[bold]{line}[/]; the reference check is skipped (the unfused graph needs {need / 2**30:.1f} GiB)")
        return
    reference = evaluate(program.graph, arrays)
    errors = []
    for got, want in zip(outputs, reference):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
        errors.append(float(np.abs(got - want).max(initial=0.0)) / scale)
    console.print(f"[bold]{line}[/]; max error vs the unfused reference {max(errors):.2e} of the output's scale")


def explain(target: str, given: Sequence[str], arch: ArchSpec, console: Console, execute: bool = False) -> None:
    kernel, module = load_target(target)
    inputs = target_inputs(kernel, module, given)
    graph = kernel.trace(**inputs).verify()
    console.print(graph_summary(graph))
    console.file.write(f"{graph}\n")
    program = compile_program(graph, arch)
    console.print(rewrite_summary(program.rewrite.report))
    candidates = program.candidates
    console.print(candidates_table(candidates, arch))
    for rank, candidate in enumerate(candidates):
        console.print(kernels_table(candidate, f"candidate {rank}: {candidate.fusion_depth.label}"))
        if rank == program.chosen:
            console.file.write(f"{candidate.graph}\n")
    console.print(f"[bold]{choice_reason(candidates)}[/]")
    console.file.write(f"{program.plan}\n")
    if execute:
        run_once(program, inputs, console)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--explain", metavar="FILE.py:FUNCTION", action="append", required=True,
                   help="trace the function and print its graph (repeat for several targets)")
    p.add_argument("--input", metavar="NAME=DIMS:DTYPE", action="append", default=[],
                   help="an input placeholder, e.g. q=4x16x2048x64:bf16")
    p.add_argument("--arch", metavar="NAME", default=None,
                   help="plan for this GPU (default: TESSERA_ARCH, else this machine's GPU, else H100-SXM)")
    p.add_argument("--run", action="store_true",
                   help="also run the chosen plan on random inputs (the GPU, else the numpy executor) "
                        "and check it against the unfused reference")


def run(args: argparse.Namespace, console: Console) -> int:
    arch = arch_named(args.arch) if args.arch else target_arch()
    for target in args.explain:
        explain(target, args.input, arch, console, execute=args.run)
    return 0
