// index_add(bf16[8,1024,768], i32[8,1024], size=50257) -> bf16[50257,768]
// index_add: 8192 slices of 768 summed into 50257 rows (1 outer), a block owning 8 rows,
// the hits taken in index order (the same order every run); schedule threads=256 vec=2 rows=8.
// launch: reduction_index_add_78eb470f<<<6283, 256>>>(in0, in1, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };
extern "C" __global__ void __launch_bounds__(256) reduction_index_add_78eb470f(const bf16_t* __restrict__ in0,
        const int* __restrict__ in1, bf16_t* __restrict__ out) {
    __shared__ int hits[256];                   // (thread of the chunk) * rows + row, in index order
    __shared__ int warp_start[9];
    const unsigned strip = blockIdx.x % 1u, rows_at = blockIdx.x / 1u;
    const unsigned a = rows_at / 6283u;
    const long long v0 = (long long)(rows_at % 6283u) * 8;
    const unsigned c0 = strip * 1024u;    // the block's strip of columns
    const unsigned lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    float acc[8][2][2];
    for (int q = 0; q < 8; ++q)
        for (int k = 0; k < 2; ++k)
            for (int j = 0; j < 2; ++j) acc[q][k][j] = 0.0f;
    for (unsigned base = 0; base < 8192u; base += 256u) {
        const unsigned i = base + threadIdx.x;
        int row = -1;
        if (i < 8192u) {
            long long at = (long long)in1[i];
            if (at < 0) at += 50257LL;                    // counted from the end; out of range: no row
            if (at >= v0 && at < v0 + 8 && at < 50257LL) row = (int)(at - v0);
        }
        unsigned before = row >= 0 ? 1u : 0u;         // inclusive scan of the hits over the warp
        #pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned y = __shfl_sync(0xffffffffu, before, lane >= (unsigned)d ? lane - d : lane);
            if (lane >= (unsigned)d) before += y;
        }
        if (lane == 31u) warp_start[warp] = (int)before;
        __syncthreads();
        if (threadIdx.x == 0) {
            int total = 0;
            for (int w = 0; w < 8; ++w) { const int c = warp_start[w]; warp_start[w] = total; total += c; }
            warp_start[8] = total;
        }
        __syncthreads();
        if (row >= 0) hits[warp_start[warp] + (int)before - 1] = (int)threadIdx.x * 8 + row;
        __syncthreads();
        const int found = warp_start[8];
        for (int h = 0; h < found; ++h) {
            const int hit = hits[h], row = hit % 8;
            const bf16_t* src = in0 + ((unsigned long long)a * 8192u + base + (unsigned)(hit / 8)) * 768u;
            #pragma unroll
            for (int k = 0; k < 2; ++k) {
                const unsigned c = c0 + (k * 256u + threadIdx.x) * 2u;
                if (c < 768u) {
                    const vec_t<bf16_t, 2> x = *reinterpret_cast<const vec_t<bf16_t, 2>*>(src + c);
                    #pragma unroll
                    for (int q = 0; q < 8; ++q)
                        if (q == row) { for (int j = 0; j < 2; ++j) acc[q][k][j] += bf16_to_f32(x.v[j]); }
                }
            }
        }
        __syncthreads();                              // the next chunk reuses hits and warp_start
    }
    #pragma unroll
    for (int q = 0; q < 8; ++q) {
        if (v0 + q >= 50257LL) break;
        bf16_t* dst = out + ((unsigned long long)a * 50257u + (unsigned long long)(v0 + q)) * 768u;
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            const unsigned c = c0 + (k * 256u + threadIdx.x) * 2u;
            if (c < 768u) {
                vec_t<bf16_t, 2> o;
                #pragma unroll
                for (int j = 0; j < 2; ++j) o.v[j] = f32_to_bf16((float)(acc[q][k][j]));
                *reinterpret_cast<vec_t<bf16_t, 2>*>(dst + c) = o;
            }
        }
    }
}
