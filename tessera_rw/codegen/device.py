"""The GPU this process launches on, and the streams work is ordered on.

Every cuda.core call sits behind `gpu_available()` or `current_device()`, so importing this module
(and the launch runtime above it) works on a machine without a driver; asking it for a device there
raises a DeviceError that says so.

Streams: `None` means one non-blocking stream tessera_rw creates and keeps per device; a cuda.core
Stream is used as given; anything speaking the `__cuda_stream__` protocol (torch.cuda.Stream,
cupy streams) is wrapped without copying:

>>> callable(resolve_stream)
True
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

from tessera_rw.algebra.errors import TesseraError

NO_GPU_HINT = ("run on a machine with an NVIDIA GPU and driver, or use the numpy executor: unset "
               "TESSERA_DEVICE or set TESSERA_DEVICE=cpu (everything but launching and on-device timing works "
               "without a GPU)")


class DeviceError(TesseraError):
    """No usable GPU, a tensor on another device than the launch, or a launch the driver refused."""


@cache
def gpu_available() -> bool:
    """Whether cuda.core finds a driver and a device 0 (checked once per process).

    >>> isinstance(gpu_available(), bool)
    True
    """
    try:
        from cuda.core import Device
        Device(0).compute_capability
        return True
    except Exception:  # no driver library, no device, or a driver too old for cuda.core
        return False


def require_gpu(what: str, op: str | None = None) -> None:
    """Raise a DeviceError naming `what` could not run, when there is no GPU."""
    if not gpu_available():
        raise DeviceError(f"{what} needs an NVIDIA GPU, and cuda.core found none (no driver or no device 0)",
                          op=op, hint=NO_GPU_HINT)


def device(index: int | None = None):
    """The cuda.core Device `index` (the current one when None), made current on this thread."""
    require_gpu("using a CUDA device")
    from cuda.core import Device
    try:
        dev = Device(index)
    except Exception as e:
        raise DeviceError(f"no CUDA device {index} ({type(e).__name__}: {e})",
                          hint="pass a tensor or stream on a device that exists") from None
    dev.set_current()
    return dev


def current_device():
    """The device work goes to when nothing names one: the thread's current device, else device 0."""
    return device(None)


@cache
def _owned_stream(index: int):
    # One per device for the whole process: creating a stream per launch would cost more than the
    # launch, and a non-blocking stream never serializes against other libraries' legacy streams.
    return device(index).create_stream()


def foreign_stream(handle: int):
    """A cuda.core Stream over a raw cudaStream_t that another library owns (0: the legacy stream)."""
    from cuda.core import LEGACY_DEFAULT_STREAM, Stream
    return LEGACY_DEFAULT_STREAM if handle == 0 else Stream.from_handle(handle)


def resolve_stream(stream: Any = None, device_index: int | None = None):
    """The cuda.core Stream to order work on.

    None is the stream tessera_rw owns on `device_index` (default: the current device); a cuda.core
    Stream passes through; an object with `__cuda_stream__` (torch.cuda.Stream, cupy.cuda.Stream)
    is wrapped, keeping the object alive. torch and cupy streams from before the protocol are taken
    by their raw handle (`cuda_stream` / `ptr`).
    """
    dev = device(device_index)
    if stream is None:
        return _owned_stream(dev.device_id)
    from cuda.core import Stream
    if isinstance(stream, Stream):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return dev.create_stream(stream)
    for attr in ("cuda_stream", "ptr"):   # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return foreign_stream(handle)
    raise DeviceError(f"cannot use {type(stream).__name__} as a CUDA stream",
                      hint="pass None, a cuda.core Stream, or an object with __cuda_stream__ "
                           "(torch.cuda.Stream, cupy.cuda.Stream)")


def library_stream(kind: str, device_index: int):
    """The current stream of the library a tensor came from ('torch', 'cupy'); None for others.

    Work on tensors a library owns is ordered after that library's pending work and before its
    next work by waiting on this stream (see `order_after`)."""
    if kind == "torch":
        import torch
        return _library_stream(torch.cuda.current_stream(device_index).cuda_stream, device_index)
    if kind == "cupy":
        import cupy
        with cupy.cuda.Device(device_index):
            return _library_stream(cupy.cuda.get_current_stream().ptr, device_index)
    return None


@lru_cache(maxsize=64)
def _library_stream(handle: int, device_index: int):
    # one wrapper per (stream, device): it owns nothing, and every call on a library's tensors asks
    return foreign_stream(handle)


def order_after(waiter, producer) -> None:
    """Make stream `waiter` wait for everything enqueued on `producer` so far (no host sync)."""
    if producer is None or waiter is None or int(waiter.handle) == int(producer.handle):
        return
    waiter.wait(producer)
