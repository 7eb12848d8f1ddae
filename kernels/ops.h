/* ops.h: every operation the Transformer needs, forward and backward.
 *
 * The contract of the backend table (backend.h): each op_<name> here calls
 * the backend's entry, so model code is written once and runs on whatever
 * backend it is given. kernels/cpu/ is the fp32 reference (plain C plus
 * OpenBLAS sgemm; cpu_ops.h, the same ops without the backend argument) and
 * the oracle for every test; kernels/cuda/ implements the same ops with the
 * same arguments on device pointers, queued on the backend's stream.
 *
 * No op returns a value to the host: results that the host needs (the loss
 * sum, the gradient norm) are accumulated into device scalars and read at
 * the step's one read point (backend_download).
 *
 * Conventions, for every op:
 *  - All tensors are row-major and contiguous; the shape comment on each
 *    pointer spells out the dimensions, e.g. `// (N, C)`.
 *  - Linear weights use PyTorch's layout W[out, in]: y = x W^T + b.
 *  - Backward ops ACCUMULATE into every gradient they produce (dx += ...,
 *    dW += ...), so residual branches and tied weights need no extra adds.
 *    Callers zero gradient buffers once per step.
 *  - Sequences are right-padded; a padding mask is given as a per-sequence
 *    valid length (k_len[b] keys of row b are real, the rest are padding).
 *  - Counts are `int` (tensors here stay below 2^31 elements per call) except
 *    whole-buffer ops, which take `size_t n_elems`.
 */
#ifndef TPTRAIN_OPS_H
#define TPTRAIN_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "backend.h"

/* ---- Memory ------------------------------------------------------------- */
static inline void op_zero(Backend *be, float *x, size_t n_elems) {
    be->ops->zero(be, x, n_elems);
}
static inline void op_copy(Backend *be, float *dst, const float *src, size_t n_elems) {
    be->ops->copy(be, dst, src, n_elems);
}
/* ids: dst = src (no overlap) */
static inline void op_copy_ids(Backend *be, int32_t *dst, const int32_t *src, size_t n_elems) {
    be->ops->copy_ids(be, dst, src, n_elems);
}

/* ---- GEMM ---------------------------------------------------------------
 * C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T.
 * op(A): (M, K), op(B): (K, N), C: (M, N); A stored (M,K) or (K,M) when
 * trans_a, B stored (K,N) or (N,K) when trans_b. beta = 0 overwrites C. */
static inline void op_gemm(Backend *be, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float *A, const float *B, float beta, float *C) {
    be->ops->gemm(be, trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

/* ---- Linear (GEMM + bias) ----------------------------------------------
 * y = x W^T + b. b may be NULL. */
static inline void op_linear_fwd(Backend *be, float *y,        // (N, out)
                   const float *x,  // (N, in)
                   const float *W,  // (out, in)
                   const float *b,  // (out) or NULL
                   int N, int in, int out) {
    be->ops->linear_fwd(be, y, x, W, b, N, in, out);
}
/* dx += dy W ; dW += dy^T x ; db += sum_rows(dy). dx, dW or db may be NULL
 * to skip that gradient. */
static inline void op_linear_bwd(Backend *be, float *dx,        // (N, in) or NULL
                   float *dW,        // (out, in) or NULL
                   float *db,        // (out) or NULL
                   const float *dy,  // (N, out)
                   const float *x,   // (N, in)
                   const float *W,   // (out, in)
                   int N, int in, int out) {
    be->ops->linear_bwd(be, dx, dW, db, dy, x, W, N, in, out);
}

/* y[n, :] += b */
static inline void op_bias_add(Backend *be, float *y,        // (N, C)
                 const float *b,  // (C)
                 int N, int C) {
    be->ops->bias_add(be, y, b, N, C);
}
/* db += sum over rows of dy */
static inline void op_bias_bwd(Backend *be, float *db,        // (C)
                 const float *dy,  // (N, C)
                 int N, int C) {
    be->ops->bias_bwd(be, db, dy, N, C);
}

/* ---- Embedding -----------------------------------------------------------
 * out[n] = scale * table[ids[n] - vocab_start] when the id falls in this
 * shard's rows [vocab_start, vocab_start + V_local), else zeros (so a
 * vocab-parallel shard contributes only its own rows; with one shard pass
 * vocab_start = 0, V_local = V). Ids outside [0, V) of the full vocabulary
 * are a caller bug and must be rejected before calling. */
static inline void op_embedding_fwd(Backend *be, float *out,          // (N, C)
                      const int32_t *ids,  // (N)
                      const float *table,  // (V_local, C)
                      float scale, int N, int C, int vocab_start, int V_local) {
    be->ops->embedding_fwd(be, out, ids, table, scale, N, C, vocab_start, V_local);
}
/* dtable[ids[n] - vocab_start] += scale * dout[n] (scatter-add, own rows
 * only; deterministic: rows are visited in order). */
static inline void op_embedding_bwd(Backend *be, float *dtable,        // (V_local, C)
                      const float *dout,    // (N, C)
                      const int32_t *ids,   // (N)
                      float scale, int N, int C, int vocab_start, int V_local) {
    be->ops->embedding_bwd(be, dtable, dout, ids, scale, N, C, vocab_start, V_local);
}

/* Sinusoidal positions (Vaswani et al., interleaved):
 * pe[t, 2i] = sin(t / 10000^(2i/C)), pe[t, 2i+1] = cos(t / 10000^(2i/C)).
 * x[b, t, :] += pe[t, :]. C must be even. Positions are constant: no backward. */
static inline void op_add_positions(Backend *be, float *x,  // (B, T, C)
                      int B, int T, int C) {
    be->ops->add_positions(be, x, B, T, C);
}

/* ---- LayerNorm -----------------------------------------------------------
 * y = (x - mean) * rstd * gamma + beta, per row; mean and rstd saved. */
static inline void op_layernorm_fwd(Backend *be, float *y,            // (N, C)
                      float *mean,         // (N)
                      float *rstd,         // (N)
                      const float *x,      // (N, C)
                      const float *gamma,  // (C)
                      const float *beta,   // (C)
                      int N, int C, float eps) {
    be->ops->layernorm_fwd(be, y, mean, rstd, x, gamma, beta, N, C, eps);
}
static inline void op_layernorm_bwd(Backend *be, float *dx,           // (N, C)  accumulated
                      float *dgamma,       // (C)     accumulated
                      float *dbeta,        // (C)     accumulated
                      const float *dy,     // (N, C)
                      const float *x,      // (N, C)
                      const float *mean,   // (N)
                      const float *rstd,   // (N)
                      const float *gamma,  // (C)
                      int N, int C) {
    be->ops->layernorm_bwd(be, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, N, C);
}

/* ---- Activations (GELU is the exact erf form, as torch's default) ------- */
static inline void op_act_fwd(Backend *be, float *y, const float *x, size_t n_elems, Activation act) {
    be->ops->act_fwd(be, y, x, n_elems, act);
}
/* dx += dy * act'(x) */
static inline void op_act_bwd(Backend *be, float *dx, const float *dy, const float *x, size_t n_elems,
                Activation act) {
    be->ops->act_bwd(be, dx, dy, x, n_elems, act);
}

/* ---- Element-wise --------------------------------------------------------- */
/* out = a + b (out may alias a or b) */
static inline void op_add(Backend *be, float *out, const float *a, const float *b, size_t n_elems) {
    be->ops->add(be, out, a, b, n_elems);
}
/* y += x */
static inline void op_accumulate(Backend *be, float *y, const float *x, size_t n_elems) {
    be->ops->accumulate(be, y, x, n_elems);
}
/* x *= s */
static inline void op_scale(Backend *be, float *x, float s, size_t n_elems) {
    be->ops->scale(be, x, s, n_elems);
}
/* acc[0] += sum of x (summed in double, fixed order); acc is a device scalar. */
static inline void op_sum_acc(Backend *be, float *acc, const float *x, size_t n_elems) {
    be->ops->sum_acc(be, acc, x, n_elems);
}
/* acc[0] += sum of squares of x (summed in double, fixed order). */
static inline void op_sumsq_acc(Backend *be, float *acc, const float *x, size_t n_elems) {
    be->ops->sumsq_acc(be, acc, x, n_elems);
}
/* Global-norm clipping on the device, as torch.nn.utils.clip_grad_norm_:
 * norm = sqrt(sum of sumsq[0..n_parts)); norm_coef[0] = norm,
 * norm_coef[1] = min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0). */
static inline void op_clip_coef(Backend *be, float *norm_coef, const float *sumsq, int n_parts, float max_norm) {
    be->ops->clip_coef(be, norm_coef, sumsq, n_parts, max_norm);
}
/* x *= s[0], s a device scalar. */
static inline void op_scale_by(Backend *be, float *x, const float *s, size_t n_elems) {
    be->ops->scale_by(be, x, s, n_elems);
}

/* ---- multi-tensor: one launch over a table of segments (OpSeg, backend.h) ----
 * op_segs_create uploads the table once (a device buffer tagged tag; the
 * segments with n = 0 are dropped); op_segs_free releases it (NULL: no-op).
 * Dies with one sentence on a segment naming an accumulator outside
 * [0, OP_SEG_MAX_ACC) or more chunks than an int counts. */
OpSegTable *op_segs_create(Backend *be, const OpSeg *segs, int n_segs, MemTag tag);
void op_segs_free(Backend *be, OpSegTable *t);
/* The device bytes of a table of n_segs segments in n_chunks chunks, and
 * the chunks of a segment of n_elems (the memory planner's figures). */
size_t op_segs_bytes(int n_segs, size_t n_chunks);
size_t op_segs_chunks(size_t n_elems);
/* For each segment s in table order: acc[s.acc] += sum of squares of
 * x[s.x_at .. s.x_at + s.n), each segment summed in double and added as
 * op_sumsq_acc adds it (so the CPU matches one op_sumsq_acc per segment bit
 * for bit). acc: device floats. */
static inline void op_sumsq_segs(Backend *be, float *acc, const float *x, const OpSegTable *segs) {
    be->ops->sumsq_segs(be, acc, x, segs);
}

/* dst = src rounded to bfloat16 (nearest, ties to even; NaN stays NaN),
 * kept as raw bits: the staging of bf16 collectives. */
static inline void op_to_bf16(Backend *be, uint16_t *dst, const float *src, size_t n_elems) {
    be->ops->to_bf16(be, dst, src, n_elems);
}
/* dst = src widened to fp32 (exact). */
static inline void op_from_bf16(Backend *be, float *dst, const uint16_t *src, size_t n_elems) {
    be->ops->from_bf16(be, dst, src, n_elems);
}

/* ---- Masked softmax ------------------------------------------------------
 * Rows are (b, h, i) over Tk keys: P = softmax(scale * S) where key j is
 * masked out when j >= k_len[b], or (causal) when j > i. Masked entries get
 * probability 0. A row with no valid key (k_len[b] == 0) becomes all zeros. */
static inline void op_softmax_fwd(Backend *be, float *P,            // (B, H, Tq, Tk)
                    const float *S,      // (B, H, Tq, Tk)
                    const int32_t *k_len,  // (B)
                    int B, int H, int Tq, int Tk, float scale, bool causal) {
    be->ops->softmax_fwd(be, P, S, k_len, B, H, Tq, Tk, scale, causal);
}
/* dS += scale * P * (dP - sum_j(dP * P)) */
static inline void op_softmax_bwd(Backend *be, float *dS,          // (B, H, Tq, Tk)
                    const float *dP,    // (B, H, Tq, Tk)
                    const float *P,     // (B, H, Tq, Tk)
                    int B, int H, int Tq, int Tk, float scale) {
    be->ops->softmax_bwd(be, dS, dP, P, B, H, Tq, Tk, scale);
}

/* ---- Scaled dot-product attention, per head --------------------------------
 * q, k, v hold H heads of width D side by side: head h of token t is
 * q[t, h*D : (h+1)*D]. out = softmax(q k^T / sqrt(D), masks) v.
 * P (the probabilities) is saved for backward. */
static inline void op_attention_fwd(Backend *be, float *out,            // (B, Tq, H*D)
                      float *P,              // (B, H, Tq, Tk)
                      const float *q,        // (B, Tq, H*D)
                      const float *k,        // (B, Tk, H*D)
                      const float *v,        // (B, Tk, H*D)
                      const int32_t *k_len,  // (B)
                      int B, int H, int Tq, int Tk, int D, bool causal) {
    be->ops->attention_fwd(be, out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal);
}
/* dq, dk, dv accumulated. scratch holds B*H*Tq*Tk floats. */
static inline void op_attention_bwd(Backend *be, float *dq,            // (B, Tq, H*D)
                      float *dk,            // (B, Tk, H*D)
                      float *dv,            // (B, Tk, H*D)
                      const float *dout,    // (B, Tq, H*D)
                      const float *P,       // (B, H, Tq, Tk)
                      const float *q,       // (B, Tq, H*D)
                      const float *k,       // (B, Tk, H*D)
                      const float *v,       // (B, Tk, H*D)
                      float *scratch,       // (B, H, Tq, Tk)
                      int B, int H, int Tq, int Tk, int D) {
    be->ops->attention_bwd(be, dq, dk, dv, dout, P, q, k, v, scratch, B, H, Tq, Tk, D);
}

/* ---- Dropout with a counter-based RNG --------------------------------------
 * Philox4x32-10 keyed by `seed`; element i uses counter
 * (i/4 lo, i/4 hi, stream lo, stream hi), word i%4. The mask is a pure
 * function of (seed, stream, i): backward recomputes it, resume reproduces it.
 * Kept elements are scaled by 1/(1-p). p == 0 copies. out may alias x. */
static inline void op_dropout_fwd(Backend *be, float *out, const float *x, size_t n_elems, float p,
                    uint64_t seed, uint64_t stream) {
    be->ops->dropout_fwd(be, out, x, n_elems, 0, p, seed, stream);
}
/* dx += mask * dy / (1-p) */
static inline void op_dropout_bwd(Backend *be, float *dx, const float *dy, size_t n_elems, float p,
                    uint64_t seed, uint64_t stream) {
    be->ops->dropout_bwd(be, dx, dy, n_elems, 0, p, seed, stream);
}
/* A window of a larger mask: out[i] is element first + i of it (first a
 * multiple of 4), so the windows of a tensor split by rows together draw
 * the mask of the whole (sequence parallelism). */
static inline void op_dropout_fwd_at(Backend *be, float *out, const float *x, size_t n_elems, uint64_t first,
                                     float p, uint64_t seed, uint64_t stream) {
    be->ops->dropout_fwd(be, out, x, n_elems, first, p, seed, stream);
}
static inline void op_dropout_bwd_at(Backend *be, float *dx, const float *dy, size_t n_elems, uint64_t first,
                                     float p, uint64_t seed, uint64_t stream) {
    be->ops->dropout_bwd(be, dx, dy, n_elems, first, p, seed, stream);
}

/* ---- Residual + dropout + LayerNorm, fused --------------------------------
 * The boundary of two pre-LN sub-blocks in one op each way, on the rows of
 * a window of the whole (N, C) mask that starts at element `first` (a
 * multiple of 4; 0 without sequence parallelism), as op_dropout_fwd_at.
 * Forward: res_out = res_in + Dropout(branch + bias) (bias may be NULL),
 * then y, mean, rstd = LayerNorm(res_out) as op_layernorm_fwd: equal to
 * op_bias_add, op_dropout_fwd_at, op_add, op_layernorm_fwd in turn (bit for
 * bit on the CPU). res_out may alias res_in; y aliases nothing; branch is
 * only read. */
static inline void op_residual_ln_fwd(Backend *be, float *res_out,   // (N, C)
                                      float *y,             // (N, C)
                                      float *mean,          // (N)
                                      float *rstd,          // (N)
                                      const float *res_in,  // (N, C)
                                      const float *branch,  // (N, C)
                                      const float *bias,    // (C) or NULL
                                      const float *gamma,   // (C)
                                      const float *beta,    // (C)
                                      int N, int C, float eps, uint64_t first, float p, uint64_t seed,
                                      uint64_t stream) {
    be->ops->residual_ln_fwd(be, res_out, y, mean, rstd, res_in, branch, bias, gamma, beta, N, C, eps, first, p,
                             seed, stream);
}
/* Backward: d_res += the LayerNorm's input gradient from dy (x, mean, rstd
 * as saved; dgamma, dbeta accumulated), as op_layernorm_bwd; then d_branch =
 * the dropout's input gradient of the new d_res and d_bias += its column
 * sums (d_bias NULL: skipped). d_branch is WRITTEN, not accumulated (it
 * equals op_dropout_bwd_at into zeros): the one pass needs no zeroing
 * before it. d_branch aliases neither dy nor d_res. */
static inline void op_residual_ln_bwd(Backend *be, float *d_res,     // (N, C) accumulated
                                      float *d_branch,      // (N, C) written
                                      float *dgamma,        // (C) accumulated
                                      float *dbeta,         // (C) accumulated
                                      float *d_bias,        // (C) accumulated, or NULL
                                      const float *dy,      // (N, C)
                                      const float *x,       // (N, C)
                                      const float *mean,    // (N)
                                      const float *rstd,    // (N)
                                      const float *gamma,   // (C)
                                      int N, int C, uint64_t first, float p, uint64_t seed, uint64_t stream) {
    be->ops->residual_ln_bwd(be, d_res, d_branch, dgamma, dbeta, d_bias, dy, x, mean, rstd, gamma, N, C, first, p,
                             seed, stream);
}

/* The raw generator, exposed for tests: 4 words for one counter. */
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Stream id of one dropout site: packs (step, micro-batch, layer, site,
 * tp rank) into 64 bits: step 32 bits | micro 8 | layer 8 | site 6 | tp 10. */
uint64_t dropout_stream(uint32_t step, uint32_t micro, uint32_t layer,
                        uint32_t site, uint32_t tp_rank);

/* ---- Label-smoothed cross-entropy ------------------------------------------
 * For row n with target y = targets[n] (rows with y == ignore_id are skipped,
 * loss 0): loss_n = (1-eps) * (-log p_y) + (eps/V) * sum_v (-log p_v),
 * p = softmax(logits[n]), as torch's cross_entropy(label_smoothing=eps).
 * Writes per-row losses and the row's log-sum-exp (saved for backward).
 * (The count of non-ignored rows is the caller's: it knows the targets.) */
static inline void op_xent_fwd(Backend *be, float *losses,          // (N)
                float *lse,             // (N)
                const float *logits,    // (N, V)
                const int32_t *targets, // (N)
                int N, int V, float eps, int32_t ignore_id) {
    be->ops->xent_fwd(be, losses, lse, logits, targets, N, V, eps, ignore_id);
}
/* dlogits += dloss[n] * (softmax(logits[n]) - (1-eps) onehot(y) - eps/V),
 * zero for ignored rows. dloss is one scale for all rows (e.g. 1/n_tokens). */
static inline void op_xent_bwd(Backend *be, float *dlogits,         // (N, V)
                 const float *logits,    // (N, V)
                 const float *lse,       // (N)
                 const int32_t *targets, // (N)
                 float dloss, int N, int V, float eps, int32_t ignore_id) {
    be->ops->xent_bwd(be, dlogits, logits, lse, targets, dloss, N, V, eps, ignore_id);
}

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
static inline void op_xent_vp_max(Backend *be, float *row_max,        // (N)
                    const float *logits,   // (N, V_local)
                    int N, int V_local, int V_valid) {
    be->ops->xent_vp_max(be, row_max, logits, N, V_local, V_valid);
}
static inline void op_xent_vp_sums(Backend *be, float *stats,          // (N, 3)
                     const float *logits,   // (N, V_local)
                     const float *row_max,  // (N) global
                     const int32_t *targets, // (N)
                     int N, int V_local, int V_valid, int vocab_start, int32_t ignore_id) {
    be->ops->xent_vp_sums(be, stats, logits, row_max, targets, N, V_local, V_valid, vocab_start, ignore_id);
}
/* V is the real vocabulary size. */
static inline void op_xent_vp_loss(Backend *be, float *losses,          // (N)
                    float *lse,             // (N)
                    const float *row_max,   // (N) global
                    const float *stats,     // (N, 3) reduced
                    const int32_t *targets, // (N)
                    int N, int V, float eps, int32_t ignore_id) {
    be->ops->xent_vp_loss(be, losses, lse, row_max, stats, targets, N, V, eps, ignore_id);
}
/* dlogits += dloss * (exp(x - lse) - (1-eps) [v == y] - eps/V), valid columns only. */
static inline void op_xent_vp_bwd(Backend *be, float *dlogits,         // (N, V_local)
                    const float *logits,    // (N, V_local)
                    const float *lse,       // (N)
                    const int32_t *targets, // (N)
                    float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps,
                    int32_t ignore_id) {
    be->ops->xent_vp_bwd(be, dlogits, logits, lse, targets, dloss, N, V_local, V_valid, vocab_start, V, eps, ignore_id);
}
/* The same gradient written over the logits, which the loss no longer
 * needs: no (N, V_local) gradient buffer, no pass to zero one. Padding
 * columns and ignored rows become 0. The one backward op that overwrites
 * rather than accumulates: each element equals op_xent_vp_bwd's into zeros. */
static inline void op_xent_vp_grad_inplace(Backend *be, float *logits, // (N, V_local) in: logits; out: gradient
                    const float *lse,       // (N)
                    const int32_t *targets, // (N)
                    float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps,
                    int32_t ignore_id) {
    be->ops->xent_vp_grad_inplace(be, logits, lse, targets, dloss, N, V_local, V_valid, vocab_start, V, eps,
                                  ignore_id);
}

/* ---- AdamW (decoupled weight decay, as torch.optim.AdamW) ------------------
 * p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). step t >= 1. */
static inline void op_adamw(Backend *be, float *p, const float *g, float *m, float *v, size_t n_elems,
              float lr, float beta1, float beta2, float eps, float wd, int t) {
    be->ops->adamw(be, p, g, m, v, n_elems, lr, beta1, beta2, eps, wd, t);
}
/* op_adamw over every segment s of the table in one launch: p[s.x_at..],
 * g[s.g_at..], m and v [s.s_at..], s.n elements, weight decay wd where
 * s.decay (else 0). Equal to one op_adamw per segment bit for bit. */
static inline void op_adamw_segs(Backend *be, float *p, const float *g, float *m, float *v, const OpSegTable *segs,
                                 float lr, float beta1, float beta2, float eps, float wd, int t) {
    be->ops->adamw_segs(be, p, g, m, v, segs, lr, beta1, beta2, eps, wd, t);
}

#endif
