// rmsnorm_matmul(f32[2,256,512], f32[512], f32[512,384], eps=1e-06) -> f32[2,256,384]
extern "C" __global__ void __launch_bounds__(256) gemm_rmsnorm_matmul_0f092883(
        const float* __restrict__ X, const float* __restrict__ G, const float* __restrict__ W, float* __restrict__ Y) {
    constexpr int M = 512, N = 384, K = 512, BM = 64, BN = 64, BK = 16;
    constexpr int TM = 4, TN = 4, PER_ROW = 4, THREADS = 256;
    __shared__ float sInv[BM];
    __shared__ float sA[BK][BM + 1];
    __shared__ float sB[BK][BN];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    {  // 1 / rms of the block's rows: PER_ROW neighbouring lanes a row, summed by a shuffle tree
        const int r = tid / PER_ROW, lane = tid % PER_ROW;
        float ss = 0.0f;
        if (m0 + r < M)
            for (int k = lane; k < K; k += PER_ROW) {
                const float v = X[(long long)(m0 + r) * K + k];
                ss += v * v;
            }
        for (int off = PER_ROW / 2; off > 0; off >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (lane == 0)
            sInv[r] = 1.0f / sqrtf(ss / (float)K + 1e-06f);
    }
    float acc[TM][TN];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int e = tid; e < BM * BK; e += THREADS) {      // A = x * g, stored k-major
            const int r = e / BK, c = e % BK, k = k0 + c;
            sA[c][r] = (m0 + r < M && k < K)
                ? X[(long long)(m0 + r) * K + k] * G[k] : 0.0f;
        }
        for (int e = tid; e < BK * BN; e += THREADS) {
            const int r = e / BN, c = e % BN, k = k0 + r;
            sB[r][c] = (k < K && n0 + c < N) ? W[(long long)k * N + n0 + c] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
            for (int i = 0; i < TM; ++i) a[i] = sA[kk][ty * TM + i];
            for (int j = 0; j < TN; ++j) b[j] = sB[kk][tx * TN + j];
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) {
            const int r = m0 + ty * TM + i, c = n0 + tx * TN + j;
            if (r < M && c < N)
                Y[(long long)r * N + c] = (float)(acc[i][j] * sInv[ty * TM + i]);
        }
}
