"""What a kernel argument is and how a torch tensor is taken in place, on stand-ins (no GPU): kinds
remembered per class (an object exporting device memory through attributes of its own is asked
each time), torch dtypes remembered, and a torch tensor's device, layout and stream checked from
its own attributes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen import device_arrays
from tessera_rw.codegen.device import DeviceError
from tessera_rw.codegen.device_arrays import dtype_from_library, is_torch_cuda_tensor, kind_of, to_device


class TorchDtype:
    __module__ = "torch"
    reads = 0

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        TorchDtype.reads += 1
        return f"torch.{self.name}"

    def __hash__(self) -> int:
        return hash(self.name)


BF16 = TorchDtype("bfloat16")


class Tensor:
    """A torch tensor as to_device reads it."""
    __module__ = "torch"

    def __init__(self, shape=(4, 8), device: int = 0, contiguous: bool = True, ptr: int = 0x1000):
        self.shape, self.dtype, self.ptr, self._contiguous = shape, BF16, ptr, contiguous
        self.is_cuda, self._device = device >= 0, device
        self.device = f"cuda:{device}" if device >= 0 else "cpu"

    def get_device(self) -> int:
        return self._device

    def is_contiguous(self) -> bool:
        return self._contiguous

    def contiguous(self) -> Tensor:
        return Tensor(self.shape, self._device, True, ptr=0x9000)

    def data_ptr(self) -> int:
        return self.ptr


STREAM = SimpleNamespace(device=SimpleNamespace(device_id=0), handle=7)


@pytest.fixture
def ordered(monkeypatch):
    """The stream orders to_device asks for, as (waiter, what it waits for)."""
    orders = []
    monkeypatch.setattr(device_arrays, "library_stream", lambda kind, index: f"{kind} stream")
    monkeypatch.setattr(device_arrays, "order_after", lambda waiter, producer: orders.append((waiter, producer)))
    return orders


def test_an_object_exporting_device_memory_of_its_own_is_asked_each_time():
    class Exported:
        pass
    exported, plain = Exported(), Exported()
    exported.__cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0x1000, False), "version": 3}
    assert kind_of(exported) == "cuda"
    with pytest.raises(TesseraError, match="cannot use a Exported as a kernel argument"):
        kind_of(plain)                         # its class was not taken for a device array's
    assert kind_of(np.zeros(2)) == kind_of(np.float32(1)) == kind_of(3) == "numpy"


def test_torch_tensors_are_known_by_their_class_and_device():
    assert kind_of(Tensor()) == "torch" and is_torch_cuda_tensor(Tensor())
    assert not is_torch_cuda_tensor(Tensor(device=-1)) and not is_torch_cuda_tensor(np.zeros(2))


def test_a_torch_dtype_is_read_once():
    reads = TorchDtype.reads
    assert dtype_from_library(BF16) is DType.bfloat16 and dtype_from_library(BF16) is DType.bfloat16
    assert TorchDtype.reads - reads <= 1


def test_a_torch_tensor_is_taken_in_place_with_its_stream_ordered(ordered):
    t = Tensor()
    taken = to_device(t, STREAM, index=2)
    assert (taken.ptr, taken.shape, taken.dtype, taken.owner, taken.kind) == (0x1000, (4, 8), DType.bfloat16, t, "torch")
    assert ordered == [(STREAM, "torch stream")]
    to_device(t, STREAM, order=False)           # a caller binding several tensors orders once itself
    assert len(ordered) == 1


def test_a_strided_torch_tensor_is_made_contiguous_by_torch(ordered):
    taken = to_device(Tensor(contiguous=False), STREAM)
    assert taken.ptr == 0x9000 and taken.owner.ptr == 0x9000


@pytest.mark.parametrize("tensor, says", [(Tensor(device=-1), "argument 3 is a torch tensor on cpu"),
                                          (Tensor(device=1), "argument 3 .* is on cuda:1, but the launch is on cuda:0")])
def test_a_torch_tensor_off_the_launch_device_is_refused(tensor, says, ordered):
    with pytest.raises(DeviceError, match=says):
        to_device(tensor, STREAM, index=3)
    assert ordered == []
