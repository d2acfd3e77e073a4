// transpose(bf16[4096,4096], axes=(1, 0)) -> bf16[4096,4096]
// copy (shared-memory tiled transpose), schedule threads=256 vec=1 tile=32; shapes baked in.
// launch: copy_transpose_821ecfe6<<<16384, 256>>>(in0, out)
template <typename T, int N> struct __align__(sizeof(T) * N) vec_t { T v[N]; };

extern "C" __global__ void __launch_bounds__(256) copy_transpose_821ecfe6(const bf16_t* __restrict__ in0, bf16_t* __restrict__ out) {
    __shared__ bf16_t tile[32][33];      // +1: column reads fall in distinct banks
    const unsigned tx = threadIdx.x % 32u, ty = threadIdx.x / 32u;
    const unsigned batch = blockIdx.x / 16384u, ab = blockIdx.x % 16384u;
    const unsigned a0 = (ab % 128u) * 32u, b0 = (ab / 128u) * 32u;
    const bf16_t* src = in0 + (0);
    bf16_t* dst = out + (0);
    #pragma unroll
    for (unsigned r = ty; r < 32u; r += 8u)      // along the input's inner axis
        if (a0 + tx < 4096u && b0 + r < 4096u) tile[r][tx] = src[(b0 + r) * 4096u + a0 + tx];
    __syncthreads();
    #pragma unroll
    for (unsigned r = ty; r < 32u; r += 8u)      // along the result's inner axis
        if (b0 + tx < 4096u && a0 + r < 4096u) dst[(a0 + r) * 4096u + b0 + tx] = tile[tx][r];
}
