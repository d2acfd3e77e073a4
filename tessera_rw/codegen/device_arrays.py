"""Tensors as kernels see them: a device pointer, a shape, a dtype, and whoever keeps the memory.

numpy arrays are copied in and out (through pinned staging, host_staging.py); torch and CuPy CUDA
tensors are used in place through cuda.core's StridedMemoryView (DLPack / __cuda_array_interface__).
Generated kernels read contiguous row-major operands, so a strided torch or CuPy tensor is first
made contiguous by its own library; anything else strided is refused with the fix spelled out.

The pure parts (dtype tables, contiguity, what a value is) work without a GPU:

>>> is_c_contiguous((3, 4), (4, 1)), is_c_contiguous((3, 4), (1, 3))
(True, False)
>>> dtype_from_library("torch.bfloat16")
<DType.bfloat16: 'bfloat16'>
>>> describe(np.zeros((2, 3), np.complex64))
((2, 3), <DType.complex64: 'complex64'>)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import DTypeError, TesseraError
from tessera_rw.codegen.device import DeviceError, library_stream, order_after
from tessera_rw.codegen.host_staging import copy_to_device, copy_to_host

KINDS = ("numpy", "torch", "cupy", "cuda")

# torch spells these differently from us; every other DType is torch.<our name>
_TORCH_NAMES = {DType.float8_e4m3: "float8_e4m3fn"}
_NO_CUPY = frozenset({DType.bfloat16, DType.float8_e4m3, DType.float8_e5m2})   # no numpy-native dtype


@dataclass(frozen=True, eq=False)
class DeviceTensor:
    """A contiguous row-major tensor in device memory. `owner` keeps the memory alive (a cuda.core
    Buffer, a torch tensor, a CuPy array); `kind` says where the data came from."""
    ptr: int
    shape: tuple[int, ...]
    dtype: DType
    owner: Any
    kind: str
    device: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __repr__(self) -> str:
        dims = ",".join(map(str, self.shape))
        return f"DeviceTensor({self.dtype.short}[{dims}] at {self.ptr:#x} on cuda:{self.device}, {self.kind})"


# -- pure: dtypes, layouts, kinds ------------------------------------------------------------------

def torch_dtype_name(dtype: DType) -> str:
    """The torch attribute naming `dtype`: torch_dtype_name(DType.float8_e4m3) == 'float8_e4m3fn'."""
    return _TORCH_NAMES.get(dtype, dtype.value)


def dtype_from_library(dtype: object) -> DType:
    """Our DType for a library's dtype or its name: torch.bfloat16, 'float8_e4m3fn', np.complex64."""
    try:
        return _FROM_LIBRARY[dtype]
    except (KeyError, TypeError):        # not seen yet, or unhashable
        pass
    from_torch = type(dtype).__module__.split(".")[0] == "torch"
    text = str(dtype) if from_torch else dtype
    if isinstance(text, str):
        text = text.removeprefix("torch.")
    try:
        found = DType.parse(text)
    except DTypeError:
        raise DTypeError(f"tensor dtype {dtype} has no tessera_rw equivalent",
                         hint="supported: " + ", ".join(d.value for d in DType)) from None
    if from_torch:          # remembered: a warm call reads each tensor's dtype
        _FROM_LIBRARY[dtype] = found
    return found


_FROM_LIBRARY: dict[object, DType] = {}


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int] | None) -> bool:
    """Whether `strides` (in elements; None means row-major) lay `shape` out densely row-major.

    Axes of size 1 may carry any stride, and an empty tensor is contiguous."""
    if strides is None or 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def contiguity_error(index: int, shape: Sequence[int], strides: Sequence[int] | None, kind: str) -> TesseraError:
    """The error for a strided operand that cannot be made contiguous for us."""
    return TesseraError(
        f"argument {index} is not contiguous row-major: shape {tuple(shape)}, strides {tuple(strides or ())} "
        f"(in elements), from {kind}",
        hint="generated kernels read dense row-major operands; pass a contiguous copy "
             "(numpy.ascontiguousarray, torch's .contiguous(), cupy.ascontiguousarray)")


def kind_of(value: Any) -> str:
    """Where a value lives: 'numpy' (host arrays and scalars), 'torch', 'cupy', or 'cuda' (a
    DeviceTensor, or any other object exporting device memory through DLPack or CAI)."""
    kind = _class_kind(type(value))
    if kind is not None:
        return kind
    if hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"):     # set on the object
        return "cuda"
    raise TesseraError(f"cannot use a {type(value).__name__} as a kernel argument",
                       hint="pass a numpy array, a torch or CuPy CUDA tensor, or a DeviceTensor")


def is_torch_cuda_tensor(value: Any) -> bool:
    """Whether `value` is a torch tensor on a CUDA GPU."""
    return _class_kind(type(value)) == "torch" and value.is_cuda


def _class_kind(cls: type) -> str | None:
    """kind_of of the values of class `cls` where the class decides it (remembered per class)."""
    kind = _KIND_OF_TYPE.get(cls)
    if kind is None:
        kind = _kind_of_type(cls)
        if kind is not None:
            _KIND_OF_TYPE[cls] = kind
    return kind


def _kind_of_type(cls: type) -> str | None:
    """kind_of for every value of class `cls` where the class decides it (DeviceTensor, numpy and
    Python numbers, torch and CuPy tensors); None for the rest, whose objects each say whether they
    export device memory."""
    if issubclass(cls, DeviceTensor):
        return "cuda"
    if issubclass(cls, (np.ndarray, np.generic, bool, int, float, complex)):
        return "numpy"
    package = cls.__module__.split(".")[0]
    if package == "torch" and hasattr(cls, "data_ptr"):
        return "torch"
    if package == "cupy" and hasattr(cls, "data"):
        return "cupy"
    return None         # an export of device memory (CAI, DLPack) is asked of each object


_KIND_OF_TYPE: dict[type, str] = {}


def describe(value: Any) -> tuple[tuple[int, ...], DType]:
    """(shape, dtype) of a kernel argument, read without touching the device."""
    kind = kind_of(value)
    if isinstance(value, DeviceTensor):
        return value.shape, value.dtype
    if kind == "numpy":
        array = np.asarray(value)
        return array.shape, dtype_from_library(array.dtype)
    if kind in ("torch", "cupy"):
        return tuple(value.shape), dtype_from_library(value.dtype)
    view = _view(value, -1)
    return tuple(view.shape), dtype_from_library(view.dtype)


def device_index_of(value: Any) -> int | None:
    """The CUDA device a value lives on; None for host values."""
    kind = kind_of(value)
    if isinstance(value, DeviceTensor):
        return value.device
    if kind == "torch":
        return value.get_device() if value.is_cuda else None
    if kind == "cupy":
        return value.device.id
    if kind == "cuda":
        return _view(value, -1).device_id
    return None


def host_array(value: Any, index: int = 0) -> np.ndarray:
    """A contiguous numpy array of a host value, its dtype one of ours."""
    array = np.ascontiguousarray(np.asarray(value))
    try:
        DType.parse(array.dtype)
    except DTypeError:
        raise DTypeError(f"argument {index} has dtype {array.dtype}, which tessera_rw kernels do not take",
                         hint="supported: " + ", ".join(d.value for d in DType)) from None
    return array


# -- device side -----------------------------------------------------------------------------------

def _view(value: Any, stream_handle: int):
    from cuda.core.utils import StridedMemoryView
    return StridedMemoryView.from_any_interface(value, stream_handle)


def _stream_device(stream) -> int:
    return stream.device.device_id


def _check_device(index: int, found: int | None, launch: int, shape, kind: str) -> None:
    if found != launch:
        where = "the host" if found is None or found < 0 else f"cuda:{found}"
        raise DeviceError(f"argument {index} ({kind}, shape {tuple(shape)}) is on {where}, "
                          f"but the launch is on cuda:{launch}",
                          hint="move every argument to one device, or pass a stream on the arguments' device")


def to_device(array: Any, stream, *, index: int = 0, order: bool = True) -> DeviceTensor:
    """Make `array` readable by a kernel on `stream`'s device.

    numpy (and Python scalars) are copied in and the copy is complete on return; torch and CuPy
    CUDA tensors are used in place, `stream` waiting for their library's pending work (unless
    `order` is False: a caller binding several tensors orders the streams once, after the last);
    a DeviceTensor is returned as it is. `index` names the argument in errors.
    """
    if isinstance(array, DeviceTensor):
        _check_device(index, array.device, _stream_device(stream), array.shape, array.kind)
        return array
    kind = kind_of(array)
    if kind == "numpy":
        return _copy_in(host_array(array, index), stream)
    launch_device = _stream_device(stream)
    if kind == "torch":
        return _torch_in_place(array, stream, launch_device, index, order)
    _check_device(index, device_index_of(array), launch_device, array.shape, kind)
    dtype = describe(array)[1]
    if kind == "cupy" and not array.flags.c_contiguous:
        import cupy
        with cupy.cuda.Device(launch_device):
            array = cupy.ascontiguousarray(array)
    if order:     # the library's work that produced the tensor (or its contiguous copy) comes first
        order_after(stream, library_stream(kind, launch_device))
    ptr, shape, strides = _layout(array, kind)
    if not is_c_contiguous(shape, strides):
        raise contiguity_error(index, shape, strides, kind)
    return DeviceTensor(ptr, shape, dtype, array, kind, launch_device)


def _torch_in_place(tensor: Any, stream, launch_device: int, index: int, order: bool) -> DeviceTensor:
    """A torch CUDA tensor as a kernel operand, in place (a strided one made contiguous by torch
    first): what a warm call on torch tensors pays per tensor, so only its own attributes are read."""
    if not tensor.is_cuda:
        raise DeviceError(f"argument {index} is a torch tensor on {tensor.device}, shape {tuple(tensor.shape)}",
                          hint="move it with .cuda(), or pass .numpy() to have it copied in")
    _check_device(index, tensor.get_device(), launch_device, tensor.shape, "torch")
    dtype = dtype_from_library(tensor.dtype)
    if not tensor.is_contiguous():   # torch's contiguity is ours: row-major, axes of size 1 taking any stride
        tensor = tensor.contiguous()
    if order:     # the torch work that produced the tensor (or its contiguous copy) comes first
        order_after(stream, library_stream("torch", launch_device))
    # the tensor itself keeps the storage alive (its data pointer includes the storage offset)
    return DeviceTensor(tensor.data_ptr(), tuple(tensor.shape), dtype, tensor, "torch", launch_device)


def _layout(array: Any, kind: str) -> tuple[int, tuple[int, ...], tuple[int, ...] | None]:
    """(pointer, shape, strides in elements) of a CuPy or other CUDA array, through StridedMemoryView;
    CuPy arrays of a dtype their DLPack export lacks are read through their own attributes."""
    try:
        view = _view(array, -1)
        return int(view.ptr), tuple(view.shape), view.strides
    except Exception:
        if kind == "cupy":
            return int(array.data.ptr), tuple(array.shape), tuple(s // array.itemsize for s in array.strides)
        raise


def _copy_in(array: np.ndarray, stream) -> DeviceTensor:
    dev = stream.device
    dtype = DType.parse(array.dtype)
    if array.nbytes == 0:
        return DeviceTensor(0, array.shape, dtype, None, "numpy", dev.device_id)
    buffer = dev.allocate(array.nbytes, stream=stream)
    copy_to_device(array.ctypes.data, int(buffer.handle), array.nbytes, stream, owner=buffer)
    return DeviceTensor(int(buffer.handle), array.shape, dtype, buffer, "numpy", dev.device_id)


def empty_like_kind(kind: str, shape: tuple[int, ...], dtype: DType, stream, *,
                    order: bool = True) -> tuple[DeviceTensor, Any]:
    """A new tensor for a kernel to write, of the library `kind` names: torch and CuPy results are
    allocated by torch / CuPy (on `stream`'s device) so the user gets their own type back, `stream`
    waiting for the library's pending work, which may still use the memory (unless `order` is
    False: the caller orders the streams once); numpy and 'cuda' results live in a cuda.core
    buffer. Returns (what the kernel writes, what the user gets: the torch / CuPy tensor, the
    DeviceTensor for 'cuda', None for numpy)."""
    dev = stream.device
    shape = tuple(shape)
    if kind == "torch":
        import torch
        out = torch.empty(shape, dtype=getattr(torch, torch_dtype_name(dtype)), device=dev.device_id)
        if order:
            order_after(stream, library_stream(kind, dev.device_id))
        return DeviceTensor(out.data_ptr(), shape, dtype, out, kind, dev.device_id), out
    if kind == "cupy":
        if dtype in _NO_CUPY:
            raise DTypeError(f"CuPy has no {dtype} arrays, so a {dtype} result cannot be returned as one",
                             hint="pass torch tensors or numpy arrays for this op")
        import cupy
        with cupy.cuda.Device(dev.device_id):
            out = cupy.empty(shape, dtype=dtype.numpy)
        if order:
            order_after(stream, library_stream(kind, dev.device_id))
        return DeviceTensor(int(out.data.ptr), shape, dtype, out, kind, dev.device_id), out
    nbytes = math.prod(shape) * dtype.itemsize
    buffer = dev.allocate(nbytes, stream=stream) if nbytes else None
    tensor = DeviceTensor(int(buffer.handle) if buffer else 0, shape, dtype, buffer, kind, dev.device_id)
    return tensor, (None if kind == "numpy" else tensor)


def window(flat: Any, offset: int, shape: Sequence[int]) -> Any:
    """The part of a flat tensor from byte `offset` on, at `shape`, sharing its memory: a torch or
    CuPy view of a torch or CuPy tensor, a DeviceTensor at the offset pointer of a DeviceTensor.
    `offset` is a whole number of elements.

    >>> t = DeviceTensor(0x1000, (12,), DType.float32, None, "cuda")
    >>> window(t, 16, (2, 4))
    DeviceTensor(f32[2,4] at 0x1010 on cuda:0, cuda)
    """
    shape = tuple(shape)
    kind = kind_of(flat)
    if isinstance(flat, DeviceTensor):
        return DeviceTensor(flat.ptr + offset, shape, flat.dtype, flat.owner, flat.kind, flat.device)
    if kind == "torch":
        start = offset // flat.element_size()
        return flat[start:start + math.prod(shape)].view(shape)
    if kind == "cupy":
        start = offset // flat.itemsize
        return flat[start:start + math.prod(shape)].reshape(shape)
    raise TesseraError(f"cannot take a window of a {type(flat).__name__}",
                       hint="pass a torch tensor, a CuPy array or a DeviceTensor")


def to_host(t: DeviceTensor, stream) -> np.ndarray:
    """Copy `t` back into a new numpy array once the work enqueued on `stream` so far is done."""
    out = np.empty(t.shape, dtype=t.dtype.numpy)
    if t.nbytes == 0:
        return out
    copy_to_host(t.ptr, out.ctypes.data, t.nbytes, stream, owner=t.owner)
    return out
