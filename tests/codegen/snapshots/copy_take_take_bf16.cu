// take(bf16[50257,768], i32[8,1024]) -> bf16[8,1024,768]
// copy (take: runs of 768 read at 8192 indices of an axis of 50257, 1 outer), schedule threads=256 vec=8.
// launch: copy_take_1aa822ea<<<3072, 256>>>(in0, in1, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };
extern "C" __global__ void __launch_bounds__(256) copy_take_1aa822ea(const bf16_t* __restrict__ in0,
        const int* __restrict__ in1, bf16_t* __restrict__ out) {
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < 786432u; e += step) {
        const unsigned c = (e % 96u) * 8u, picked = e / 96u;
        const unsigned i = picked % 8192u, a = picked / 8192u;
        long long j = (long long)in1[i];
        if (j < 0) j += 50257LL;                         // counted from the end, as numpy does
        vec_t<bf16_t, 8> r;
        if (j >= 0 && j < 50257LL) {
            r = *reinterpret_cast<const vec_t<bf16_t, 8>*>(in0 + ((unsigned long long)a * 50257u + (unsigned long long)j) * 768u + c);
        } else {                                     // out of range: zeros
            #pragma unroll
            for (int k = 0; k < 8; ++k) r.v[k] = bf16_t();
        }
        *reinterpret_cast<vec_t<bf16_t, 8>*>(out + e * 8u) = r;
    }
}
