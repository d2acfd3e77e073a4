// logsumexp(bf16[4096,32000], axes=(1,)) -> bf16[4096]
// logsumexp (the online softmax statistics), each row's written over rows of 32000, 4096 rows; one block per row, resident (one read);
// schedule threads=1024 vec=8 rows_per_block=1, 32 elements per thread.
// launch: softmax_logsumexp_91dae9ab<<<4096, 1024>>>(in0, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };
__device__ __forceinline__ float rowwise_block_sum(float x) {
    __shared__ float partial[32];
    x = warp_sum(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return warp_sum(threadIdx.x % 32u < 32u ? partial[threadIdx.x % 32u] : 0.0f);
}
__device__ __forceinline__ float rowwise_block_max(float x) {
    __shared__ float partial[32];
    x = warp_max(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return warp_max(threadIdx.x % 32u < 32u ? partial[threadIdx.x % 32u] : -__int_as_float(0x7f800000));
}
extern "C" __global__ void __launch_bounds__(1024) softmax_logsumexp_91dae9ab(const bf16_t* __restrict__ in0, bf16_t* __restrict__ out) {
    const unsigned row = blockIdx.x * 1u + threadIdx.x / 1024u;
    const unsigned lane = threadIdx.x % 1024u;
    float nan_seen = 0.0f;
    float v[4][8];
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned c = (k * 1024u + lane) * 8u;
        if (c >= 32000u) { for (int j = 0; j < 8; ++j) v[k][j] = -__int_as_float(0x7f800000); continue; }
        const vec_t<bf16_t, 8> p0 = *reinterpret_cast<const vec_t<bf16_t, 8>*>(in0 + (row) * 32000u + c);
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float x0 = bf16_to_f32(p0.v[j]);
            v[k][j] = x0;
            if (v[k][j] != v[k][j]) nan_seen = 1.0f;
        }
    }
    float m = -__int_as_float(0x7f800000);
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) m = fmaxf(m, v[k][j]);
    }
    m = rowwise_block_max(m);
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned c = (k * 1024u + lane) * 8u;
        if (c >= 32000u) continue;
        #pragma unroll
        for (int j = 0; j < 8; ++j) { v[k][j] = v[k][j] - m; s += expf(v[k][j]); }
    }
    const float denom = rowwise_block_sum(s);
    const float inv = 1.0f / denom;
    const float any_nan = rowwise_block_max(nan_seen);
    const float total = any_nan > 0.0f ? __int_as_float(0x7fffffff) : fabsf(m) == __int_as_float(0x7f800000) ? m : m + logf(denom);
    if (lane == 0u) out[row] = f32_to_bf16((float)(total));
}
