// multi_elementwise(f32[4096,4096], f32[4096,4096], f32[4096,4096], f32[4096,4096], exprs='add(mul($2,0.9:float32),mul($1,0.1:float32));add(mul($3,0.999:float32),mul(mul($1,$1),0.001:float32));sub(mul($0,0.9999:float32),mul(div(add(mul($2,0.9:float32),mul($1,0.1:float32)),add(sqrt(add(mul($3,0.999:float32),mul(mul($1,$1),0.001:float32))),1e-08:float32)),0.0001:float32))') -> f32[3,4096,4096]
// elementwise, 3 results of 16777216 elements from one read of the operands; schedule threads=256 vec=4.
// launch: elementwise_multi_elementwise_dd7401f1<<<grid, 256>>>(in0, in1, in2, in3, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };

extern "C" __global__ void __launch_bounds__(256) elementwise_multi_elementwise_dd7401f1(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2, const float* __restrict__ in3, float* __restrict__ out) {
    const unsigned step = gridDim.x * blockDim.x * 4u;
    for (unsigned i = (((unsigned)blockIdx.x) * blockDim.x + threadIdx.x) * 4u; i < 16777216u; i += step) {
        const vec_t<float, 4> a0 = *reinterpret_cast<const vec_t<float, 4>*>(in0 + (i));
        const vec_t<float, 4> a1 = *reinterpret_cast<const vec_t<float, 4>*>(in1 + (i));
        const vec_t<float, 4> a2 = *reinterpret_cast<const vec_t<float, 4>*>(in2 + (i));
        const vec_t<float, 4> a3 = *reinterpret_cast<const vec_t<float, 4>*>(in3 + (i));
        vec_t<float, 4> r0, r1, r2;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float x0 = a0.v[j];
            const float x1 = a1.v[j];
            const float x2 = a2.v[j];
            const float x3 = a3.v[j];
            const float e0_4 = (x2 * 0.9f);
            const float e0_5 = (x1 * 0.1f);
            const float e0_6 = (e0_4 + e0_5);
            r0.v[j] = (float)(e0_6);
            const float e1_8 = (x3 * 0.999f);
            const float e1_9 = (x1 * x1);
            const float e1_10 = (e1_9 * 0.001f);
            const float e1_11 = (e1_8 + e1_10);
            r1.v[j] = (float)(e1_11);
            const float e2_13 = (x0 * 0.9999f);
            const float e2_14 = (x2 * 0.9f);
            const float e2_15 = (x1 * 0.1f);
            const float e2_16 = (e2_14 + e2_15);
            const float e2_17 = (x3 * 0.999f);
            const float e2_18 = (x1 * x1);
            const float e2_19 = (e2_18 * 0.001f);
            const float e2_20 = (e2_17 + e2_19);
            const float e2_21 = sqrtf(e2_20);
            const float e2_22 = (e2_21 + 1e-08f);
            const float e2_23 = (e2_16 / e2_22);
            const float e2_24 = (e2_23 * 0.0001f);
            const float e2_25 = (e2_13 - e2_24);
            r2.v[j] = (float)(e2_25);
        }
        *reinterpret_cast<vec_t<float, 4>*>(out + 0u + i) = r0;
        *reinterpret_cast<vec_t<float, 4>*>(out + 16777216u + i) = r1;
        *reinterpret_cast<vec_t<float, 4>*>(out + 33554432u + i) = r2;
    }
}
