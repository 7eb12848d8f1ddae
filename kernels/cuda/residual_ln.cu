// residual_ln.cu: residual add + dropout + LayerNorm, fused each way.
//
// The boundary between two pre-LN sub-blocks is, unfused, four passes
// forward (bias add, dropout, residual add, LayerNorm) and six launches
// backward (LayerNorm backward's, a zeroing, dropout backward, the bias
// gradient's). Here the row work is one pass each way, through
// layernorm_row.cuh's kernels (the code layernorm.cu runs): forward reads
// branch and res_in once (bias, gamma, beta from cache), writes res_out and
// keeps it in registers for the LayerNorm, writes y (fp32 or bf16), mean,
// rstd; backward reads dy, x and d_res once, writes d_res and d_branch
// (fp32 or bf16) and sums the columns (dgamma, dbeta, the bias gradient) as
// it goes, in colsum.cuh's order, the one layernorm.cu's and bias.cu's sums
// follow: no atomics, the same bits every run.
//
// The dropout mask is drawn exactly as dropout.cu draws it (element i of
// the window starting at `first` uses Philox counter (first + i) / 4, word
// (first + i) % 4; one Philox call per float4 where rows are 4-wide and the
// pointers 16-byte aligned, a call per element otherwise), the residual
// arithmetic uses __fadd_rn / __fmul_rn (no FMA) as dropout.cu does. So
// both ops equal the unfused CUDA sequence bit for bit, and res_out and
// d_branch (given d_res) the CPU's too; y, mean, rstd, d_res and the column
// sums differ from the CPU only as layernorm.cu's do, in the order of their
// double sums (harness.h's SUM_RTOL).
//
// The rows' code (the forward's source, the backward's tail, the dropout)
// is residual_ln_row.cuh's, written for the device and the host so
// test/test_ln_rows.cc runs it on the CPU; this file launches it.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "residual_ln_row.cuh"

static int rln_chunks(int N) { return scratch_ln_chunks(N); }

// ---- launchers ---------------------------------------------------------------------

static void residual_ln_fwd_launch(float *res_out, float *y, uint16_t *y16, float *mean, float *rstd,
                                   const float *res_in,
                                   const float *branch, const float *bias, const float *gamma, const float *beta,
                                   int N, int C, float eps, RlnDrop d, cudaStream_t stream) {
    // float4 loads and stores where C and every row pointer allow (bias, gamma, beta read per element or float4)
    const bool vec = C % 4 == 0 && ln_aligned(res_out, 16) && ln_aligned(res_in, 16) && ln_aligned(branch, 16) &&
                     ln_aligned(gamma, 16) && ln_aligned(beta, 16) && ln_aligned(y, 16) && ln_aligned(y16, 8);
    const RlnSrc src = {d, res_out, res_in, branch, bias};
    if (y) ln_fwd_launch(src, y, mean, rstd, gamma, beta, N, C, eps, vec, stream);
    else ln_fwd_launch(src, y16, mean, rstd, gamma, beta, N, C, eps, vec, stream);
}

static void residual_ln_bwd_launch(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma, float *dbeta,
                                   float *d_bias,
                                   const float *dy, const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int N, int C, RlnDrop d, bool round_bias,
                                   double *part,  // (3, n_chunks, C)
                                   cudaStream_t stream) {
    const bool vec = C % 4 == 0 && ln_aligned(d_res, 16) && ln_aligned(dy, 16) && ln_aligned(x, 16) &&
                     ln_aligned(gamma, 16) && (d_branch ? ln_aligned(d_branch, 16) : ln_aligned(d_branch16, 8));
    const size_t plane = (size_t)rln_chunks(N) * C;
    const ColsumPlanes pl = {{part, part + plane, part + 2 * plane}, {dgamma, dbeta, d_bias}};
    const LnBwdRows rows = {d_res, dy, x, mean, rstd, gamma};
    const int n_sums = d_bias ? 3 : 2;
    if (d_branch16) {  // bf16 values: summed as stored
        const RlnTail<uint16_t> tail = {d, d_branch16, true};
        if (vec) ln_bwd_launch<true>(tail, rows, pl, n_sums, N, C, stream);
        else ln_bwd_launch<false>(tail, rows, pl, n_sums, N, C, stream);
    } else {
        const RlnTail<float> tail = {d, d_branch, round_bias};
        if (vec) ln_bwd_launch<true>(tail, rows, pl, n_sums, N, C, stream);
        else ln_bwd_launch<false>(tail, rows, pl, n_sums, N, C, stream);
    }
}

// ---- exported ops ---------------------------------------------------------------------

static void rln_check_drop(const char *op, float p, uint64_t first) {
    TP_CHECK(p >= 0.0f && p <= 1.0f, "%s: p = %g outside [0, 1]", op, (double)p);
    TP_CHECK(first % 4 == 0, "%s: window start %llu is not a multiple of 4", op, (unsigned long long)first);
}

extern "C" void cuda_op_residual_ln_fwd(float *res_out, float *y, uint16_t *y16, float *mean, float *rstd,
                                        const float *res_in,
                                        const float *branch, const float *bias, const float *gamma,
                                        const float *beta, int N, int C, float eps, uint64_t first, float p,
                                        uint64_t seed, uint64_t stream_id, const StepVars *step,
                                        cudaStream_t stream) {
    const char *op = "cuda_op_residual_ln_fwd";
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, C);
    rln_check_drop(op, p, first);
    if (N == 0) return;
    TP_NEED_PTR(op, mean);
    TP_NEED_PTR(op, rstd);
    if (C > 0) {
        TP_NEED_PTR(op, res_out);
        TP_CHECK((y == NULL) != (y16 == NULL), "%s: give exactly one of y and y16", op);
        TP_NEED_PTR(op, res_in);
        TP_NEED_PTR(op, branch);
        TP_NEED_PTR(op, gamma);
        TP_NEED_PTR(op, beta);
        TP_CHECK(!y || (y != res_in && y != branch && y != res_out), "%s: y must not alias res_in, branch or res_out",
                 op);
    }
    residual_ln_fwd_launch(res_out, y, y16, mean, rstd, res_in, branch, bias, gamma, beta, N, C, eps,
                           rln_drop_of(first, p, seed, stream_id, step), stream);
}

extern "C" size_t cuda_residual_ln_bwd_scratch_bytes(int N, int C) { return scratch_residual_ln_bwd(N, C); }

static void residual_ln_bwd_op(const char *op, float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma,
                               float *dbeta,
                               float *d_bias, const float *dy, const float *x, const float *mean, const float *rstd,
                               const float *gamma, int N, int C, uint64_t first, float p, uint64_t seed,
                               uint64_t stream_id, const StepVars *step, bool round_bias, void *scratch,
                               cudaStream_t stream) {
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, C);
    rln_check_drop(op, p, first);
    if (N == 0 || C == 0) return;  // adds nothing, writes nothing
    TP_NEED_PTR(op, d_res);
    TP_CHECK((d_branch == NULL) != (d_branch16 == NULL), "%s: give exactly one of d_branch and d_branch16", op);
    TP_NEED_PTR(op, dgamma);
    TP_NEED_PTR(op, dbeta);
    TP_NEED_PTR(op, dy);
    TP_NEED_PTR(op, x);
    TP_NEED_PTR(op, mean);
    TP_NEED_PTR(op, rstd);
    TP_NEED_PTR(op, gamma);
    const void *br = d_branch ? (const void *)d_branch : (const void *)d_branch16;
    TP_CHECK(br != dy && br != d_res, "%s: d_branch must not alias dy or d_res", op);
    TpCarver cv = tp_carver(scratch, cuda_residual_ln_bwd_scratch_bytes(N, C), op);
    double *part = (double *)tp_carve(&cv, 3 * (size_t)rln_chunks(N) * C * sizeof(double));  // (3, n_chunks, C)
    residual_ln_bwd_launch(d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x, mean, rstd, gamma, N, C,
                           rln_drop_of(first, p, seed, stream_id, step), round_bias, part, stream);
}

extern "C" void cuda_op_residual_ln_bwd(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma,
                                        float *dbeta, float *d_bias, const float *dy, const float *x,
                                        const float *mean, const float *rstd, const float *gamma, int N, int C,
                                        uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                        const StepVars *step, void *scratch, cudaStream_t stream) {
    residual_ln_bwd_op("cuda_op_residual_ln_bwd", d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x, mean,
                       rstd, gamma, N, C, first, p, seed, stream_id, step, false, scratch, stream);
}

extern "C" void cuda_op_residual_ln_bwd_bias16(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma,
                                               float *dbeta, float *d_bias, const float *dy, const float *x,
                                               const float *mean, const float *rstd, const float *gamma, int N,
                                               int C, uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                               const StepVars *step, void *scratch, cudaStream_t stream) {
    residual_ln_bwd_op("cuda_op_residual_ln_bwd_bias16", d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x,
                       mean, rstd, gamma, N, C, first, p, seed, stream_id, step, true, scratch, stream);
}
