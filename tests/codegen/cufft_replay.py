"""FFT calls replayed on the host: what cuFFT computes for an FFTCall, read and written through the
strides it describes, with the staging and unstaging kernels' index arithmetic taken from the
constants they were emitted with; and the signals and layouts the tests run them on."""

from __future__ import annotations

import re

import numpy as np

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.library_kernels import FFTCall, Transform, scale_source, stage_source, unstage_source

H100 = arch_named("H100-SXM")
NORMS = ("backward", "ortho", "forward")
# (op, operand dtype): real and complex signals, both precisions, 16-bit signals widened
SIGNALS = [("rfft", DType.float32), ("rfft", DType.float64), ("rfft", DType.bfloat16), ("rfft", DType.float16),
           ("irfft", DType.complex64), ("irfft", DType.complex128), ("irfft", DType.float32),
           ("fft", DType.complex64), ("fft", DType.complex128), ("fft", DType.float32), ("fft", DType.bfloat16),
           ("ifft", DType.complex64), ("ifft", DType.complex128)]
# (shape, axis): last axis (one execution), leading axis (interleaved), middle axis both ways, odd
# rows along a middle axis (real sides padded to start each execution aligned), and more rows than
# MAX_EXECUTIONS (the axis moved last)
LAYOUTS = [((4, 5, 6), 0), ((4, 5, 6), 1), ((4, 5, 6), 2), ((10, 6, 2), 1), ((2, 6, 40), 1), ((3, 5, 3), 1),
           ((12, 5, 40), 1)]


def fft_op(name: str, shape: tuple[int, ...], dtype: DType, n: int, axis: int, norm: str) -> KernelOp:
    x = TensorType(shape, dtype)
    attrs = dict(n=n, axis=axis, norm=norm)
    return KernelOp.of(name, (x,), OPS[name].infer(x, **attrs), **attrs)


def lengths(name: str, length: int) -> dict[str, int]:
    """n for the natural transform, a cropped operand and a zero-padded one."""
    if name == "irfft":
        return {"natural": 2 * (length - 1), "crop": length, "pad": 2 * length + 1}
    return {"natural": length, "crop": max(1, length - 2), "pad": length + 3}


def random(shape, dtype: DType, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy)


def reference(o: KernelOp, x: np.ndarray) -> np.ndarray:
    widened = x.astype(np.float32) if x.dtype.itemsize == 2 else x
    return np.asarray(OPS[o.op].reference(widened, **o.attr_map)).astype(o.result.dtype.numpy)


# -- replaying a call on the host -------------------------------------------------------------------

def _constants(source: str) -> dict[str, float]:
    found = dict(re.findall(r"\b([A-Z_]+) = (-?\d+)\b", source))
    scale = re.search(r"\bS = (\S+?)f?;", source)[1]
    return {**{k: int(v) for k, v in found.items()}, "S": float.fromhex(scale)}


def stage_on_host(call: FFTCall, x: np.ndarray) -> np.ndarray:
    """The staging kernel's index arithmetic, from the constants it was emitted with: the flat
    buffer cuFFT reads, its padding (never written) NaN."""
    c = _constants(stage_source(call).source)
    i = np.arange(c["TOTAL"])
    j, k, row = i % c["INNER"], (i // c["INNER"]) % c["DST_LEN"], i // (c["INNER"] * c["DST_LEN"])
    src = x.reshape(-1).astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    inside = k < c["SRC_LEN"]
    value = np.where(inside, src[np.where(inside, (row * c["SRC_LEN"] + k) * c["INNER"] + j, 0)], 0).astype(complex)
    if call.hermitian:
        value = np.where((k == 0) | (k == c["HALF"]), value.real, value)
    value = value * c["S"]
    flat = np.full(call.rows * c["ROW_PITCH"], np.nan, complex)
    at = (row * c["INNER"] + j) * c["DST_LEN"] + k if c["AXIS_LAST"] else row * c["ROW_PITCH"] + k * c["INNER"] + j
    flat[at] = value
    return flat if call.staged.dtype.is_complex else flat.real


def unstage_on_host(call: FFTCall, written: np.ndarray) -> np.ndarray:
    """The unstaging kernel's index arithmetic, from its constants: the result's elements."""
    c = _constants(unstage_source(call).source + "S = 0x1p+0;")
    i = np.arange(c["TOTAL"])
    j, k, row = i % c["INNER"], (i // c["INNER"]) % c["LEN"], i // (c["INNER"] * c["LEN"])
    at = (row * c["INNER"] + j) * c["LEN"] + k if c["AXIS_LAST"] else row * c["ROW_PITCH"] + k * c["INNER"] + j
    return written[at]


def _real(t: TensorType) -> bool:
    return not t.dtype.is_complex


def run_on_host(call: FFTCall, x: np.ndarray) -> np.ndarray:
    """What cuFFT computes for `call`: each transform read and written through the described strides,
    each execution starting aligned to a complex element (cuFFT refuses others)."""
    flat = x.reshape(-1) if call.staged is None else stage_on_host(call, x)
    assert flat.size == (x.size if call.staged is None else call.rows * call.in_pitch)
    reads = call.n // 2 + 1 if call.hermitian else call.n
    if call.hermitian:      # what numpy ignores, cuFFT is given as zero (its C2R does not ignore it)
        ignored = [0] + ([call.n // 2] if call.n % 2 == 0 else [])
        if call.axis_last:                                   # rows, inner elements, the axis
            taken = flat.reshape(call.rows, -1, reads)[..., ignored]
        else:                                                # complex rows are never padded
            taken = np.take(flat.reshape(call.staged.shape), ignored, axis=call.axis)
        assert not taken.imag.any()
    writes = call.result.shape[call.axis]
    size = call.rows * call.out_pitch if call.scratch_output else call.result.numel
    out = np.zeros(size, np.complex128)
    written = np.zeros(size, int)
    for loop in range(call.loops):
        if call.loops > 1:
            assert not (_real(call.planned) and loop * call.in_step % 2), f"execution {loop} reads a misaligned start"
            assert not (_real(call.result) and loop * call.out_step % 2), f"execution {loop} writes a misaligned start"
        for b in range(call.batch):
            src = loop * call.in_step + b * call.idist + np.arange(reads) * call.istride
            dst = loop * call.out_step + b * call.odist + np.arange(writes) * call.ostride
            assert src.max() < flat.size and dst.max() < out.size
            v = flat[src]
            assert not np.isnan(v).any(), "a transform reads padding"
            if call.transform in (Transform.R2C, Transform.D2Z):
                y = np.fft.rfft(v)
            elif call.hermitian:
                y = np.fft.irfft(v, call.n) * call.n       # cuFFT's transforms are unnormalized
            else:
                y = np.fft.ifft(v) * call.n if call.inverse else np.fft.fft(v)
            out[dst] = y
            written[dst] += 1
    if call.scratch_output:
        out, written = unstage_on_host(call, out), unstage_on_host(call, written)
    assert (written == 1).all(), "every result element is written exactly once"
    if call.scale_output:
        out *= _constants_scale(call)
    out = out if call.result.dtype.is_complex else out.real
    return out.astype(call.result.dtype.numpy).reshape(call.result.shape)


def _constants_scale(call: FFTCall) -> float:
    literal = re.search(r"\*= (\S+?)f?;", scale_source(call).source)[1]
    return float.fromhex(literal)

@op.kernel
def long_conv(x, w):
    return op.conv1d(x, w, padding="same")
