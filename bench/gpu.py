"""`python -m bench gpu [--quick]`: our generated kernels against torch on this GPU, side by side in one run.

Per row, following the method of counting the floor first and checking before timing:
1. the floor: the row's FLOPs over the measured matrix-unit rate and its bytes (each input read
   once, each output written once) over the measured copy bandwidth, whichever is longer;
2. ours checked on random data against a float64 reference (‖out − ref‖/‖ref‖, its output poisoned
   with NaN first) at each default schedule; one over the tolerance FAILS the row, which is not timed;
3. ours (the fastest checked default schedule) and torch's version timed under one protocol: CUDA
   events, warm-up, L2 flushed between reps, median of two batches whose gap is the noise.

Rows: bf16 GEMM vs torch.matmul; an fp8 (e4m3) GEMM vs torch._scaled_mm; flash attention forward vs scaled_dot_product_attention; softmax and
layernorm vs torch and the copy bandwidth; GEMM + bias + GELU vs eager torch and torch.compile; the
long FFT convolution (bench/gpu_fftconv.py); a ResNet basic block, forward and training step, vs
cuDNN through torch (bench/gpu_conv.py); a linear layer's dW + db and attention's gradients
(bench/gpu_backward.py); rotary embeddings and SwiGLU, whose slices and joins the plan reads in
place (bench/gpu_slices.py). `--quick` takes fewer reps, the first schedule only,
and no 8192^3 GEMM. Last, a warm `@op.kernel` call against its plan run directly. The table is
printed and written to bench/results/gpu[-quick]-<device>-<date>.json and .md (bench/gpu_results.py),
with the driver and the clocks before and after the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rich.console import Console

from bench.results_files import suite_name, wanted
from bench.gpu_timing import (Protocol, Timing, copy_bandwidth, matmul_rate, rel_error, run_poisoned, time_ours,
                              time_torch)
from bench.gpu_rows import BF16, Row, rows
from bench.gpu_results import (Result, error_line, gpu_machine, machine_lines, passed, progress_line,
                               results_markdown, rich_table, row_record, save)
from tessera_rw.algebra.dtypes import DType
from tessera_rw.tune.device_measure import COMPILE_WORKERS

RESULTS = Path(__file__).parent / "results"
COMPILE_LIMIT_S = 60                 # torch.compile gets this long; a slower compile is reported, not waited for
TOLERANCE = {DType.bfloat16: 1e-2, DType.float16: 1e-2, DType.float32: 1e-4}   # ‖out − ref‖ / ‖ref‖
COPY_BYTES = 1 << 30
CEILING_N = 8192


def preflight() -> str | None:
    """Why this benchmark cannot run here (None: it can), in one line."""
    try:
        import torch
    except ImportError:
        return ("bench gpu needs PyTorch with CUDA: torch is not installed, and every row compares our kernel "
                "with torch's in the same run (install torch, or run the suites that need no GPU: "
                "cpu, registers, cost)")
    if not torch.cuda.is_available():
        return (f"bench gpu needs an NVIDIA GPU: torch {torch.__version__} sees none "
                f"(built for CUDA {torch.version.cuda}); run it on a machine with a GPU and driver")
    from tessera_rw.codegen.device import gpu_available
    if not gpu_available():
        return "bench gpu needs an NVIDIA GPU: torch sees one but cuda.core does not (check the driver and cuda-core)"
    from tessera_rw.codegen.arch import ArchError, current_arch
    try:
        current_arch()
    except ArchError as e:
        return f"bench gpu: {str(e).splitlines()[0]}"
    return None


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float
    matmul_flops_per_s: float

    def floor_ms(self, flops: float, nbytes: float) -> float:
        return 1e3 * max(flops / self.matmul_flops_per_s, nbytes / self.copy_bytes_per_s)


def versus_compiled(row: Row, ours: Result, protocol: Protocol) -> Result:
    """Ours against torch.compile of the same function, compiled in a child process that gets
    COMPILE_LIMIT_S to compile; a slower or failed compile is said in the row, not waited for."""
    result = Result(row.name.split(" vs ")[0] + " vs torch.compile", floor_ms=ours.floor_ms, ours=ours.ours,
                    rate_unit=ours.rate_unit, work=ours.work, error=ours.error)
    args = [sys.executable, "-m", "bench.gpu_compiled", *map(str, row.compiled), str(protocol.warmup),
            str(protocol.reps), str(protocol.flush_bytes)]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=2 * COMPILE_LIMIT_S,
                              cwd=Path(__file__).parents[1])
    except subprocess.TimeoutExpired:
        result.status = f"not compared: torch.compile gave no result within {2 * COMPILE_LIMIT_S} s"
        return result
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        result.status = f"not compared: torch.compile failed ({tail[:100]})"
        return result
    got = json.loads(lines[-1])
    if got["compile_s"] > COMPILE_LIMIT_S:
        result.status = f"not compared: torch.compile took {got['compile_s']:.0f} s to compile (over a minute)"
        return result
    result.torch, result.torch_error = Timing(got["median_ms"], got["spread"]), got["rel_error"]
    result.notes.append(f"torch.compile compiled in {got['compile_s']:.0f} s")
    return result


def precompile(kernels, arch) -> None:
    """Compile every (template, op, schedule) of `kernels` in parallel into the binary cache, so that
    the rows, checked and timed one kernel at a time, only load them. A kernel that fails to emit or
    compile is left for its row, which reports the error."""
    from cuda.core import Device
    from tessera_rw.codegen.compile import compile_cuda
    sm = f"sm_{Device(0).arch}"

    def compile_one(kernel) -> None:
        template, op, schedule = kernel
        try:
            compile_cuda(template.emit(op, schedule, arch), sm)
        except Exception:
            pass

    with ThreadPoolExecutor(max_workers=COMPILE_WORKERS) as pool:
        list(pool.map(compile_one, kernels))


def row_schedules(row: Row, arch, quick: bool) -> list:
    """The default schedules a row checks (the first only with --quick)."""
    from tessera_rw.codegen.templates.registry import templates_for
    found = templates_for(row.op)
    if not found or found[0].unavailable(row.op, arch):
        return []
    return found[0].schedules(row.op, arch)[:1 if quick else None]


def kernels_to_compile(rows: list[Row], arch, quick: bool):
    """(template, op, schedule) for every row's checked schedules; a row whose template fails here
    is left out, to fail in its own row."""
    from tessera_rw.codegen.templates.registry import templates_for
    for row in rows:
        try:
            found = [(templates_for(row.op)[0], row.op, s) for s in row_schedules(row, arch, quick)]
        except Exception:
            continue
        yield from found


def run_row(row: Row, protocol: Protocol, ceilings: Ceilings, quick: bool) -> Result:
    import torch
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.templates.registry import templates_for
    memory_bound = row.flops == 0
    result = Result(row.name, floor_ms=ceilings.floor_ms(row.flops, row.bytes),
                    rate_unit="GB/s" if memory_bound else "TFLOP/s", work=row.bytes if memory_bound else row.flops)
    if memory_bound:     # the ceiling of a pass over these bytes: a copy of the same size
        copy = copy_bandwidth(row.bytes // 2, protocol)
        result.floor_ms = 1e3 * row.bytes / copy
        result.notes.append(f"copy of the same bytes: {copy / 1e9:,.0f} GB/s (read + write); "
                            f"'% of floor' is the fraction of it ours reaches")
    tol = TOLERANCE[row.op.result.dtype]
    found = templates_for(row.op)
    if not found:
        result.status = "FAILED: no template implements the op"
        return result
    if reason := found[0].unavailable(row.op, current_arch()):     # fp8 before sm_89: torch has none either
        result.status = f"skipped: {reason}"
        return result
    inputs = row.make()
    ref = row.reference(*inputs)
    result.torch_error = rel_error(row.torch_fn(*inputs), ref)
    schedules = row_schedules(row, current_arch(), quick)
    checked = [(s, rel_error(run_poisoned(row.op, inputs, s), ref)) for s in schedules]
    del ref
    wrong = [f"{s.describe()}: error {error:.1e} over {tol:.0e}" for s, error in checked if not error <= tol]
    if wrong:                      # a wrong kernel is not timed, and neither is the row
        result.status = f"FAILED: {len(wrong)} of {len(checked)} schedules wrong on random data"
        result.notes.extend(wrong)
        return result
    if len(checked) > 1:           # a short trial picks the schedule worth the full timing
        trial = Protocol(2, max(3, protocol.reps // 5), protocol.flush_bytes)
        checked.sort(key=lambda se: time_ours(row.op, inputs, se[0], trial, batches=1).median_ms)
    best, result.error = checked[0]
    result.notes.insert(0, f"schedule {best.describe()}")
    result.ours = time_ours(row.op, inputs, best, protocol)
    result.torch = time_torch(lambda: row.torch_fn(*inputs), protocol)
    inputs = None                  # the operands' device memory goes back before the next row
    torch.cuda.empty_cache()
    return result


def call_overheads() -> dict:
    """A warm `@op.kernel` call on a small numpy array against running its plan directly, on the GPU
    (bench/kernel_calls.py): what a call costs beyond its kernels, copies in and out included."""
    from bench.kernel_calls import warm_call_overhead_us
    call_us, plan_us, overhead_us = warm_call_overhead_us()
    return {"warm_call_us": call_us, "plan_run_us": plan_us, "overhead_us": overhead_us,
            "line": f"a warm @op.kernel call on a 4x64 float32 numpy array: {call_us:.1f} µs, its plan run "
                    f"directly {plan_us:.1f} µs (copies in and out included), overhead {overhead_us:.1f} µs "
                    "(median of paired differences)"}


def protocol_for(arch, quick: bool) -> Protocol:
    return Protocol(warmup=3 if quick else 10, reps=10 if quick else 50, flush_bytes=2 * arch.l2_bytes)


def run(quick: bool = False, console: Console | None = None, only: str | None = None) -> int:
    """Run every row (or those whose name holds `only`); 2 when this machine cannot run the benchmark,
    1 when a row failed, else 0."""
    console = console or Console(width=None if sys.stdout.isatty() else 220)
    reason = preflight()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from bench.gpu_backward import backward_rows
    from bench.gpu_conv import conv_rows
    from bench.gpu_fftconv import LONG_CONV_NAME, long_conv
    from bench.gpu_slices import slice_row_runs
    from tessera_rw.codegen.arch import current_arch
    arch = current_arch()
    protocol = protocol_for(arch, quick)
    ceilings = Ceilings(copy_bandwidth(COPY_BYTES, protocol), matmul_rate(CEILING_N, protocol))
    machine = gpu_machine()
    header = machine_lines(machine) + [
        f"{'--quick: ' if quick else ''}{f'--only {only!r}: ' if only else ''}protocol: {protocol.warmup} warm-up, "
        f"2 x {protocol.reps} reps, {protocol.flush_bytes >> 20} MiB L2 flush between reps, medians",
        f"measured ceilings: copy {ceilings.copy_bytes_per_s / 1e9:,.0f} GB/s (read + write), "
        f"torch.matmul bf16 {CEILING_N}^3 {ceilings.matmul_flops_per_s / 1e12:,.0f} TFLOP/s "
        f"(datasheet {arch.hbm_gbps:,.0f} GB/s, {arch.peak_flops(BF16) / 1e12:,.0f} TFLOP/s)"]
    for line in header:
        console.print(line, markup=False)
    results = []
    all_rows = [row for row in rows(quick) if wanted(row.name, only)]
    precompile(list(kernels_to_compile(all_rows, arch, quick)), arch)
    for row in all_rows:
        try:
            results.append(run_row(row, protocol, ceilings, quick))
            if row.compiled and results[-1].ours is not None:
                results.append(versus_compiled(row, results[-1], protocol))
        except Exception as e:     # one broken row is reported and the rest still run
            results.append(Result(row.name, status=f"ERROR {error_line(e)}"))
        console.print(progress_line(results[-1]), markup=False)
    for name, timed in [(LONG_CONV_NAME, partial(long_conv, protocol, ceilings)),
                        *conv_rows(protocol, ceilings), *backward_rows(protocol, ceilings, quick),
                        *slice_row_runs(protocol, ceilings)]:
        if wanted(name, only):
            results.append(timed())
            console.print(progress_line(results[-1]), markup=False)
    try:
        calls = call_overheads()
    except Exception as e:       # the rows above are kept whatever happens here
        calls = {"line": f"the warm-call measurement failed: {error_line(e, 200)}"}
    console.print(rich_table(results, f"tessera_rw vs torch on {arch.name}"))
    for r in results:
        for note in r.notes:
            console.print(f"  {r.name}: {note}", markup=False)
    document = {"suite": "gpu", "quick": quick, "protocol": vars(protocol),
                "ceilings": {"copy_bytes_per_s": ceilings.copy_bytes_per_s,
                             "matmul_flops_per_s": ceilings.matmul_flops_per_s},
                "rows": [row_record(r) for r in results], "calls": calls}
    paths = save(suite_name("gpu", quick, only), machine, document, "\n".join(f"{h}  " for h in header[3:])
                 + "\n\n" + results_markdown(results) + "\n\n" + calls["line"])
    console.print(calls["line"], markup=False)
    console.print(f"written: {', '.join(map(str, paths))}")
    return 0 if all(passed(r.status) for r in results) else 1
