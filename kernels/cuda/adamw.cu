// adamw.cu: the AdamW update over one contiguous range of parameters.
//
// Same formula and order of operations as kernels/cpu/adamw.c (torch's
// single-tensor AdamW): decay, moments, then the bias-corrected step. The
// per-call constants (step size, 1/sqrt(1 - b2^t), decay) are computed on
// the host by the CPU's expressions, and every device operation is rounded
// as written (IEEE _rn intrinsics: no FMA contraction, exact sqrt and
// division), so the update matches the CPU's fp32 arithmetic step for step.
// Each parameter is independent, so one range is one kernel; a fused
// multi-tensor version is a later step (parameters already live in one
// contiguous buffer).
#include <math.h>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define ADAMW_THREADS 256u

// ---- kernels ---------------------------------------------------------------------

__global__ void adamw_kernel(float *p,        // (n_elems) updated
                             const float *g,  // (n_elems)
                             float *m,        // (n_elems) updated
                             float *v,        // (n_elems) updated
                             size_t n_elems, float beta1, float one_minus_beta1, float beta2,
                             float one_minus_beta2, float eps, float step_size,
                             float inv_sqrt_bias2, float decay) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        // mi = beta1 * m + (1 - beta1) * g
        const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_beta1, gi));
        // vi = beta2 * v + (1 - beta2) * g * g
        const float vi =
            __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(one_minus_beta2, gi), gi));
        // denom = sqrt(vi) * inv_sqrt_bias2 + eps
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), inv_sqrt_bias2), eps);
        // p = p * decay - step_size * mi / denom
        p[i] = __fsub_rn(__fmul_rn(p[i], decay), __fdiv_rn(__fmul_rn(step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
    }
}

// ---- launchers ---------------------------------------------------------------------

static void adamw_launch(float *p, const float *g, float *m, float *v, size_t n_elems, float lr,
                         float beta1, float beta2, float eps, float wd, int t,
                         cudaStream_t stream) {
    // the CPU's expressions, in the same types
    double bias1 = 1.0 - pow((double)beta1, (double)t);
    double bias2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)(lr / bias1);
    float inv_sqrt_bias2 = (float)(1.0 / sqrt(bias2));
    float decay = 1.0f - lr * wd;
    adamw_kernel<<<tp_grid_1d(n_elems, ADAMW_THREADS), ADAMW_THREADS, 0, stream>>>(
        p, g, m, v, n_elems, beta1, 1.0f - beta1, beta2, 1.0f - beta2, eps, step_size,
        inv_sqrt_bias2, decay);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

extern "C" void cuda_op_adamw(float *p, const float *g, float *m, float *v, size_t n_elems,
                              float lr, float beta1, float beta2, float eps, float wd, int t,
                              cudaStream_t stream) {
    TP_CHECK(t >= 1, "cuda_op_adamw: step t = %d, must be >= 1", t);
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_adamw", p);
    TP_NEED_PTR("cuda_op_adamw", g);
    TP_NEED_PTR("cuda_op_adamw", m);
    TP_NEED_PTR("cuda_op_adamw", v);
    adamw_launch(p, g, m, v, n_elems, lr, beta1, beta2, eps, wd, t, stream);
}
