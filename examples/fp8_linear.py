"""An fp8 linear layer, gelu(x Wᵀ + b), with W kept [out, in] as torch keeps it.

x and W hold float8_e4m3 values; the product accumulates in fp32 on fp8 tensor cores (sm_89 and
newer) and writes bf16. The e-graph folds Wᵀ into the GEMM, which reads W where it lies (no
transpose kernel), and the bias and the gelu into its epilogue: one kernel. A weight stored
[in, out] instead is laid out k-major by a transpose kernel first, as Hopper's fp8 tensor cores
read it; on an H100 the cost model puts that copy and the warpgroup-MMA GEMM at 185 µs, the one
kernel that transposes W on its way into shared memory (mma.sync) at 556 µs. Small products keep
the one kernel.

    tessera-rewrite --explain examples/fp8_linear.py --run     # the fusion trace and the plan
    python examples/fp8_linear.py                              # both layouts, checked against numpy
"""

import sys

import ml_dtypes
import numpy as np
from scipy.special import erf

from tessera_rw import op


@op.kernel
def fp8_linear(x, w, b):
    return op.gelu(x @ w.mT + b)


@op.kernel
def fp8_linear_in_out(x, w, b):
    return op.gelu(x @ w + b)


def example_inputs():
    """What `tessera-rewrite --explain` traces with: 8192 tokens of width 4096 into 4096 features."""
    return {"x": op.tensor((8192, 4096), "fp8_e4m3"), "w": op.tensor((4096, 4096), "fp8_e4m3"),
            "b": op.tensor((4096,), "bf16")}


# ---- checking the kernels against plain numpy ------------------------------------------------------

TOLERANCE = 2e-2        # a bf16 result: its rounding, relative to the output's largest value


def linear_reference(x, w, b, w_is_out_in: bool):
    """The same math in float64 on the fp8 values as stored."""
    x, w, b = (np.asarray(a, np.float64) for a in (x, w, b))
    pre = x @ (w.T if w_is_out_in else w) + b
    return 0.5 * pre * (1 + erf(pre / np.sqrt(2)))


def main() -> int:
    """Run both layouts on small random inputs (on the GPU if there is one, else the numpy executor)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 192)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal(128).astype(ml_dtypes.bfloat16)
    failures = 0
    for kernel, shape in ((fp8_linear, (128, 192)), (fp8_linear_in_out, (192, 128))):
        w = (rng.standard_normal(shape) / np.sqrt(192)).astype(ml_dtypes.float8_e4m3fn)
        want = linear_reference(x, w, b, kernel is fp8_linear)
        got = np.asarray(kernel(x, w, b), np.float64)
        error = float(np.abs(got - want).max() / np.abs(want).max())
        ok = error < TOLERANCE
        failures += not ok
        print(f"{kernel.name:18s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
