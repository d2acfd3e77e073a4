#!/bin/bash
# The GPU checks on a host without internet, in one command, from the repository's root:
#
#   bash bench/gpu_host.sh WHEELHOUSE OUTDIR [STEP[:SECONDS] ...]
#
# WHEELHOUSE holds the wheels `python -m bench wheelhouse` gathered (see its --help); they and this
# checkout (editable, with the example plugin) are installed into the host's python3 first (the
# script stops if that fails). Steps, each stopped after SECONDS (default 600), its log written to
# OUTDIR:
#   tests     every gpu-marked test                      bench / benchq   python -m bench gpu [--quick]
#   tune / tuneq   python -m bench tune [--quick]         sanitize   racecheck, synccheck and memcheck
#   rows / tunerows   python -m bench gpu|tune --only "$BENCH_ONLY" (the rows whose name holds it)
# Default: tests benchq sanitize. The results files the run wrote (and the timing logs) are packed
# into OUTDIR/results.tar; a step stopped at its limit writes none. Where the checkout was copied
# without its git metadata, set BENCH_COMMIT to the commit it holds: the results are stamped with it.
set -u
WHEELS=$1; OUT=$2; shift 2
STEPS=("$@"); [ ${#STEPS[@]} -eq 0 ] && STEPS=(tests benchq sanitize)
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
T0=$(date +%s); stamp() { echo "== $1 at +$(( $(date +%s) - T0 )) s"; }
START="$OUT/.started"; touch "$START"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e plugins/rmsnorm_matmul &&
  python3 -c "from tessera_rw.codegen.device import gpu_available; print('gpu_available:', gpu_available())
from tessera_rw.codegen.library_kernels import library_available, _runtime; print('cuFFT:', library_available('cuFFT'), _runtime('cuFFT')[1])"
} > "$OUT/setup.log" 2>&1 || { echo "setup failed:"; tail -20 "$OUT/setup.log"; exit 1; }
tail -2 "$OUT/setup.log"; stamp setup
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for step in "${STEPS[@]}"; do
  name=${step%%:*}; secs=${step#*:}; [ "$secs" = "$step" ] && secs=600
  stamp "$name"
  case $name in
    tests) # on 14 workers where pytest-xdist is installed, each test stopped after 120 s where pytest-timeout is
           PARALLEL=$(python3 -c "import xdist" 2>/dev/null && echo "-n 14")
           LIMITS=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "-o timeout=120 -o timeout_method=thread")
           # -v: each result is logged as it comes, so a run stopped at its limit still tells what failed
           timeout "$secs" python3 -m pytest -m gpu -v $PARALLEL $LIMITS -rfE \
             > "$OUT/gpu-tests.log" 2>&1; echo "pytest rc $?"; grep -E "passed|failed" "$OUT/gpu-tests.log" | tail -1
           grep -E "^(FAILED|ERROR) |\] (FAILED|ERROR) | (FAILED|ERROR) +\[" "$OUT/gpu-tests.log" | cut -c1-200 | sort -u | head -40;;
    bench|benchq) timeout "$secs" python3 -m bench gpu $([ "$name" = benchq ] && echo --quick) > "$OUT/bench-gpu.log" 2>&1
           echo "bench gpu rc $?";;
    rows) timeout "$secs" python3 -m bench gpu --only "${BENCH_ONLY:?rows needs BENCH_ONLY}" > "$OUT/bench-gpu-only.log" 2>&1
           echo "bench gpu --only rc $?";;
    tunerows) timeout "$secs" python3 -m bench tune --only "${BENCH_ONLY:?tunerows needs BENCH_ONLY}" \
             > "$OUT/bench-tune-only.log" 2>&1; echo "bench tune --only rc $?";;
    tune|tuneq) timeout "$secs" python3 -m bench tune $([ "$name" = tuneq ] && echo --quick) > "$OUT/bench-tune.log" 2>&1
           echo "bench tune rc $?";;
    sanitize) timeout "$secs" python3 -m bench sanitize > "$OUT/sanitize.log" 2>&1; echo "plain rc $?"
           [ -z "$SANITIZER" ] && { echo "compute-sanitizer is not installed here"; continue; }
           for tool in racecheck synccheck memcheck; do
             timeout "$secs" "$SANITIZER" --tool $tool --report-api-errors no --error-exitcode 9 --print-limit 20 \
               python3 -m bench sanitize >> "$OUT/sanitize.log" 2>&1; echo "$tool rc $?"
           done;;
    *) echo "unknown step $name";;
  esac
done
stamp done
find bench/results tests/data/tuning_logs -type f -newer "$START" 2>/dev/null | tar cf "$OUT/results.tar" -T -
tar tf "$OUT/results.tar"
