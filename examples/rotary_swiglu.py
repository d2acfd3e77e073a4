"""Two pieces of a LLaMA-style block that slice and join tensors: rotary embeddings and SwiGLU.

    rope(x) = x · cos + rotate_half(x) · sin,    rotate_half(x) = cat(−x[..., d/2:], x[..., :d/2])
    swiglu(x) = (silu(g) · u) W_down,            g | u = x W_gate_up  (one projection, split in half)

Written this way each slice and the concatenate are copies: rotary embeddings are four kernels (a
copy of each half, the negation, the join) before the products, SwiGLU a gemm, copies of the halves
and the product before the second gemm. tessera_rw computes the concatenate where the products read
it and reads the halves where the projection wrote them. By the cost model on an H100, at the
example's inputs: rotary embeddings are one `concatenated_elementwise` kernel, 14.0 µs and 34.6 MB
through HBM (x read once, the tables once, the result written) against 76.6 µs for the six unfused
kernels; SwiGLU is the two gemms and one `strided_elementwise` between them, 122.6 µs against 176.0.

    tessera-rewrite --explain examples/rotary_swiglu.py --run     # the fusion trace and the plans
    python examples/rotary_swiglu.py                              # small inputs, checked against numpy
"""

import sys

import ml_dtypes
import numpy as np

from tessera_rw import op


@op.kernel
def rotary_embedding(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + op.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


@op.kernel
def swiglu_mlp(tokens, w_gate_up, w_down):
    h = tokens @ w_gate_up
    half = h.shape[-1] // 2
    return (op.silu(h[..., :half]) * h[..., half:]) @ w_down


def rotary_tables(seq: int, dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position · frequency, each frequency repeated over both halves."""
    freq = base ** (-np.arange(0, dim, 2) / dim)
    angle = np.outer(np.arange(seq), freq)
    return np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle, angle], -1))


def example_inputs():
    """32 heads of 2048 tokens × 128 for the rotary embedding; 4096 tokens of width 1024 into a
    hidden width of 2816 (its gate and up halves packed) for SwiGLU; bf16."""
    rng = np.random.default_rng(0)
    cos, sin = rotary_tables(2048, 128)
    bf16 = ml_dtypes.bfloat16
    return {"x": rng.standard_normal((32, 2048, 128)).astype(bf16), "cos": cos.astype(bf16),
            "sin": sin.astype(bf16), "tokens": rng.standard_normal((4096, 1024)).astype(bf16),
            "w_gate_up": (rng.standard_normal((1024, 5632)) / 32).astype(bf16),
            "w_down": (rng.standard_normal((2816, 1024)) / 53).astype(bf16)}


# ---- checking the kernels against plain numpy ------------------------------------------------------

TOLERANCE = 3e-2        # bf16 results: their rounding, relative to the output's largest value


def rotary_reference(x, cos, sin):
    x, cos, sin = (np.asarray(a, np.float64) for a in (x, cos, sin))
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def swiglu_reference(tokens, w_gate_up, w_down):
    h = np.asarray(tokens, np.float64) @ np.asarray(w_gate_up, np.float64)
    half = h.shape[-1] // 2
    gate, up = h[..., :half], h[..., half:]
    return (gate / (1 + np.exp(-gate)) * up) @ np.asarray(w_down, np.float64)


def main() -> int:
    """Run both kernels on small random inputs (on the GPU if there is one, else the numpy executor)."""
    rng = np.random.default_rng(1)
    bf16 = ml_dtypes.bfloat16
    cos, sin = (t.astype(bf16) for t in rotary_tables(64, 32))
    x = rng.standard_normal((2, 4, 64, 32)).astype(bf16)
    tokens = rng.standard_normal((96, 64)).astype(bf16)
    w_gate_up = (rng.standard_normal((64, 256)) / 8).astype(bf16)
    w_down = (rng.standard_normal((128, 64)) / 11).astype(bf16)
    failures = 0
    for kernel, args, want in ((rotary_embedding, (x, cos, sin), rotary_reference(x, cos, sin)),
                               (swiglu_mlp, (tokens, w_gate_up, w_down), swiglu_reference(tokens, w_gate_up, w_down))):
        got = np.asarray(kernel(*args), np.float64)
        error = float(np.abs(got - want).max() / np.abs(want).max())
        ok = error < TOLERANCE
        failures += not ok
        print(f"{kernel.name:18s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
