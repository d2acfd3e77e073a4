"""Launching generated kernels through cuda.core, and the one-op entry point tests and benchmarks use.

A cubin is loaded once per (cubin, device). A kernel written for more than the default 48 KB of
dynamic shared memory (attention) gets its opt-in attribute raised before its first launch, after a
check against the device's limit. Kernel arguments are the operand pointers in operand order, then
the output pointer, as every template emits them, then the zeroed workspace a kernel asks for
(KernelSource.workspace_bytes: allocated when the launch is bound unless the caller lends one,
zeroed on the stream before every launch), then the TMA tensor maps a kernel declares
(KernelSource.tensor_maps), encoded from those pointers when the launch is bound.

`run_kernel` checks its inputs against the op before touching a device, so a bad call reads the
same on any machine:

>>> from tessera_rw.algebra.node import TensorType
>>> t = TensorType((4,), DType.float32)
>>> run_kernel(KernelOp.of("add", (t, t), t), [np.zeros(4, np.float32)])
Traceback (most recent call last):
...
tessera_rw.algebra.errors.TesseraError: add: takes 2 operands, got 1
  operands: expected (f32[4], f32[4]); got (f32[4])
  hint: pass one array per operand, in operand order
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import ArchSpec, arch_named, current_arch
from tessera_rw.codegen.compile import CompiledKernel, KernelSource, compile_cuda
from tessera_rw.codegen.device import DeviceError, library_stream, order_after, require_gpu, resolve_stream
from tessera_rw.codegen.device_arrays import (DeviceTensor, describe, device_index_of, empty_like_kind, kind_of,
                                              to_device, to_host)
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import first_schedule

DEFAULT_SMEM_LIMIT = 48 * 1024     # dynamic shared memory a kernel gets without opting in


# -- pure checks -----------------------------------------------------------------------------------

def smem_opt_in(name: str, dynamic: int, static: int, optin_limit: int,
                default_limit: int = DEFAULT_SMEM_LIMIT) -> int | None:
    """The max-dynamic-smem attribute kernel `name` needs (None: the default suffices), or a clear
    error when static + dynamic shared memory exceeds what one block may opt in to on the device.

    >>> smem_opt_in("k", 40_000, 0, 232_448) is None, smem_opt_in("k", 98_304, 0, 232_448)
    (True, 98304)
    """
    if static + dynamic > optin_limit:
        raise DeviceError(f"kernel {name} needs {static + dynamic} bytes of shared memory per block "
                          f"({static} static + {dynamic} dynamic), but the device allows {optin_limit}",
                          hint="pick a schedule with smaller tiles or fewer pipeline stages")
    return dynamic if static + dynamic > default_limit else None


def check_launch_shape(source: KernelSource) -> None:
    """A KernelSource must say how it is launched: a block size and a grid of positive extents."""
    if not 0 < source.threads <= 1024:
        raise DeviceError(f"kernel {source.name} has block size {source.threads}",
                          hint="the emitter must set KernelSource.threads (1..1024) for a direct launch")
    if len(source.grid) != 3 or min(source.grid) < 1:
        raise DeviceError(f"kernel {source.name} has grid {source.grid}",
                          hint="the emitter must set KernelSource.grid to three positive extents")


def _types(items: Sequence[tuple[tuple[int, ...], DType]]) -> str:
    return "(" + ", ".join(f"{d.short}[{','.join(map(str, s))}]" for s, d in items) + ")"


def check_operands(op: KernelOp, inputs: Sequence[Any]) -> None:
    """Raise a TesseraError naming the op when `inputs` do not match its operands' shapes and dtypes."""
    expected = [(t.shape, t.dtype) for t in op.operands]
    got = [describe(x) for x in inputs]
    if len(got) != len(expected):
        raise TesseraError(f"takes {len(expected)} operands, got {len(got)}", op=op.op,
                           operands=f"expected {_types(expected)}; got {_types(got)}",
                           hint="pass one array per operand, in operand order")
    for i, ((shape, dtype), (want_shape, want_dtype)) in enumerate(zip(got, expected)):
        if tuple(shape) != tuple(want_shape) or dtype is not want_dtype:
            raise TesseraError(f"operand {i} is {_types([(shape, dtype)])[1:-1]}, the kernel was built for "
                               f"{_types([(want_shape, want_dtype)])[1:-1]}", op=op.op,
                               operands=f"expected {_types(expected)}; got {_types(got)}",
                               hint="cast or reshape the input, or build the KernelOp for these types")


def coerce_scalars(op: KernelOp, inputs: Sequence[Any]) -> list[Any]:
    """Python scalars take the dtype of the operand they stand for (numpy arrays keep theirs)."""
    return [np.asarray(x, dtype=t.dtype.numpy) if isinstance(x, (bool, int, float, complex)) else x
            for x, t in zip(inputs, op.operands)] + list(inputs[len(op.operands):])


# -- loading and launching -------------------------------------------------------------------------

class LoadedKernel:
    """A cubin loaded on one device, with the dynamic shared memory it has been allowed so far."""

    def __init__(self, compiled: CompiledKernel, device_index: int):
        from cuda.core import ObjectCode
        self.compiled, self.device_index = compiled, device_index
        self.module = ObjectCode.from_cubin(compiled.cubin, name=compiled.name)   # kept: the kernel lives in it
        self.kernel = self.module.get_kernel(compiled.name)
        self._smem_allowed = DEFAULT_SMEM_LIMIT
        self._lock = threading.Lock()

    @staticmethod
    def load(compiled: CompiledKernel, device_index: int) -> LoadedKernel:
        return _load(compiled, device_index)

    def allow_dynamic_smem(self, dynamic: int, device) -> None:
        """Raise the kernel's max dynamic shared memory on `device` to `dynamic` bytes if needed."""
        with self._lock:
            if dynamic <= self._smem_allowed:
                return
            limit = device.properties.max_shared_memory_per_block_optin
            value = smem_opt_in(self.compiled.name, dynamic, self.compiled.smem_bytes, limit)
            if value is None:
                return
            from cuda.bindings import driver
            (err,) = driver.cuKernelSetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value,
                driver.CUkernel(int(self.kernel.handle)), driver.CUdevice(self.device_index))
            if err != driver.CUresult.CUDA_SUCCESS:
                raise DeviceError(f"the driver refused {value} bytes of dynamic shared memory for kernel "
                                  f"{self.compiled.name} ({err.name}); the device allows {limit}",
                                  hint="pick a schedule with smaller tiles or fewer pipeline stages")
            self._smem_allowed = value


@lru_cache(maxsize=256)
def _load(compiled: CompiledKernel, device_index: int) -> LoadedKernel:
    return LoadedKernel(compiled, device_index)


@dataclass(frozen=True)
class BoundLaunch:
    """Everything one launch needs, resolved once: calling it enqueues the kernel (timing loops
    call it repeatedly, so nothing is looked up per call)."""
    name: str
    stream: Any
    config: Any
    kernel: Any
    args: tuple[Any, ...]
    workspace: Any = None          # a cuda.core Buffer zeroed before each launch, or None

    def __call__(self) -> None:
        from cuda.core import launch as cuda_launch
        try:
            if self.workspace is not None:
                self.workspace.fill(0, stream=self.stream)
            cuda_launch(self.stream, self.config, self.kernel, *self.args)
        except Exception as e:
            raise DeviceError(f"launching kernel {self.name} failed ({type(e).__name__}: {e}); "
                              f"config {self.config}",
                              hint="check the grid, block and shared memory the emitter asked for") from e


@dataclass(frozen=True)
class KernelLauncher:
    """A kernel made ready to launch on one device: loaded, its shared memory allowed, its launch
    configuration and workspace resolved, its arity checked. `bound(args, stream)` adds only the
    argument pointers (and the tensor maps encoded from them) and the stream, so a plan called
    again and again does the rest once."""
    source: KernelSource
    kernel: Any
    config: Any
    scratch: DeviceTensor | None = None      # the workspace the kernel takes, or None
    zeroed: Any = None                       # ... as a cuda.core Buffer, zeroed before each launch

    def arguments(self, args: Sequence[DeviceTensor]) -> tuple[Any, ...]:
        """The kernel's argument values for `args` (operands, then the output): their pointers, the
        workspace's, then the tensor maps encoded from them."""
        pointers = [*args] + ([self.scratch] if self.scratch is not None else [])
        maps = tuple(m.descriptor(args[m.operand].ptr) for m in self.source.tensor_maps)
        return (*(np.uint64(a.ptr) for a in pointers), *maps)

    def on(self, stream, arguments: tuple[Any, ...]) -> BoundLaunch:
        """The launch with `arguments` (from `arguments()`) on `stream`."""
        return BoundLaunch(self.source.name, stream, self.config, self.kernel, arguments, self.zeroed)

    def bound(self, args: Sequence[DeviceTensor], stream) -> BoundLaunch:
        """The launch on `args` (operands, then the output) on `stream`."""
        return self.on(stream, self.arguments(args))


def launcher(source: KernelSource, compiled: CompiledKernel, stream, arguments: int,
             workspace: DeviceTensor | None = None) -> KernelLauncher:
    """Load, configure and check everything for launching `compiled` with `arguments` pointers
    (operands, then the output) on `stream`'s device. A kernel that asks for a workspace gets
    `workspace` (at least `source.workspace_bytes` on that device) or one allocated here."""
    check_launch_shape(source)
    dev = stream.device
    loaded = LoadedKernel.load(compiled, dev.device_id)
    loaded.allow_dynamic_smem(source.dynamic_smem, dev)
    scratch = _workspace(source, workspace, stream)
    pointers = arguments + (scratch is not None)
    try:
        wanted = loaded.kernel.num_arguments
    except Exception:   # drivers before 12.4 cannot say
        wanted = pointers + len(source.tensor_maps)
    if wanted != pointers + len(source.tensor_maps):
        raise DeviceError(f"kernel {source.name} takes {wanted} arguments, got {pointers} pointers and "
                          f"{len(source.tensor_maps)} tensor maps",
                          hint="pass the operands in operand order, then the output")
    from cuda.core import Buffer, LaunchConfig
    config = LaunchConfig(grid=tuple(source.grid), block=source.threads, shmem_size=source.dynamic_smem)
    zeroed = None if scratch is None else Buffer.from_handle(scratch.ptr, source.workspace_bytes, owner=scratch.owner)
    return KernelLauncher(source, loaded.kernel, config, scratch, zeroed)


def bind(source: KernelSource, compiled: CompiledKernel, args: Sequence[DeviceTensor], stream=None,
         workspace: DeviceTensor | None = None) -> BoundLaunch:
    """Load, configure and check everything for launching `compiled` on `args` (operands, then the
    output); nothing is enqueued. A kernel that asks for a workspace gets `workspace` (at least
    `source.workspace_bytes` on the stream's device) or one allocated here."""
    stream = resolve_stream(stream)
    dev = stream.device
    for i, a in enumerate(args):
        if a.device != dev.device_id:
            raise DeviceError(f"argument {i} of kernel {source.name} is on cuda:{a.device}, the stream on "
                              f"cuda:{dev.device_id}", hint="put every argument and the stream on one device")
    return launcher(source, compiled, stream, len(args), workspace).bound(args, stream)


def _workspace(source: KernelSource, lent: DeviceTensor | None, stream) -> DeviceTensor | None:
    """The workspace `source` takes: `lent` when it is big enough and on the stream's device, else a
    new allocation; None for a kernel without one."""
    need = source.workspace_bytes
    if not need:
        return None
    if lent is not None and lent.nbytes >= need and lent.device == stream.device.device_id:
        return lent
    return empty_like_kind("cuda", (need,), DType.bool, stream)[0]


def launch(source: KernelSource, compiled: CompiledKernel, args: Sequence[DeviceTensor], stream=None) -> None:
    """Enqueue `compiled` (built from `source`) on `stream` with `args`: operands, then the output.

    The launch is the one the emitter wrote the kernel for: grid `source.grid`, block
    `source.threads`, `source.dynamic_smem` bytes of dynamic shared memory."""
    bind(source, compiled, args, stream)()


# -- one op, end to end ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """A kernel for one op, compiled for the device, its arguments resident there."""
    stream: Any
    source: KernelSource
    compiled: CompiledKernel
    args: tuple[DeviceTensor, ...]       # operands, then the output
    result: Any                          # what the user gets back (None: copy the output to numpy)
    kind: str
    arch: ArchSpec


def _arch(arch: ArchSpec | str | None) -> ArchSpec:
    if isinstance(arch, ArchSpec):
        return arch
    return arch_named(arch) if arch else current_arch()


def prepare(op: KernelOp, inputs: Sequence[Any], *, schedule=None, arch=None, stream=None,
            fast_math: bool = False) -> Prepared:
    """Check `inputs`, pick op's template and schedule, emit, compile for the device, move the inputs
    there and allocate the output (of the first input's kind)."""
    from tessera_rw.codegen.templates.registry import template_for
    inputs = coerce_scalars(op, list(inputs))
    check_operands(op, inputs)
    require_gpu("running a kernel", op=op.op)
    template = template_for(op)
    devices = [d for d in map(device_index_of, inputs) if d is not None]
    s = resolve_stream(stream, devices[0] if devices else None)
    dev = s.device
    spec = _arch(arch)
    if schedule is None:
        schedule = first_schedule(template, op, spec)
    source = template.emit(op, schedule, spec)
    compiled = compile_cuda(source, f"sm_{dev.arch}", fast_math=fast_math)
    args = tuple(to_device(x, s, index=i) for i, x in enumerate(inputs))
    kind = kind_of(inputs[0]) if inputs else "numpy"
    out, result = empty_like_kind(kind, op.result.shape, op.result.dtype, s)
    return Prepared(s, source, compiled, (*args, out), result, kind, spec)


def run_kernel(op: KernelOp, inputs: Sequence[Any], *, schedule=None, arch=None, stream=None,
               fast_math: bool = False) -> Any:
    """Run one op on the GPU with its template's kernel: numpy in, numpy out (copied); torch or CuPy
    CUDA tensors in, a tensor of the first input's library out (zero-copy, ordered on that library's
    current stream); a DeviceTensor first, a DeviceTensor out (enqueued on `stream`, not awaited).
    `schedule` defaults to the template's first for `arch` (default: this GPU's); the kernel is
    compiled for the device's own sm_XY.

    >>> run_kernel(op, [a, b])                           # doctest: +SKIP
    """
    p = prepare(op, inputs, schedule=schedule, arch=arch, stream=stream, fast_math=fast_math)
    launch(p.source, p.compiled, p.args, p.stream)
    return finish(p)


def finish(p: Prepared) -> Any:
    """Hand the output back: copied to numpy, or the library tensor once its stream is ordered after ours."""
    if p.kind == "numpy":
        return to_host(p.args[-1], p.stream)
    if p.kind in ("torch", "cupy"):
        order_after(library_stream(p.kind, p.args[-1].device), p.stream)
    return p.result


# -- timing ----------------------------------------------------------------------------------------

@lru_cache(maxsize=8)
def l2_flush_buffer(device_index: int, nbytes: int):
    from tessera_rw.codegen.device import device
    stream = resolve_stream(None, device_index)
    buffer = device(device_index).allocate(nbytes, stream=stream)
    stream.sync()     # allocated in our stream's order; the timed stream may be another
    return buffer


def time_launch(bound: BoundLaunch, *, warmup: int = 3, reps: int = 20, flush_bytes: int = 0) -> list[float]:
    """Milliseconds of each of `reps` launches, by CUDA events around each on its stream, after
    `warmup` launches. With `flush_bytes`, a buffer that large is overwritten before every rep so
    each starts with a cold L2 (the flush is outside the timed interval)."""
    from cuda.core import EventOptions
    s = bound.stream
    for _ in range(warmup):
        bound()
    flush = l2_flush_buffer(s.device.device_id, flush_bytes) if flush_bytes else None
    timing = EventOptions(timing_enabled=True)
    events = []
    for rep in range(reps):
        if flush is not None:
            flush.fill(rep & 0xFF, stream=s)
        start = s.record(options=timing)
        bound()
        events.append((start, s.record(options=timing)))
    if events:
        events[-1][1].sync()
    return [end - start for start, end in events]


def time_kernel(op: KernelOp, inputs: Sequence[Any], *, schedule=None, warmup: int = 3, reps: int = 20,
                flush_l2: bool = True, arch=None, stream=None, fast_math: bool = False) -> list[float]:
    """Milliseconds per launch of op's kernel, `reps` times, on inputs moved to the device once.

    Between reps a buffer twice the arch's L2 is overwritten (`flush_l2`), so every rep reads its
    operands from HBM as it would inside a larger program.

    >>> times = time_kernel(op, [a, b], reps=50)        # doctest: +SKIP
    """
    p = prepare(op, inputs, schedule=schedule, arch=arch, stream=stream, fast_math=fast_math)
    bound = bind(p.source, p.compiled, p.args, p.stream)
    return time_launch(bound, warmup=warmup, reps=reps, flush_bytes=2 * p.arch.l2_bytes if flush_l2 else 0)
