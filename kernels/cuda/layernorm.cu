// layernorm.cu: LayerNorm forward and backward.
//
// The rows are layernorm_row.cuh's kernels (shared with residual_ln.cu, so
// the fused op's LayerNorm is this op's bit for bit): a warp per row, the
// row read once into registers (float4 loads where rows are 4-wide and the
// pointers 16-byte aligned, scalar loads of the same elements otherwise),
// row statistics summed in double from the registers (two-pass mean and
// biased variance; the two means of the backward) and reduced with the
// fixed warp butterfly, mean and rstd rounded to float as the CPU rounds
// them.
//
// dgamma and dbeta are column sums over all rows, in colsum.cuh's order
// (no atomics: the same bits every run). The backward's row kernel sums
// them as it has each row (a block per chunk of rows, a warp per row
// stream) and writes one partial per chunk into the caller's scratch
// (cuda_layernorm_bwd_scratch_bytes); colsum.cuh's pass 2 adds them up.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "layernorm_row.cuh"

// ---- launchers ---------------------------------------------------------------------

static void layernorm_fwd_launch(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                                 const float *beta, int N, int C, float eps, cudaStream_t stream) {
    const bool vec = C % 4 == 0 && ln_aligned(y, 16) && ln_aligned(x, 16) && ln_aligned(gamma, 16) &&
                     ln_aligned(beta, 16);
    LnSrcPlain src = {x};
    ln_fwd_launch(src, y, mean, rstd, gamma, beta, N, C, eps, vec, stream);
}

static void layernorm_bwd_launch(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                                 const float *mean, const float *rstd, const float *gamma, int N, int C,
                                 double *part_dgamma,  // (n_chunks, C)
                                 double *part_dbeta,   // (n_chunks, C)
                                 cudaStream_t stream) {
    const bool vec = C % 4 == 0 && ln_aligned(dx, 16) && ln_aligned(dy, 16) && ln_aligned(x, 16) &&
                     ln_aligned(gamma, 16);
    const LnBwdRows rows = {dx, dy, x, mean, rstd, gamma};
    const ColsumPlanes pl = {{part_dgamma, part_dbeta, NULL}, {dgamma, dbeta, NULL}};
    const LnTailNone tail;
    if (vec) ln_bwd_launch<true>(tail, rows, pl, 2, N, C, stream);
    else ln_bwd_launch<false>(tail, rows, pl, 2, N, C, stream);
}

static int ln_chunks(int N) { return scratch_ln_chunks(N); }

// ---- exported ops ---------------------------------------------------------------------

extern "C" void cuda_op_layernorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                      const float *gamma, const float *beta, int N, int C,
                                      float eps, cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_layernorm_fwd", N);
    TP_NEED_SIZE("cuda_op_layernorm_fwd", C);
    if (N == 0) return;
    TP_NEED_PTR("cuda_op_layernorm_fwd", mean);
    TP_NEED_PTR("cuda_op_layernorm_fwd", rstd);
    if (C > 0) {
        TP_NEED_PTR("cuda_op_layernorm_fwd", y);
        TP_NEED_PTR("cuda_op_layernorm_fwd", x);
        TP_NEED_PTR("cuda_op_layernorm_fwd", gamma);
        TP_NEED_PTR("cuda_op_layernorm_fwd", beta);
    }
    layernorm_fwd_launch(y, mean, rstd, x, gamma, beta, N, C, eps, stream);
}

extern "C" size_t cuda_layernorm_bwd_scratch_bytes(int N, int C) {
    return scratch_layernorm_bwd(N, C);
}

extern "C" void cuda_op_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy,
                                      const float *x, const float *mean, const float *rstd,
                                      const float *gamma, int N, int C, void *scratch,
                                      cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_layernorm_bwd", N);
    TP_NEED_SIZE("cuda_op_layernorm_bwd", C);
    if (N == 0 || C == 0) return;  // adds nothing
    TP_NEED_PTR("cuda_op_layernorm_bwd", dx);
    TP_NEED_PTR("cuda_op_layernorm_bwd", dgamma);
    TP_NEED_PTR("cuda_op_layernorm_bwd", dbeta);
    TP_NEED_PTR("cuda_op_layernorm_bwd", dy);
    TP_NEED_PTR("cuda_op_layernorm_bwd", x);
    TP_NEED_PTR("cuda_op_layernorm_bwd", mean);
    TP_NEED_PTR("cuda_op_layernorm_bwd", rstd);
    TP_NEED_PTR("cuda_op_layernorm_bwd", gamma);
    TpCarver cv = tp_carver(scratch, cuda_layernorm_bwd_scratch_bytes(N, C), "cuda_op_layernorm_bwd");
    const size_t part_bytes = (size_t)ln_chunks(N) * C * sizeof(double);
    double *part_dgamma = (double *)tp_carve(&cv, part_bytes);  // (n_chunks, C)
    double *part_dbeta = (double *)tp_carve(&cv, part_bytes);   // (n_chunks, C)
    layernorm_bwd_launch(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, N, C, part_dgamma,
                         part_dbeta, stream);
}
