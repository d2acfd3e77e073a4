"""The launch runtime: dtype tables, layout checks and error messages everywhere; transfers, zero-copy
torch / CuPy arguments, streams, opt-in shared memory and timing on a GPU (`gpu` marker)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import DTypeError, TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import KernelSource, compile_cuda
from tessera_rw.codegen.device import DeviceError, gpu_available, resolve_stream
from tessera_rw.codegen.device_arrays import (DeviceTensor, contiguity_error, describe, dtype_from_library,
                                              empty_like_kind, host_array, is_c_contiguous, kind_of, to_device,
                                              to_host, torch_dtype_name)
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.launch import (check_launch_shape, coerce_scalars, launch, run_kernel, smem_opt_in,
                                       time_kernel)
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
from tessera_rw.codegen.templates.spectral import spectral_op

F32 = TensorType((256, 512), DType.float32)
ADD = KernelOp.of("add", (F32, F32), F32)
no_gpu = pytest.mark.skipif(gpu_available(), reason="checks the behaviour without a GPU")
gpu = pytest.mark.gpu


def _random(shape, dtype: DType, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype is DType.bool:
        return rng.random(shape) < 0.5
    if dtype.is_integer:
        return rng.integers(-1000, 1000, shape).astype(dtype.numpy)
    if dtype.is_complex:
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype.numpy)
    return rng.standard_normal(shape).astype(dtype.numpy)


# -- without a GPU ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_torch_dtype_names_round_trip(dtype):
    assert dtype_from_library("torch." + torch_dtype_name(dtype)) is dtype
    assert dtype_from_library(dtype.numpy) is dtype            # CuPy and StridedMemoryView speak numpy


def test_library_dtypes_map_to_ours():
    assert torch_dtype_name(DType.float8_e4m3) == "float8_e4m3fn"
    assert dtype_from_library(np.dtype(ml_dtypes.bfloat16)) is DType.bfloat16
    assert dtype_from_library(np.dtype(ml_dtypes.float8_e5m2)) is DType.float8_e5m2
    with pytest.raises(DTypeError, match="uint8"):
        dtype_from_library("torch.uint8")


@pytest.mark.parametrize("shape, strides, expected", [
    ((3, 4), (4, 1), True),
    ((3, 4), None, True),                 # DLPack's "no strides": row-major
    ((), (), True),
    ((0, 4), (0, 0), True),               # empty: nothing to lay out
    ((3, 1, 4), (4, 99, 1), True),        # a size-1 axis may carry any stride
    ((4, 3), (1, 4), False),              # a transpose
    ((3, 2), (4, 2), False),              # every other column
    ((3, 4), (0, 1), False),              # a broadcast row
])
def test_c_contiguity(shape, strides, expected):
    assert is_c_contiguous(shape, strides) is expected


def test_contiguity_error_names_argument_layout_and_fix():
    message = str(contiguity_error(2, (4, 3), (1, 4), "cuda"))
    assert "argument 2" in message and "(4, 3)" in message and "(1, 4)" in message
    assert ".contiguous()" in message and "ascontiguousarray" in message


def test_kinds_and_descriptions():
    t = DeviceTensor(0x1000, (2, 3), DType.bfloat16, None, "torch")
    assert [kind_of(x) for x in (np.zeros(2), np.float32(1), 2.0, t)] == ["numpy", "numpy", "numpy", "cuda"]
    assert describe(np.zeros((2, 3), ml_dtypes.bfloat16)) == ((2, 3), DType.bfloat16)
    assert describe(np.zeros(4, np.complex64)) == ((4,), DType.complex64)
    assert describe(t) == ((2, 3), DType.bfloat16)
    with pytest.raises(TesseraError, match="cannot use a str as a kernel argument"):
        kind_of("x")


def test_device_tensor_is_frozen_and_sized():
    t = DeviceTensor(0x1000, (2, 3), DType.complex64, None, "numpy")
    assert (t.numel, t.nbytes) == (6, 48) and "c64[2,3]" in repr(t)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.ptr = 0


def test_host_arrays_become_contiguous_and_bad_dtypes_are_named():
    x = np.arange(12, dtype=np.float32).reshape(3, 4).T
    y = host_array(x)
    assert y.flags.c_contiguous and np.array_equal(x, y)
    with pytest.raises(DTypeError, match="argument 3 has dtype uint16"):
        host_array(np.zeros(2, np.uint16), 3)


def test_python_scalars_take_their_operands_dtype():
    s = TensorType((), DType.bfloat16)
    op = KernelOp.of("mul", (F32, s), F32)
    x, scalar = coerce_scalars(op, [np.zeros((256, 512), np.float32), 2.0])
    assert scalar.dtype == ml_dtypes.bfloat16 and float(scalar) == 2.0


def test_operand_mismatches_name_op_and_types():
    a = np.zeros((256, 512), np.float32)
    with pytest.raises(TesseraError, match="add: takes 2 operands, got 3"):
        run_kernel(ADD, [a, a, a])
    with pytest.raises(TesseraError, match=r"operand 1 is f32\[512,256\], the kernel was built for f32\[256,512\]"):
        run_kernel(ADD, [a, a.T])
    with pytest.raises(TesseraError, match=r"operand 0 is f64\[256,512\]") as e:
        run_kernel(ADD, [a.astype(np.float64), a])
    assert "expected (f32[256,512], f32[256,512])" in str(e.value)


def test_shared_memory_opt_in():
    assert smem_opt_in("k", 48 * 1024, 0, 227 * 1024) is None      # the default covers 48 KB
    assert smem_opt_in("k", 96 * 1024, 0, 227 * 1024) == 96 * 1024
    assert smem_opt_in("k", 40 * 1024, 10 * 1024, 227 * 1024) == 40 * 1024
    with pytest.raises(DeviceError, match=r"kernel k needs 233472 bytes .*allows 232448"):
        smem_opt_in("k", 228 * 1024, 0, 227 * 1024)


def test_attention_kernels_need_the_opt_in():
    q = TensorType((1, 2, 256, 128), DType.bfloat16)
    op = KernelOp.of("flash_attention", (q, q, q), q, scale=128 ** -0.5, causal=False, has_mask=False)
    h100 = arch_named("h100")
    t = FlashAttentionTemplate()
    source = t.emit(op, t.schedules(op, h100)[0], h100)
    assert smem_opt_in(source.name, source.dynamic_smem, 0, h100.smem_per_block) == source.dynamic_smem > 48 * 1024


def test_a_kernel_without_a_block_size_is_refused():
    with pytest.raises(DeviceError, match="block size 0"):
        check_launch_shape(KernelSource("k", "", threads=0))


@no_gpu
def test_without_a_gpu():
    assert gpu_available() is False
    with pytest.raises(DeviceError, match="add: running a kernel needs an NVIDIA GPU") as e:
        run_kernel(ADD, [np.zeros((256, 512), np.float32)] * 2)
    assert "numpy executor" in str(e.value)
    with pytest.raises(DeviceError, match="needs an NVIDIA GPU"):
        resolve_stream()


# -- on a GPU --------------------------------------------------------------------------------------

SCALE2 = KernelSource("scale2", 'extern "C" __global__ void scale2(const float* x, float* out) {\n'
                                "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                "    if (i < 1000) out[i] = 2.0f * x[i];\n}\n", threads=128, grid=(8, 1, 1))


def _sm() -> str:
    from cuda.core import Device
    return f"sm_{Device(0).arch}"


@gpu
@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_numpy_round_trip(dtype):
    s = resolve_stream()
    x = _random((3, 5, 7), dtype)
    t = to_device(x, s)
    assert (t.kind, t.shape, t.dtype) == ("numpy", x.shape, dtype) and t.ptr
    back = to_host(t, s)
    assert back.dtype == x.dtype and back.tobytes() == x.tobytes()


@gpu
def test_numpy_copies_reuse_one_pinned_buffer_and_cross_chunks(monkeypatch):
    from tessera_rw.codegen import host_staging
    real, sizes = host_staging.pinned_resource(), []

    class Counting:
        def allocate(self, size):
            sizes.append(size)
            return real.allocate(size)

    monkeypatch.setattr(host_staging, "pinned_resource", Counting)
    monkeypatch.setattr(host_staging, "_buffers", host_staging._ThreadBuffers())
    s = resolve_stream()
    big = _random((host_staging.CHUNK_BYTES // 4 * 2 + 3,), DType.float32, seed=1)   # two chunks and a tail
    assert to_host(to_device(big, s), s).tobytes() == big.tobytes()
    for seed in range(3):
        x = _random((64, 33), DType.float32, seed=seed)
        assert to_host(to_device(x, s), s).tobytes() == x.tobytes()
    assert sizes == [host_staging.CHUNK_BYTES]        # one buffer, made at the first copy, reused after


@gpu
def test_hand_written_kernel_on_numpy():
    s = resolve_stream()
    x = _random(1000, DType.float32)
    out, user = empty_like_kind("numpy", (1000,), DType.float32, s)
    assert user is None
    launch(SCALE2, compile_cuda(SCALE2, _sm()), [to_device(x, s), out], s)
    np.testing.assert_array_equal(to_host(out, s), 2 * x)


@gpu
@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_hand_written_kernel_on_library_tensors_is_zero_copy(library):
    lib = pytest.importorskip(library)
    s = resolve_stream()
    host = _random(1000, DType.float32)
    x = lib.asarray(host, device="cuda") if library == "torch" else lib.asarray(host)
    x_in = to_device(x, s)
    assert x_in.kind == library and x_in.ptr == (x.data_ptr() if library == "torch" else x.data.ptr)
    out, user = empty_like_kind(library, (1000,), DType.float32, s)
    launch(SCALE2, compile_cuda(SCALE2, _sm()), [x_in, out], s)
    s.sync()
    assert type(user) is type(x)
    np.testing.assert_array_equal(to_host(out, s), 2 * to_host(x_in, s))


@gpu
@pytest.mark.parametrize("dtype", [DType.float32, DType.bfloat16])
def test_run_kernel_on_numpy(dtype):
    t = TensorType((256, 512), dtype)
    a, b = _random(t.shape, dtype, 1), _random(t.shape, dtype, 2)
    y = run_kernel(KernelOp.of("add", (t, t), t), [a, b])
    assert isinstance(y, np.ndarray) and y.dtype == dtype.numpy
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype.numpy)
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=1e-2 if dtype.is_low_precision else 1e-6)


@gpu
def test_complex64_spectral_kernel():
    op = spectral_op((2, 4, 9), (8, 4, 9))
    x, w = _random((2, 4, 9), DType.complex64, 1), _random((8, 4, 9), DType.complex64, 2)
    y = run_kernel(op, [x, w])
    np.testing.assert_allclose(y, OPS["spectral_contract"].reference(x, w, groups=1), rtol=1e-4, atol=1e-4)


@gpu
def test_torch_in_torch_out_with_a_strided_input_and_streams():
    torch = pytest.importorskip("torch")
    a = torch.randn(512, 256, device="cuda").T                    # strided: made contiguous by torch
    b = torch.randn(256, 512, device="cuda")
    assert not a.is_contiguous()
    y = run_kernel(ADD, [a, b])
    assert isinstance(y, torch.Tensor) and y.is_cuda and torch.equal(y, a + b)
    side = torch.cuda.Stream()
    y = run_kernel(ADD, [a, b], stream=side)
    side.synchronize()
    assert torch.equal(y, a + b)


@gpu
def test_a_cuda_core_stream_passes_through():
    from cuda.core import Device
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    assert resolve_stream(stream) is stream
    a, b = _random(F32.shape, DType.float32, 1), _random(F32.shape, DType.float32, 2)
    np.testing.assert_array_equal(run_kernel(ADD, [a, b], stream=stream), a + b)


@gpu
def test_attention_with_more_than_48_kb_of_shared_memory():
    q_t = TensorType((1, 2, 256, 128), DType.bfloat16)
    op = KernelOp.of("flash_attention", (q_t, q_t, q_t), q_t, scale=128 ** -0.5, causal=False, has_mask=False)
    q, k, v = (_random(q_t.shape, DType.bfloat16, i) for i in range(3))
    y = run_kernel(op, [q, k, v])
    want = OPS["flash_attention"].reference(*(x.astype(np.float32) for x in (q, k, v)), **op.attr_map)
    np.testing.assert_allclose(y.astype(np.float32), want, atol=3e-2, rtol=3e-2)


@gpu
def test_time_kernel_returns_positive_times():
    a, b = _random(F32.shape, DType.float32, 1), _random(F32.shape, DType.float32, 2)
    times = time_kernel(ADD, [a, b], warmup=2, reps=5)
    assert len(times) == 5 and all(t > 0 for t in times) and np.median(times) < 100
