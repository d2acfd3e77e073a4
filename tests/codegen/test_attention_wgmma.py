"""sm_90's wgmma FlashAttention kernel under the CPU emulator: a register-A wgmma multiplies the
fragment layout the PTX ISA gives it, the kernel matches float64 numpy over many key tiles (each
stage refilled), and the ways its pipeline or operands go wrong fail instead of passing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.emulator import EmulatorError, build
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate, WarpgroupAttentionSchedule

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")

H100 = arch_named("h100")

# D (64 x 64) = A (64 x 16, from registers) B (16 x 64, K-major in a swizzled tile): each thread
# packs its A fragment from the matrix as the PTX ISA's m64n16 layout places it, and writes out its
# accumulators as the m64nN layout places them.
RS_PRODUCT = r"""
extern "C" __global__ void rs_product(const bf16_t* A, const bf16_t* B, float* D) {
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t* tile = (bf16_t*)(smem + ((1024 - (smem_addr(smem) & 1023)) & 1023));
    const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, t = tid & 3;
    for (int i = tid; i < 64 * 16; i += 128) {           // B's column n (16 values of k) as row n
        const int n = i / 16, k = i % 16;
        tile[n * 64 + (((k / 8) ^ n) & 7) * 8 + k % 8] = B[k * 64 + n];
    }
    fence_proxy_async();
    __syncthreads();
    const int r = 16 * warp + g;
    auto pair = [&](int row, int col) {
        return (unsigned)(*(const unsigned short*)&A[row * 16 + col])
             | ((unsigned)(*(const unsigned short*)&A[row * 16 + col + 1]) << 16);
    };
    unsigned a[4] = {pair(r, 2 * t), pair(r + 8, 2 * t), pair(r, 8 + 2 * t), pair(r + 8, 8 + 2 * t)};
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    wgmma_fence();
    wgmma_rs_m64n64k16_bf16<0>(d, a, wgmma_desc(tile, 16, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) D[(r + 8 * (e / 2)) * 64 + 8 * j + 2 * t + e % 2] = d[4 * j + e];
}
"""


def test_a_register_a_wgmma_reads_the_m64n16_fragment_layout():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
    out = np.full((64, 64), np.nan, np.float32)
    build(KernelSource("rs_product", RS_PRODUCT, threads=128, dynamic_smem=64 * 64 * 2 + 1024,
                       target="sm_90a"))([a, b, out])
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


# one head of 520 keys, causal, D = 128: 64-key tiles in 3 stages, each refilled twice or more
SCHEDULE = WarpgroupAttentionSchedule(bm=128, bn=64, warps=8, stages=3)


def _attention():
    q = TensorType((1, 1, 520, 128), DType.bfloat16)
    op = KernelOp.of("flash_attention", (q, q, q), q, scale=128 ** -0.5, causal=True, has_mask=False)
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(q.shape).astype(ml_dtypes.bfloat16) for _ in range(3)]
    return op, arrays


def _reference(q, k, v) -> np.ndarray:
    q, k, v = (x.astype(np.float64)[0, 0] for x in (q, k, v))
    s = q @ k.T * 128 ** -0.5
    s[np.triu_indices(len(s), 1)] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def _run(old: str = "", new: str = "") -> np.ndarray:
    op, (q, k, v) = _attention()
    source = FlashAttentionTemplate().emit(op, SCHEDULE, H100)
    if old:
        assert old in source.source
        source = KernelSource(source.name + "_mutated", source.source.replace(old, new).replace(
            source.name, source.name + "_mutated"), source.threads, source.grid, source.dynamic_smem,
            target=source.target)
    out = np.full(q.shape, np.nan, ml_dtypes.bfloat16)
    build(source)([q, k, v, out])
    return out.astype(np.float64)[0, 0]


def test_the_wgmma_kernel_matches_the_reference_over_refilled_stages():
    _, (q, k, v) = _attention()
    np.testing.assert_allclose(_run(), _reference(q, k, v), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("old, new, message", [
    # the barrier before a refill: a stage is overwritten while the other warpgroup still reads it
    ("        __syncthreads();                                  // for every thread",
     "        // no barrier", "an issued wgmma (reads changed|still reads)"),
    # V's second 64-wide block of the head dim read from the wrong place
    ("wgmma_desc(vt + kk * 16 * 64, BN * ROW_BYTES, ATOM)", "wgmma_desc(vt + kk * 16 * 64, ATOM, ATOM)", None),
    # O rescaled while the previous tile's P V still accumulates into it: a refill lands under it
    ("wgmma_wait<0>();                                  // tile t - 1's P V", "// tile t - 1's P V",
     "writes shared memory that an issued wgmma still reads"),
    # O stored before the last tile's P V retires
    ("    wgmma_wait<0>();\n    wgmma_hold<D / 2>(&o[0][0][0]);\n    wgmma_hold<BN / 4>",
     "    wgmma_hold<D / 2>(&o[0][0][0]);\n    wgmma_hold<BN / 4>", "finished with wgmmas in flight"),
    # S read before its wgmmas retire (only the P V behind it may still run)
    ("wgmma_wait<1>();", "wgmma_wait<2>();", None),
    # P's rows g + 8 and columns 8.. swapped in the register operand
    ("p[kk][1] = pack_bf16x2(s[0][2 * kk][2], s[0][2 * kk][3]);\n"
     "            p[kk][2] = pack_bf16x2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);",
     "p[kk][2] = pack_bf16x2(s[0][2 * kk][2], s[0][2 * kk][3]);\n"
     "            p[kk][1] = pack_bf16x2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);", None),
])
def test_a_broken_wgmma_kernel_fails(old, new, message):
    """Each mutation stops the run with `message`, or (None) gives a wrong result."""
    if message:
        with pytest.raises(EmulatorError, match=message):
            _run(old, new)
    else:
        _, (q, k, v) = _attention()
        assert not np.allclose(_run(old, new), _reference(q, k, v), rtol=2e-2, atol=2e-2)
