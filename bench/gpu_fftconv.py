"""The long-convolution row of `python -m bench gpu`.

A depthwise causal conv1d whose filter is as long as the signal (Hyena-style: B=16, C=768, L=8192,
float32), which the cost model sends to the FFT plan:
    y = irfft(rfft(pad_left(x, L-1), n=2L) · conj(rfft(w, n=2L)), n=2L)[..., :L]
(no wrap-around: every index t + k stays under 2L). Ours runs that plan's kernels one by one through
the launch runtime (the pad, the transforms, our generated spectral contraction) and is timed as the
sum of their medians; torch runs the same algorithm with torch.fft. The filter's transform is a
property of the weights, so neither side pays it per call. While the launch runtime cannot run
rfft / irfft on the device the row is owed: it needs the plan runtime.
"""

from __future__ import annotations

from bench.gpu import Ceilings, Result, op_of
from bench.gpu_timing import Protocol, Timing, rel_error, time_ours, time_torch
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.kernel_op import KernelOp

B, C, L = 16, 768, 8192
F32 = DType.float32
TOLERANCE = 1e-4        # float32 transforms of 16K points: ~1e-6 relative


def fft_on_device() -> str | None:
    """None when run_kernel launches an rfft and gets torch's answer; else why not, in one line."""
    import torch
    from tessera_rw.codegen.launch import run_kernel
    x = torch.randn(4, 64, device="cuda")
    op = op_of("rfft", TensorType((4, 64), F32), n=64, axis=1, norm="backward")
    try:
        got = run_kernel(op, [x])
    except Exception as e:
        return f"run_kernel cannot launch rfft ({type(e).__name__}: {str(e).splitlines()[0][:140]})"
    if not torch.allclose(got, torch.fft.rfft(x, n=64), rtol=1e-4, atol=1e-4):
        return "run_kernel's rfft disagrees with torch.fft.rfft"
    return None


def plan_ops() -> tuple[KernelOp, KernelOp, KernelOp, KernelOp, KernelOp]:
    """The FFT plan's kernels: pad x, rfft x, rfft w (once per filter), contract, irfft.

    >>> [op.op for op in plan_ops()]
    ['pad', 'rfft', 'rfft', 'spectral_contract', 'irfft']
    """
    n = 2 * L
    pad = op_of("pad", TensorType((B, C, L), F32), pads=((0, 0), (0, 0), (L - 1, 0)), value=0.0)
    forward = op_of("rfft", pad.result, n=n, axis=2, norm="backward")
    filter_fft = op_of("rfft", TensorType((C, 1, L), F32), n=n, axis=2, norm="backward")
    contract = op_of("spectral_contract", forward.result, filter_fft.result, groups=C)
    return pad, forward, filter_fft, contract, op_of("irfft", contract.result, n=n, axis=2, norm="backward")


def long_conv(protocol: Protocol, ceilings: Ceilings) -> Result:
    io_bytes = 2 * B * C * L * 4 + C * L * 4            # x read, y written, the filter read
    result = Result(f"long conv1d depthwise f32 B={B} C={C} L={L}, filter {L} (FFT plan) vs torch.fft",
                    floor_ms=ceilings.floor_ms(0, io_bytes), rate_unit="GB/s", work=io_bytes)
    reason = fft_on_device()
    if reason:
        result.status = "owed: needs the plan runtime"
        result.notes.append(reason)
        return result
    try:
        _measure(result, protocol)
    except Exception as e:
        result.status = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return result


def _measure(result: Result, protocol: Protocol) -> None:
    import torch
    import torch.nn.functional as F
    from tessera_rw.codegen.launch import run_kernel
    n = 2 * L
    x = torch.randn(B, C, L, device="cuda")
    w = torch.randn(C, 1, L, device="cuda") * L ** -0.5
    pad, forward, filter_fft, contract, inverse = plan_ops()

    w_hat = run_kernel(filter_fft, [w])
    stages = [(pad, [x])]
    stages.append((forward, [run_kernel(*stages[-1])]))
    stages.append((contract, [run_kernel(*stages[-1]), w_hat]))
    stages.append((inverse, [run_kernel(*stages[-1])]))
    y = run_kernel(*stages[-1])[..., :L]

    w_ref = torch.fft.rfft(w.double()[:, 0, :], n=n).conj()
    ref = torch.fft.irfft(torch.fft.rfft(F.pad(x.double(), (L - 1, 0)), n=n) * w_ref, n=n)[..., :L]
    result.error = rel_error(y, ref)
    w_lib = torch.fft.rfft(w[:, 0, :], n=n).conj()

    def library():
        return torch.fft.irfft(torch.fft.rfft(F.pad(x, (L - 1, 0)), n=n) * w_lib, n=n)[..., :L]
    result.torch_error = rel_error(library(), ref)
    del ref, w_ref
    if result.error > TOLERANCE:
        result.status = "FAILED: wrong on random data"
        return
    times = [time_ours(op, inputs, None, protocol) for op, inputs in stages]
    result.ours = Timing(sum(t.median_ms for t in times), max(t.spread for t in times))
    result.torch = time_torch(library, protocol)
    result.notes.append("ours: sum of the stage medians " + ", ".join(
        f"{op.op} {t.median_ms:.3f} ms" for (op, _), t in zip(stages, times)))
