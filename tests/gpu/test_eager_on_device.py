"""Eager op calls on the GPU: ops on torch / CuPy CUDA tensors run the compiled one-op plan and give
back a tensor of the input's kind; a pinned tile runs on the device and matches float64 numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op

pytestmark = pytest.mark.gpu


def relative_error(got, want) -> float:
    got = np.asarray(got, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("tile", [None, (64, 128, 32), (128, 64)], ids=["unpinned", "64x128x32", "128x64"])
def test_eager_matmul_on_torch_cuda_tensors(tile):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    a = rng.standard_normal((300, 136)).astype(np.float32)
    b = rng.standard_normal((136, 200)).astype(np.float32)
    ta, tb = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (a, b))
    got = op.matmul(ta, tb, tile_shape=tile)
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.bfloat16
    want = ta.float().cpu().numpy().astype(np.float64) @ tb.float().cpu().numpy().astype(np.float64)
    assert relative_error(got.float().cpu().numpy(), want) < 1e-2


def test_eager_softmax_on_cupy_arrays():
    cp = pytest.importorskip("cupy")
    x = np.random.default_rng(2).standard_normal((64, 1000)).astype(np.float32)
    got = op.softmax(cp.asarray(x), axis=-1)
    assert isinstance(got, cp.ndarray)
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(cp.asnumpy(got), e / e.sum(axis=-1, keepdims=True), rtol=1e-4, atol=1e-6)


def test_eager_pinned_matmul_on_numpy_runs_the_device_kernel():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((257, 96)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((96, 130)).astype(ml_dtypes.bfloat16)
    got = op.matmul(a, b, tile_shape=(64, 128, 32))
    assert relative_error(got, a.astype(np.float64) @ b.astype(np.float64)) < 1e-2
