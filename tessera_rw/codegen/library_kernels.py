"""Library calls in plans: the FFT steps run on cuFFT, beside the kernels tessera_rw generates.

A step whose template names a library (FFTTemplate: "cuFFT") has no generated source. It binds to
an `FFTCall`, the transform as cuFFT describes it (type, length, the batch layout along one axis
of a dense row-major tensor, numpy's norm factor), and a `CuFFTKernel` runs that call on one
device through nvmath-python's low-level cuFFT bindings. Where numpy's semantics need more than
cuFFT does, small generated kernels sit around the call (fft_kernels.py): a staging copy (crop
or zero-pad to n, widen 16-bit or real input, clear the imaginary parts a real inverse ignores,
fold in the norm factor, pad rows for alignment), a copy of padded output rows into the result,
and an in-place scale of the output.

The description is pure and works on any machine:

>>> x = TensorType((2, 64, 5119), DType.float32)
>>> op = KernelOp.of("rfft", (x,), TensorType((2, 64, 2560), DType.complex64), n=5119, axis=2, norm="backward")
>>> c = FFTCall.of(op)
>>> c.transform.name, c.batch, (c.istride, c.idist, c.ostride, c.odist), c.loops, c.scale, c.staged
('R2C', 128, (1, 5119, 1, 2560), 1, 1.0, None)
"""

from __future__ import annotations

import enum
import math
import threading
import weakref
from dataclasses import dataclass
from functools import cache
from typing import Any, Sequence

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.compile import CompiledKernel, KernelSource, compile_cuda
from tessera_rw.codegen.device import resolve_stream
from tessera_rw.codegen.device_arrays import DeviceTensor
from tessera_rw.codegen.fft_kernels import scale_source, stage_source, unstage_source
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.launch import bind

INSTALL_HINT = ("FFT steps run on cuFFT through nvmath-python: install nvmath-python and the cuFFT wheel of "
                "the CUDA major version in use (nvidia-cufft for CUDA 13, nvidia-cufft-cu12 for CUDA 12), "
                "or run the plan on the numpy executor (TESSERA_DEVICE=cpu)")


class LibraryCallError(TesseraError):
    """A library call the runtime cannot make: a missing library, an unsupported call, or one that failed."""


# -- is the library there ----------------------------------------------------------------------------

@cache
def _runtime(name: str) -> tuple[Any, str]:
    """(the bindings module, '') when library `name` loads, else (None, why not)."""
    if name != "cuFFT":
        return None, f"tessera_rw has no runtime for {name}"
    try:
        from nvmath.bindings import cufft
        cufft.get_version()     # the bindings import without libcufft; this loads it
    except ImportError as e:
        return None, f"nvmath-python is not installed ({e})"
    except Exception as e:      # no libcufft, no driver: the bindings say which
        return None, f"nvmath-python's cuFFT bindings do not load ({type(e).__name__}: {e})"
    return cufft, ""


def library_available(name: str) -> bool:
    """Whether the runtime can call library `name` ("cuFFT") in this process (checked once).

    >>> library_available("cuBLAS")
    False
    """
    return _runtime(name)[0] is not None


def library_call(op: KernelOp, library: str) -> FFTCall:
    """The call that runs `op` on `library`, or a LibraryCallError saying why it cannot run here.

    >>> t = TensorType((4, 16), DType.float32)
    >>> op = KernelOp.of("rfft", (t,), TensorType((4, 9), DType.complex64), n=16, axis=1, norm="backward")
    >>> library_call(op, "cuBLAS")          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tessera_rw.codegen.library_kernels.LibraryCallError: rfft: tessera_rw has no runtime for cuBLAS
      hint: FFT steps run on cuFFT through nvmath-python: ...
    """
    if not library_available(library):
        raise LibraryCallError(_runtime(library)[1] or f"{library} is not available", op=op.op, hint=INSTALL_HINT)
    return FFTCall.of(op)


# -- the call, described -----------------------------------------------------------------------------

class Transform(enum.Enum):
    """cuFFT's transform types; the names are nvmath's `cufft.Type` members."""
    R2C = "R2C"
    C2R = "C2R"
    C2C = "C2C"
    D2Z = "D2Z"
    Z2D = "Z2D"
    Z2Z = "Z2Z"


_TRANSFORMS = {   # (op, double precision) -> (transform, the dtype cuFFT reads)
    ("rfft", False): (Transform.R2C, DType.float32), ("rfft", True): (Transform.D2Z, DType.float64),
    ("irfft", False): (Transform.C2R, DType.complex64), ("irfft", True): (Transform.Z2D, DType.complex128),
    ("fft", False): (Transform.C2C, DType.complex64), ("fft", True): (Transform.Z2Z, DType.complex128),
    ("ifft", False): (Transform.C2C, DType.complex64), ("ifft", True): (Transform.Z2Z, DType.complex128),
}
_READABLE = frozenset({DType.float32, DType.float64, DType.bfloat16, DType.float16, DType.complex64,
                       DType.complex128})
# Interleaved batches (idist = 1) read coalesced once a warp's worth sit side by side; below that,
# fewer executions matter more than the access pattern.
_COALESCED_BATCH = 32
# Past this many executions (a host call each), the axis is moved last in a staging copy and one
# execution transforms every row, its result moved back by a second copy.
MAX_EXECUTIONS = 8


@dataclass(frozen=True)
class FFTCall:
    """One rfft / irfft / fft / ifft step as cuFFT runs it. Strides, distances and steps count
    elements of the buffer read (`planned`) and of the buffer written (the result, or a padded copy
    of it): transform b of execution l reads element k at l*in_step + b*idist + k*istride and
    writes at l*out_step + b*odist + k*ostride.

    cuFFT refuses (INVALID_VALUE) a real-side pointer that is not aligned to a complex element, so
    an execution may start only at an even offset of a real buffer. Where a transform along a
    middle axis would start odd ones, the real side's rows are padded by one element: `in_pitch`
    and `out_pitch` are the distances between consecutive rows (indices of the axes before `axis`)
    in the two buffers. A padded input is always staged; a padded output is written to a scratch
    buffer and copied into the result (`unstage_source`).

    Where a layout would take more than MAX_EXECUTIONS executions, the call is `axis_last`: the
    staging copy lays each transform's elements out contiguously (rows, then the inner elements,
    then the axis), one execution transforms them all, and cuFFT writes a scratch buffer laid out
    the same way, which the unstaging copy moves back into the result."""
    op: str
    source: TensorType              # the op's operand
    result: TensorType              # the op's result
    axis: int
    n: int
    transform: Transform
    inverse: bool
    staged: TensorType | None       # the dense copy of `source` cuFFT reads instead, when one is needed
    batch: int                      # transforms per execution
    istride: int
    idist: int
    ostride: int
    odist: int
    loops: int                      # executions
    in_step: int
    out_step: int
    in_pitch: int
    out_pitch: int
    axis_last: bool                 # the staged operand and cuFFT's output hold each transform contiguously
    scale: float                    # numpy's norm factor: applied while staging if there is a copy, else after

    @classmethod
    def of(cls, op: KernelOp) -> FFTCall:
        """The call for an rfft / irfft / fft / ifft KernelOp; LibraryCallError when there is none."""
        if op.op not in ("rfft", "irfft", "fft", "ifft"):
            raise LibraryCallError("is not a cuFFT transform", op=op.op, operands=str(op))
        (source,), result = op.operands, op.result
        a = op.attr_map
        axis, n, norm = a["axis"], a["n"], a["norm"]
        if source.dtype not in _READABLE:
            raise LibraryCallError(f"cuFFT steps read float16/bfloat16/float32/float64 or complex operands, "
                                   f"got {source.dtype}", op=op.op, operands=str(op), hint="cast to float32 first")
        double = result.dtype in (DType.float64, DType.complex128)
        transform, reads = _TRANSFORMS[op.op, double]
        inverse = op.op in ("irfft", "ifft")
        hermitian = op.op == "irfft"
        needed = n // 2 + 1 if hermitian else n
        # A copy first when cuFFT cannot read the operand as it is: another dtype, too short along
        # the axis (zero padding), or the input of a C2R transform, which cuFFT overwrites and whose
        # imaginary parts at 0 and n/2 numpy ignores. A longer operand is cropped by the strides.
        copied = hermitian or source.dtype is not reads or source.shape[axis] < needed
        real_input, real_output = transform in (Transform.R2C, Transform.D2Z), hermitian
        outer, inner = math.prod(source.shape[:axis]), math.prod(source.shape[axis + 1:])
        lin, lout = needed if copied else source.shape[axis], result.shape[axis]
        in_pitch, out_pitch = lin * inner, lout * inner
        over_outer = inner == 1 or (not (real_input or real_output) and inner < _COALESCED_BATCH and outer > inner)
        axis_last = (inner if over_outer else outer) > MAX_EXECUTIONS
        if axis_last:                  # one execution over every transform, each contiguous
            copied, in_pitch = True, needed * inner
            layout = dict(batch=outer * inner, istride=1, idist=needed, ostride=1, odist=lout, loops=1,
                          in_step=0, out_step=0)
        elif over_outer:               # one execution per inner index: only complex ones start odd
            layout = dict(batch=outer, istride=inner, idist=in_pitch, ostride=inner, odist=out_pitch,
                          loops=inner, in_step=1, out_step=1)
        else:                          # interleaved, one execution per outer index
            if outer > 1 and real_input and in_pitch % 2:    # rows padded to an even length: copied
                copied, lin = True, needed
                in_pitch = lin * inner + (lin * inner) % 2
            if outer > 1 and real_output and out_pitch % 2:
                out_pitch += 1
            layout = dict(batch=inner, istride=inner, idist=1, ostride=inner, odist=1,
                          loops=outer, in_step=in_pitch, out_step=out_pitch)
        staged = TensorType(source.shape[:axis] + (needed,) + source.shape[axis + 1:], reads) if copied else None
        # numpy: "backward" scales the inverse by 1/n, "forward" the forward one, "ortho" both by 1/sqrt(n)
        if norm == "ortho":
            scale = 1.0 / math.sqrt(n)
        else:
            scale = 1.0 / n if inverse == (norm == "backward") else 1.0
        return cls(op.op, source, result, axis, n, transform, inverse, staged, in_pitch=in_pitch,
                   out_pitch=out_pitch, axis_last=axis_last, scale=scale, **layout)

    @property
    def planned(self) -> TensorType:
        """What cuFFT reads: the staged copy, or the operand itself."""
        return self.source if self.staged is None else self.staged

    @property
    def hermitian(self) -> bool:
        """A real inverse: its staged spectrum has no imaginary part at 0 (and at n/2 for even n)."""
        return self.transform in (Transform.C2R, Transform.Z2D)

    @property
    def double(self) -> bool:
        return self.transform in (Transform.D2Z, Transform.Z2D, Transform.Z2Z)

    @property
    def rows(self) -> int:
        """The number of rows (indices of the axes before `axis`)."""
        return math.prod(self.source.shape[:self.axis])

    @property
    def scratch_output(self) -> bool:
        """Whether cuFFT writes a scratch buffer (rows padded for alignment, or the axis last), copied
        into the result after."""
        return self.axis_last or self.out_pitch != math.prod(self.result.shape[self.axis:])

    @property
    def staged_elements(self) -> int:
        """Elements of the staging buffer cuFFT reads (rows padded to `in_pitch`); 0 without one."""
        return self.rows * self.in_pitch if self.staged is not None else 0

    @property
    def written_elements(self) -> int:
        """Elements of the scratch output cuFFT writes (rows padded to `out_pitch`); 0 without one."""
        return self.rows * self.out_pitch if self.scratch_output else 0

    @property
    def scale_output(self) -> bool:
        return self.scale != 1.0 and self.staged is None

    def __str__(self) -> str:
        return (f"{self.transform.name} n={self.n} batch={self.batch} x{self.loops}: {self.source} -> {self.result}"
                f"{'' if self.staged is None else ' staged ' + str(self.staged)}{' axis last' if self.axis_last else ''}")


# -- running it --------------------------------------------------------------------------------------

_EXEC = {Transform.R2C: "exec_r2c", Transform.C2R: "exec_c2r", Transform.C2C: "exec_c2c",
         Transform.D2Z: "exec_d2z", Transform.Z2D: "exec_z2d", Transform.Z2Z: "exec_z2z"}
_FORWARD, _INVERSE = -1, 1      # CUFFT_FORWARD, CUFFT_INVERSE


def _destroy(cufft: Any, handle: int) -> None:
    try:
        cufft.destroy(handle)
    except Exception:   # at interpreter exit the context may be gone first; the driver frees it then
        pass


class CuFFTKernel:
    """One FFTCall made ready on one device: its cuFFT plan made, the kernels around it compiled for
    the device's sm, its scratch buffers allocated. Each owner (a DevicePlan) holds its own: a cuFFT
    plan has one work area that every execution uses, so two owners sharing one could race on two
    streams. A lock orders the enqueueing of one kernel's calls, not their running: like its
    DevicePlan's, calls on two streams must not overlap in time.

    >>> CuFFTKernel(call, 0)([x, y], stream)       # doctest: +SKIP
    """

    def __init__(self, call: FFTCall, device_index: int):
        cufft, why = _runtime("cuFFT")
        if cufft is None:
            raise LibraryCallError(f"{call.op} cannot run on cuFFT here: {why}", op=call.op, operands=str(call),
                                   hint=INSTALL_HINT)
        self.call, self.device_index, self._cufft = call, device_index, cufft
        self._lock = threading.Lock()
        stream = resolve_stream(None, device_index)
        sm = f"sm_{stream.device.arch}"
        self._stage = self._compiled(stage_source(call), sm) if call.staged is not None else None
        self._scale = self._compiled(scale_source(call), sm) if call.scale_output else None
        self._unstage = self._compiled(unstage_source(call), sm) if call.scratch_output else None
        self._scratch = self._scratch_for(call.staged, call.staged_elements, stream)
        self._written = self._scratch_for(call.result if call.scratch_output else None, call.written_elements, stream)
        stream.sync()           # allocated in this stream's order; calls may come on others
        self._handle = self._plan() if call.batch and call.loops else None    # nothing to transform
        if self._handle is not None:
            weakref.finalize(self, _destroy, cufft, self._handle)

    def _scratch_for(self, t: TensorType | None, elements: int, stream: Any) -> DeviceTensor | None:
        """A device buffer of `elements` of t's dtype, seen as t (whose rows may be padded within it)."""
        if t is None or not elements:
            return None
        buffer = stream.device.allocate(elements * t.dtype.itemsize, stream=stream)
        return DeviceTensor(int(buffer.handle), t.shape, t.dtype, buffer, "cuda", self.device_index)

    @staticmethod
    def _compiled(source: KernelSource, sm: str) -> tuple[KernelSource, CompiledKernel]:
        return source, compile_cuda(source, sm)

    def _checked(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            status = getattr(e, "status", None)
            try:
                status = self._cufft.Result(status).name if status is not None else f"{type(e).__name__}: {e}"
            except ValueError:
                status = f"status {status}"
            raise LibraryCallError(f"{what} failed with {status} ({self.call})", op=self.call.op,
                                   operands=f"{self.call.source} -> {self.call.result}",
                                   hint="ALLOC_FAILED means the device is out of memory; otherwise run the plan "
                                        "on the numpy executor (TESSERA_DEVICE=cpu) and report the shapes") from e

    def _plan(self) -> int:
        c, cufft = self.call, self._cufft
        handle = self._checked("cufftCreate", cufft.create)
        try:
            self._checked("cufftMakePlanMany64", cufft.make_plan_many64, handle, 1, [c.n], [c.planned.shape[c.axis]],
                          c.istride, c.idist, [c.result.shape[c.axis]], c.ostride, c.odist,
                          int(cufft.Type[c.transform.name]), c.batch)
        except LibraryCallError:
            _destroy(cufft, handle)
            raise
        return handle

    def __call__(self, args: Sequence[DeviceTensor], stream: Any = None) -> None:
        """Enqueue the call on `stream` (None: tessera_rw's stream on the device): args are the
        operand, then the result, both dense row-major on this device."""
        c = self.call
        if len(args) != 2:
            raise LibraryCallError(f"takes the operand and the result, got {len(args)} tensors", op=c.op)
        for got, want, role in zip(args, (c.source, c.result), ("operand", "result")):
            if tuple(got.shape) != want.shape or got.dtype is not want.dtype:
                raise LibraryCallError(f"the {role} is {got.dtype}{list(got.shape)}, the call was made for {want}",
                                       op=c.op, operands=f"{c.source} -> {c.result}",
                                       hint="make a CuFFTKernel for these types")
        stream = resolve_stream(stream, self.device_index)
        if self._handle is None:
            return
        x, y = args
        written = y if self._written is None else self._written
        with self._lock:
            if self._stage is not None:
                bind(*self._stage, [x, self._scratch], stream)()
                x = self._scratch
            self._checked("cufftSetStream", self._cufft.set_stream, self._handle, int(stream.handle))
            run = getattr(self._cufft, _EXEC[c.transform])
            complex_to_complex = c.transform in (Transform.C2C, Transform.Z2Z)
            direction = ((_INVERSE if c.inverse else _FORWARD),) if complex_to_complex else ()
            in_bytes, out_bytes = c.in_step * c.planned.dtype.itemsize, c.out_step * c.result.dtype.itemsize
            for i in range(c.loops):
                self._checked(f"cufft{_EXEC[c.transform].title().replace('_', '')}", run, self._handle,
                              x.ptr + i * in_bytes, written.ptr + i * out_bytes, *direction)
            if self._unstage is not None:
                bind(*self._unstage, [written, y], stream)()
            if self._scale is not None:
                bind(*self._scale, [y], stream)()


__all__ = ["CuFFTKernel", "FFTCall", "INSTALL_HINT", "LibraryCallError", "Transform", "library_available",
           "library_call", "scale_source", "stage_source", "unstage_source"]
