// layernorm_row.cuh: one row of LayerNorm, forward and the backward's input
// gradient, by one warp. layernorm.cu and residual_ln.cu both run their rows
// through these, so the fused residual op's LayerNorm is the plain op's bit
// for bit (the model may fuse a boundary in one recompute mode and not in
// another, and promises the same bits). Private to kernels/cuda.
//
// Lanes stride the row (c = lane, lane + 32, ...); row statistics are summed
// in double like the CPU (two-pass mean and biased variance; the two means
// of the backward) and reduced with the fixed warp butterfly; mean and rstd
// are rounded to float exactly as the CPU rounds them. Every lane of the
// warp must call (the reductions shuffle across all 32).
#ifndef TPTRAIN_LAYERNORM_ROW_CUH
#define TPTRAIN_LAYERNORM_ROW_CUH

#include "cuda_kernel_util.cuh"

// yr = (xr - mean) * rstd * gamma + beta, or (yr NULL) its bf16 rounding
// into yr16; the row's mean and rstd returned.
__device__ __forceinline__ void tp_ln_row_fwd(float *yr,           // (C) or NULL
                                              uint16_t *yr16,      // (C) or NULL
                                              const float *xr,     // (C)
                                              const float *gamma,  // (C)
                                              const float *beta,   // (C)
                                              int C, float eps, int lane, float *mean_out, float *rstd_out) {
    double sum = 0.0;
    for (int c = lane; c < C; c += TP_WARP) sum += xr[c];
    sum = tp_warp_sum(sum);
    const double mu = C > 0 ? sum / C : 0.0;
    double sq = 0.0;
    for (int c = lane; c < C; c += TP_WARP) {
        double d = xr[c] - mu;
        sq += d * d;
    }
    sq = tp_warp_sum(sq);
    const double var = C > 0 ? sq / C : 0.0;
    const float m = (float)mu;
    const float rs = (float)(1.0 / sqrt(var + (double)eps));
    for (int c = lane; c < C; c += TP_WARP) {
        const float v = (xr[c] - m) * rs * gamma[c] + beta[c];  // one expression for both outputs
        if (yr) yr[c] = v;
        else yr16[c] = tp_bf16_bits(v);
    }
    *mean_out = m;
    *rstd_out = rs;
}

// dxr += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
__device__ __forceinline__ void tp_ln_row_bwd_dx(float *dxr,          // (C) accumulated
                                                 const float *dyr,    // (C)
                                                 const float *xr,     // (C)
                                                 const float *gamma,  // (C)
                                                 float m, float rs, int C, int lane) {
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int c = lane; c < C; c += TP_WARP) {
        float xhat = (xr[c] - m) * rs;
        float g = dyr[c] * gamma[c];
        sum_g += g;
        sum_g_xhat += (double)g * xhat;
    }
    sum_g = tp_warp_sum(sum_g);
    sum_g_xhat = tp_warp_sum(sum_g_xhat);
    const float mean_g = (float)(sum_g / C);
    const float mean_g_xhat = (float)(sum_g_xhat / C);
    for (int c = lane; c < C; c += TP_WARP) {
        float xhat = (xr[c] - m) * rs;
        float g = dyr[c] * gamma[c];
        dxr[c] += rs * (g - mean_g - xhat * mean_g_xhat);
    }
}

#endif
