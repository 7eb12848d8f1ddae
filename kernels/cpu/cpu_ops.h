/* cpu_ops.h: the fp32 CPU reference of every op, the oracle of the tests.
 *
 * cpu_<name> is ops.h's op_<name> without the backend argument, on host
 * pointers: ops.h states each contract (shapes, accumulation, masks) once.
 * The CPU backend (backend_cpu.c) puts these in its table; tests call them
 * directly as the reference. Three of them also return what the host-side
 * reference needs (cpu_sumsq, cpu_xent_fwd, cpu_xent_vp_loss).
 */
#ifndef TPTRAIN_CPU_OPS_H
#define TPTRAIN_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "backend.h"  // Activation

/* ---- Memory ------------------------------------------------------------- */
void cpu_zero(float *x, size_t n_elems);
void cpu_copy(float *dst, const float *src, size_t n_elems);

/* ---- GEMM ---------------------------------------------------------------
 * C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T.
 * op(A): (M, K), op(B): (K, N), C: (M, N); A stored (M,K) or (K,M) when
 * trans_a, B stored (K,N) or (N,K) when trans_b. beta = 0 overwrites C. */
void cpu_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float *A, const float *B, float beta, float *C);

/* ---- Linear (GEMM + bias) ----------------------------------------------
 * y = x W^T + b. b may be NULL. */
void cpu_linear_fwd(float *y,        // (N, out)
                   const float *x,  // (N, in)
                   const float *W,  // (out, in)
                   const float *b,  // (out) or NULL
                   int N, int in, int out);
void cpu_linear_bwd(float *dx,        // (N, in) or NULL
                   float *dW,        // (out, in) or NULL
                   float *db,        // (out) or NULL
                   const float *dy,  // (N, out)
                   const float *x,   // (N, in)
                   const float *W,   // (out, in)
                   int N, int in, int out);

void cpu_bias_add(float *y,        // (N, C)
                 const float *b,  // (C)
                 int N, int C);
void cpu_bias_bwd(float *db,        // (C)
                 const float *dy,  // (N, C)
                 int N, int C);

/* ---- Embedding -----------------------------------------------------------
 * out[n] = scale * table[ids[n] - vocab_start] when the id falls in this
 * shard's rows [vocab_start, vocab_start + V_local), else zeros (so a
 * vocab-parallel shard contributes only its own rows; with one shard pass
 * vocab_start = 0, V_local = V). Ids outside [0, V) of the full vocabulary
 * are a caller bug and must be rejected before calling. */
void cpu_embedding_fwd(float *out,          // (N, C)
                      const int32_t *ids,  // (N)
                      const float *table,  // (V_local, C)
                      float scale, int N, int C, int vocab_start, int V_local);
void cpu_embedding_bwd(float *dtable,        // (V_local, C)
                      const float *dout,    // (N, C)
                      const int32_t *ids,   // (N)
                      float scale, int N, int C, int vocab_start, int V_local);

void cpu_add_positions(float *x,  // (B, T, C)
                      int B, int T, int C);

/* ---- LayerNorm -----------------------------------------------------------
 * y = (x - mean) * rstd * gamma + beta, per row; mean and rstd saved. */
void cpu_layernorm_fwd(float *y,            // (N, C)
                      float *mean,         // (N)
                      float *rstd,         // (N)
                      const float *x,      // (N, C)
                      const float *gamma,  // (C)
                      const float *beta,   // (C)
                      int N, int C, float eps);
void cpu_layernorm_bwd(float *dx,           // (N, C)  accumulated
                      float *dgamma,       // (C)     accumulated
                      float *dbeta,        // (C)     accumulated
                      const float *dy,     // (N, C)
                      const float *x,      // (N, C)
                      const float *mean,   // (N)
                      const float *rstd,   // (N)
                      const float *gamma,  // (C)
                      int N, int C);

/* ---- Activations (GELU is the exact erf form, as torch's default) ------- */
void cpu_act_fwd(float *y, const float *x, size_t n_elems, Activation act);
void cpu_act_bwd(float *dx, const float *dy, const float *x, size_t n_elems,
                Activation act);

/* ---- Element-wise --------------------------------------------------------- */
void cpu_add(float *out, const float *a, const float *b, size_t n_elems);
void cpu_accumulate(float *y, const float *x, size_t n_elems);
void cpu_scale(float *x, float s, size_t n_elems);
double cpu_sumsq(const float *x, size_t n_elems);
void cpu_sum_acc(float *acc, const float *x, size_t n_elems);
void cpu_sumsq_acc(float *acc, const float *x, size_t n_elems);
void cpu_clip_coef(float *norm_coef, const float *sumsq, int n_parts, float max_norm);
void cpu_scale_by(float *x, const float *s, size_t n_elems);
/* cpu_sumsq_acc(acc + s.acc, x + s.x_at, s.n) for each segment in order. */
void cpu_sumsq_segs(float *acc, const float *x, const OpSeg *segs, int n_segs);
void cpu_to_bf16(uint16_t *dst, const float *src, size_t n_elems);
void cpu_from_bf16(float *dst, const uint16_t *src, size_t n_elems);

/* ---- Masked softmax ------------------------------------------------------
 * Rows are (b, h, i) over Tk keys: P = softmax(scale * S) where key j is
 * masked out when j >= k_len[b], or (causal) when j > i. Masked entries get
 * probability 0. A row with no valid key (k_len[b] == 0) becomes all zeros. */
void cpu_softmax_fwd(float *P,            // (B, H, Tq, Tk)
                    const float *S,      // (B, H, Tq, Tk)
                    const int32_t *k_len,  // (B)
                    int B, int H, int Tq, int Tk, float scale, bool causal);
void cpu_softmax_bwd(float *dS,          // (B, H, Tq, Tk)
                    const float *dP,    // (B, H, Tq, Tk)
                    const float *P,     // (B, H, Tq, Tk)
                    int B, int H, int Tq, int Tk, float scale);

/* ---- Scaled dot-product attention, per head --------------------------------
 * q, k, v hold H heads of width D side by side: head h of token t is
 * q[t, h*D : (h+1)*D]. out = softmax(q k^T / sqrt(D), masks) v.
 * P (the probabilities) is saved for backward. */
void cpu_attention_fwd(float *out,            // (B, Tq, H*D)
                      float *P,              // (B, H, Tq, Tk)
                      const float *q,        // (B, Tq, H*D)
                      const float *k,        // (B, Tk, H*D)
                      const float *v,        // (B, Tk, H*D)
                      const int32_t *k_len,  // (B)
                      int B, int H, int Tq, int Tk, int D, bool causal);
void cpu_attention_bwd(float *dq,            // (B, Tq, H*D)
                      float *dk,            // (B, Tk, H*D)
                      float *dv,            // (B, Tk, H*D)
                      const float *dout,    // (B, Tq, H*D)
                      const float *P,       // (B, H, Tq, Tk)
                      const float *q,       // (B, Tq, H*D)
                      const float *k,       // (B, Tk, H*D)
                      const float *v,       // (B, Tk, H*D)
                      float *scratch,       // (B, H, Tq, Tk)
                      int B, int H, int Tq, int Tk, int D);

/* ---- Dropout with a counter-based RNG --------------------------------------
 * Philox4x32-10 keyed by `seed`; element i uses counter
 * (i/4 lo, i/4 hi, stream lo, stream hi), word i%4. The mask is a pure
 * function of (seed, stream, i): backward recomputes it, resume reproduces it.
 * Kept elements are scaled by 1/(1-p). p == 0 copies. out may alias x. */
void cpu_dropout_fwd(float *out, const float *x, size_t n_elems, float p,
                    uint64_t seed, uint64_t stream);
void cpu_dropout_bwd(float *dx, const float *dy, size_t n_elems, float p,
                    uint64_t seed, uint64_t stream);
/* The same on a window: out[i] takes element first + i of the mask
 * (first a multiple of 4, so the windows' Philox blocks are whole). */
void cpu_dropout_fwd_at(float *out, const float *x, size_t n_elems, uint64_t first, float p,
                        uint64_t seed, uint64_t stream);
void cpu_dropout_bwd_at(float *dx, const float *dy, size_t n_elems, uint64_t first, float p,
                        uint64_t seed, uint64_t stream);
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* ---- Residual + dropout + LayerNorm, fused (ops.h op_residual_ln_*) -------
 * The reference is the unfused sequence of the ops above (residual_ln.c). */
void cpu_residual_ln_fwd(float *res_out, float *y, float *mean, float *rstd, const float *res_in,
                         const float *branch, const float *bias, const float *gamma, const float *beta, int N,
                         int C, float eps, uint64_t first, float p, uint64_t seed, uint64_t stream);
void cpu_residual_ln_bwd(float *d_res, float *d_branch, float *dgamma, float *dbeta, float *d_bias,
                         const float *dy, const float *x, const float *mean, const float *rstd, const float *gamma,
                         int N, int C, uint64_t first, float p, uint64_t seed, uint64_t stream);
uint64_t dropout_stream(uint32_t step, uint32_t micro, uint32_t layer,
                        uint32_t site, uint32_t tp_rank);

/* ---- Label-smoothed cross-entropy ------------------------------------------
 * For row n with target y = targets[n] (rows with y == ignore_id are skipped,
 * loss 0): loss_n = (1-eps) * (-log p_y) + (eps/V) * sum_v (-log p_v),
 * p = softmax(logits[n]), as torch's cross_entropy(label_smoothing=eps).
 * Writes per-row losses and the row's log-sum-exp (saved for backward).
 * Returns the number of non-ignored rows. */
int cpu_xent_fwd(float *losses,          // (N)
                float *lse,             // (N)
                const float *logits,    // (N, V)
                const int32_t *targets, // (N)
                int N, int V, float eps, int32_t ignore_id);
void cpu_xent_bwd(float *dlogits,         // (N, V)
                 const float *logits,    // (N, V)
                 const float *lse,       // (N)
                 const int32_t *targets, // (N)
                 float dloss, int N, int V, float eps, int32_t ignore_id);

/* ---- Vocab-parallel label-smoothed cross-entropy -----------------------------
 * The logits of a row are split over tp ranks by vocabulary: this rank holds
 * columns [vocab_start, vocab_start + V_local) of the V real ones, of which
 * the first V_valid are real (the rest pad the vocabulary to a multiple of
 * tp and are ignored). The full row is never gathered:
 *   1. op_xent_vp_max: the shard's row max; the caller reduces it (MAX).
 *   2. op_xent_vp_sums: with the global max, per row the shard's
 *      {sum exp(x - max), sum x, x_target (0 if the target is elsewhere)};
 *      the caller reduces them (SUM).
 *   3. op_xent_vp_loss: losses and lse from the reduced statistics (every
 *      rank computes the same values).
 *   4. op_xent_vp_bwd: the shard's gradient.
 * With one shard this is op_xent_fwd / op_xent_bwd. Rows whose target is
 * ignore_id give loss 0 and no gradient. */
void cpu_xent_vp_max(float *row_max,        // (N)
                    const float *logits,   // (N, V_local)
                    int N, int V_local, int V_valid);
void cpu_xent_vp_sums(float *stats,          // (N, 3)
                     const float *logits,   // (N, V_local)
                     const float *row_max,  // (N) global
                     const int32_t *targets, // (N)
                     int N, int V_local, int V_valid, int vocab_start, int32_t ignore_id);
int cpu_xent_vp_loss(float *losses,          // (N)
                    float *lse,             // (N)
                    const float *row_max,   // (N) global
                    const float *stats,     // (N, 3) reduced
                    const int32_t *targets, // (N)
                    int N, int V, float eps, int32_t ignore_id);
void cpu_xent_vp_bwd(float *dlogits,         // (N, V_local)
                    const float *logits,    // (N, V_local)
                    const float *lse,       // (N)
                    const int32_t *targets, // (N)
                    float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps,
                    int32_t ignore_id);
/* op_xent_vp_grad_inplace's reference (ops.h). */
void cpu_xent_vp_grad_inplace(float *logits,        // (N, V_local) in: logits; out: their gradient
                             const float *lse,      // (N)
                             const int32_t *targets, // (N)
                             float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps,
                             int32_t ignore_id);

/* ---- AdamW (decoupled weight decay, as torch.optim.AdamW) ------------------
 * p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). step t >= 1. */
void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n_elems,
              float lr, float beta1, float beta2, float eps, float wd, int t);
/* cpu_adamw over each segment (p at x_at, g at g_at, m and v at s_at; wd
 * where decay, else 0), in order. */
void cpu_adamw_segs(float *p, const float *g, float *m, float *v, const OpSeg *segs, int n_segs, float lr,
                    float beta1, float beta2, float eps, float wd, int t);

#endif
