// adamw.cu: the AdamW update over one contiguous range of parameters.
//
// Same formula and order of operations as kernels/cpu/adamw.c (torch's
// single-tensor AdamW): decay, moments, then the bias-corrected step. The
// per-call constants (step size, 1/sqrt(1 - b2^t), decay) are computed on
// the host by the CPU's expressions, and every device operation is rounded
// as written (IEEE _rn intrinsics: no FMA contraction, exact sqrt and
// division), so the update matches the CPU's fp32 arithmetic step for step.
// Each parameter is independent, so one range is one kernel, and
// adamw_segs_kernel runs every segment of a table (kernels/segs.c) in one
// launch, a block per chunk, with the same element update.
#include <math.h>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define ADAMW_THREADS 256u

// ---- kernels ---------------------------------------------------------------------

// One element: the CPU's expressions, each rounded as written.
__device__ __forceinline__ void adamw_elem(float *p, const float *g, float *m, float *v,
                                           float beta1, float one_minus_beta1, float beta2,
                                           float one_minus_beta2, float eps, float step_size,
                                           float inv_sqrt_bias2, float decay) {
    const float gi = *g;
    // mi = beta1 * m + (1 - beta1) * g
    const float mi = __fadd_rn(__fmul_rn(beta1, *m), __fmul_rn(one_minus_beta1, gi));
    // vi = beta2 * v + (1 - beta2) * g * g
    const float vi = __fadd_rn(__fmul_rn(beta2, *v), __fmul_rn(__fmul_rn(one_minus_beta2, gi), gi));
    // denom = sqrt(vi) * inv_sqrt_bias2 + eps
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), inv_sqrt_bias2), eps);
    // p = p * decay - step_size * mi / denom
    *p = __fsub_rn(__fmul_rn(*p, decay), __fdiv_rn(__fmul_rn(step_size, mi), denom));
    *m = mi;
    *v = vi;
}

__global__ void adamw_kernel(float *p,        // (n_elems) updated
                             const float *g,  // (n_elems)
                             float *m,        // (n_elems) updated
                             float *v,        // (n_elems) updated
                             size_t n_elems, float beta1, float one_minus_beta1, float beta2,
                             float one_minus_beta2, float eps, float step_size,
                             float inv_sqrt_bias2, float decay) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        adamw_elem(p + i, g + i, m + i, v + i, beta1, one_minus_beta1, beta2, one_minus_beta2, eps,
                   step_size, inv_sqrt_bias2, decay);
}

// Every block grid-stride over the chunks; a chunk's segment says where its
// parameters, gradients and state start and whether it decays (decay_on) or not
// (decay_off, the CPU's 1 - lr * 0).
__global__ void adamw_segs_kernel(float *p,                  // (every segment's x_at + n) updated
                                  const float *g,            // (every segment's g_at + n)
                                  float *m,                  // (every segment's s_at + n) updated
                                  float *v,                  // (every segment's s_at + n) updated
                                  const OpSeg *segs,         // (n_segs)
                                  const OpSegChunk *chunks,  // (n_chunks)
                                  int n_chunks, float beta1, float one_minus_beta1, float beta2,
                                  float one_minus_beta2, float eps, float step_size,
                                  float inv_sqrt_bias2, float decay_on, float decay_off) {
    for (int c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        const OpSegChunk ch = chunks[c];
        const OpSeg s = segs[ch.seg];
        const uint64_t left = s.n - ch.lo;
        const unsigned len = left < OP_SEG_CHUNK_ELEMS ? (unsigned)left : OP_SEG_CHUNK_ELEMS;
        const float decay = s.decay ? decay_on : decay_off;
        float *ps = p + s.x_at + ch.lo, *ms = m + s.s_at + ch.lo, *vs = v + s.s_at + ch.lo;
        const float *gs = g + s.g_at + ch.lo;
        for (unsigned i = threadIdx.x; i < len; i += blockDim.x)
            adamw_elem(ps + i, gs + i, ms + i, vs + i, beta1, one_minus_beta1, beta2,
                       one_minus_beta2, eps, step_size, inv_sqrt_bias2, decay);
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

static void adamw_segs_launch(float *p, const float *g, float *m, float *v, const OpSegTable *t,
                              float lr, float beta1, float beta2, float eps, float wd, int step,
                              cudaStream_t stream) {
    // the CPU's expressions, in the same types (cpu_adamw per segment)
    double bias1 = 1.0 - pow((double)beta1, (double)step);
    double bias2 = 1.0 - pow((double)beta2, (double)step);
    float step_size = (float)(lr / bias1);
    float inv_sqrt_bias2 = (float)(1.0 / sqrt(bias2));
    float decay_on = 1.0f - lr * wd, decay_off = 1.0f - lr * 0.0f;
    const unsigned n_blocks = t->n_chunks < (int)TP_MAX_GRID ? (unsigned)t->n_chunks : TP_MAX_GRID;
    adamw_segs_kernel<<<n_blocks, ADAMW_THREADS, 0, stream>>>(
        p, g, m, v, t->d_segs, t->d_chunks, t->n_chunks, beta1, 1.0f - beta1, beta2, 1.0f - beta2,
        eps, step_size, inv_sqrt_bias2, decay_on, decay_off);
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

extern "C" void cuda_op_adamw_segs(float *p, const float *g, float *m, float *v,
                                   const OpSegTable *segs, float lr, float beta1, float beta2,
                                   float eps, float wd, int t, cudaStream_t stream) {
    TP_CHECK(t >= 1, "cuda_op_adamw_segs: step t = %d, must be >= 1", t);
    TP_NEED_PTR("cuda_op_adamw_segs", segs);
    if (segs->n_chunks == 0) return;
    TP_NEED_PTR("cuda_op_adamw_segs", p);
    TP_NEED_PTR("cuda_op_adamw_segs", g);
    TP_NEED_PTR("cuda_op_adamw_segs", m);
    TP_NEED_PTR("cuda_op_adamw_segs", v);
    adamw_segs_launch(p, g, m, v, segs, lr, beta1, beta2, eps, wd, t, stream);
}
