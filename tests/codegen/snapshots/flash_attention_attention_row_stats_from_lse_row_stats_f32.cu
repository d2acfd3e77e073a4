// attention_row_stats_from_lse(bf16[17301504], bf16[4,16,4096,64]) -> f32[4,16,4096,2]
// schedule: warps=8
// launch: attention_row_stats_from_lse_bf16_d64_w8<<<32768, 256>>>(fwd, do, stats); stats [rows][2] fp32

extern "C" __global__ void __launch_bounds__(8 * 32)
attention_row_stats_from_lse_bf16_d64_w8(const bf16_t* __restrict__ fwd, const bf16_t* __restrict__ dout, float* __restrict__ stats) {
    constexpr int D = 64, WARPS = 8;
    constexpr long long ROWS = 262144, NO = ROWS * D;     // rows, and where O ends in fwd
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= ROWS)
        return;                                           // the whole warp: its row is past the end
    const bf16_t* o = fwd + row * D;
    const bf16_t* g = dout + row * D;
    float acc = 0.f;
    #pragma unroll
    for (int c = 2 * lane; c < D; c += 64) {
        const unsigned ov = *(const unsigned*)(o + c), gv = *(const unsigned*)(g + c);
        acc += bf16_to_f32(ov & 0xffffu) * bf16_to_f32(gv & 0xffffu) + bf16_to_f32(ov >> 16) * bf16_to_f32(gv >> 16);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        stats[2 * row] = bf16_to_f32(fwd[NO + row]) + bf16_to_f32(fwd[NO + ROWS + row]);   // lse: high part + remainder
        stats[2 * row + 1] = acc;
    }
}
