"""A Hyena-style long-convolution block: a causal convolution as long as the sequence, gated.

    v, g1, g2 = split(x W_in + b_in)           # a value and two gates per channel
    z = g1 · v
    y = g2 · (h ∗ z + skip · z)                # h: a learned filter per channel, as long as the sequence
    out = y W_out + b_out

Written directly, the depthwise convolution costs L² multiply-adds per channel and sequence:
17 GFLOP for the example's 2 sequences of 4096 tokens × 256 channels, four times that at twice the
length. tessera_rw's `spectral` rules give the conv1d a second form,

    conv1d(z, w) = crop(irfft(rfft(pad z) · conj(rfft w)))

and the cost model picks it because it is O(L log L): the plan runs `rfft`, `spectral_contract` (the
per-frequency product; groups=channels makes it a pointwise product), `irfft` — cuFFT on a GPU,
numpy.fft on the host. The gates and the skip term fuse into elementwise kernels around it, which
read v, g1 and g2 where the projection wrote them (no copies of the split), and the projections'
biases into their gemms.

The rewrite covers conv1d (and conv2d) with stride 1 and dilation 1, any padding, any groups; a
strided or dilated convolution stays direct.

    tessera-rewrite --explain examples/hyena_conv.py:hyena_block --run
    python examples/hyena_conv.py           # small inputs, checked against the numpy version below
"""

import sys

import numpy as np

from tessera_rw import op


@op.kernel
def hyena_block(x, w_in, b_in, filt, skip, w_out, b_out):
    seq, width = x.shape[1:]
    u = op.transpose(x @ w_in + b_in, (0, 2, 1))    # (batch, 3·width, seq): channels first, as conv1d wants
    v, g1, g2 = u[:, :width], u[:, width:2 * width], u[:, 2 * width:]
    z = g1 * v
    # conv1d is a cross-correlation (torch's convention), so padding seq-1 steps on the left only
    # makes it causal: y[t] = Σ_j filt[j] z[t-(seq-1)+j] uses z[0..t] only. filt[:, 0, seq-1-τ] is the
    # response at lag τ (a causal filter h goes in time-reversed: h[..., ::-1]).
    # groups=width: depthwise, each channel convolved with its own filter.
    y = op.conv1d(z, filt, padding=(seq - 1, 0), groups=width)
    y = g2 * (y + skip * z)
    return op.transpose(y, (0, 2, 1)) @ w_out + b_out        # back to (batch, seq, width)


def parameter_shapes(batch, seq, width):
    return {"x": (batch, seq, width),
            "w_in": (width, 3 * width), "b_in": (3 * width,),
            "filt": (width, 1, seq),              # depthwise: (out channels, in channels per group, taps)
            "skip": (width, 1),
            "w_out": (width, width), "b_out": (width,)}


def example_inputs():
    """Width 256 over 2 sequences of 4096 tokens, in float32 (FFT convolutions usually run in float32:
    a length-8k transform in bf16 keeps little of the signal)."""
    return {name: op.tensor(shape, "float32") for name, shape in parameter_shapes(2, 4096, 256).items()}


# ---- the same block in plain numpy -------------------------------------------------------------------

def causal_conv_reference(z, filt):
    """y[..., t] = Σ_τ h[τ] z[..., t-τ] with h = filt reversed in time: the direct O(L²) sum."""
    h = filt[:, 0, ::-1]                        # h[c, τ]: channel c's response at lag τ
    seq = z.shape[-1]
    y = np.zeros_like(z)
    for lag in range(seq):
        y[..., lag:] += h[:, lag, None] * z[..., :seq - lag]
    return y


def hyena_block_reference(x, w_in, b_in, filt, skip, w_out, b_out):
    """float64 numpy (x is promoted, so everything after it is)."""
    x = np.asarray(x, np.float64)
    u = np.swapaxes(x @ w_in + b_in, 1, 2)
    v, g1, g2 = np.split(u, 3, axis=1)
    z = g1 * v
    y = g2 * (causal_conv_reference(z, filt) + skip * z)
    return np.swapaxes(y, 1, 2) @ w_out + b_out


# ---- checking the kernel against it ----------------------------------------------------------------

TOLERANCE = 1e-3        # float32 inputs; the error is measured relative to the output's largest value


def random_parameters(rng, batch, seq, width):
    """float32 values; projections ~ 1/√fan_in, a filter that decays with the lag as Hyena's do."""
    p = {name: rng.standard_normal(shape).astype(np.float32)
         for name, shape in parameter_shapes(batch, seq, width).items()}
    p["w_in"] /= np.sqrt(width)
    p["w_out"] /= np.sqrt(width)
    decay = np.exp(-np.arange(seq)[::-1] / (seq / 8))     # filt is time-reversed: lag 0 is the last tap
    p["filt"] = (p["filt"] * decay / np.sqrt(seq)).astype(np.float32)
    return p


def max_relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    """Run the block on 256 tokens, on the GPU if there is one, else the numpy executor."""
    params = random_parameters(np.random.default_rng(0), batch=2, seq=256, width=32)
    error = max_relative_error(hyena_block(**params), hyena_block_reference(**params))
    ok = error < TOLERANCE
    print(f"{hyena_block.name:18s} max relative error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
