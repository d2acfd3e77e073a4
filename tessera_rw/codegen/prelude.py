"""The device helpers every generated kernel starts with: self-contained, no CUDA headers.

Generated sources include nothing, so NVRTC compiles them on any machine with only the NVRTC
wheel installed. bf16 and fp16 travel as 16-bit integers and convert through PTX; tensor-core
products, ldmatrix and cp.async are spelled as the PTX instructions they are.
"""

from __future__ import annotations

TYPES = r"""
typedef unsigned short bf16_t;
typedef unsigned short f16_t;
typedef unsigned char fp8_t;
"""

# Helpers written in plain CUDA C++ (the CPU emulator compiles them as they are).
PORTABLE_HELPERS = r"""
__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((unsigned)h) << 16); }
// fp8 widened to fp32 exactly, in plain arithmetic (sm_80 has no fp8 conversion instruction):
// e4m3 (bias 7, no infinities, S.1111.111 is NaN) and e5m2 (bias 15, IEEE-like infinities and NaNs)
__device__ __forceinline__ float e4m3_to_f32(fp8_t x) {
    const unsigned e = (x >> 3) & 0xFu, m = x & 7u;
    float mag = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    if (e == 15u && m == 7u) mag = __uint_as_float(0x7fc00000u);
    return (x & 0x80u) ? -mag : mag;
}
__device__ __forceinline__ float e5m2_to_f32(fp8_t x) {
    const unsigned e = (x >> 2) & 0x1Fu, m = x & 3u;
    const float mag = e == 0u ? (float)m * 1.52587890625e-05f
                    : e == 31u ? __uint_as_float(m ? 0x7fc00000u : 0x7f800000u)
                    : __uint_as_float(((e + 112u) << 23) | (m << 21));
    return (x & 0x80u) ? -mag : mag;
}

// an integer power as torch computes it: exact by squaring, wrapping as the narrower result type
// does (in unsigned arithmetic, where wrapping is defined); a negative exponent gives 0, or ±1 for
// a base of ±1
__device__ __forceinline__ long long ipow(long long x, long long n) {
    if (n < 0) return x == 1 ? 1 : x == -1 ? ((n & 1) ? -1 : 1) : 0;
    unsigned long long r = 1, b = (unsigned long long)x;
    for (; n; n >>= 1, b *= b)
        if (n & 1) r *= b;
    return (long long)r;
}

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// dst[0..3] += v in global memory (dst 16-byte aligned), as one vector reduction where the device
// has one (sm_90's float4 atomicAdd), else as four; the sums' order depends on timing: `fast`
// kernels only
__device__ __forceinline__ void atomic_add_f32x4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd((float4*)dst, v);
#else
    atomicAdd(dst, v.x);
    atomicAdd(dst + 1, v.y);
    atomicAdd(dst + 2, v.z);
    atomicAdd(dst + 3, v.w);
#endif
}
"""

# Helpers spelled as PTX instructions; codegen/emulator_ptx.h defines each again for the CPU emulator.
PTX_HELPERS = r"""
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float f16_to_f32(f16_t h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ f16_t f32_to_f16(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// two fp32 values packed as a bf16x2 register (low half = a), the layout mma.sync expects
__device__ __forceinline__ unsigned pack_bf16x2(float a, float b) {
    unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a)); return r;
}
__device__ __forceinline__ unsigned pack_f16x2(float a, float b) {
    unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a)); return r;
}
// cvt.rna.tf32.f32: an fp32 value rounded to tf32's 10 mantissa bits (to nearest, ties away), as mma expects
__device__ __forceinline__ unsigned tf32_round(float x) {
    unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
// 2^x by the special function unit (ex2.approx, flushing subnormals)
__device__ __forceinline__ float exp2_approx(float x) {
    float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}

"""


def _mma(name: str, shape: str, kind: str, what: str) -> str:
    """A helper issuing one mma.sync of `shape` on `kind` operands: D = A B + C in four fp32
    accumulators, A in four registers and B in two, laid out as the PTX ISA's figures for `shape`."""
    return (f"// {what}\n"
            f"__device__ __forceinline__ void {name}(float* d, const unsigned* a, const unsigned* b) {{\n"
            f'    asm volatile("mma.sync.aligned.{shape}.row.col.f32.{kind}.{kind}.f32 "\n'
            '                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"\n'
            '                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
            '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));\n}\n')


PTX_HELPERS += "".join((
    _mma("mma_bf16_16816", "m16n8k16", "bf16", "D = A(16x16, row) * B(16x8, col) + C, bf16 inputs (sm_80+)"),
    _mma("mma_f16_16816", "m16n8k16", "f16", "the same, fp16 inputs"),
    _mma("mma_tf32_1688", "m16n8k8", "tf32", "D = A(16x8, row) * B(8x8, col) + C, tf32 inputs (fp32 bit patterns)"),
    _mma("mma_e4m3_16832", "m16n8k32", "e4m3", "D = A(16x32, row) * B(32x8, col) + C, fp8 inputs four to a register (sm_89+)"),
    _mma("mma_e5m2_16832", "m16n8k32", "e5m2", "the same, e5m2 inputs"),
))

PTX_HELPERS += r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}

// 16-byte global -> shared copy that bypasses registers; bytes beyond `valid` are zero-filled
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(valid));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
"""

PRELUDE = TYPES + PORTABLE_HELPERS + PTX_HELPERS


# Warpgroup MMAs (wgmma, sm_90a): D(64 x N) += A(64 x K) B(K x N), both operands read from shared
# memory through 64-bit matrix descriptors (or, in the `_rs` helpers, A from registers), N/2 fp32
# accumulators per thread of the 128-thread warpgroup. One helper per (N, operand kind) a kernel
# may issue; 16-bit operands take their major-ness as template arguments (TA: A stored M-major,
# TB: B stored N-major), fp8 ones are always K-major. Kernels that use them are compiled for
# sm_90a (KernelSource.target).
HOPPER_TARGET = "sm_90a"
WGMMA_WIDTHS = (32, 64, 128, 256)
WGMMA_KINDS = {"bf16": 16, "f16": 16, "e4m3": 32, "e5m2": 32}      # operand kind: the instruction's k


def wgmma_name(n: int, kind: str) -> str:
    """The helper issuing one m64 x n wgmma on `kind` operands: 'wgmma_m64n128k16_bf16'."""
    return f"wgmma_m64n{n}k{WGMMA_KINDS[kind]}_{kind}"


def _wgmma(n: int, kind: str) -> str:
    regs = n // 2
    ops = ", ".join(f"%{i}" for i in range(regs))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    transposes = ", %{}, %{}".format(regs + 2, regs + 3) if WGMMA_KINDS[kind] == 16 else ""
    immediates = ', "n"(TA), "n"(TB)' if transposes else ""
    check = "" if transposes else '    static_assert(TA == 0 && TB == 0, "fp8 wgmma operands are K-major");\n'
    return (f"template <int TA, int TB> __device__ __forceinline__ void {wgmma_name(n, kind)}("
            f"float* d, unsigned long long a, unsigned long long b) {{\n{check}"
            f'    asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k{WGMMA_KINDS[kind]}.f32.{kind}.{kind} "\n'
            f'                 "{{{ops}}}, %{regs}, %{regs + 1}, 1, 1, 1{transposes};"\n'
            f"                 : {outputs}\n"
            f'                 : "l"(a), "l"(b){immediates});\n}}\n')


def wgmma_rs_name(n: int, kind: str) -> str:
    """The helper issuing one m64 x n wgmma whose A comes from registers: 'wgmma_rs_m64n64k16_bf16'."""
    return f"wgmma_rs_m64n{n}k16_{kind}"


def _wgmma_rs(n: int, kind: str) -> str:
    # A (64 x 16) from registers, four 32-bit pairs per thread laid out as an m64n16 accumulator:
    # a[0] = (row g, columns 2t, 2t+1), a[1] = row g + 8, a[2] and a[3] the same 8 columns on
    regs = n // 2
    ops = ", ".join(f"%{i}" for i in range(regs))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))
    return (f"template <int TB> __device__ __forceinline__ void {wgmma_rs_name(n, kind)}("
            f"float* d, const unsigned* a, unsigned long long b) {{\n"
            f'    asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "\n'
            f'                 "{{{ops}}}, {{{a}}}, %{regs + 4}, 1, 1, 1, %{regs + 5};"\n'
            f"                 : {outputs}\n"
            f'                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TB));\n}}\n')


RS_KINDS = ("bf16", "f16")             # register-A wgmmas: 16-bit operands


# The operands' shared layout: rows of 128 bytes whose 16-byte chunks are XOR-swizzled by row, in
# atoms of 8 rows (1024 bytes) to which every tile is aligned
ROW_BYTES, ATOM_BYTES = 128, 1024

# the device code and the emulator both build descriptors with this
WGMMA_DESCRIPTOR = r"""
// the matrix descriptor of a wgmma operand: its 128-byte swizzled tile's start address (1024-byte
// atoms), leading and stride byte offsets (encoded in 16-byte units)
__device__ __forceinline__ unsigned long long wgmma_desc(const void* tile, unsigned leading, unsigned stride) {
    return (unsigned long long)((smem_addr(tile) & 0x3FFFFu) >> 4) | ((unsigned long long)(leading >> 4) << 16)
         | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
"""


HOPPER_HELPERS = WGMMA_DESCRIPTOR + r"""
// wgmma.fence: the accumulators' prior writes are ordered before the next wgmma that reads them
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// wait until at most N committed wgmma groups of this warpgroup are pending
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// an empty asm reading and writing each of N accumulators: the compiler moves none of their uses
// across it (the registers of an issued wgmma hold their result only after wgmma.wait_group)
template <int N> __device__ __forceinline__ void wgmma_hold(float* d) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// ... and of N registers an issued wgmma reads as its A operand: held until after wgmma.wait_group,
// no other value takes them while the tensor cores may still read them
template <int N> __device__ __forceinline__ void wgmma_hold(unsigned* a) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i]) :: "memory");
}
// shared memory written through the generic proxy (stores, cp.async) made visible to the async
// proxy that wgmma reads it through
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A TMA tensor map (CUtensorMap): 128 opaque bytes the host encodes (cuTensorMapEncodeTiled) and
// passes by value as a __grid_constant__ kernel parameter
struct __align__(64) TmaMap { unsigned long long opaque[16]; };
// mbarriers: 8 bytes of shared memory counting arrivals and transaction bytes per phase
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// the barriers' initialization made visible to the async proxy (the TMA unit completes on them)
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_addr(bar)) : "memory");
}
// arrive, and expect `bytes` more of transactions (TMA copies) before the phase completes
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// whether the phase of parity `parity` has completed (waits a while in hardware before saying no)
__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, unsigned parity) {
    unsigned done;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    return done;
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    while (!mbar_try_wait(bar, parity)) {}
}
// the warpgroup's registers per thread, lowered (a producer's) or raised (a consumer's) to N:
// every thread of the warpgroup executes it, N a multiple of 8 in 24..256
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
// a barrier among the 128 threads of one warpgroup (`id` 1..15; 0 is __syncthreads')
__device__ __forceinline__ void warpgroup_sync(int id) { asm volatile("bar.sync %0, 128;" :: "r"(id) : "memory"); }
// named barrier `id` of `threads` arrivals (a multiple of 32): wait for the generation to open,
// or arrive and go on
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
// one TMA box from global memory into shared memory at `dst`, coordinates innermost first;
// its bytes count as transactions on `bar`
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaMap* map, int c0, int c1, unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(smem_addr(dst)), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaMap* map, int c0, int c1, int c2, unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 :: "r"(smem_addr(dst)), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
                 : "memory");
}
""" + "".join(_wgmma(n, kind) for kind in WGMMA_KINDS for n in WGMMA_WIDTHS) \
  + "".join(_wgmma_rs(n, kind) for kind in RS_KINDS for n in WGMMA_WIDTHS)


def emulated_wgmma_helpers() -> str:
    """The wgmma helpers as the CPU emulator defines them (emulator_ptx.h's emu::wgmma), one per
    helper of HOPPER_HELPERS."""
    return WGMMA_DESCRIPTOR + "".join(
        f"template <int TA, int TB> inline void {wgmma_name(n, kind)}(float* d, unsigned long long a, "
        f"unsigned long long b) {{ emu::wgmma(d, a, b, {n}, {WGMMA_KINDS[kind]}, emu::WGMMA_{kind.upper()}, "
        f"TA, TB); }}\n"
        for kind in WGMMA_KINDS for n in WGMMA_WIDTHS) + "".join(
        f"template <int TB> inline void {wgmma_rs_name(n, kind)}(float* d, const unsigned* a, "
        f"unsigned long long b) {{ emu::wgmma_rs(d, a, b, {n}, emu::WGMMA_{kind.upper()}, TB); }}\n"
        for kind in RS_KINDS for n in WGMMA_WIDTHS)
