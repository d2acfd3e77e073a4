"""The emulator's named barriers (bar.sync / bar.arrive id, threads): a warp that arrives lets the
warps that sync go on once the generation's count is in; a wait no arrival completes is a deadlock,
and counts the device refuses (not a multiple of 32, one id used with two) stop the run."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.codegen import emulator
from tessera_rw.codegen.compile import KernelSource, compile_cuda
from tessera_rw.codegen.emulator import EmulatorError, build

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


HANDOFF = r"""
extern "C" __global__ void KERNEL(const float* x, float* y) {
    __shared__ float s[32];
    if (threadIdx.x >= 32) {                     // warp 1 writes, then lets warp 0 go on
        s[threadIdx.x - 32] = x[threadIdx.x - 32];
        ARRIVE
        return;
    }
    SYNC
    y[threadIdx.x] = s[31 - threadIdx.x];
}
"""


@pytest.mark.parametrize("arrive, sync, outcome", [
    ("named_barrier_arrive(1, 64);", "named_barrier_sync(1, 64);", "reversed"),
    ("", "named_barrier_sync(1, 64);", "deadlock"),                # nobody arrives: warp 0 waits forever
    ("named_barrier_arrive(1, 64);", "named_barrier_sync(1, 96);", "two thread counts"),
    ("named_barrier_arrive(1, 48);", "named_barrier_sync(1, 48);", "multiple of 32"),
])
def test_a_named_barrier_hands_over_between_warps(arrive, sync, outcome):
    name = f"handoff_{abs(hash(arrive + sync)) % 10_000}"
    body = HANDOFF.replace("KERNEL", name).replace("ARRIVE", arrive).replace("SYNC", sync)
    x = np.arange(1, 33, dtype=np.float32)
    source = KernelSource(name, body, threads=64, target="sm_90a")
    if outcome != "reversed":
        with pytest.raises(EmulatorError, match=outcome):
            build(source)([x, np.zeros(32, np.float32)])
        return
    y = np.full(32, np.nan, np.float32)
    build(source)([x, y], writes=[1])
    np.testing.assert_array_equal(y, x[::-1])
    assert compile_cuda(source, "sm_90").spill_bytes == 0         # the same text is a kernel NVRTC builds
