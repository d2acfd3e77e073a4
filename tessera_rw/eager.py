"""Eager op calls that compile: ops on GPU arrays, ops with a pinned schedule, ops under a policy.

An op called on arrays outside a kernel runs at once. On numpy arrays with nothing pinned and the
default numerics policy, the numpy reference computes it (exact, and nothing to compile). On CuPy
or torch CUDA arrays, with a pin (`op.matmul(a, b, tile_shape=(128, 128, 64))`), or inside a
`numerics.policy("kahan_sum")` or `("fast")` block, the one-op graph goes through the same
pipeline as an `@op.kernel` call and runs where a kernel call would: the result has the inputs'
kind. Programs are kept per (graph, numerics policy, pins, tuning settings), so a warm eager call
compiles nothing.

>>> import numpy as np
>>> from tessera_rw import op
>>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
>>> op.matmul(a, a.T, tile_shape=(64, 64))    # runs the plan whose GEMM kernel has 64x64 tiles
array([[ 5., 14.],
       [14., 50.]], dtype=float32)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.schedule_pin import SchedulePin
from tessera_rw.codegen.device_arrays import device_index_of
from tessera_rw.codegen.numerics import Numerics, current_numerics
from tessera_rw.execute import run_program
from tessera_rw.pipeline import CompiledProgram, compile_program
from tessera_rw.tune.plan_tuner import TuneSettings
from tessera_rw.tuning import autotune


def run_eager(graph: Graph, values: dict[str, Any], pins: tuple[SchedulePin, ...]) -> Any:
    """The op's result when this call compiles (GPU arrays, pins, a policy), else None (numpy reference)."""
    numerics = current_numerics()
    if not pins and numerics is Numerics.DEFAULT and not any(_on_gpu(v) for v in values.values()):
        return None
    program = _program(graph.name, graph.inputs, graph.outputs, numerics, pins, autotune.settings())
    return run_program(program, values)[0]


def _on_gpu(value: Any) -> bool:
    try:
        return device_index_of(value) is not None
    except TesseraError:          # an array-like of another library: the numpy reference reads it
        return False


@lru_cache(maxsize=256)
def _program(name: str, inputs: tuple[Node, ...], outputs: tuple[Node, ...], numerics: Numerics,
             pins: tuple[SchedulePin, ...], tuning: TuneSettings | None) -> CompiledProgram:
    # nodes are interned: an equal call builds the same nodes, so they key the cache
    return compile_program(Graph(name, inputs, outputs), None, tuning, pins)

