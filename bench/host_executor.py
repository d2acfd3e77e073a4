"""The numpy executor against plain numpy / scipy, on the same random inputs in the same run.

- Attention at S = 8192 on bf16 inputs (what the fused GPU kernel takes): the executor runs the
  fused plan's flash_attention block by block in float32 arithmetic; the baseline is the naive form
  softmax(q kᵀ · scale) v in float32 on the same values, which holds the S×S scores. Peak memory
  is what numpy allocates during the call (tracemalloc sees numpy's allocations), inputs excluded.
- A depthwise convolution with a filter as long as the sequence: the executor runs the plan the
  cost model chose (rfft · spectral product · irfft through scipy.fft); the baselines are
  scipy.signal's direct correlation, channel by channel, and scipy's FFT convolution.

Each pair is checked to agree before it is timed.
"""

from __future__ import annotations

import math
import tracemalloc
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from scipy import signal

from tessera_rw import op

from bench.timing import time_call


@dataclass(frozen=True)
class Versus:
    """Our call and its baseline: median seconds, peak bytes allocated, and how far apart they are."""
    what: str
    ours_s: float
    baseline_s: float
    ours_peak: int
    baseline_peak: int
    max_rel_error: float
    plan: str                     # the chosen plan's kernels, as the executor ran them

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.ours_s


def peak_bytes(fn) -> int:
    """The most memory numpy and Python held at once during fn(), beyond what they held before."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


@op.kernel
def attention(q, k, v):
    return op.flash_attention(q, k, v)


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(q.shape[-1] ** -0.5)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    return (s / s.sum(axis=-1, keepdims=True)) @ v


def attention_versus_naive(heads: int = 2, seq: int = 8192, dim: int = 64, reps: int = 3) -> Versus:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, seq, dim), dtype=np.float32).astype(ml_dtypes.bfloat16)
               for _ in range(3))
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))  # the same values, for the baseline
    ours = attention(q, k, v)                                   # compiles the program once
    want = naive_attention(q32.astype(np.float64), k32.astype(np.float64), v32.astype(np.float64))
    steps = ", ".join(s.op for s in attention.program(q, k, v).plan.steps)
    return Versus(f"attention B=1 H={heads} S={seq} D={dim} bf16 (float32 arithmetic)",
                  time_call(lambda: attention(q, k, v), reps).median_s,
                  time_call(lambda: naive_attention(q32, k32, v32), reps).median_s,
                  peak_bytes(lambda: attention(q, k, v)), peak_bytes(lambda: naive_attention(q32, k32, v32)),
                  relative_error(ours, want), steps)


def long_conv(channels: int, seq: int):
    @op.kernel
    def causal_depthwise(z, filt):
        return op.conv1d(z, filt, padding=(seq - 1, 0), groups=channels)
    return causal_depthwise


def scipy_direct(z: np.ndarray, filt: np.ndarray) -> np.ndarray:
    padded = np.pad(z, ((0, 0), (0, 0), (z.shape[-1] - 1, 0)))
    return np.stack([np.stack([signal.correlate(padded[b, c], filt[c, 0], mode="valid", method="direct")
                               for c in range(z.shape[1])]) for b in range(z.shape[0])])


def scipy_fft(z: np.ndarray, filt: np.ndarray) -> np.ndarray:
    full = signal.fftconvolve(z, filt[None, :, 0, ::-1], mode="full", axes=-1)
    return full[..., :z.shape[-1]]


def conv_versus_scipy(channels: int = 16, seq: int = 8192, reps: int = 3) -> tuple[Versus, Versus]:
    """(ours vs scipy direct, ours vs scipy fftconvolve) for a causal depthwise conv, float32."""
    rng = np.random.default_rng(1)
    z = rng.standard_normal((1, channels, seq), dtype=np.float32)
    filt = (rng.standard_normal((channels, 1, seq)) / math.sqrt(seq)).astype(np.float32)
    kernel = long_conv(channels, seq)
    ours = kernel(z, filt)
    want = scipy_direct(z.astype(np.float64), filt.astype(np.float64))
    steps = ", ".join(s.op for s in kernel.program(z, filt).plan.steps)
    ours_s = time_call(lambda: kernel(z, filt), reps).median_s
    ours_peak = peak_bytes(lambda: kernel(z, filt))
    what = f"causal depthwise conv1d C={channels} L={seq}, filter length {seq}, f32"
    direct = Versus(what + " vs scipy direct", ours_s, time_call(lambda: scipy_direct(z, filt), 1, warmup=0).median_s,
                    ours_peak, peak_bytes(lambda: scipy_direct(z, filt)), relative_error(ours, want), steps)
    if relative_error(scipy_fft(z, filt), want) > 1e-4:
        raise AssertionError("scipy's FFT convolution disagrees with its direct one: the baselines are miswired")
    fft = Versus(what + " vs scipy fftconvolve", ours_s, time_call(lambda: scipy_fft(z, filt), reps).median_s,
                 ours_peak, peak_bytes(lambda: scipy_fft(z, filt)), direct.max_rel_error, steps)
    return direct, fft
