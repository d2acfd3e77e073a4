// sum(bf16[4096,4096], axes=(1,)) -> bf16[4096]
// reduction (row reduce) of 4096 elements into each of 4096 outputs,
// schedule threads=512 vec=8 split=512; accumulates in float.
// launch: reduction_sum_e56cf5ca<<<4096, 512>>>(x, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };

__device__ __forceinline__ float reduction_combine(float a, float b) { return a + b; }

extern "C" __global__ void __launch_bounds__(512) reduction_sum_e56cf5ca(const bf16_t* __restrict__ x, bf16_t* __restrict__ out) {
    const unsigned row = blockIdx.x * 1u + threadIdx.x / 512u;
    const unsigned lane = threadIdx.x % 512u;
    float acc = (float)0;
    if (row < 4096u) {
        const bf16_t* base = x + ((row) * 4096u);
        #pragma unroll 4
        for (unsigned r = lane * 8u; r < 4096u; r += 4096u) {
            const vec_t<bf16_t, 8> c = *reinterpret_cast<const vec_t<bf16_t, 8>*>(base + (r));
            #pragma unroll
            for (int j = 0; j < 8; ++j) acc = reduction_combine(acc, (float)bf16_to_f32(c.v[j]));
        }
    }
    for (int o = 16; o > 0; o >>= 1) acc = reduction_combine(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    __shared__ float partial[16];
    if (lane % 32u == 0) partial[lane / 32u] = acc;
    __syncthreads();
    if (lane >= 32u) return;
    acc = lane < 16u ? partial[lane] : (float)0;
    for (int o = 16; o > 0; o >>= 1) acc = reduction_combine(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0 && row < 4096u) out[row] = f32_to_bf16((float)(acc));
}
