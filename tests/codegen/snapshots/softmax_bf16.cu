// softmax(bf16[8192,8192], axis=1) -> bf16[8192,8192]
// softmax over rows of 8192, 8192 rows; one block per row, resident (one read);
// schedule threads=512 vec=8 rows_per_block=1, 16 elements per thread.
// launch: softmax_softmax_dcf1bda7<<<8192, 512>>>(in0, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };
__device__ __forceinline__ float rowwise_block_sum(float x) {
    __shared__ float partial[16];
    x = warp_sum(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return warp_sum(threadIdx.x % 32u < 16u ? partial[threadIdx.x % 32u] : 0.0f);
}
__device__ __forceinline__ float rowwise_block_max(float x) {
    __shared__ float partial[16];
    x = warp_max(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return warp_max(threadIdx.x % 32u < 16u ? partial[threadIdx.x % 32u] : -__int_as_float(0x7f800000));
}
extern "C" __global__ void __launch_bounds__(512) softmax_softmax_dcf1bda7(const bf16_t* __restrict__ in0, bf16_t* __restrict__ out) {
    const unsigned row = blockIdx.x * 1u + threadIdx.x / 512u;
    const unsigned lane = threadIdx.x % 512u;
    float v[2][8];
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
        const unsigned c = (k * 512u + lane) * 8u;
        const vec_t<bf16_t, 8> p0 = *reinterpret_cast<const vec_t<bf16_t, 8>*>(in0 + (row) * 8192u + c);
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float x0 = bf16_to_f32(p0.v[j]);
            v[k][j] = x0;
        }
    }
    float m = -__int_as_float(0x7f800000);
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, v[k][j]);
    }
    m = rowwise_block_max(m);
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) { v[k][j] = expf(v[k][j] - m); s += v[k][j]; }
    }
    const float denom = rowwise_block_sum(s);
    const float inv = 1.0f / denom;
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
        const unsigned c = (k * 512u + lane) * 8u;
        vec_t<bf16_t, 8> o;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            float y = v[k][j] * inv;
            o.v[j] = f32_to_bf16((float)(y));
        }
        *reinterpret_cast<vec_t<bf16_t, 8>*>(out + (unsigned)row * 8192u + c) = o;
    }
}
