"""`python -m bench sanitize`: every default schedule of the Hopper kernels, once, on small shapes,
for a run under compute-sanitizer (racecheck, synccheck, memcheck):

    compute-sanitizer --tool racecheck --error-exitcode 1 python -m bench sanitize

The shapes are small so that the instrumented launches finish in seconds, yet each covers more than
one tile (and a ragged one for the GEMM) so that barriers between pipeline stages and tiles are
exercised. Each launch's output is poisoned first and checked against a float64 reference, so the
run also fails on a wrong result. The exit status is 1 when any schedule is wrong.
"""

from __future__ import annotations

import sys

from bench.gpu import (TOLERANCE, attention_row, epilogue_row, fp8_gemm_row, gemm_row, kernels_to_compile,
                       layernorm_row, precompile, preflight, row_schedules, softmax_row)
from bench.gpu_timing import rel_error, run_poisoned


def small_rows():
    return [gemm_row(512), epilogue_row(384, 320, 192), fp8_gemm_row(512),
            attention_row(1, 2, 384, 64, False), attention_row(1, 2, 384, 128, True),
            softmax_row(512), layernorm_row(512)]


def run() -> int:
    reason = preflight()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.templates.registry import templates_for
    arch, wrong, rows = current_arch(), 0, small_rows()
    precompile(list(kernels_to_compile(rows, arch, quick=False)), arch)
    for row in rows:
        schedules = row_schedules(row, arch, quick=False)
        if not schedules:
            print(f"{row.name}: skipped ({templates_for(row.op)[0].unavailable(row.op, arch)})")
            continue
        inputs = row.make()
        ref = row.reference(*inputs)
        for schedule in schedules:
            error = rel_error(run_poisoned(row.op, inputs, schedule), ref)
            ok = error <= TOLERANCE[row.op.result.dtype]
            wrong += not ok
            print(f"{row.name.split(' vs ')[0]} [{schedule.describe()}]: error {error:.1e} {'ok' if ok else 'WRONG'}",
                  flush=True)
    return 1 if wrong else 0
