"""`python -m bench.gpu_compiled M N K WARMUP REPS FLUSH_BYTES`: torch.compile of gelu(a @ b + bias) on
random bf16 data, checked against float64 and timed like every other row; prints one JSON line.

It runs in its own process so that `python -m bench gpu` can stop a compile that takes too long.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    m, n, k, warmup, reps, flush = map(int, argv)
    import torch
    import torch.nn.functional as F

    from bench.gpu_timing import Protocol, rel_error, time_torch
    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    fn = torch.compile(lambda a, b, bias: F.gelu(torch.matmul(a, b) + bias))
    start = time.perf_counter()
    out = fn(a, b, bias)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    error = rel_error(out, F.gelu(a.double() @ b.double() + bias.double()))
    t = time_torch(lambda: fn(a, b, bias), Protocol(warmup, reps, flush))
    print(json.dumps({"compile_s": compile_s, "median_ms": t.median_ms, "spread": t.spread, "rel_error": error}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
