"""numpy copies to and from the device through a pinned buffer each thread reuses: the chunking and
the reuse, against stand-ins for cuda.core's Buffer and pinned memory that copy within host memory
(no GPU); test_device_arrays.py runs the real copies on a GPU."""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import cuda.core
from tessera_rw.codegen import host_staging


class HostBuffer:
    """cuda.core.Buffer's copy interface over plain host memory."""

    def __init__(self, ptr: int, size: int, keep=None):
        self.handle, self.size, self._keep = ptr, size, keep

    @classmethod
    def from_handle(cls, ptr, size, mr=None, owner=None):
        return cls(int(ptr), size, owner)

    def copy_from(self, src, *, stream):
        assert src.size == self.size
        stream.pending.append(lambda: ctypes.memmove(self.handle, src.handle, self.size))

    def copy_to(self, dst, *, stream):
        dst.copy_from(self, stream=stream)

    def close(self, stream=None):
        self.closed = True


class PinnedStandIn:
    def __init__(self):
        self.allocated, self.buffers = [], []

    def allocate(self, size):
        memory = np.empty(size, np.uint8)
        self.allocated.append(size)
        self.buffers.append(HostBuffer(memory.ctypes.data, size, memory))
        return self.buffers[-1]


class Stream:
    """Copies run at sync(), as the device would run them after the enqueue returns."""

    def __init__(self, device_id: int = 0):
        self.device, self.pending = SimpleNamespace(device_id=device_id), []

    def sync(self):
        for work in self.pending:
            work()
        self.pending.clear()


@pytest.fixture
def pinned(monkeypatch):
    resource = PinnedStandIn()
    monkeypatch.setattr(cuda.core, "Buffer", HostBuffer)
    monkeypatch.setattr(host_staging, "pinned_resource", lambda: resource)
    monkeypatch.setattr(host_staging, "_buffers", host_staging._ThreadBuffers())
    monkeypatch.setattr(host_staging, "CHUNK_BYTES", 96)
    monkeypatch.setattr(host_staging, "_MIN_BYTES", 32)
    return resource


def round_trip(x: np.ndarray, stream: Stream) -> np.ndarray:
    device = np.full(x.nbytes, 0xEE, np.uint8)          # stands in for device memory
    host_staging.copy_to_device(x.ctypes.data, device.ctypes.data, x.nbytes, stream)
    back = np.empty_like(x)
    host_staging.copy_to_host(device.ctypes.data, back.ctypes.data, x.nbytes, stream)
    assert not stream.pending, "a copy returned before it was done"
    return back


@pytest.mark.parametrize("nbytes", [1, 20, 96, 97, 1000])
def test_copies_arrive_whole_across_chunks(pinned, nbytes):
    x = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
    assert round_trip(x, Stream()).tobytes() == x.tobytes()


def test_one_pinned_buffer_is_reused_grown_and_capped(pinned):
    stream = Stream()
    for nbytes in (10, 20, 10):
        round_trip(np.arange(nbytes, dtype=np.uint8), stream)
    assert pinned.allocated == [32]                     # every small copy through the first buffer
    round_trip(np.arange(50, dtype=np.uint8), stream)
    round_trip(np.arange(5000, dtype=np.float32), stream)
    assert pinned.allocated == [32, 64, 96]             # grown in powers of two up to one chunk
    assert [getattr(b, "closed", False) for b in pinned.buffers] == [True, True, False]   # the smaller ones freed
    round_trip(np.arange(5000, dtype=np.float32), stream)
    assert pinned.allocated == [32, 64, 96]


def test_a_copy_in_is_done_before_the_next_one_reuses_the_buffer(pinned):
    stream = Stream()
    a, b = np.arange(20, dtype=np.uint8), np.arange(100, 120, dtype=np.uint8)
    device_a, device_b = np.zeros(20, np.uint8), np.zeros(20, np.uint8)
    host_staging.copy_to_device(a.ctypes.data, device_a.ctypes.data, a.nbytes, stream)
    host_staging.copy_to_device(b.ctypes.data, device_b.ctypes.data, b.nbytes, stream)
    stream.sync()
    assert device_a.tolist() == a.tolist() and device_b.tolist() == b.tolist()


def test_each_thread_and_device_has_its_own_buffer(pinned):
    x = np.arange(8, dtype=np.uint8)
    assert round_trip(x, Stream(0)).tolist() == round_trip(x, Stream(1)).tolist() == x.tolist()
    got = []
    worker = threading.Thread(target=lambda: got.append(round_trip(x, Stream(0)).tolist()))
    worker.start()
    worker.join()
    assert got == [x.tolist()] and pinned.allocated == [32, 32, 32]
