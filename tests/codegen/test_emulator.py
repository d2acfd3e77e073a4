"""The CPU emulator itself: PTX fragment layouts as the PTX ISA documents them, the run order that
exposes a missing barrier, deferred cp.async, faults and divergent barriers reported as errors.
(test_emulated_kernels.py runs the templates' kernels through it.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.codegen import emulator
from tessera_rw.codegen.compile import KernelSource, compile_cuda
from tessera_rw.codegen.emulator import EmulatorError, build, run_emulated

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def run(name: str, body: str, arrays, threads: int = 32, blocks: int = 1):
    build(KernelSource(name, body, threads=threads, grid=(blocks, 1, 1)))(arrays, writes=range(len(arrays)))
    return arrays[-1]


# lane = 4g + t holds A(g|g+8, 2t..2t+1 | +8), B(2t..2t+1 | +8, g), D(g|g+8, 2t..2t+1): written out
# here from the PTX ISA's m16n8k16 figures, independently of emulator_ptx.h
MMA_16816 = r"""
extern "C" __global__ void mma_check(const bf16_t* A, const bf16_t* B, float* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto pair = [](const bf16_t* p, int stride) { return (unsigned)p[0] | ((unsigned)p[stride] << 16); };
    unsigned a[4] = {pair(A + g * 16 + 2 * t, 1), pair(A + (g + 8) * 16 + 2 * t, 1),
                     pair(A + g * 16 + 2 * t + 8, 1), pair(A + (g + 8) * 16 + 2 * t + 8, 1)};
    unsigned b[2] = {pair(B + (2 * t) * 8 + g, 8), pair(B + (2 * t + 8) * 8 + g, 8)};
    float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    mma_bf16_16816(d, a, b);
    D[g * 8 + 2 * t] = d[0]; D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2]; D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
"""


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "f16"])
def test_mma_m16n8k16_follows_the_ptx_fragment_layout(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(dtype)
    b = rng.standard_normal((16, 8)).astype(dtype)
    body = MMA_16816 if dtype is ml_dtypes.bfloat16 else MMA_16816.replace("bf16", "f16").replace(
        "mma_check", "mma_check_f16")
    name = "mma_check" if dtype is ml_dtypes.bfloat16 else "mma_check_f16"
    d = run(name, body, [a, b, np.zeros((16, 8), np.float32)])
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64) + 1, rtol=1e-5, atol=1e-5)


# m16n8k8 tf32: lane = 4g + t holds A(g|g+8, t|t+4), B(t|t+4, g), D as m16n8k16's (PTX ISA figures)
MMA_1688 = r"""
extern "C" __global__ void mma_tf32_check(const float* A, const float* B, float* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned a[4] = {tf32_round(A[g * 8 + t]), tf32_round(A[(g + 8) * 8 + t]),
                     tf32_round(A[g * 8 + t + 4]), tf32_round(A[(g + 8) * 8 + t + 4])};
    unsigned b[2] = {tf32_round(B[t * 8 + g]), tf32_round(B[(t + 4) * 8 + g])};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_tf32_1688(d, a, b);
    D[g * 8 + 2 * t] = d[0]; D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2]; D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
"""


def test_mma_m16n8k8_tf32_follows_the_ptx_fragment_layout_and_rounds_operands():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    d = run("mma_tf32_check", MMA_1688, [a, b, np.zeros((16, 8), np.float32)])
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(d, want, atol=4 * 2.0 ** -10 * np.abs(a).max() * np.abs(b).max())
    assert not np.allclose(d, want, rtol=0, atol=1e-6)        # tf32 keeps 10 mantissa bits, not 23


# m16n8k32 fp8: lane = 4g + t holds A(g|g+8, 4t..4t+3 | +16), B(4t..4t+3 | +16, g), four bytes to a
# register, low byte first; D as m16n8k16's (PTX ISA figures)
MMA_16832 = r"""
extern "C" __global__ void mma_fp8_check(const fp8_t* A, const fp8_t* B, float* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto quad = [](const fp8_t* p, int stride) {
        return (unsigned)p[0] | ((unsigned)p[stride] << 8) | ((unsigned)p[2 * stride] << 16) | ((unsigned)p[3 * stride] << 24);
    };
    unsigned a[4] = {quad(A + g * 32 + 4 * t, 1), quad(A + (g + 8) * 32 + 4 * t, 1),
                     quad(A + g * 32 + 4 * t + 16, 1), quad(A + (g + 8) * 32 + 4 * t + 16, 1)};
    unsigned b[2] = {quad(B + (4 * t) * 8 + g, 8), quad(B + (4 * t + 16) * 8 + g, 8)};
    float d[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    MMA(d, a, b);
    D[g * 8 + 2 * t] = d[0]; D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2]; D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
"""


@pytest.mark.parametrize("dtype, mma", [(ml_dtypes.float8_e4m3fn, "mma_e4m3_16832"),
                                        (ml_dtypes.float8_e5m2, "mma_e5m2_16832")], ids=["e4m3", "e5m2"])
def test_mma_m16n8k32_fp8_follows_the_ptx_fragment_layout_and_decodes_every_value(dtype, mma):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((16, 32)).astype(dtype), rng.standard_normal((32, 8)).astype(dtype)
    name = f"check_{mma}"
    body = MMA_16832.replace("mma_fp8_check", name).replace("MMA", mma)
    d = run(name, body, [a, b, np.zeros((16, 8), np.float32)])
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64) + 0.5, rtol=1e-5, atol=1e-5)
    # every byte, each exactly: B's first 8 rows are the identity, so D[r, j] = A[r, j] + 0.5 checks
    # the 128 values in A's first 8 columns per run (NaN and infinity alone, as NaN * 0 is NaN)
    values = np.arange(256, dtype=np.uint8).view(dtype)
    finite = np.isfinite(values.astype(np.float32))
    identity = np.zeros((32, 8), dtype)
    identity[:8] = np.eye(8)
    for chunk in (values[finite][:128], values[finite][128:]):
        a = np.zeros((16, 32), dtype)
        a[:, :8].flat[:chunk.size] = chunk
        d = run(name, body, [a, identity, np.zeros((16, 8), np.float32)])
        np.testing.assert_array_equal(d.flat[:chunk.size], chunk.astype(np.float32) + 0.5)
    for special in values[~finite]:
        a = np.zeros((16, 32), dtype)
        a[0, 0] = special
        d = run(name, body, [a, identity, np.zeros((16, 8), np.float32)])
        np.testing.assert_array_equal(d[0, 0], np.float32(special.astype(np.float32)) + 0.5)


BYTE_PERM = r"""
extern "C" __global__ void byte_perm_check(const unsigned* X, unsigned* R) {
    const unsigned selectors[4] = {0x5140u, 0x7362u, 0x3210u, 0x0467u};
    if (threadIdx.x < 4) R[threadIdx.x] = __byte_perm(X[0], X[1], selectors[threadIdx.x]);
}
"""


def test_byte_perm_picks_bytes_of_the_pair_by_nibble():
    x = np.array([0x03020100, 0x07060504], np.uint32)     # byte i of y:x is i
    r = run("byte_perm_check", BYTE_PERM, [x, np.zeros(4, np.uint32)])
    np.testing.assert_array_equal(r, [0x05010400, 0x07030602, 0x03020100, 0x00040607])


LDMATRIX = r"""
extern "C" __global__ void ldmatrix_check(const unsigned short* M, unsigned* plain, unsigned* trans) {
    __shared__ __align__(16) unsigned short s[4 * 64];
    for (int i = threadIdx.x; i < 4 * 64; i += 32) s[i] = M[i];
    __syncthreads();
    unsigned r[4], q[4];
    const unsigned short* row = s + (threadIdx.x / 8) * 64 + (threadIdx.x % 8) * 8;   // matrix lane/8, row lane%8
    ldmatrix_x4(r, row);
    ldmatrix_x4_trans(q, row);
    for (int i = 0; i < 4; ++i) { plain[i * 32 + threadIdx.x] = r[i]; trans[i * 32 + threadIdx.x] = q[i]; }
}
"""


def test_ldmatrix_gives_each_lane_a_row_pair_or_a_column_pair():
    m = np.arange(4 * 64, dtype=np.uint16)           # element value = its index: matrix*64 + row*8 + col
    plain, trans = np.zeros(128, np.uint32), np.zeros(128, np.uint32)
    run("ldmatrix_check", LDMATRIX, [m, plain, trans])
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    for i in range(4):
        lo, hi = i * 64 + g * 8 + 2 * t, i * 64 + g * 8 + 2 * t + 1                  # row g, columns 2t, 2t+1
        np.testing.assert_array_equal(plain[i * 32:(i + 1) * 32], lo | (hi << 16))
        lo, hi = i * 64 + (2 * t) * 8 + g, i * 64 + (2 * t + 1) * 8 + g              # rows 2t, 2t+1, column g
        np.testing.assert_array_equal(trans[i * 32:(i + 1) * 32], lo | (hi << 16))


LDMATRIX_X2 = r"""
extern "C" __global__ void ldmatrix_x2_check(const unsigned short* M, unsigned* out) {
    __shared__ __align__(16) unsigned short s[2 * 64];
    for (int i = threadIdx.x; i < 2 * 64; i += 32) s[i] = M[i];
    __syncthreads();
    unsigned r[2];
    ldmatrix_x2(r, s + ((threadIdx.x / 8) % 2) * 64 + (threadIdx.x % 8) * 8);   // lanes 16-31: ignored
    out[threadIdx.x] = r[0]; out[32 + threadIdx.x] = r[1];
}
"""


def test_ldmatrix_x2_reads_the_addresses_of_lanes_0_to_15():
    m = np.arange(2 * 64, dtype=np.uint16)
    out = run("ldmatrix_x2_check", LDMATRIX_X2, [m, np.zeros(64, np.uint32)])
    g, t = np.arange(32) // 4, np.arange(32) % 4
    for i in range(2):
        np.testing.assert_array_equal(out[i * 32:(i + 1) * 32], (i * 64 + g * 8 + 2 * t) | ((i * 64 + g * 8 + 2 * t + 1) << 16))


def test_a_misaligned_ldmatrix_address_stops_the_run():
    body = LDMATRIX_X2.replace("ldmatrix_x2_check", "ldmatrix_misaligned").replace(
        "(threadIdx.x % 8) * 8);", "(threadIdx.x % 8) * 8 + 1);")
    with pytest.raises(EmulatorError, match="not 16-byte aligned"):
        run("ldmatrix_misaligned", body, [np.arange(128, dtype=np.uint16), np.zeros(64, np.uint32)])


REVERSE = r"""
extern "C" __global__ void KERNEL(const float* x, float* y) {
    __shared__ float s[64];
    s[threadIdx.x] = x[threadIdx.x];
    BARRIER
    y[threadIdx.x] = s[63 - threadIdx.x];     // written by the other warp
}
"""


@pytest.mark.parametrize("barrier", [True, False])
def test_a_missing_barrier_between_warps_reads_stale_shared_memory(barrier):
    body = REVERSE.replace("BARRIER", "__syncthreads();" if barrier else "").replace(
        "KERNEL", f"reverse_{barrier:d}")
    x = np.arange(1, 65, dtype=np.float32)
    y = run(f"reverse_{barrier:d}", body, [x, np.full(64, np.nan, np.float32)], threads=64)
    assert np.array_equal(y, x[::-1]) == barrier


PIPELINE = r"""
extern "C" __global__ void KERNEL(const float* x, float* y) {
    __shared__ __align__(16) float s[4 * 32];
    cp_async_16(s + 4 * threadIdx.x, x + 4 * threadIdx.x, 16);
    cp_async_commit();
    WAIT
    __syncthreads();
    y[threadIdx.x] = s[4 * (31 - threadIdx.x)];
}
"""


@pytest.mark.parametrize("wait", [True, False])
def test_cp_async_lands_when_its_group_is_waited_for(wait):
    name = f"pipeline_{wait:d}"
    body = PIPELINE.replace("WAIT", "cp_async_wait<0>();" if wait else "").replace("KERNEL", name)
    x = np.arange(1, 129, dtype=np.float32)
    y = run(name, body, [x, np.full(32, np.nan, np.float32)])
    assert np.array_equal(y, x[::4][::-1]) == wait


def test_cp_async_zero_fills_past_the_valid_bytes():
    body = r"""
extern "C" __global__ void partial_copy(const float* x, float* y) {
    __shared__ __align__(16) float s[4 * 32];
    cp_async_16(s + 4 * threadIdx.x, x + 4 * threadIdx.x, 4 * (threadIdx.x % 5));   // 0..4 floats, 0..16 bytes
    cp_async_commit();
    cp_async_wait<0>();
    for (int e = 0; e < 4; ++e) y[4 * threadIdx.x + e] = s[4 * threadIdx.x + e];
}
"""
    x = np.arange(1, 129, dtype=np.float32)
    y = run("partial_copy", body, [x, np.full(128, np.nan, np.float32)]).reshape(32, 4)
    valid = np.arange(32) % 5
    for lane in range(32):
        np.testing.assert_array_equal(y[lane], np.where(np.arange(4) < valid[lane], x.reshape(32, 4)[lane], 0))


def test_lanes_of_one_warp_at_different_collectives_are_an_error():
    body = r"""
extern "C" __global__ void mismatched(float* y) {
    if (threadIdx.x < 16) y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    else __syncwarp();
}
"""
    with pytest.raises(EmulatorError, match="different collectives"):
        run("mismatched", body, [np.zeros(32, np.float32)])


def test_lanes_of_one_warp_at_different_barriers_are_an_error():
    body = r"""
extern "C" __global__ void diverge(float* y) {
    if (threadIdx.x < 16) __syncthreads();
    else y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
"""
    with pytest.raises(EmulatorError, match="different barriers"):
        run("diverge", body, [np.zeros(32, np.float32)])


def test_an_access_outside_every_buffer_fails_the_launch_not_the_caller():
    body = r"""
extern "C" __global__ void wild(float* y) { y[threadIdx.x + (1LL << 40)] = 1.0f; }
"""
    with pytest.raises(EmulatorError, match="signal"):
        run("wild", body, [np.zeros(32, np.float32)])


def test_a_kernel_the_host_compiler_rejects_names_the_kernel():
    with pytest.raises(EmulatorError, match="rejected kernel broken"):
        run("broken", 'extern "C" __global__ void broken(float* y) { y[0] = undeclared; }',
            [np.zeros(1, np.float32)])


def test_a_library_call_has_no_kernel_to_emulate():
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tests.codegen.ragged_ops import of
    op = of("rfft", TensorType((4, 64), DType.float32), n=64, axis=1, norm="backward")
    with pytest.raises(EmulatorError, match="no generated kernel"):
        run_emulated(op, [np.ones((4, 64), np.float32)])


# One m64n128k16 wgmma on tiles laid out as the PTX ISA's 128-byte swizzle figures draw them,
# written here element by element, independently of emulator_ptx.h: 128-byte shared rows, the
# 16-byte chunk c of row r stored at chunk c ^ (r % 8). K-major: one row per m (n), k along it.
# MN-major: one row per k, 64 values of m (n) along it, the next 64 LBO bytes on. The accumulator
# layout is the figure's: warp w, lane 4g + t holds d[4j + e] = D(16w + g + 8(e/2), 8j + 2t + e%2).
WGMMA = r"""
__device__ __forceinline__ unsigned long long check_desc(const void* tile, unsigned leading, unsigned stride) {
    return (unsigned long long)((smem_addr(tile) & 0x3FFFFu) >> 4) | ((unsigned long long)(leading >> 4) << 16)
         | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ int check_at(int row, int byte) { return row * 128 + ((((byte / 16) ^ row) & 7) * 16) + byte % 16; }

extern "C" __global__ void KERNEL(const bf16_t* A, const bf16_t* B, float* D) {
    extern __shared__ __align__(16) unsigned char raw[];
    unsigned char* a = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023) + SHIFT;
    unsigned char* b = a + 8192;
    for (int i = threadIdx.x; i < 64 * 16; i += 128) {           // A(m, k), 64 x 16
        const int m = i / 16, k = i % 16;
        const int at = TA ? check_at(k, 2 * m) : check_at(m, 2 * k);
        *(bf16_t*)(a + at) = A[i];
    }
    for (int i = threadIdx.x; i < 16 * 128; i += 128) {          // B(k, n), 16 x 128
        const int k = i / 128, n = i % 128;
        const int at = TB ? (n / 64) * 2048 + check_at(k, 2 * (n % 64)) : check_at(n, 2 * k);
        *(bf16_t*)(b + at) = B[i];
    }
    fence_proxy_async();
    __syncthreads();
    float d[64];
    for (int e = 0; e < 64; ++e) d[e] = 1.0f;
    wgmma_fence();
    wgmma_m64n128k16_bf16<TA, TB>(d, check_desc(a, 2048, 1024), check_desc(b, 2048, 1024));
    wgmma_commit();
    BEFORE_WAIT
    wgmma_wait<0>();
    const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int e = 0; e < 64; ++e) D[(16 * w + g + 8 * (e % 4 / 2)) * 128 + 8 * (e / 4) + 2 * t + e % 2] = d[e];
}
"""


def run_wgmma(ta: int, tb: int, before_wait: str = "", name: str = "", shift: int = 0):
    """Run WGMMA on random operands: (A, B, D, its source), the tiles `shift` bytes past an atom."""
    name = name or f"wgmma_check_{ta}{tb}"
    body = WGMMA.replace("KERNEL", name).replace("TA", str(ta)).replace("TB", str(tb)).replace(
        "BEFORE_WAIT", before_wait).replace("SHIFT", str(shift))
    rng = np.random.default_rng(ta * 2 + tb)
    a = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((16, 128)).astype(ml_dtypes.bfloat16)
    source = KernelSource(name, body, threads=128, dynamic_smem=8192 + 4096 * 4 + 1024, target="sm_90a")
    d = np.full((64, 128), np.nan, np.float32)
    build(source)([a, b, d])
    return a, b, d, source


@pytest.mark.parametrize("ta, tb", [(0, 0), (0, 1), (1, 0), (1, 1)], ids=["kk", "k-mn", "mn-k", "mn-mn"])
def test_wgmma_reads_128_byte_swizzled_operands_through_their_descriptors(ta, tb):
    a, b, d, source = run_wgmma(ta, tb)
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64) + 1, rtol=1e-5, atol=1e-5)
    assert compile_cuda(source, "sm_90").arch == "sm_90a"       # the same text is a kernel NVRTC builds


def test_wgmma_accumulators_read_before_the_wait_hold_their_old_values():
    early = ("{ const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;\n"
             "for (int e = 0; e < 64; ++e) D[(16 * w + g + 8 * (e % 4 / 2)) * 128 + 8 * (e / 4) + 2 * t + e % 2] = d[e];\n"
             "wgmma_wait<0>(); return; }")
    _, _, d, _ = run_wgmma(0, 0, early, "wgmma_early_read")
    assert np.all(d == 1.0)       # the product lands in the registers at the wait, not before


def test_a_thread_that_ends_with_wgmmas_in_flight_stops_the_run():
    with pytest.raises(EmulatorError, match="finished with wgmmas in flight"):
        run_wgmma(0, 0, "return;", "wgmma_never_waited")


def test_shared_memory_changed_under_an_issued_wgmma_stops_the_run():
    with pytest.raises(EmulatorError, match="changed before wgmma.wait_group"):
        run_wgmma(0, 0, "if (threadIdx.x == 0) *(bf16_t*)a ^= 0x8000;", "wgmma_store_under")
    with pytest.raises(EmulatorError, match="cp.async: writes shared memory that an issued wgmma still reads"):
        run_wgmma(0, 1, "cp_async_16(b + 16 * threadIdx.x, B, 16); cp_async_commit();", "wgmma_copy_under")


def test_a_wgmma_tile_not_aligned_to_its_swizzle_atom_reads_the_wrong_elements():
    # the tiles start 16 bytes past a 1024-byte boundary: the kernel's swizzle and the hardware's disagree
    a, b, d, _ = run_wgmma(0, 0, name="wgmma_misaligned", shift=16)
    assert not np.allclose(d, a.astype(np.float64) @ b.astype(np.float64) + 1, rtol=1e-3, atol=1e-3)

