/* cuda_ops.h: the CUDA backend of kernels/ops.h, op for op.
 *
 * cuda_op_<name> has the arguments of op_<name>, in the same order and with
 * the same meaning (accumulating backward ops, masks, Philox counter layout,
 * vocab-parallel protocol: see ops.h), plus a final stream. All tensor
 * pointers, k_len, ids and targets included, are DEVICE pointers. Ops are
 * enqueued on `stream` and return at once, except the three that return a
 * value (cuda_op_sumsq, cuda_op_xent_fwd, cuda_op_xent_vp_loss): they
 * synchronise `stream` and return the value. The GEMM and linear ops live in
 * gemm.cu (cuBLASLt) and are declared there, not here.
 *
 * Every op checks its sizes (non-negative) and pointers (non-NULL when the
 * sizes make them used) and dies with a message on bad input, as the rest
 * of the project does. Where ops.h lets an output alias an input (op_add,
 * op_act_*, op_dropout_fwd, op_softmax_bwd dS == dP), so do these.
 *
 * Differences from the CPU that a caller may notice:
 *  - cuda_op_xent_fwd / cuda_op_xent_vp_loss check targets on the device
 *    and die after the stream synchronises (the CPU dies at the bad row).
 *  - Reductions (sumsq, bias/LayerNorm column sums, embedding scatter-add,
 *    xent statistics) are deterministic: the same inputs give the same bits
 *    on every run, independent of scheduling. The embedding backward and the
 *    dropout masks are bit-identical to the CPU reference.
 *  - Some ops take temporary device memory from the stream-ordered pool
 *    (cudaMallocAsync): sumsq, bias_bwd, layernorm_bwd, embedding_bwd, xent
 *    fwd/loss, and copy of overlapping ranges.
 *
 * dropout_stream() and philox4x32_10() stay host functions of the CPU
 * library; the device generator is kernels/philox.h. The dropout ops name the
 * Philox stream `stream_id`, since `stream` is the CUDA stream here.
 */
#ifndef TPTRAIN_CUDA_OPS_H
#define TPTRAIN_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cuda_runtime_api.h>

#include "ops.h"  // Activation, and the contract these mirror (CPU ops: call them from C)

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Memory ------------------------------------------------------------- */
void cuda_op_zero(float *x, size_t n_elems, cudaStream_t stream);
/* memmove semantics: overlapping ranges are copied through a temporary. */
void cuda_op_copy(float *dst, const float *src, size_t n_elems, cudaStream_t stream);

/* ---- Bias (the rest of the linear layer is in gemm.cu) ------------------ */
/* y[n, :] += b */
void cuda_op_bias_add(float *y,        // (N, C)
                      const float *b,  // (C)
                      int N, int C, cudaStream_t stream);
/* db += sum over rows of dy (column sums in double, fixed order) */
void cuda_op_bias_bwd(float *db,        // (C)
                      const float *dy,  // (N, C)
                      int N, int C, cudaStream_t stream);

/* ---- Embedding ------------------------------------------------------------ */
void cuda_op_embedding_fwd(float *out,          // (N, C)
                           const int32_t *ids,  // (N)
                           const float *table,  // (V_local, C)
                           float scale, int N, int C, int vocab_start, int V_local,
                           cudaStream_t stream);
/* dtable[ids[n] - vocab_start] += scale * dout[n], own rows only. Each
 * table row adds its occurrences in increasing n, as the CPU does. */
void cuda_op_embedding_bwd(float *dtable,       // (V_local, C)
                           const float *dout,   // (N, C)
                           const int32_t *ids,  // (N)
                           float scale, int N, int C, int vocab_start, int V_local,
                           cudaStream_t stream);
void cuda_op_add_positions(float *x,  // (B, T, C)
                           int B, int T, int C, cudaStream_t stream);

/* ---- LayerNorm ------------------------------------------------------------ */
void cuda_op_layernorm_fwd(float *y,            // (N, C)
                           float *mean,         // (N)
                           float *rstd,         // (N)
                           const float *x,      // (N, C)
                           const float *gamma,  // (C)
                           const float *beta,   // (C)
                           int N, int C, float eps, cudaStream_t stream);
void cuda_op_layernorm_bwd(float *dx,           // (N, C)  accumulated
                           float *dgamma,       // (C)     accumulated
                           float *dbeta,        // (C)     accumulated
                           const float *dy,     // (N, C)
                           const float *x,      // (N, C)
                           const float *mean,   // (N)
                           const float *rstd,   // (N)
                           const float *gamma,  // (C)
                           int N, int C, cudaStream_t stream);

/* ---- Activations and element-wise ----------------------------------------- */
void cuda_op_act_fwd(float *y, const float *x, size_t n_elems, Activation act,
                     cudaStream_t stream);
/* dx += dy * act'(x) */
void cuda_op_act_bwd(float *dx, const float *dy, const float *x, size_t n_elems,
                     Activation act, cudaStream_t stream);
void cuda_op_add(float *out, const float *a, const float *b, size_t n_elems,
                 cudaStream_t stream);
void cuda_op_accumulate(float *y, const float *x, size_t n_elems, cudaStream_t stream);
void cuda_op_scale(float *x, float s, size_t n_elems, cudaStream_t stream);
/* Sum of squares in double; synchronises stream. */
double cuda_op_sumsq(const float *x, size_t n_elems, cudaStream_t stream);

/* ---- Masked softmax and attention ------------------------------------------ */
void cuda_op_softmax_fwd(float *P,              // (B, H, Tq, Tk)
                         const float *S,        // (B, H, Tq, Tk)
                         const int32_t *k_len,  // (B)
                         int B, int H, int Tq, int Tk, float scale, bool causal,
                         cudaStream_t stream);
void cuda_op_softmax_bwd(float *dS,        // (B, H, Tq, Tk)
                         const float *dP,  // (B, H, Tq, Tk)
                         const float *P,   // (B, H, Tq, Tk)
                         int B, int H, int Tq, int Tk, float scale, cudaStream_t stream);
void cuda_op_attention_fwd(float *out,            // (B, Tq, H*D)
                           float *P,              // (B, H, Tq, Tk)
                           const float *q,        // (B, Tq, H*D)
                           const float *k,        // (B, Tk, H*D)
                           const float *v,        // (B, Tk, H*D)
                           const int32_t *k_len,  // (B)
                           int B, int H, int Tq, int Tk, int D, bool causal,
                           cudaStream_t stream);
void cuda_op_attention_bwd(float *dq,          // (B, Tq, H*D)
                           float *dk,          // (B, Tk, H*D)
                           float *dv,          // (B, Tk, H*D)
                           const float *dout,  // (B, Tq, H*D)
                           const float *P,     // (B, H, Tq, Tk)
                           const float *q,     // (B, Tq, H*D)
                           const float *k,     // (B, Tk, H*D)
                           const float *v,     // (B, Tk, H*D)
                           float *scratch,     // (B, H, Tq, Tk)
                           int B, int H, int Tq, int Tk, int D, cudaStream_t stream);

/* ---- Dropout (masks bit-identical to the CPU's) ----------------------------- */
void cuda_op_dropout_fwd(float *out, const float *x, size_t n_elems, float p,
                         uint64_t seed, uint64_t stream_id, cudaStream_t stream);
void cuda_op_dropout_bwd(float *dx, const float *dy, size_t n_elems, float p,
                         uint64_t seed, uint64_t stream_id, cudaStream_t stream);

/* ---- Cross-entropy ------------------------------------------------------------ */
/* Returns the number of non-ignored rows; synchronises stream. */
int cuda_op_xent_fwd(float *losses,           // (N)
                     float *lse,              // (N)
                     const float *logits,     // (N, V)
                     const int32_t *targets,  // (N)
                     int N, int V, float eps, int32_t ignore_id, cudaStream_t stream);
void cuda_op_xent_bwd(float *dlogits,          // (N, V)
                      const float *logits,     // (N, V)
                      const float *lse,        // (N)
                      const int32_t *targets,  // (N)
                      float dloss, int N, int V, float eps, int32_t ignore_id,
                      cudaStream_t stream);
void cuda_op_xent_vp_max(float *row_max,       // (N)
                         const float *logits,  // (N, V_local)
                         int N, int V_local, int V_valid, cudaStream_t stream);
void cuda_op_xent_vp_sums(float *stats,            // (N, 3)
                          const float *logits,     // (N, V_local)
                          const float *row_max,    // (N) global
                          const int32_t *targets,  // (N)
                          int N, int V_local, int V_valid, int vocab_start,
                          int32_t ignore_id, cudaStream_t stream);
/* Returns the number of non-ignored rows; synchronises stream. */
int cuda_op_xent_vp_loss(float *losses,            // (N)
                         float *lse,               // (N)
                         const float *row_max,     // (N) global
                         const float *stats,       // (N, 3) reduced
                         const int32_t *targets,   // (N)
                         int N, int V, float eps, int32_t ignore_id, cudaStream_t stream);
void cuda_op_xent_vp_bwd(float *dlogits,           // (N, V_local)
                         const float *logits,      // (N, V_local)
                         const float *lse,         // (N)
                         const int32_t *targets,   // (N)
                         float dloss, int N, int V_local, int V_valid, int vocab_start, int V,
                         float eps, int32_t ignore_id, cudaStream_t stream);

/* ---- AdamW -------------------------------------------------------------------- */
void cuda_op_adamw(float *p, const float *g, float *m, float *v, size_t n_elems, float lr,
                   float beta1, float beta2, float eps, float wd, int t, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
