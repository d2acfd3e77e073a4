// spectral_contract(c64[16,64,1057], c64[64,64,1057], groups=1) -> c64[16,64,1057]
// schedule: threads=128 freq_per_thread=1 out_channels_per_block=8 batch_per_block=4
// complex64 operands as interleaved (re, im) float pairs
// launch: spectral_contract_128t_f1_o8_n4(x, w, y); grid=(288), block=(128)
namespace spectral_contract_128t_f1_o8_n4_config {
constexpr int N = 16, C = 64, O = 64, CG = 64, OG = 64, GROUPS = 1, F = 1057;
constexpr int THREADS = 128, FPT = 1, OB = 8, NB = 4, NT = 4, OT = 8;
}

using namespace spectral_contract_128t_f1_o8_n4_config;
struct __align__(8) spectral_cf { float re, im; };

extern "C" __global__ void __launch_bounds__(128) spectral_contract_128t_f1_o8_n4(const spectral_cf* __restrict__ x,
                                                           const spectral_cf* __restrict__ w,
                                                           spectral_cf* __restrict__ y) {
    // Batch tiles vary fastest: the NT blocks that read one w tile are scheduled side by side.
    int bid = blockIdx.x;
    const int nt = bid % NT; bid /= NT;
    const int ot = bid % OT; bid /= OT;
    const int g = bid % GROUPS, ft = bid / GROUPS;
    const int n0 = nt * NB, o0 = ot * OB, f0 = ft * THREADS * FPT + threadIdx.x;
    const spectral_cf* xg = x + ((long long)n0 * C + g * CG) * F;
    const spectral_cf* wg = w + ((long long)(g * OG + o0) * CG) * F;

    float acc_re[NB][OB][FPT] = {}, acc_im[NB][OB][FPT] = {};
    #pragma unroll 1
    for (int c = 0; c < CG; ++c) {
        spectral_cf xv[NB][FPT];
        #pragma unroll
        for (int b = 0; b < NB; ++b)
            #pragma unroll
            for (int i = 0; i < FPT; ++i) {
                const int f = f0 + i * THREADS;
                spectral_cf v = {0.f, 0.f};
                if (n0 + b < N && f < F) v = xg[((long long)b * C + c) * F + f];
                xv[b][i] = v;
            }
        #pragma unroll
        for (int o = 0; o < OB; ++o)
            #pragma unroll
            for (int i = 0; i < FPT; ++i) {
                const int f = f0 + i * THREADS;
                spectral_cf v = {0.f, 0.f};
                if (o0 + o < OG && f < F) v = wg[((long long)o * CG + c) * F + f];
                #pragma unroll
                for (int b = 0; b < NB; ++b) {     // x · conj(w)
                    acc_re[b][o][i] = fmaf(xv[b][i].re, v.re, fmaf(xv[b][i].im, v.im, acc_re[b][o][i]));
                    acc_im[b][o][i] = fmaf(xv[b][i].im, v.re, fmaf(-xv[b][i].re, v.im, acc_im[b][o][i]));
                }
            }
    }
    #pragma unroll
    for (int b = 0; b < NB; ++b)
        #pragma unroll
        for (int o = 0; o < OB; ++o)
            #pragma unroll
            for (int i = 0; i < FPT; ++i) {
                const int f = f0 + i * THREADS;
                if (n0 + b < N && o0 + o < OG && f < F) {
                    spectral_cf r = {acc_re[b][o][i], acc_im[b][o][i]};
                    y[((long long)(n0 + b) * O + g * OG + o0 + o) * F + f] = r;
                }
            }
}
