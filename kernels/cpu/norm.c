/* norm.c: LayerNorm on the CPU.
 *
 * One row at a time, the textbook way: a two-pass mean and (biased) variance
 * in double, as torch.nn.LayerNorm, with mean and 1/std saved for backward.
 * The backward uses the usual closed form
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,
 * with its two row means in double, and column sums for dgamma and dbeta
 * accumulated in double across rows (a stack block of columns at a time: no
 * op allocates) before being added to the caller's buffers.
 */
#include <math.h>

#include "cpu_ops.h"
#include "err.h"

// y, x (N, C); mean, rstd (N); gamma, beta (C)
void cpu_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma, const float *beta,
                       int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = y + (size_t)n * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++) sum += xr[c];
        double mu = C > 0 ? sum / C : 0.0;
        double sq = 0.0;
        for (int c = 0; c < C; c++) {
            double d = xr[c] - mu;
            sq += d * d;
        }
        double var = C > 0 ? sq / C : 0.0;
        float m = (float)mu;
        float rs = (float)(1.0 / sqrt(var + (double)eps));
        for (int c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
        mean[n] = m;
        rstd[n] = rs;
    }
}

// dx, dy, x (N, C); dgamma, dbeta, gamma (C); mean, rstd (N). dx, dgamma, dbeta accumulated.
void cpu_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x, const float *mean,
                       const float *rstd, const float *gamma, int N, int C) {
    if (C <= 0 || N <= 0) return;  // adds nothing
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        const float *dyr = dy + (size_t)n * C;
        float *dxr = dx + (size_t)n * C;
        float m = mean[n], rs = rstd[n];
        double sum_g = 0.0, sum_g_xhat = 0.0;
        for (int c = 0; c < C; c++) {
            float xhat = (xr[c] - m) * rs;
            float g = dyr[c] * gamma[c];
            sum_g += g;
            sum_g_xhat += (double)g * xhat;
        }
        float mean_g = (float)(sum_g / C);
        float mean_g_xhat = (float)(sum_g_xhat / C);
        for (int c = 0; c < C; c++) {
            float xhat = (xr[c] - m) * rs;
            float g = dyr[c] * gamma[c];
            dxr[c] += rs * (g - mean_g - xhat * mean_g_xhat);
        }
    }
    /* Column sums over blocks of COL_BLOCK columns, rows in order, so the
     * double accumulators live on the stack (no op allocates). */
    enum { COL_BLOCK = 64 };
    for (int c0 = 0; c0 < C; c0 += COL_BLOCK) {
        const int nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
        double dgamma_acc[COL_BLOCK] = {0}, dbeta_acc[COL_BLOCK] = {0};  // (nc)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C + c0;
            const float *dyr = dy + (size_t)n * C + c0;
            float m = mean[n], rs = rstd[n];
            for (int c = 0; c < nc; c++) {
                float xhat = (xr[c] - m) * rs;
                dgamma_acc[c] += (double)dyr[c] * xhat;
                dbeta_acc[c] += dyr[c];
            }
        }
        for (int c = 0; c < nc; c++) {
            dgamma[c0 + c] += (float)dgamma_acc[c];
            dbeta[c0 + c] += (float)dbeta_acc[c];
        }
    }
}
