/* attention.c: masked softmax and scaled dot-product attention on the CPU.
 *
 * Attention is written as the three textbook steps per (batch, head):
 * S = q k^T, P = masked softmax(S / sqrt(D)), out = P v, with the full P kept
 * for backward. Heads sit side by side inside a token row, (B, T, H*D), so
 * each per-head matrix is a strided view with leading dimension H*D; the
 * products call cblas_sgemm directly with those leading dimensions instead of
 * copying heads out. op_softmax_fwd and attention share one masked-softmax
 * row helper, so there is one definition of the masks: key j of row (b, h, i) is valid
 * when j < k_len[b] and, if causal, j <= i. Masked keys are never read, so
 * their scores may hold anything; row sums are accumulated in double.
 */
#include <cblas.h>
#include <math.h>

#include "bf16.h"
#include "cpu_ops.h"
#include "err.h"

/* Number of valid keys of query row i: keys [0, n) are valid. */
static int valid_keys(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && n > i + 1) n = i + 1;
    return n < 0 ? 0 : n;
}

/* p[j] = softmax(scale * s)[j] over j < n_valid, 0 for j >= n_valid.
 * Safe when p == s: each s[j] is read before p[j] is written. */
static void softmax_row(float *p,        // (Tk)
                        const float *s,  // (Tk)
                        int Tk, int n_valid, float scale) {
    if (n_valid == 0) {
        for (int j = 0; j < Tk; j++) p[j] = 0.0f;
        return;
    }
    float max = -INFINITY;
    for (int j = 0; j < n_valid; j++) {
        float z = scale * s[j];
        if (z > max) max = z;
    }
    double sum = 0.0;
    for (int j = 0; j < n_valid; j++) {
        float e = expf(scale * s[j] - max);
        p[j] = e;
        sum += e;
    }
    float inv_sum = (float)(1.0 / sum);
    for (int j = 0; j < n_valid; j++) p[j] *= inv_sum;
    for (int j = n_valid; j < Tk; j++) p[j] = 0.0f;
}

/* ds[j] += scale * p[j] * (dp[j] - sum_k dp[k] p[k]). Safe when ds == dp. */
static void softmax_bwd_row(float *ds,        // (Tk)
                            const float *dp,  // (Tk)
                            const float *p,   // (Tk)
                            int Tk, float scale) {
    double dot = 0.0;
    for (int j = 0; j < Tk; j++) dot += (double)dp[j] * p[j];
    float d = (float)dot;
    for (int j = 0; j < Tk; j++) ds[j] += scale * p[j] * (dp[j] - d);
}

void cpu_softmax_fwd(float *P,              // (B, H, Tq, Tk)
                    const float *S,        // (B, H, Tq, Tk)
                    const int32_t *k_len,  // (B)
                    int B, int H, int Tq, int Tk, float scale, bool causal) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                size_t row = (((size_t)b * H + h) * Tq + i) * Tk;
                softmax_row(P + row, S + row, Tk, valid_keys(k_len[b], i, Tk, causal),
                            scale);
            }
}

void cpu_softmax_bwd(float *dS,        // (B, H, Tq, Tk)
                    const float *dP,  // (B, H, Tq, Tk)
                    const float *P,   // (B, H, Tq, Tk)
                    int B, int H, int Tq, int Tk, float scale) {
    size_t n_rows = (size_t)B * H * Tq;
    for (size_t r = 0; r < n_rows; r++)
        softmax_bwd_row(dS + r * Tk, dP + r * Tk, P + r * Tk, Tk, scale);
}

/* Row-major sgemm with explicit leading dimensions, for strided head views. */
static void sgemm_ld(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
                beta, C, ldc);
}

/* The dropout on the probabilities of attention_drop_*: its room Pd (the
 * forward's; the backward's is its scratch) and its mask's window. NULL: none. */
typedef struct {
    float *Pd;          // (B, H, Tq, Tk)
    uint64_t first, ld;
    float p;
    uint64_t seed, stream;
} AttnDrop;

/* The window of (b, h)'s (Tq, Tk) probabilities in the mask. */
static uint64_t drop_at(const AttnDrop *d, int b, int h, int Tq, int Tk) {
    return d->first + (uint64_t)b * d->ld + (uint64_t)h * Tq * Tk;
}

static void attention_fwd_core(float *out,            // (B, Tq, H*D)
                               float *P,              // (B, H, Tq, Tk)
                               const float *q,        // (B, Tq, H*D)
                               const float *k,        // (B, Tk, H*D)
                               const float *v,        // (B, Tk, H*D)
                               const int32_t *k_len,  // (B)
                               int B, int H, int Tq, int Tk, int D, bool causal, const AttnDrop *drop) {
    TP_CHECK(B >= 0 && H >= 0 && Tq >= 0 && Tk >= 0 && D >= 0,
             "op_attention_fwd: negative size");
    if (B == 0 || H == 0 || Tq == 0 || D == 0) return;
    int HD = H * D;
    float scale = 1.0f / sqrtf((float)D);
    if (Tk == 0) {  // nothing to attend to: every output row is zero
        for (size_t i = 0; out && i < (size_t)B * Tq * HD; i++) out[i] = 0.0f;
        return;
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q_bh = q + (size_t)b * Tq * HD + (size_t)h * D;  // (Tq, D) ld HD
            const float *k_bh = k + (size_t)b * Tk * HD + (size_t)h * D;  // (Tk, D) ld HD
            const float *v_bh = v + (size_t)b * Tk * HD + (size_t)h * D;  // (Tk, D) ld HD
            float *P_bh = P + ((size_t)b * H + h) * Tq * Tk;              // (Tq, Tk)
            sgemm_ld(false, true, Tq, Tk, D, 1.0f, q_bh, HD, k_bh, HD, 0.0f, P_bh, Tk);
            for (int i = 0; i < Tq; i++)
                softmax_row(P_bh + (size_t)i * Tk, P_bh + (size_t)i * Tk, Tk,
                            valid_keys(k_len[b], i, Tk, causal), scale);
            if (!out) continue;  // P alone
            const float *Pv = P_bh;  // the probabilities the product takes: P, or dropped into Pd
            if (drop) {
                float *Pd_bh = drop->Pd + ((size_t)b * H + h) * Tq * Tk;
                cpu_dropout_fwd_win(Pd_bh, P_bh, 1, (size_t)Tq * Tk, 0, drop_at(drop, b, h, Tq, Tk), drop->p,
                                    drop->seed, drop->stream);
                Pv = Pd_bh;
            }
            float *out_bh = out + (size_t)b * Tq * HD + (size_t)h * D;  // (Tq, D) ld HD
            sgemm_ld(false, false, Tq, D, Tk, 1.0f, Pv, Tk, v_bh, HD, 0.0f, out_bh, HD);
        }
}

void cpu_attention_fwd(float *out, float *P, const float *q, const float *k, const float *v, const int32_t *k_len,
                       int B, int H, int Tq, int Tk, int D, bool causal) {
    attention_fwd_core(out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal, NULL);
}

// dq, dout, q (B, Tq, H*D); dk, dv, k, v (B, Tk, H*D); P, scratch (B, H, Tq, Tk).
// GRAD_WRITE: the three products with beta 0 (every row written: a padding
// key's P and dS columns are zeros, so are its dk and dv rows); with Tq or Tk
// 0 there are no products, and the gradients they would write are zeros.
// With drop: dv from the dropped probabilities, rebuilt in scratch first,
// and dP through the mask before the softmax's backward.
static void attention_bwd_core(float *dq, float *dk, float *dv, GradMode mode, const float *dout, const float *P,
                               const float *q, const float *k, const float *v, float *scratch, int B, int H, int Tq,
                               int Tk, int D, const AttnDrop *drop) {
    TP_CHECK(grad_mode_valid(mode), "op_attention_bwd: unknown gradient mode %d", (int)mode);
    TP_CHECK(B >= 0 && H >= 0 && Tq >= 0 && Tk >= 0 && D >= 0,
             "op_attention_bwd: negative size");
    if (B == 0 || H == 0 || D == 0) return;
    int HD = H * D;
    if (Tq == 0 || Tk == 0) {  // added: nothing; written: zeros
        if (mode == GRAD_WRITE && Tk == 0) cpu_zero(dq, (size_t)B * Tq * HD);
        if (mode == GRAD_WRITE && Tq == 0) cpu_zero(dk, (size_t)B * Tk * HD), cpu_zero(dv, (size_t)B * Tk * HD);
        return;
    }
    const float beta = mode == GRAD_ADD ? 1.0f : 0.0f;
    float scale = 1.0f / sqrtf((float)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t q_off = (size_t)b * Tq * HD + (size_t)h * D;
            size_t k_off = (size_t)b * Tk * HD + (size_t)h * D;
            const float *P_bh = P + ((size_t)b * H + h) * Tq * Tk;  // (Tq, Tk)
            float *dS = scratch + ((size_t)b * H + h) * Tq * Tk;     // (Tq, Tk)
            const uint64_t at = drop ? drop_at(drop, b, h, Tq, Tk) : 0;
            const size_t n_p = (size_t)Tq * Tk;
            if (drop) cpu_dropout_fwd_win(dS, P_bh, 1, n_p, 0, at, drop->p, drop->seed, drop->stream);
            // dv (+)= P^T dout (the dropped P: dS holds it)
            sgemm_ld(true, false, Tk, D, Tq, 1.0f, drop ? dS : P_bh, Tk, dout + q_off, HD, beta,
                     dv + k_off, HD);
            // dP = dout v^T (through the mask), then dS = scale * P * (dP - rowsum(dP * P)) in place
            sgemm_ld(false, true, Tq, Tk, D, 1.0f, dout + q_off, HD, v + k_off, HD, 0.0f,
                     dS, Tk);
            if (drop) cpu_dropout_bwd_win(dS, GRAD_WRITE, dS, 1, n_p, 0, at, drop->p, drop->seed, drop->stream);
            for (int i = 0; i < Tq; i++) {
                float *row = dS + (size_t)i * Tk;
                const float *p_row = P_bh + (size_t)i * Tk;
                double dot = 0.0;
                for (int j = 0; j < Tk; j++) dot += (double)row[j] * p_row[j];
                float d = (float)dot;
                for (int j = 0; j < Tk; j++) row[j] = scale * p_row[j] * (row[j] - d);
            }
            // dq (+)= dS k ; dk (+)= dS^T q
            sgemm_ld(false, false, Tq, D, Tk, 1.0f, dS, Tk, k + k_off, HD, beta,
                     dq + q_off, HD);
            sgemm_ld(true, false, Tk, D, Tq, 1.0f, dS, Tk, q + q_off, HD, beta,
                     dk + k_off, HD);
        }
}

void cpu_attention_bwd(float *dq, float *dk, float *dv, GradMode mode, const float *dout, const float *P,
                       const float *q, const float *k, const float *v, float *scratch, int B, int H, int Tq, int Tk,
                       int D) {
    attention_bwd_core(dq, dk, dv, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D, NULL);
}

/* ---- attention with dropout on the probabilities (attention_drop_*) ---- */

void cpu_attention_drop_fwd(float *out, float *P, float *Pd, const float *q, const float *k, const float *v,
                            const int32_t *k_len, int B, int H, int Tq, int Tk, int D, bool causal, uint64_t first,
                            uint64_t ld, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(p >= 0.0f && p < 1.0f, "op_attention_drop_fwd: p = %g outside [0, 1)", (double)p);
    const AttnDrop drop = {Pd, first, ld, p, seed, stream};
    attention_fwd_core(out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal, p > 0.0f ? &drop : NULL);
}

void cpu_attention_drop_bwd(float *dq, float *dk, float *dv, GradMode mode, const float *dout, const float *P,
                            const float *q, const float *k, const float *v, float *scratch, int B, int H, int Tq,
                            int Tk, int D, uint64_t first, uint64_t ld, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(p >= 0.0f && p < 1.0f, "op_attention_drop_bwd: p = %g outside [0, 1)", (double)p);
    const AttnDrop drop = {scratch, first, ld, p, seed, stream};
    attention_bwd_core(dq, dk, dv, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D, p > 0.0f ? &drop : NULL);
}

/* ---- attention without the probabilities (ops_list.h: attention_flash_*) ----
 * Per (b, h) in the work room: S = q k^T (fp32 sums of exact products of
 * the bf16 values), p = exp(scale s - lse) over the valid keys, and the
 * products on the bf16 roundings the contract names (p, dout and ds), each
 * an sgemm on the rounded fp32 values. */

static float bf16r(float x) { return tp_bf16_to_f32(tp_f32_to_bf16(x)); }

static void flash_check(const char *op, int B, int H, int Tq, int Tk, int D) {
    TP_CHECK(B >= 0 && H >= 0 && Tq >= 0 && Tk >= 0 && D >= 0, "%s: negative size", op);
    TP_CHECK(D % 16 == 0 && D <= 128, "%s: head width D = %d must be a multiple of 16, at most 128", op, D);
}

/* Row i's probabilities from its scores s (Tk) and lse: exp(scale s - lse)
 * over the n valid keys, zeros after them (all zeros when n is 0). */
static void flash_p_row(float *p, const float *s, int n, int Tk, float scale, float lse) {
    for (int j = 0; j < Tk; j++) p[j] = j < n ? expf(scale * s[j] - lse) : 0.0f;
}

size_t cpu_attention_flash_work(int Tq, int Tk, int D) {
    return 2 * (size_t)Tq * Tk + (size_t)Tq * D;
}

void cpu_attention_flash_fwd(uint16_t *out16, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *k_len, int B, int H, int Tq, int Tk, int D, bool causal, float *work) {
    flash_check("op_attention_flash_fwd", B, H, Tq, Tk, D);
    if (B == 0 || H == 0 || Tq == 0 || D == 0) return;
    const int HD = H * D;
    if (Tk == 0) {  // nothing to attend to: out zeros, lse -inf
        for (size_t i = 0; i < (size_t)B * Tq * HD; i++) out16[i] = 0;
        for (size_t i = 0; i < (size_t)B * H * Tq; i++) lse[i] = -INFINITY;
        return;
    }
    const float scale = 1.0f / sqrtf((float)D);
    float *S = work, *out = work + (size_t)Tq * Tk;  // (Tq, Tk), (Tq, D)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t q_off = (size_t)b * Tq * HD + (size_t)h * D, k_off = (size_t)b * Tk * HD + (size_t)h * D;
            float *lse_bh = lse + ((size_t)b * H + h) * Tq;
            sgemm_ld(false, true, Tq, Tk, D, 1.0f, q + q_off, HD, k + k_off, HD, 0.0f, S, Tk);
            for (int i = 0; i < Tq; i++) {
                float *s = S + (size_t)i * Tk;
                const int n = valid_keys(k_len[b], i, Tk, causal);
                float m = -INFINITY;
                for (int j = 0; j < n; j++) m = fmaxf(m, scale * s[j]);
                double sum = 0.0;
                for (int j = 0; j < n; j++) sum += expf(scale * s[j] - m);
                lse_bh[i] = n > 0 ? m + (float)log(sum) : -INFINITY;
                flash_p_row(s, s, n, Tk, scale, lse_bh[i]);
                for (int j = 0; j < n; j++) s[j] = bf16r(s[j]);
            }
            sgemm_ld(false, false, Tq, D, Tk, 1.0f, S, Tk, v + k_off, HD, 0.0f, out, D);
            for (int i = 0; i < Tq; i++)
                cpu_to_bf16(out16 + q_off + (size_t)i * HD, out + (size_t)i * D, (size_t)D);
        }
}

void cpu_attention_flash_bwd(float *dq, float *dk, float *dv, GradMode mode, const float *dout, const float *lse,
                             const float *q, const float *k, const float *v, const int32_t *k_len, float *delta,
                             int B, int H, int Tq, int Tk, int D, bool causal, float *work) {
    TP_CHECK(grad_mode_valid(mode), "op_attention_flash_bwd: unknown gradient mode %d", (int)mode);
    flash_check("op_attention_flash_bwd", B, H, Tq, Tk, D);
    if (B == 0 || H == 0 || D == 0) return;
    const int HD = H * D;
    if (Tq == 0 || Tk == 0) {  // added: nothing; written: zeros
        if (mode == GRAD_WRITE && Tk == 0) cpu_zero(dq, (size_t)B * Tq * HD);
        if (mode == GRAD_WRITE && Tq == 0) cpu_zero(dk, (size_t)B * Tk * HD), cpu_zero(dv, (size_t)B * Tk * HD);
        if (Tk == 0) cpu_zero(delta, (size_t)B * H * Tq);
        return;
    }
    const float beta = mode == GRAD_ADD ? 1.0f : 0.0f, scale = 1.0f / sqrtf((float)D);
    float *P = work, *dS = work + (size_t)Tq * Tk, *G = dS + (size_t)Tq * Tk;  // (Tq, Tk) x 2, (Tq, D)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t q_off = (size_t)b * Tq * HD + (size_t)h * D, k_off = (size_t)b * Tk * HD + (size_t)h * D;
            const float *lse_bh = lse + ((size_t)b * H + h) * Tq;
            float *delta_bh = delta + ((size_t)b * H + h) * Tq;
            for (int i = 0; i < Tq; i++)
                for (int d = 0; d < D; d++) G[(size_t)i * D + d] = bf16r(dout[q_off + (size_t)i * HD + d]);
            sgemm_ld(false, true, Tq, Tk, D, 1.0f, q + q_off, HD, k + k_off, HD, 0.0f, P, Tk);
            sgemm_ld(false, true, Tq, Tk, D, 1.0f, G, D, v + k_off, HD, 0.0f, dS, Tk);  // dP
            for (int i = 0; i < Tq; i++) {
                float *p = P + (size_t)i * Tk, *ds = dS + (size_t)i * Tk;
                const int n = valid_keys(k_len[b], i, Tk, causal);
                flash_p_row(p, p, n, Tk, scale, lse_bh[i]);
                double dot = 0.0;
                for (int j = 0; j < n; j++) dot += (double)p[j] * ds[j];
                delta_bh[i] = (float)dot;
                for (int j = 0; j < Tk; j++) {
                    ds[j] = j < n ? bf16r(scale * p[j] * (ds[j] - delta_bh[i])) : 0.0f;
                    p[j] = bf16r(p[j]);
                }
            }
            sgemm_ld(true, false, Tk, D, Tq, 1.0f, P, Tk, G, D, beta, dv + k_off, HD);
            sgemm_ld(false, false, Tq, D, Tk, 1.0f, dS, Tk, k + k_off, HD, beta, dq + q_off, HD);
            sgemm_ld(true, false, Tk, D, Tq, 1.0f, dS, Tk, q + q_off, HD, beta, dk + k_off, HD);
        }
}
