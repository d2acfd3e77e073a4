"""The cost of calling an @op.kernel: warm-call overhead and the first call of the attention example.

- Warm overhead: a kernel whose program is compiled (and tuned, from a warm cache) called on a
  small array, against running its compiled plan directly with the same executor, the two run in
  pairs; the median paired difference is what binding, the signature lookup and dispatch cost per
  call.
- First call: a fresh process with an empty cache calls the attention example (bf16, 4x16x2048x64)
  with autotuning on, no GPU timing (`auto` ranks by the cost model without a GPU): trace,
  rewrite, extract, tune, lower and run it once. The process's imports are timed apart.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PAIRS = 5000

FIRST_CALL = """
import json, sys, time
start = time.perf_counter()
import numpy as np
from tessera_rw import autotune
sys.path.insert(0, "examples")
import attention as example
imported = time.perf_counter()
autotune.enable(True)
rng = np.random.default_rng(0)
inputs = {n: rng.standard_normal(t.shape).astype(t.dtype.numpy) for n, t in example.example_inputs().items()}
called = time.perf_counter()
out = example.attention(**inputs)
done = time.perf_counter()
program = example.attention.program(**inputs)
print(json.dumps({"import_s": imported - start, "first_call_s": done - called, "chosen_by": program.chosen_by,
                  "kernels": len(program.plan.steps), "finite": bool(np.isfinite(out.astype(np.float32)).all())}))
"""


def paired_calls_us(call: Callable[[], object], base: Callable[[], object],
                    pairs: int = PAIRS) -> tuple[float, float, float]:
    """(median µs of `call`, of `base`, median of call − base over pairs run back to back): each pair
    runs the two in turn (in alternating order), so a burst of load on a shared machine falls on
    both halves of the pairs it hits and drops out of their difference, where medians of separate
    blocks of calls would each take it whole."""
    for _ in range(50):
        call()
        base()
    clock, calls, bases, differences = time.perf_counter_ns, [], [], []
    for i in range(pairs):
        swapped = i % 2 == 1
        start = clock()
        (base if swapped else call)()
        middle = clock()
        (call if swapped else base)()
        end = clock()
        took_call, took_base = (end - middle, middle - start) if swapped else (middle - start, end - middle)
        calls.append(took_call / 1e3)
        bases.append(took_base / 1e3)
        differences.append((took_call - took_base) / 1e3)
    return statistics.median(calls), statistics.median(bases), statistics.median(differences)


def warm_call_overhead_us() -> tuple[float, float, float]:
    """(kernel call µs, direct plan run µs, the call's overhead over the run: their median paired
    difference), on the executor the call itself uses."""
    from tessera_rw import autotune, op
    from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
    from tessera_rw.codegen.numerics import current_numerics
    from tessera_rw.execute import where_to_run

    @op.kernel
    def scaled_softmax(x):
        return op.softmax(x * 0.5, axis=-1)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TESSERA_CACHE_DIR"] = cache
        autotune.enable(True)
        try:
            scaled_softmax(x)                          # compiles and tunes into the cache
            program = scaled_softmax.program(x)
            if where_to_run(program, {"x": x}) == "gpu":
                from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
                direct = lambda: run_plan_on_gpu(program.plan, {"x": x}, numerics=current_numerics(),  # noqa: E731
                                                 schedules=program.schedules)
            else:
                numerics = current_numerics()
                direct = lambda: run_plan_on_cpu(program.plan, {"x": x}, numerics)  # noqa: E731
            found = paired_calls_us(lambda: scaled_softmax(x), direct)
        finally:
            autotune.enable(False)
            os.environ.pop("TESSERA_CACHE_DIR", None)
    return found


def first_call_of_attention() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TESSERA_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, "-c", FIRST_CALL], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the attention example failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
