"""`--run`: run the chosen plan, on the given arrays or random ones, and check it against the
unfused graph's reference, at the bound of the least precise type each output is computed through.

>>> plan_error(np.array([1.0, 2.2]), np.array([1.0, 2.0]))
0.10000000000000009
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from rich.console import Console

from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import topological_order
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.codegen.kernel_check import tolerance
from tessera_rw.codegen.numerics import Numerics, current_numerics
from tessera_rw.execute import run_program, where_to_run
from tessera_rw.pipeline import CompiledProgram
from tessera_rw.report import node_flops

REFERENCE_LIMIT_BYTES = 1 << 30     # the unfused reference holds every intermediate at once
REFERENCE_LIMIT_FLOPS = 10 ** 11    # and runs every op the plain way (a direct convolution is O(L²))


def run_arrays(inputs: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays for a run: the given arrays as they are, random ones for placeholders (never all
    zeros): random ints and bools, and normal floats scaled as a network's initializer scales its
    weights (`spread`), so that a deep program's activations stay of order one: from unit-variance
    weights, a few layers push softmaxes to one-hot and the output's value to rounding noise, which
    no plan then agrees on."""
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
            arrays[name] = (rng.standard_normal(t.shape) * spread(t.shape)).astype(t.dtype.numpy)
        else:
            arrays[name] = rng.integers(-100, 100, t.shape).astype(t.dtype.numpy)
    return arrays


def spread(shape: tuple[int, ...]) -> float:
    """The standard deviation of a random float array of `shape`: 1/√fan-in, the fan-in taken as a
    matrix's rows (x @ w reads w's rows), and 1 for vectors and scalars.

    >>> spread((256, 3072)), spread((768,))
    (0.0625, 1.0)
    """
    return 1.0 / math.sqrt(shape[-2]) if len(shape) >= 2 and shape[-2] > 0 else 1.0


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


def _allowed(output: Node, fast: bool) -> float:
    """The plan's bound for `output`: that of the least precise type it is computed through, as the
    program's own rounding is (a float32 result of bfloat16 products is as precise as bfloat16);
    integers and bools agree exactly."""
    if not (output.dtype.is_float or output.dtype.is_complex):
        return 0.0
    computed = {output.dtype} | {n.dtype for n in topological_order((output,))      # an input returned as is
                                 if n.op not in ("input", "constant") and (n.dtype.is_float or n.dtype.is_complex)}
    return PLAN_AGREEMENT * max(tolerance(dtype, REDUCTION_BOUND, fast=fast) for dtype in computed)


DEVICE_LABELS = {"gpu": "GPU", "cpu": "CPU (numpy executor)", "emulator": "CPU emulator of its CUDA kernels"}


def run_once(program: CompiledProgram, inputs: dict[str, Any], console: Console) -> bool:
    """Run the chosen plan (on the given arrays, random ones for placeholders) and check it against
    the unfused reference when that fits in memory and time: False when it disagrees."""
    arrays = run_arrays(inputs)
    device = where_to_run(program, arrays)
    start = time.perf_counter()
    outputs = run_program(program, arrays)
    seconds = time.perf_counter() - start
    line = f"ran the plan on the {DEVICE_LABELS.get(device, device)} in {seconds:.2f} s"
    need = sum(n.type.nbytes for n in program.graph.nodes)
    work = sum(node_flops(n) for n in program.graph.nodes)
    if need > REFERENCE_LIMIT_BYTES or work > REFERENCE_LIMIT_FLOPS:
        console.print(f"[bold]{line}[/]; the reference check is skipped (the unfused graph needs "
                      f"{need / 2**30:.1f} GiB and {work / 1e9:,.0f} GFLOP): give smaller --input shapes to check "
                      "the plan at them")
        return True
    reference = evaluate(program.graph, arrays)
    fast = current_numerics() is Numerics.FAST
    checks = [(plan_error(got, want), _allowed(node, fast))
              for got, want, node in zip(outputs, reference, program.graph.outputs)]
    worst, bound = max(checks, key=lambda c: c[0] / c[1] if c[1] else math.inf * c[0] if c[0] else 0.0)
    ok = worst <= bound
    verdict = "" if ok else f" [bold red]FAILED[/]: over the bound {bound:.1e} for its dtype"
    console.print(f"[bold]{line}[/]; max error vs the unfused reference {worst:.2e} of the output's scale{verdict}")
    return ok
