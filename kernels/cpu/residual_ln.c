/* residual_ln.c: the fused residual + dropout + LayerNorm ops on the CPU.
 *
 * A pre-LN sub-block ends with x_out = x_in + Dropout(branch + bias) and the
 * next one starts with LayerNorm(x_out); on a GPU the two are one pass over
 * the rows each way (kernels/cuda/residual_ln.cu). The reference is the
 * unfused sequence itself, written with the other reference ops, so the
 * fused ops are bit-identical to it by construction and the CUDA kernels
 * have one plain meaning to match. The forward uses y (the LayerNorm
 * output, overwritten last) as its scratch, so no op allocates.
 */
#include "cpu_ops.h"
#include "err.h"

/* Shapes and aliasing: the op's entry in kernels/ops_list.h. */
void cpu_residual_ln_fwd(float *res_out, float *y, float *mean, float *rstd, const float *res_in, const float *branch,
                         const float *bias, const float *gamma, const float *beta, int N, int C, float eps,
                         uint64_t first, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(N >= 0 && C >= 0, "op_residual_ln_fwd: N = %d, C = %d must not be negative", N, C);
    const size_t n_elems = (size_t)N * C;
    TP_CHECK(n_elems == 0 || (y != res_in && y != branch && y != res_out),
             "op_residual_ln_fwd: y must not alias res_in, branch or res_out");
    cpu_copy(y, branch, n_elems);                                 // y: scratch until the LayerNorm
    if (bias) cpu_bias_add(y, bias, N, C);                        // branch + bias
    cpu_dropout_fwd_at(y, y, n_elems, first, p, seed, stream);    // Dropout(...)
    cpu_add(res_out, res_in, y, n_elems);                         // the residual stream
    cpu_layernorm_fwd(y, mean, rstd, res_out, gamma, beta, N, C, eps);
}

void cpu_residual_ln_bwd(float *d_res, float *d_branch, float *dgamma, float *dbeta, float *d_bias, const float *dy,
                         const float *x, const float *mean, const float *rstd, const float *gamma, int N, int C,
                         uint64_t first, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(N >= 0 && C >= 0, "op_residual_ln_bwd: N = %d, C = %d must not be negative", N, C);
    const size_t n_elems = (size_t)N * C;
    TP_CHECK(n_elems == 0 || (d_branch != dy && d_branch != d_res),
             "op_residual_ln_bwd: d_branch must not alias dy or d_res");
    cpu_layernorm_bwd(d_res, dgamma, dbeta, dy, x, mean, rstd, gamma, N, C);
    cpu_zero(d_branch, n_elems);
    cpu_dropout_bwd_at(d_branch, NULL, GRAD_ADD, d_res, n_elems, first, p, seed, stream);  // into zeros: 0 + value
    if (d_bias) cpu_bias_bwd(d_bias, d_branch, N, C);
}
