/* cuda_ops.h: the CUDA kernels behind kernels/backend.h, op for op.
 * PRIVATE to kernels/cuda (and the GPU tests): the model reaches these only
 * through the Backend table that backend_cuda.cu fills.
 *
 * cuda_op_<name> has the arguments of ops.h's op_<name>, in the same order
 * and with the same meaning (accumulating backward ops, masks, Philox
 * counter layout, vocab-parallel protocol: see ops.h), minus the backend and
 * plus, where the op needs temporary device memory, a `scratch` pointer,
 * and a final stream. All tensor pointers, k_len, ids and targets included,
 * are DEVICE pointers. Every op is enqueued on `stream` and returns at
 * once: none synchronises and none returns a value. The GEMM and linear
 * ops live in gemm.cu (cuBLASLt) and are declared in cuda_gemm.h.
 *
 * Scratch: no op allocates. An op that needs temporary device memory has a
 * cuda_<op>_scratch_bytes(...) function of its arguments; the caller passes
 * at least that many bytes, aligned to 256, as `scratch` (the backend takes
 * them from its workspace arena, backend_workspace). The scratch may be
 * reused by the next op on the same stream.
 *
 * Every op checks its sizes (non-negative) and pointers (non-NULL when the
 * sizes make them used) and dies with a message on bad input, as the rest
 * of the project does. Where ops.h lets an output alias an input (op_add,
 * op_act_*, op_dropout_fwd, op_softmax_bwd dS == dP), so do these.
 *
 * Differences from the CPU that a caller may notice:
 *  - cuda_op_xent_fwd / cuda_op_xent_vp_loss check targets on the device and
 *    record a bad one in a CudaOpStatus (host memory mapped into the device)
 *    instead of dying at the bad row; the backend reads it at its next
 *    synchronisation (backend_sync, backend_download) and dies there with
 *    cuda_status_message's sentence. Bad rows get loss 0 meanwhile.
 *  - Reductions (sums into device scalars, bias/LayerNorm column sums,
 *    embedding scatter-add, xent statistics) are deterministic: the same
 *    inputs give the same bits on every run, independent of scheduling, with
 *    no float atomics. The embedding backward, dropout, clip_coef and
 *    scale_by are bit-identical to the CPU reference.
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

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"  // Activation (ops.h states the contract these mirror)

/* ---- Status reported by the device ----------------------------------------- */
/* Filled by the cross-entropy ops when a target is outside [0, V); lives in
 * host memory mapped into the device (the backend's). Zero = nothing seen. */
typedef struct {
    int n_bad_targets;     // bad targets seen so far
    int first_bad_row;     // of the first op call that saw one
    int first_bad_target;
    int V;
    int op;                // CUDA_STATUS_XENT_FWD or CUDA_STATUS_XENT_VP_LOSS
} CudaOpStatus;
enum { CUDA_STATUS_XENT_FWD = 1, CUDA_STATUS_XENT_VP_LOSS = 2 };
/* One sentence for a status that saw bad targets; false when it saw none. */
bool cuda_status_message(const volatile CudaOpStatus *status, char *buf, size_t len);

/* ---- Memory ------------------------------------------------------------- */
void cuda_op_zero(float *x, size_t n_elems, cudaStream_t stream);
/* memmove semantics: overlapping ranges go through scratch, which must hold
 * cuda_copy_scratch_bytes(dst, src, n_bytes) (n_bytes when the ranges
 * overlap, else 0; scratch may be NULL then). */
size_t cuda_copy_scratch_bytes(const void *dst, const void *src, size_t n_bytes);
void cuda_op_copy_bytes(void *dst, const void *src, size_t n_bytes, void *scratch,
                        cudaStream_t stream);
void cuda_op_copy(float *dst,        // (n_elems)
                  const float *src,  // (n_elems)
                  size_t n_elems, void *scratch, cudaStream_t stream);
void cuda_op_copy_ids(int32_t *dst,        // (n_elems)
                      const int32_t *src,  // (n_elems)
                      size_t n_elems, void *scratch, cudaStream_t stream);

/* ---- Bias (the rest of the linear layer is in gemm.cu) ------------------ */
/* y[n, :] += b */
void cuda_op_bias_add(float *y,        // (N, C)
                      const float *b,  // (C)
                      int N, int C, cudaStream_t stream);
/* db += sum over rows of dy (column sums in double, fixed order) */
size_t cuda_bias_bwd_scratch_bytes(int N, int C);
void cuda_op_bias_bwd(float *db,        // (C)
                      const float *dy,  // (N, C)
                      int N, int C,
                      void *scratch,    // (cuda_bias_bwd_scratch_bytes(N, C))
                      cudaStream_t stream);

/* ---- Embedding ------------------------------------------------------------ */
void cuda_op_embedding_fwd(float *out,          // (N, C)
                           const int32_t *ids,  // (N)
                           const float *table,  // (V_local, C)
                           float scale, int N, int C, int vocab_start, int V_local,
                           cudaStream_t stream);
/* dtable[ids[n] - vocab_start] += scale * dout[n], own rows only. Each
 * table row adds its occurrences in increasing n, as the CPU does. */
size_t cuda_embedding_bwd_scratch_bytes(int N, int V_local);
void cuda_op_embedding_bwd(float *dtable,       // (V_local, C)
                           const float *dout,   // (N, C)
                           const int32_t *ids,  // (N)
                           float scale, int N, int C, int vocab_start, int V_local,
                           void *scratch,       // (cuda_embedding_bwd_scratch_bytes(N, V_local))
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
size_t cuda_layernorm_bwd_scratch_bytes(int N, int C);
void cuda_op_layernorm_bwd(float *dx,           // (N, C)  accumulated
                           float *dgamma,       // (C)     accumulated
                           float *dbeta,        // (C)     accumulated
                           const float *dy,     // (N, C)
                           const float *x,      // (N, C)
                           const float *mean,   // (N)
                           const float *rstd,   // (N)
                           const float *gamma,  // (C)
                           int N, int C,
                           void *scratch,       // (cuda_layernorm_bwd_scratch_bytes(N, C))
                           cudaStream_t stream);

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

/* ---- Device scalars: sums, the global norm, clipping (reduce.cu) ----------- */
/* acc[0] += sum of x / of x^2, summed in double in a fixed order (the same
 * bits on every run; within a few 1e-16 relative of the CPU's loop). */
size_t cuda_sum_scratch_bytes(size_t n_elems);
void cuda_op_sum_acc(float *acc,       // (1)
                     const float *x,   // (n_elems)
                     size_t n_elems,
                     void *scratch,    // (cuda_sum_scratch_bytes(n_elems))
                     cudaStream_t stream);
void cuda_op_sumsq_acc(float *acc,      // (1)
                       const float *x,  // (n_elems)
                       size_t n_elems,
                       void *scratch,   // (cuda_sum_scratch_bytes(n_elems))
                       cudaStream_t stream);
/* acc[s.acc] += sumsq of each segment of the table (device side: segs->d_*),
 * one launch: blocks sum chunks in double, the last block to finish adds
 * each segment's total in table order, as cuda_op_sumsq_acc would. */
void cuda_op_sumsq_segs(float *acc,             // (OP_SEG_MAX_ACC) at most
                        const float *x,         // (every segment's x_at + n)
                        const OpSegTable *segs, cudaStream_t stream);
/* norm_coef[0] = sqrt(sum sumsq[0..n_parts)), norm_coef[1] = clip factor. */
void cuda_op_clip_coef(float *norm_coef,    // (2)
                       const float *sumsq,  // (n_parts)
                       int n_parts, float max_norm, cudaStream_t stream);
/* x *= s[0] */
void cuda_op_scale_by(float *x,        // (n_elems)
                      const float *s,  // (1)
                      size_t n_elems, cudaStream_t stream);

/* fp32 <-> bf16 (raw bits), as the CPU's common/bf16.h rounds: bit-identical. */
void cuda_op_to_bf16(uint16_t *dst,      // (n_elems)
                     const float *src,   // (n_elems)
                     size_t n_elems, cudaStream_t stream);
void cuda_op_from_bf16(float *dst,          // (n_elems)
                       const uint16_t *src, // (n_elems)
                       size_t n_elems, cudaStream_t stream);

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
void cuda_op_dropout_fwd(float *out, const float *x, size_t n_elems, uint64_t first, float p,
                         uint64_t seed, uint64_t stream_id, cudaStream_t stream);
void cuda_op_dropout_bwd(float *dx, const float *dy, size_t n_elems, uint64_t first, float p,
                         uint64_t seed, uint64_t stream_id, cudaStream_t stream);

/* ---- Residual + dropout + LayerNorm, fused (residual_ln.cu) ------------------ */
void cuda_op_residual_ln_fwd(float *res_out,       // (N, C)
                             float *y,             // (N, C)
                             float *mean,          // (N)
                             float *rstd,          // (N)
                             const float *res_in,  // (N, C)
                             const float *branch,  // (N, C)
                             const float *bias,    // (C) or NULL
                             const float *gamma,   // (C)
                             const float *beta,    // (C)
                             int N, int C, float eps, uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                             cudaStream_t stream);
size_t cuda_residual_ln_bwd_scratch_bytes(int N, int C);
void cuda_op_residual_ln_bwd(float *d_res,         // (N, C) accumulated
                             float *d_branch,      // (N, C) written
                             float *dgamma,        // (C) accumulated
                             float *dbeta,         // (C) accumulated
                             float *d_bias,        // (C) accumulated, or NULL
                             const float *dy,      // (N, C)
                             const float *x,       // (N, C)
                             const float *mean,    // (N)
                             const float *rstd,    // (N)
                             const float *gamma,   // (C)
                             int N, int C, uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                             void *scratch,        // (cuda_residual_ln_bwd_scratch_bytes(N, C))
                             cudaStream_t stream);

/* ---- Cross-entropy ------------------------------------------------------------ */
/* A target outside [0, V) is recorded in *status (device-visible). */
void cuda_op_xent_fwd(float *losses,           // (N)
                      float *lse,              // (N)
                      const float *logits,     // (N, V)
                      const int32_t *targets,  // (N)
                      int N, int V, float eps, int32_t ignore_id, CudaOpStatus *status,
                      cudaStream_t stream);
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
/* A target outside [0, V) is recorded in *status (device-visible). */
void cuda_op_xent_vp_loss(float *losses,            // (N)
                          float *lse,               // (N)
                          const float *row_max,     // (N) global
                          const float *stats,       // (N, 3) reduced
                          const int32_t *targets,   // (N)
                          int N, int V, float eps, int32_t ignore_id, CudaOpStatus *status,
                          cudaStream_t stream);
void cuda_op_xent_vp_bwd(float *dlogits,           // (N, V_local)
                         const float *logits,      // (N, V_local)
                         const float *lse,         // (N)
                         const int32_t *targets,   // (N)
                         float dloss, int N, int V_local, int V_valid, int vocab_start, int V,
                         float eps, int32_t ignore_id, cudaStream_t stream);
void cuda_op_xent_vp_grad_inplace(float *logits,           // (N, V_local) in: logits; out: gradient
                                  const float *lse,        // (N)
                                  const int32_t *targets,  // (N)
                                  float dloss, int N, int V_local, int V_valid, int vocab_start,
                                  int V, float eps, int32_t ignore_id, cudaStream_t stream);

/* ---- AdamW -------------------------------------------------------------------- */
void cuda_op_adamw(float *p, const float *g, float *m, float *v, size_t n_elems, float lr,
                   float beta1, float beta2, float eps, float wd, int t, cudaStream_t stream);
/* cuda_op_adamw over every segment of the table in one launch (wd where decay). */
void cuda_op_adamw_segs(float *p, const float *g, float *m, float *v, const OpSegTable *segs, float lr,
                        float beta1, float beta2, float eps, float wd, int t, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
