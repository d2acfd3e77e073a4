// The prelude's PTX helpers (prelude.PTX_HELPERS) as the emulator runs them: the same names and
// signatures, the same rounding, the fragment layouts of the PTX ISA's mma.sync and ldmatrix.
// Included after emulator_runtime.h and the prelude's typedefs.
#pragma once

__device__ __forceinline__ bf16_t f32_to_bf16(float f) {          // round to nearest even
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    return (bf16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float f16_to_f32(f16_t h) { return (float)emu_bits<_Float16>(h); }
__device__ __forceinline__ f16_t f32_to_f16(float f) { return emu_bits<f16_t>((_Float16)f); }
__device__ __forceinline__ unsigned pack_bf16x2(float a, float b) {
    return (unsigned)f32_to_bf16(a) | ((unsigned)f32_to_bf16(b) << 16);
}
__device__ __forceinline__ unsigned pack_f16x2(float a, float b) {
    return (unsigned)f32_to_f16(a) | ((unsigned)f32_to_f16(b) << 16);
}
// cvt.rna.tf32.f32: 10 mantissa bits, to nearest, ties away from zero
__device__ __forceinline__ unsigned tf32_round(float x) {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;
    return (u + 0x1000u) & 0xffffe000u;
}
__device__ __forceinline__ float exp2_approx(float x) { return exp2f(x); }

namespace emu {

inline float half_of(unsigned word, int k, bool bf16) {
    const unsigned short h = (unsigned short)(word >> (16 * (k & 1)));
    return bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// m16n8k16, A row-major 16x16 in 4 registers, B column-major 16x8 in 2, C/D 16x8 in 4 floats:
// lane = 4g + t holds A(g|g+8, 2t..2t+1 | 2t+8..2t+9), B(2t..2t+1 | 2t+8..2t+9, g), D(g|g+8, 2t..2t+1).
inline void mma_16816(float* d, const unsigned* a, const unsigned* b, bool bf16) {
    Slot mine{};
    for (int i = 0; i < 4; ++i) mine.words[i] = a[i];
    for (int i = 0; i < 2; ++i) mine.words[4 + i] = b[i];
    const Slot* s = exchange(mine, MMA);
    const int g = lane() / 4, t = lane() % 4;
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; ++k) {
            const float x = half_of(s[(row % 8) * 4 + (k % 8) / 2].words[row / 8 + 2 * (k / 8)], k, bf16);
            const float y = half_of(s[col * 4 + (k % 8) / 2].words[4 + k / 8], k, bf16);
            acc += x * y;
        }
        d[e] = acc;
    }
}

// m16n8k8 tf32: lane = 4g + t holds A(g|g+8, t|t+4), B(t|t+4, g), D as m16n8k16's.
inline void mma_1688_tf32(float* d, const unsigned* a, const unsigned* b) {
    Slot mine{};
    for (int i = 0; i < 4; ++i) mine.words[i] = a[i];
    for (int i = 0; i < 2; ++i) mine.words[4 + i] = b[i];
    const Slot* s = exchange(mine, MMA);
    const int g = lane() / 4, t = lane() % 4;
    auto tf32 = [](unsigned w) { return __uint_as_float(w & 0xffffe000u); };
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 8; ++k)
            acc += tf32(s[(row % 8) * 4 + k % 4].words[row / 8 + 2 * (k / 4)]) * tf32(s[col * 4 + k % 4].words[4 + k / 4]);
        d[e] = acc;
    }
}

// fp8 values: e4m3 (the "fn" variant: no infinities, S.1111.111 is NaN) and e5m2 (IEEE-like)
inline float fp8_decode(unsigned char v, bool e4m3) {
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
    const int e = (v & 0x7f) >> mbits, m = v & ((1 << mbits) - 1);
    const float sign = v & 0x80 ? -1.0f : 1.0f;
    if (e == emax && (!e4m3 || m == (1 << mbits) - 1))
        return e4m3 || m ? NAN : sign * INFINITY;
    const float frac = e ? 1.0f + (float)m / (1 << mbits) : (float)m / (1 << mbits);
    return sign * std::ldexp(frac, (e ? e : 1) - bias);
}

// every byte's value, decoded once: the MMAs convert each operand they read
inline float fp8_to_f32(unsigned char v, bool e4m3) {
    struct Table {
        float values[2][256];
        Table() {
            for (int i = 0; i < 256; ++i)
                for (int kind = 0; kind < 2; ++kind) values[kind][i] = fp8_decode((unsigned char)i, kind == 1);
        }
    };
    static const Table table;
    return table.values[e4m3][v];
}

// m16n8k32 fp8: the byte layout of m16n8k16's 16-bit one, four values to a register: lane = 4g + t
// holds A(g|g+8, 4t..4t+3 | 4t+16..4t+19), B(4t..4t+3 | 4t+16..4t+19, g), D as m16n8k16's.
inline void mma_16832_fp8(float* d, const unsigned* a, const unsigned* b, bool e4m3) {
    Slot mine{};
    for (int i = 0; i < 4; ++i) mine.words[i] = a[i];
    for (int i = 0; i < 2; ++i) mine.words[4 + i] = b[i];
    const Slot* s = exchange(mine, MMA);
    const int g = lane() / 4, t = lane() % 4;
    auto byte = [](unsigned word, int k) { return (unsigned char)(word >> (8 * (k & 3))); };
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 32; ++k) {
            const float x = fp8_to_f32(byte(s[(row % 8) * 4 + (k % 16) / 4].words[row / 8 + 2 * (k / 16)], k), e4m3);
            const float y = fp8_to_f32(byte(s[col * 4 + (k % 16) / 4].words[4 + k / 16], k), e4m3);
            acc += x * y;
        }
        d[e] = acc;
    }
}

inline void require_aligned(const void* p, const char* what) {
    if ((uintptr_t)p % 16) fail(what);
}

// ldmatrix: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; lane 4g + t receives row g,
// columns 2t..2t+1 of each matrix (transposed: rows 2t..2t+1 of column g). The first lane to go on
// reads for the whole warp, so shared memory is read as the instruction reads it: all at once,
// before any lane's next store.
inline void ldmatrix(unsigned* r, const void* p, int matrices, bool transposed) {
    if (lane() < 8 * matrices) require_aligned(p, "ldmatrix: a row address is not 16-byte aligned");
    Slot mine{};
    mine.pointer = p;
    bool first = false;
    Slot* s = exchange(mine, LDMATRIX, &first);
    if (first) {
        unsigned loaded[32][4];
        for (int l = 0; l < 32; ++l) {
            const int g = l / 4, t = l % 4;
            for (int i = 0; i < matrices; ++i) {
                unsigned lo, hi;
                if (!transposed) {
                    const unsigned short* row = (const unsigned short*)s[i * 8 + g].pointer;
                    lo = row[2 * t];
                    hi = row[2 * t + 1];
                } else {
                    lo = ((const unsigned short*)s[i * 8 + 2 * t].pointer)[g];
                    hi = ((const unsigned short*)s[i * 8 + 2 * t + 1].pointer)[g];
                }
                loaded[l][i] = lo | (hi << 16);
            }
        }
        for (int l = 0; l < 32; ++l)
            for (int i = 0; i < matrices; ++i) s[l].words[i] = loaded[l][i];
    }
    for (int i = 0; i < matrices; ++i) r[i] = s[lane()].words[i];
}

}  // namespace emu

__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b) { emu::mma_16816(d, a, b, true); }
__device__ __forceinline__ void mma_f16_16816(float* d, const unsigned* a, const unsigned* b) { emu::mma_16816(d, a, b, false); }
__device__ __forceinline__ void mma_e4m3_16832(float* d, const unsigned* a, const unsigned* b) { emu::mma_16832_fp8(d, a, b, true); }
__device__ __forceinline__ void mma_e5m2_16832(float* d, const unsigned* a, const unsigned* b) { emu::mma_16832_fp8(d, a, b, false); }
__device__ __forceinline__ void mma_tf32_1688(float* d, const unsigned* a, const unsigned* b) { emu::mma_1688_tf32(d, a, b); }
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) { emu::ldmatrix(r, p, 4, false); }
__device__ __forceinline__ void ldmatrix_x2(unsigned* r, const void* p) { emu::ldmatrix(r, p, 2, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) { emu::ldmatrix(r, p, 4, true); }
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned* r, const void* p) { emu::ldmatrix(r, p, 2, true); }

// the source is read when the copy is issued (global memory does not change during a kernel);
// shared memory is written when cp_async_wait retires the copy's group
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int valid) {
    if (valid < 0 || valid > 16) emu::fail("cp.async: the source size is not in 0..16");
    emu::require_aligned(dst, "cp.async: the shared address is not 16-byte aligned");
    const long at = emu::dynamic_smem_offset(dst);
    if (at >= 0 && emu::block().async_reads[at / 16])
        emu::fail("cp.async: writes shared memory that an issued wgmma still reads (retire it with wgmma.wait_group first)");
    if (valid) emu::require_aligned(src, "cp.async: the global address is not 16-byte aligned");
    emu::Copy c{dst, {}};
    if (valid) std::memcpy(c.bytes, src, valid);
    emu::self().open_group.push_back(c);
}
__device__ __forceinline__ void cp_async_commit() {
    emu::Thread& t = emu::self();
    t.groups.push_back(std::move(t.open_group));
    t.open_group.clear();
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    emu::Thread& t = emu::self();
    while (t.groups.size() > N) {
        emu::apply(t.groups.front());
        t.groups.erase(t.groups.begin());
    }
}

// ---- sm_90a: shared-window addresses, warpgroup MMAs (prelude.HOPPER_HELPERS) ----
namespace emu {

// The shared-window address of dynamic shared memory's first byte: 16-byte aligned and no more,
// as a block's dynamic shared memory starts after its static memory and a reserved kilobyte, so
// a kernel that needs a 1024-byte aligned tile (128-byte swizzled wgmma operands) must align it.
constexpr unsigned DYNAMIC_SMEM_WINDOW = 0x410;

inline unsigned shared_address(const void* p) {
    const long offset = dynamic_smem_offset(p);
    if (offset < 0)
        fail("smem_addr: not an address in dynamic shared memory (the only shared memory the emulator maps to addresses)");
    return DYNAMIC_SMEM_WINDOW + (unsigned)offset;
}

inline const unsigned char* shared_pointer(unsigned address, int bytes) {
    if (address < DYNAMIC_SMEM_WINDOW || address + bytes > DYNAMIC_SMEM_WINDOW + dynamic_smem_bytes())
        fail("wgmma or TMA: an access reaches outside the block's dynamic shared memory");
    return dynamic_smem_arena() + (address - DYNAMIC_SMEM_WINDOW);
}

// The shared address of element (mn, k) of a wgmma operand described by `desc` (PTX ISA, "Shared
// Memory Matrix Layout" and "Matrix Descriptor Format"): start address, leading and stride byte
// offsets in 16-byte units, swizzle mode in bits 62-63. The canonical 128-byte swizzled layouts,
// in elements of `es` bytes, t = 16 / es of them to a 16-byte chunk:
//   K-major:  ((8, m), (t, 2k)) : ((128 B, SBO), (es, 16 B))      rows of 128 bytes, 8 to an atom
//   MN-major: ((t, 8, m), (8, k)) : ((es, 16 B, LBO), (128 B, SBO))  128 bytes of M/N per k-row
// then the swizzle: address bits 4-6 (the 16-byte chunk) XOR bits 7-9 (the row within its
// 1024-byte atom), on the absolute address, so a start address advanced along k stays in step.
inline unsigned operand_address(unsigned long long desc, bool mn_major, int es, int mn, int k) {
    if ((desc >> 62) != 1 || ((desc >> 49) & 7))
        fail("wgmma: the emulator reads 128-byte swizzled operands with base offset 0 only");
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4, lbo = (unsigned)((desc >> 16) & 0x3FFF) << 4,
                   sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    const int t = 16 / es;
    const unsigned offset = mn_major
        ? (mn % t) * es + (mn / t % 8) * 16 + (mn / (8 * t)) * lbo + (k % 8) * 128 + (k / 8) * sbo
        : (mn % 8) * 128 + (mn / 8) * sbo + (k / t) * 16 + (k % t) * es;
    const unsigned address = start + offset;
    return address ^ (((address >> 7) & 7) << 4);
}

enum WgmmaKind { WGMMA_BF16, WGMMA_F16, WGMMA_E4M3, WGMMA_E5M2 };

inline float wgmma_value(const unsigned char* p, WgmmaKind kind) {
    switch (kind) {
        case WGMMA_BF16: return bf16_to_f32(*(const unsigned short*)p);
        case WGMMA_F16: return f16_to_f32(*(const unsigned short*)p);
        case WGMMA_E4M3: return fp8_to_f32(*p, true);
        default: return fp8_to_f32(*p, false);
    }
}

// wgmma.mma_async m64nNkK: this thread's share of D (64 x n) += A (64 x k) B (k x n), the
// accumulator layout of the PTX ISA's figure: warp w of the warpgroup holds rows 16w..16w+15;
// lane 4g + t holds d[4j + e] = D(16w + g + 8 (e / 2), 8j + 2t + e % 2). The operands are read
// when the instruction issues and the product lands in d when wgmma.wait_group retires its group,
// reading the same shared bytes again: a kernel that changes them in between (a tile written after
// it was issued), or issues a cp.async into them (a stage refilled too early: the copy may land at
// once on the device), stops with a message; one that reads its accumulators before the wait reads
// their old values. `a_rows` holds A's rows 16w + g and 16w + g + 8 (k values each) when A comes
// from registers; empty, A is read from shared memory through `a_desc`.
inline void wgmma_issue(float* d, const std::vector<float>& a_rows, unsigned long long a_desc,
                        unsigned long long b_desc, int n, int k, WgmmaKind kind, bool a_mn_major, bool b_mn_major) {
    if (blockDim.x % 128) fail("wgmma: the block is not made of whole 128-thread warpgroups");
    const int es = kind == WGMMA_BF16 || kind == WGMMA_F16 ? 2 : 1;
    const int w = warp() % 4, g = lane() / 4, t = lane() % 4;
    const bool a_shared = a_rows.empty();
    const size_t b_first = a_shared ? 2 * k : 0;
    // A (from shared memory): rows r0, r0 + 8 by k; then B: k by this thread's 2n/8 columns
    std::vector<unsigned> offsets;        // into dynamic shared memory
    offsets.reserve(b_first + (size_t)k * (n / 4));
    for (int h = 0; h < 2 && a_shared; ++h)
        for (int kk = 0; kk < k; ++kk) offsets.push_back(operand_address(a_desc, a_mn_major, es, 16 * w + g + 8 * h, kk));
    for (int kk = 0; kk < k; ++kk)
        for (int c = 0; c < n / 4; ++c)
            offsets.push_back(operand_address(b_desc, b_mn_major, es, 8 * (c / 2) + 2 * t + c % 2, kk));
    for (unsigned& o : offsets) o = (unsigned)(shared_pointer(o, es) - dynamic_smem_arena());
    // the bytes as issued; their 16-byte pieces are counted as read (once per element: the counts
    // only say whether a piece is read), so no cp.async writes them until the wgmma retires
    std::vector<unsigned char> issued(offsets.size() * es);
    const unsigned char* smem = dynamic_smem_arena();
    std::vector<int>& reads = block().async_reads;
    for (size_t i = 0; i < offsets.size(); ++i) {
        if (block().landing_writes[offsets[i] / 16])
            fail("wgmma: reads shared memory that a TMA copy has yet to land in (wait on the copy's mbarrier first)");
        for (int byte = 0; byte < es; ++byte) issued[i * es + byte] = smem[offsets[i] + byte];
        ++reads[offsets[i] / 16];
    }
    self().open_mmas.push_back([=, offsets = std::move(offsets), issued = std::move(issued)]() {
        const unsigned char* now = dynamic_smem_arena();
        std::vector<int>& reads = block().async_reads;
        for (size_t i = 0; i < offsets.size(); ++i) {
            for (int byte = 0; byte < es; ++byte)
                if (issued[i * es + byte] != now[offsets[i] + byte])
                    fail("wgmma: shared memory an issued wgmma reads changed before wgmma.wait_group retired it");
            --reads[offsets[i] / 16];
        }
        std::vector<float> a(a_shared ? 2 * k : 0), b((size_t)k * (n / 4));      // b by column, then k
        for (size_t i = 0; i < a.size(); ++i) a[i] = wgmma_value(&issued[i * es], kind);
        for (int kk = 0; kk < k; ++kk)
            for (int c = 0; c < n / 4; ++c) b[c * k + kk] = wgmma_value(&issued[(b_first + kk * (n / 4) + c) * es], kind);
        const float* a_values = a_shared ? a.data() : a_rows.data();
        for (int e = 0; e < n / 2; ++e) {
            const int h = (e % 4) / 2, c = 2 * (e / 4) + e % 2;
            const float *row = &a_values[h * k], *column = &b[c * k];
            float acc = d[e];
            for (int kk = 0; kk < k; ++kk) acc += row[kk] * column[kk];
            d[e] = acc;
        }
    });
}

inline void wgmma(float* d, unsigned long long a_desc, unsigned long long b_desc, int n, int k, WgmmaKind kind,
                  bool a_mn_major, bool b_mn_major) {
    wgmma_issue(d, {}, a_desc, b_desc, n, k, kind, a_mn_major, b_mn_major);
}

// wgmma with A (64 x 16, 16-bit values) from registers: lane 4g + t of warp w holds a[0] = A(16w + g,
// 2t..2t+1), a[1] = A(16w + g + 8, 2t..2t+1), a[2] and a[3] the same rows at columns 8 + 2t..9 + 2t,
// two values to a register, the lower column in the low half. The warp's lanes publish their
// registers; each reads its two rows from the quad that holds them.
inline void wgmma_rs(float* d, const unsigned* a, unsigned long long b_desc, int n, WgmmaKind kind, bool b_mn_major) {
    Slot mine{};
    for (int i = 0; i < 4; ++i) mine.words[i] = a[i];
    const Slot* s = exchange(mine, MMA);
    const int g = lane() / 4;
    std::vector<float> rows(2 * 16);
    for (int h = 0; h < 2; ++h)
        for (int kk = 0; kk < 16; ++kk) {
            const unsigned word = s[4 * g + (kk % 8) / 2].words[2 * (kk / 8) + h];
            const unsigned short half = (unsigned short)(kk % 2 ? word >> 16 : word & 0xFFFF);
            rows[h * 16 + kk] = kind == WGMMA_BF16 ? bf16_to_f32(half) : f16_to_f32(half);
        }
    wgmma_issue(d, rows, 0, b_desc, n, 16, kind, false, b_mn_major);
}

}  // namespace emu

__device__ __forceinline__ unsigned smem_addr(const void* p) { return emu::shared_address(p); }
__device__ __forceinline__ void wgmma_fence() {}
template <int N> __device__ __forceinline__ void wgmma_hold(float*) {}
template <int N> __device__ __forceinline__ void wgmma_hold(unsigned*) {}
__device__ __forceinline__ void fence_proxy_async() {}
__device__ __forceinline__ void wgmma_commit() {
    emu::Thread& t = emu::self();
    t.mma_groups.push_back(std::move(t.open_mmas));
    t.open_mmas.clear();
}
// wgmma.wait_group.sync.aligned: the warp's lanes wait together (a warp collective), so no lane
// goes past it, to hand a stage back say, while another lane's wgmmas on that stage are in flight
template <int N> __device__ __forceinline__ void wgmma_wait() {
    emu::exchange(emu::Slot{}, emu::WGMMA_WAIT);
    emu::Thread& t = emu::self();
    while (t.mma_groups.size() > N) {
        for (auto& retire : t.mma_groups.front()) retire();
        t.mma_groups.erase(t.mma_groups.begin());
    }
}

// ---- sm_90a: mbarriers and TMA tensor copies ----

// A tensor map as the emulator encodes it (the device's is 128 opaque bytes the driver writes):
// the tensor's base, rank, extents (innermost first), byte strides of dims 1.., box, element size
// and swizzle span in bytes (0: none).
struct TmaMap {
    const unsigned char* base;
    int rank, element_bytes, swizzle;
    long long dims[5], strides[5];
    int box[5];
};

namespace emu {

// The map of one tensor from its command-line spec over the mapped argument files (or an error).
const char* tensor_map(const char* spec, const std::vector<void*>& pointers, const std::vector<size_t>& sizes,
                       TmaMap* map);   // in emulator_runtime.cpp

inline Mbarrier& mbarrier(const void* bar) {
    auto found = block().mbarriers.find(bar);
    if (found == block().mbarriers.end())
        fail("mbarrier: used before mbarrier.init (or before the __syncthreads that makes its init visible)");
    return found->second;
}

// the phase completes when its arrivals are in and its transaction bytes have all landed
inline void mbarrier_settle(Mbarrier& m) {
    ++block().progress;
    if (m.pending == 0 && m.tx == 0) {
        ++m.phase;
        m.pending = m.count;
    }
}

inline void mbarrier_arrive(const void* bar, long long expect_tx) {
    Mbarrier& m = mbarrier(bar);
    if (m.pending == 0) fail("mbarrier: more arrivals in one phase than its count");
    m.tx += expect_tx;
    --m.pending;
    mbarrier_settle(m);
}

// The index of the 16-byte piece of dynamic shared memory holding `address`.
inline size_t first_piece(unsigned address) { return (address - DYNAMIC_SMEM_WINDOW) / 16; }

// Shared bytes [address, address + n) that an issued wgmma still reads stop the run: a stage
// refilled before its MMAs retired.
inline void check_not_read_async(unsigned address, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        if (block().async_reads[first_piece(address) + i / 16])
            fail("TMA: writes shared memory that an issued wgmma still reads (retire it with wgmma.wait_group, "
                 "then release the stage, before refilling it)");
}

// The copies complete on `m` in the phases that have completed land in shared memory: a wait has
// seen their phase complete.
inline void land(Mbarrier& m) {
    std::vector<Landing> later;
    for (Landing& l : m.landing) {
        if (l.phase >= m.phase) {
            later.push_back(std::move(l));
            continue;
        }
        check_not_read_async(l.address, l.bytes.size());
        std::memcpy(const_cast<unsigned char*>(shared_pointer(l.address, l.bytes.size())), l.bytes.data(), l.bytes.size());
        for (size_t i = 0; i < l.bytes.size(); i += 16) --block().landing_writes[first_piece(l.address) + i / 16];
    }
    m.landing = std::move(later);
}

// A TMA tile load: the box at `coords` (innermost first) is read from global memory now, elements
// outside the tensor as zeros, and its bytes complete as transactions on `bar`; it lands in shared
// memory at `dst`, each 16-byte chunk at its address XOR the swizzle, when a wait on `bar` sees the
// phase complete (so a tile read without that wait is stale). The hardware may write it any time
// after the issue: a copy into bytes an issued wgmma still reads stops the run.
inline void tma_load(void* dst, const TmaMap* map, const int* coords, int rank, const void* bar) {
    if (map->rank != rank) fail("TMA: the copy's rank differs from its tensor map's");
    const unsigned at = shared_address(dst);
    if (at % 128) fail("TMA: the shared destination is not 128-byte aligned");
    const int es = map->element_bytes;
    long long elements = 1;
    for (int d = 0; d < rank; ++d) elements *= map->box[d];
    const size_t total = (size_t)(elements * es);
    Landing copy{at, std::vector<unsigned char>(total), 0};
    for (long long i = 0; i < elements; ++i) {
        long long rest = i, offset = 0;
        bool inside = true;
        for (int d = 0; d < rank; ++d) {
            const long long c = coords[d] + rest % map->box[d];
            rest /= map->box[d];
            inside &= c >= 0 && c < map->dims[d];
            offset += c * map->strides[d];
        }
        unsigned address = at + (unsigned)(i * es);
        if (map->swizzle == 128) address ^= ((address >> 7) & 7) << 4;
        shared_pointer(address, es);                     // inside the block's shared memory
        unsigned char* to = copy.bytes.data() + (address - at);
        if (inside) std::memcpy(to, map->base + offset, es);
        else std::memset(to, 0, es);
    }
    check_not_read_async(at, total);
    for (size_t i = 0; i < total; i += 16)
        if (block().landing_writes[first_piece(at) + i / 16]++)
            fail("TMA: a copy into shared memory that another copy has yet to land in (wait on the first one's "
                 "mbarrier before the stage is refilled)");
    Mbarrier& m = mbarrier(bar);
    copy.phase = m.phase;
    m.landing.push_back(std::move(copy));
    m.tx -= (long long)total;
    mbarrier_settle(m);
}

}  // namespace emu

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned arrivals) {
    if (!arrivals) emu::fail("mbarrier.init: a barrier needs at least one arrival");
    emu::shared_address(bar);
    emu::block().mbarriers[bar] = emu::Mbarrier{(int)arrivals, (int)arrivals, 0, 0};
    ++emu::block().progress;
}
__device__ __forceinline__ void fence_mbarrier_init() {}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
}
// A consumer's arrival hands a stage back: the arriving thread steps aside (it runs again after the
// threads the arrival wakes) so a producer waiting for the stage refills it now, before the
// arriving warp goes on. A stage handed back before its wgmmas retire is then refilled while they still read it,
// which the TMA copy reports; otherwise the warp would reach its wgmma.wait_group first, and the
// early hand-back would go unseen.
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    emu::mbarrier_arrive(bar, 0);
    emu::yield(emu::STEPPED_ASIDE);
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    emu::mbarrier_arrive(bar, bytes);
}
// try_wait.parity: true once the phase of that parity has completed, i.e. the current phase's
// parity differs, and then the copies complete on it have landed; a thread told no yields, to be
// polled again after the others have run
__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, unsigned parity) {
    emu::Mbarrier& m = emu::mbarrier(bar);
    if ((m.phase & 1) != (parity & 1)) {
        emu::land(m);
        ++emu::block().progress;
        return true;
    }
    emu::yield(emu::POLLING);
    return false;
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    while (!mbar_try_wait(bar, parity)) {}
}
namespace emu {

// Named barrier `id` of `threads` arrivals a generation (bar.sync / bar.arrive id, threads).
inline Mbarrier& named_barrier(int id, int threads) {
    if (id < 1 || id > 15) fail("bar: a named barrier's id is 1..15 (0 is __syncthreads')");
    if (threads <= 0 || threads % 32) fail("bar: a named barrier's thread count is a positive multiple of 32");
    Mbarrier& b = block().named_barriers.try_emplace(id, Mbarrier{threads, threads, 0, 0}).first->second;
    if (b.count != threads) fail("bar: one named barrier used with two thread counts");
    return b;
}

// One arrival; the last of a generation opens it. The generation arrived in.
inline unsigned named_arrive(Mbarrier& b) {
    const unsigned generation = b.phase;
    ++block().progress;
    if (--b.pending == 0) {
        b.pending = b.count;
        ++b.phase;
    }
    return generation;
}

}  // namespace emu

// bar.sync id, threads: arrive, and poll until the generation's last arrival has opened it
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    emu::Mbarrier& b = emu::named_barrier(id, threads);
    const unsigned generation = emu::named_arrive(b);
    while (b.phase == generation) emu::yield(emu::POLLING);
}
// bar.arrive id, threads: arrive and go on
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    emu::named_arrive(emu::named_barrier(id, threads));
}
__device__ __forceinline__ void warpgroup_sync(int id) { named_barrier_sync(id, 128); }
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaMap* map, int c0, int c1, unsigned long long* bar) {
    const int coords[] = {c0, c1};
    emu::tma_load(dst, map, coords, 2, bar);
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaMap* map, int c0, int c1, int c2, unsigned long long* bar) {
    const int coords[] = {c0, c1, c2};
    emu::tma_load(dst, map, coords, 3, bar);
}
