"""Autotuning a matmul and a linear layer: choosing tiles, pipeline depth and warps per shape.

Four ways in, from the least to the most control:

1. `autotune(op.matmul, shapes=(M, N, K), dtype=...)`: tune one op at one shape now, get its config.
2. `@op.autotune(cache=...)`: a kernel that tunes each new (shapes, dtypes) signature on its first
   call and keeps the result, so a later process tunes nothing.
3. `kernel.schedule.search_space(...)` then `kernel.schedule.autotune(...)`: narrow the space to the
   values you allow, and tune now.
4. `op.matmul(a, b, tile_shape=(bm, bn, bk))`: pin the tile of the GEMM kernel computing that
   product (eagerly or inside a kernel); it is not tuned, and `--explain` says so.

`method="auto"` times candidate schedules on the GPU (each checked against the numpy reference
first) when there is one; without a GPU it ranks them by the roofline cost model. Results live in a
named cache, here "examples", next to (not inside) the default one: under
`$TESSERA_CACHE_DIR/autotune/examples/`, else `~/.tessera/autotune/examples/`, one file per GPU arch.
`tessera-rewrite cache list --name examples` shows it, `cache clear --name examples` empties it.

    python examples/matmul_autotune.py
    tessera-rewrite --explain examples/matmul_autotune.py:linear_gelu --run
"""

import sys

import numpy as np
from rich.console import Console
from scipy.special import erf

from tessera_rw import autotune, op
from tessera_rw.tune.cache import TuneCache

CACHE = "examples"


# A linear layer with its activation: the bias add and the gelu run in the gemm's epilogue, so the
# (tokens × 3072) pre-activation never goes to memory. Its tiles are tuned per shape on first call.
@op.autotune(cache=CACHE)
def linear_gelu(x, w, b):
    return op.gelu(x @ w + b)


def example_inputs():
    """GPT-2 small's MLP up-projection (768 → 3072) over 1024 tokens, in bf16."""
    return {"x": op.tensor((1024, 768), "bf16"), "w": op.tensor((768, 3072), "bf16"),
            "b": op.tensor((3072,), "bf16")}


def linear_gelu_reference(x, w, b):
    u = np.asarray(x, np.float64) @ w + b
    return 0.5 * u * (1 + erf(u / np.sqrt(2)))


TOLERANCE = 1e-3        # float32 inputs; the error is measured relative to the output's largest value


def max_relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    console = Console()
    print(f"tuning results go to {TuneCache(CACHE).folder}")

    # 1. one op at one shape. `cfg` describes the heaviest kernel of what was tuned; str() is one line.
    cfg = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="auto", max_trials=20, cache=CACHE)
    print(f"matmul 1024³ bf16: {cfg}  (chosen by {cfg.chosen_by}, {cfg.time_us:.1f} µs)")
    # ...and later, or in another process, the cache answers without tuning:
    print(f"  from the cache:  {autotune.load(op.matmul, (1024, 1024, 1024), dtype='bf16', cache=CACHE)}")

    # 2. calling the kernel on a new signature tunes it first (as @op.autotune asked), then runs it:
    #    on the GPU if there is one, else on the numpy executor.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = (rng.standard_normal((96, 128)) / np.sqrt(96)).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    error = max_relative_error(linear_gelu(x, w, b), linear_gelu_reference(x, w, b))
    ok = error < TOLERANCE
    print(f"{linear_gelu.name:18s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")

    # 3. narrow the space, then tune the kernel at the example's shapes (placeholders: no data needed)
    linear_gelu.schedule.search_space(tile_sizes=[(64, 64), (128, 64), (128, 128)], pipeline_stages=[2, 3, 4])
    cfg = linear_gelu.schedule.autotune(**example_inputs(), cost_model="roofline", max_trials=20, cache=CACHE)
    print(f"linear_gelu 1024×768 → 3072 bf16: {cfg}  (chosen by {cfg.chosen_by})")
    console.print(cfg.table())           # every schedule weighed (empty when the cache answered)

    # 4. pin the tile yourself: the product runs the GEMM kernel with 64x64 tiles, untuned
    pinned = op.matmul(x, w, tile_shape=(64, 64))
    pinned_error = max_relative_error(pinned, np.asarray(x, np.float64) @ w)
    pinned_ok = pinned_error < TOLERANCE
    print(f"{'pinned matmul':18s} max relative error {pinned_error:.1e}  {'ok' if pinned_ok else 'FAILED'}")
    return 0 if ok and pinned_ok else 1


if __name__ == "__main__":
    sys.exit(main())
