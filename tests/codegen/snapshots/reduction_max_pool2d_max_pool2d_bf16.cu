// max_pool2d(bf16[32,64,112,112], dilation=(1, 1), kernel=(3, 3), pad=(1, 1), stride=(2, 2)) -> bf16[32,64,56,56]
// pool (max_pool2d: windows (3, 3) stride (2, 2) padding (1, 1) dilation (1, 1) over planes
// (112, 112) pooled to (56, 56)), schedule threads=256.
// launch: reduction_max_pool2d_adab8a6a<<<4224, 256>>>(in0, out)
extern "C" __global__ void __launch_bounds__(256) reduction_max_pool2d_adab8a6a(const bf16_t* __restrict__ in0,
        bf16_t* __restrict__ out) {
    const unsigned step = gridDim.x * blockDim.x;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < 6422528u; e += step) {
        const int ow = (int)(e % 56u), oh = (int)(e / 56u % 56u);
        const unsigned long long plane = (unsigned long long)(e / 3136u) * 12544u;
        const bf16_t* src = in0 + plane;
        const int h0 = oh * 2 - 1, w0 = ow * 2 - 1;
        float best = (-__int_as_float(0x7f800000));
        #pragma unroll
        for (int i = 0; i < 3; ++i) {
            const int h = h0 + i * 1;
            if (h < 0 || h >= 112) continue;
            #pragma unroll
            for (int j = 0; j < 3; ++j) {
                const int w = w0 + j * 1;
                if (w < 0 || w >= 112) continue;
                const float v = bf16_to_f32(src[h * 112 + w]);
                if (v > best || v != v) best = v;      // v != v: a NaN, which replaces any
            }
        }
        out[e] = f32_to_bf16((float)(best));
    }
}
