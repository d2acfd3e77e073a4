"""The long-convolution row of `python -m bench gpu`.

A depthwise causal conv1d whose filter is as long as the signal (Hyena-style: B=16, C=768, L=8192,
float32), which the cost model sends to the FFT plan (pad, rfft of x and of w, the spectral
contraction, irfft, slice: cuFFT for the transforms, generated kernels for the rest). Ours is the
`@op.kernel` call on torch CUDA tensors, as a user makes it; torch runs the same algorithm with
torch.fft, the filter's transform included on both sides.
"""

from __future__ import annotations

from bench.gpu import Ceilings
from bench.gpu_results import Result, error_line
from bench.gpu_timing import Protocol, rel_error, time_torch
from tessera_rw import op

B, C, L = 16, 768, 8192
LONG_CONV_NAME = f"long conv1d depthwise f32 B={B} C={C} L={L}, filter {L} (FFT plan) vs torch.fft"
TOLERANCE = 1e-4        # float32 transforms of 16K points: ~1e-6 relative


@op.kernel
def causal_long_conv(x, w):
    return op.conv1d(x, w, padding=(L - 1, 0), groups=C)


def plan_steps() -> list[str]:
    """The plan the kernel runs for the benchmark's shapes (no GPU needed).

    >>> steps = plan_steps()
    >>> "rfft" in steps and "irfft" in steps and "conv1d" not in steps
    True
    """
    x, w = op.tensor((B, C, L), "float32"), op.tensor((C, 1, L), "float32")
    return [s.op for s in causal_long_conv.program(x, w).plan.steps]


def fft_on_device() -> str | None:
    """None when the GPU plan runtime can make cuFFT calls here; else why not, in one line."""
    from tessera_rw.codegen.library_kernels import library_available
    if not library_available("cuFFT"):
        return "cuFFT is not loadable through nvmath-python here (carry nvmath-python; libcufft must be present)"
    return None


def long_conv(protocol: Protocol, ceilings: Ceilings) -> Result:
    io_bytes = 2 * B * C * L * 4 + C * L * 4            # x read, y written, the filter read
    result = Result(LONG_CONV_NAME,
                    floor_ms=ceilings.floor_ms(0, io_bytes), rate_unit="GB/s", work=io_bytes)
    reason = fft_on_device()
    if reason:
        result.status = "owed: needs the plan runtime"
        result.notes.append(reason)
        return result
    try:
        _measure(result, protocol)
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result


def _measure(result: Result, protocol: Protocol) -> None:
    import os

    import torch
    import torch.nn.functional as F
    os.environ["TESSERA_DEVICE"] = "gpu"
    n = 2 * L
    x = torch.randn(B, C, L, device="cuda")
    w = torch.randn(C, 1, L, device="cuda") * L ** -0.5
    y = causal_long_conv(x, w)

    ref = torch.fft.irfft(torch.fft.rfft(F.pad(x.double(), (L - 1, 0)), n=n)
                          * torch.fft.rfft(w.double()[:, 0, :], n=n).conj(), n=n)[..., :L]
    result.error = rel_error(y, ref)

    def library():
        w_hat = torch.fft.rfft(w[:, 0, :], n=n).conj()
        return torch.fft.irfft(torch.fft.rfft(F.pad(x, (L - 1, 0)), n=n) * w_hat, n=n)[..., :L]
    result.torch_error = rel_error(library(), ref)
    del ref
    if result.error > TOLERANCE:
        result.status = "FAILED: wrong on random data"
        return
    result.ours = time_torch(lambda: causal_long_conv(x, w), protocol)
    result.torch = time_torch(library, protocol)
    result.notes.append("ours: the plan " + " -> ".join(plan_steps()))
