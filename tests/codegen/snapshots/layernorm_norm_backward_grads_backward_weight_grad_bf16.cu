// norm_backward_grads(bf16[8192,4096], bf16[8192,4096], bf16[4096], axes=(1,), eps=1e-05, has_weight=True, norm='layernorm', parts=256) -> bf16[37748736]
// layernorm input, weight and bias gradients over rows of 4096, 8192 rows; block p of 256 walks the rows p, p + 256, …, resident (one read);
// schedule threads=256 vec=8 rows_per_block=1, 16 elements per thread.
// launch: layernorm_norm_backward_grads_8c914796<<<256, 256>>>(in0, in1, in2, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };
__device__ __forceinline__ float rowwise_block_sum(float x) {
    __shared__ float partial[8];
    x = warp_sum(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return warp_sum(threadIdx.x % 32u < 8u ? partial[threadIdx.x % 32u] : 0.0f);
}
__device__ __forceinline__ float rowwise_block_max(float x) {
    __shared__ float partial[8];
    x = warp_max(x);
    __syncthreads();                      // the previous reduction may still be reading `partial`
    if (threadIdx.x % 32u == 0) partial[threadIdx.x / 32u] = x;
    __syncthreads();
    return warp_max(threadIdx.x % 32u < 8u ? partial[threadIdx.x % 32u] : -__int_as_float(0x7f800000));
}
extern "C" __global__ void __launch_bounds__(256) layernorm_norm_backward_grads_8c914796(const bf16_t* __restrict__ in0, const bf16_t* __restrict__ in1, const bf16_t* __restrict__ in2, bf16_t* __restrict__ out) {
    const unsigned lane = threadIdx.x;
    float pw[2][8] = {}, pb[2][8] = {};   // this block's Σ g x̂ and Σ g
    float w[2][8];
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
        const unsigned c = (k * 256u + lane) * 8u;
        const vec_t<bf16_t, 8> w2 = *reinterpret_cast<const vec_t<bf16_t, 8>*>(in2 + 0 + c);
        #pragma unroll
        for (int j = 0; j < 8; ++j) w[k][j] = bf16_to_f32(w2.v[j]);
    }
    for (unsigned row = blockIdx.x; row < 8192u; row += 256u) {
        float x[2][8], g[2][8];
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            const unsigned c = (k * 256u + lane) * 8u;
            const vec_t<bf16_t, 8> x0 = *reinterpret_cast<const vec_t<bf16_t, 8>*>(in0 + (row) * 4096u + c);
            const vec_t<bf16_t, 8> g1 = *reinterpret_cast<const vec_t<bf16_t, 8>*>(in1 + (row) * 4096u + c);
            #pragma unroll
            for (int j = 0; j < 8; ++j) { x[k][j] = bf16_to_f32(x0.v[j]); g[k][j] = bf16_to_f32(g1.v[j]); }
        }
        float s = 0.0f;
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) s += x[k][j];
        }
        const float mean = rowwise_block_sum(s) * (1.0f / 4096.0f);
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) x[k][j] -= mean;
        }
        float q = 0.0f;
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) q += x[k][j] * x[k][j];
        }
        const float rstd = rsqrtf(rowwise_block_sum(q) * (1.0f / 4096.0f) + 1e-05f);
        float a = 0.0f;
        float b = 0.0f;
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            #pragma unroll
            for (int j = 0; j < 8; ++j) { x[k][j] *= rstd; const float gw = g[k][j] * w[k][j]; a += gw; b += gw * x[k][j]; pw[k][j] += g[k][j] * x[k][j]; pb[k][j] += g[k][j]; }
        }
        const float c1 = rowwise_block_sum(a) * (1.0f / 4096.0f);
        const float c2 = rowwise_block_sum(b) * (1.0f / 4096.0f);
        #pragma unroll
        for (int k = 0; k < 2; ++k) {
            const unsigned c = (k * 256u + lane) * 8u;
            vec_t<bf16_t, 8> o;
            #pragma unroll
            for (int j = 0; j < 8; ++j) o.v[j] = f32_to_bf16((float)(rstd * (g[k][j] * w[k][j] - c1 - x[k][j] * c2)));
            *reinterpret_cast<vec_t<bf16_t, 8>*>(out + (unsigned)row * 4096u + c) = o;
        }
    }
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
        const unsigned c = (k * 256u + lane) * 8u;
        {
            vec_t<bf16_t, 8> hi, lo;
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float total = pw[k][j];
                hi.v[j] = f32_to_bf16((float)(total));
                lo.v[j] = f32_to_bf16((float)(total - bf16_to_f32(hi.v[j])));
            }
            *reinterpret_cast<vec_t<bf16_t, 8>*>(out + (unsigned)33554432u + (unsigned)blockIdx.x * 8192u + c) = hi;
            *reinterpret_cast<vec_t<bf16_t, 8>*>(out + (unsigned)33554432u + (unsigned)blockIdx.x * 8192u + c + 4096u) = lo;
        }
        {
            vec_t<bf16_t, 8> hi, lo;
            #pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float total = pb[k][j];
                hi.v[j] = f32_to_bf16((float)(total));
                lo.v[j] = f32_to_bf16((float)(total - bf16_to_f32(hi.v[j])));
            }
            *reinterpret_cast<vec_t<bf16_t, 8>*>(out + (unsigned)35651584u + (unsigned)blockIdx.x * 8192u + c) = hi;
            *reinterpret_cast<vec_t<bf16_t, 8>*>(out + (unsigned)35651584u + (unsigned)blockIdx.x * 8192u + c + 4096u) = lo;
        }
    }
}
