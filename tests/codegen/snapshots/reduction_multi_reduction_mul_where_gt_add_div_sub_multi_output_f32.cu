// multi_reduction(f32[32,64,56,56], f32[1,64,1,1], f32[1,64,1,1], f32[1,64,1,1], f32[1,64,1,1], axes=(0, 2, 3), exprs='mul(where(gt(add(mul(div(sub($0,$1),$2),$3),$4),0.0:float32),1.0:float32,0.0:float32),div(sub($0,$1),$2));where(gt(add(mul(div(sub($0,$1),$2),$3),$4),0.0:float32),1.0:float32,0.0:float32);div(mul(where(gt(add(mul(div(sub($0,$1),$2),$3),$4),0.0:float32),1.0:float32,0.0:float32),$3),$2)', reduce='sum', width=64) -> f32[3,64]
// reduction (row reduce) of 100352 elements into each of 64 outputs,
// schedule threads=512 vec=4 split=512 blocks=5; accumulates in float.
// launch: reduction_multi_reduction_e749305f<<<320, 512>>>(in0, in1, in2, in3, in4, out, work)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };

__device__ __forceinline__ float reduction_combine(float a, float b) { return a + b; }

extern "C" __global__ void __launch_bounds__(512) reduction_multi_reduction_e749305f(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2, const float* __restrict__ in3, const float* __restrict__ in4, float* __restrict__ out, unsigned char* __restrict__ work) {
    const unsigned row = blockIdx.x / 5u;
    const unsigned part = blockIdx.x % 5u;
    const unsigned lane = threadIdx.x % 512u;
    float acc0 = (float)0;
    float acc1 = (float)0;
    float acc2 = (float)0;
    if (row < 64u) {
        const float* base0 = in0 + ((row) * 3136u);
        const float* base1 = in1 + (row);
        const float* base2 = in2 + (row);
        const float* base3 = in3 + (row);
        const float* base4 = in4 + (row);
        #pragma unroll 4
        for (unsigned r = (part * 512u + lane) * 4u; r < 100352u; r += 10240u) {
            const vec_t<float, 4> c0 = *reinterpret_cast<const vec_t<float, 4>*>(base0 + ((r) % 3136u + (r / 3136u) * 200704u));
            const float s1 = base1[0];
            const float s2 = base2[0];
            const float s3 = base3[0];
            const float s4 = base4[0];
            #pragma unroll
            for (int j = 0; j < 4; ++j) { const float x0 = c0.v[j]; const float x1 = s1; const float x2 = s2; const float x3 = s3; const float x4 = s4; const float e0_5 = (x0 - x1); const float e0_6 = (e0_5 / x2); const float e0_7 = (e0_6 * x3); const float e0_8 = (e0_7 + x4); const bool e0_9 = (e0_8 > 0.0f); const float e0_10 = (e0_9 ? 1.0f : 0.0f); const float e0_11 = (x0 - x1); const float e0_12 = (e0_11 / x2); const float e0_13 = (e0_10 * e0_12); const float e1_14 = (x0 - x1); const float e1_15 = (e1_14 / x2); const float e1_16 = (e1_15 * x3); const float e1_17 = (e1_16 + x4); const bool e1_18 = (e1_17 > 0.0f); const float e1_19 = (e1_18 ? 1.0f : 0.0f); const float e2_20 = (x0 - x1); const float e2_21 = (e2_20 / x2); const float e2_22 = (e2_21 * x3); const float e2_23 = (e2_22 + x4); const bool e2_24 = (e2_23 > 0.0f); const float e2_25 = (e2_24 ? 1.0f : 0.0f); const float e2_26 = (e2_25 * x3); const float e2_27 = (e2_26 / x2); acc0 = reduction_combine(acc0, (float)(float)(e0_13)); acc1 = reduction_combine(acc1, (float)(float)(e1_19)); acc2 = reduction_combine(acc2, (float)(float)(e2_27)); }
        }
    }
    for (int o = 16; o > 0; o >>= 1) { acc0 = reduction_combine(acc0, __shfl_xor_sync(0xffffffffu, acc0, o)); acc1 = reduction_combine(acc1, __shfl_xor_sync(0xffffffffu, acc1, o)); acc2 = reduction_combine(acc2, __shfl_xor_sync(0xffffffffu, acc2, o)); }
    __shared__ float partial[3][16];
    if (lane % 32u == 0) {
        partial[0][lane / 32u] = acc0;
        partial[1][lane / 32u] = acc1;
        partial[2][lane / 32u] = acc2;
    }
    __syncthreads();
    if (lane >= 32u) return;
    acc0 = lane < 16u ? partial[0][lane] : (float)0;
    acc1 = lane < 16u ? partial[1][lane] : (float)0;
    acc2 = lane < 16u ? partial[2][lane] : (float)0;
    for (int o = 16; o > 0; o >>= 1) { acc0 = reduction_combine(acc0, __shfl_xor_sync(0xffffffffu, acc0, o)); acc1 = reduction_combine(acc1, __shfl_xor_sync(0xffffffffu, acc1, o)); acc2 = reduction_combine(acc2, __shfl_xor_sync(0xffffffffu, acc2, o)); }
    float* parts = reinterpret_cast<float*>(work);
    unsigned* arrived = reinterpret_cast<unsigned*>(parts + 960u);
    if (lane == 0) { const unsigned at = row * 5u + part; parts[0u + at] = acc0; parts[320u + at] = acc1; parts[640u + at] = acc2; __threadfence(); }
    unsigned last = 0;
    if (lane == 0) last = atomicAdd(&arrived[row], 1u) == 4u;
    if (!__shfl_sync(0xffffffffu, last, 0)) return;       // another block of the row comes later
    __threadfence();
    acc0 = (float)0;
    acc1 = (float)0;
    acc2 = (float)0;
    for (unsigned q = row * 5u + lane; q < (row + 1u) * 5u; q += 32u) { acc0 = reduction_combine(acc0, ((volatile float*)parts)[0u + q]); acc1 = reduction_combine(acc1, ((volatile float*)parts)[320u + q]); acc2 = reduction_combine(acc2, ((volatile float*)parts)[640u + q]); }
    for (int o = 16; o > 0; o >>= 1) { acc0 = reduction_combine(acc0, __shfl_xor_sync(0xffffffffu, acc0, o)); acc1 = reduction_combine(acc1, __shfl_xor_sync(0xffffffffu, acc1, o)); acc2 = reduction_combine(acc2, __shfl_xor_sync(0xffffffffu, acc2, o)); }
    if (lane == 0 && row < 64u) { out[0u + row] = (float)(acc0); out[64u + row] = (float)(acc1); out[128u + row] = (float)(acc2); }
}
