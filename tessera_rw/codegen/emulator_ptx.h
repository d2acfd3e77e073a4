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
inline float fp8_to_f32(unsigned char v, bool e4m3) {
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
    const int e = (v & 0x7f) >> mbits, m = v & ((1 << mbits) - 1);
    const float sign = v & 0x80 ? -1.0f : 1.0f;
    if (e == emax && (!e4m3 || m == (1 << mbits) - 1))
        return e4m3 || m ? NAN : sign * INFINITY;
    const float frac = e ? 1.0f + (float)m / (1 << mbits) : (float)m / (1 << mbits);
    return sign * std::ldexp(frac, (e ? e : 1) - bias);
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
