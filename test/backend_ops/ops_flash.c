/* ops_flash.c: attention without the probabilities (attention_flash_fwd,
 * attention_flash_bwd).
 *
 * Two oracles. The flash reference itself (cpu_attention_flash_*) is held
 * to the exact attention (cpu_attention_fwd / _bwd, the path checked
 * against PyTorch) on the same bf16 q, k, v: its lse against one made here
 * in double, its output and gradients within the bf16 roundings the
 * contract adds (p, dout and ds rounded before their products). Then each
 * target against the flash reference: the CPU exactly (it is the
 * reference), a GPU within the tolerances below, since its tensor cores sum
 * in another order and its lse comes from a running maximum. Written
 * gradients equal added ones, padding keys' dk and dv rows are zeros, and
 * the empty shapes behave as attention_bwd's; gradients written as bf16
 * bits (dq16, dk16, dv16) are the written fp32 ones rounded, exactly. A GPU
 * runs every shape twice: through the tiled kernels, then with the
 * short-sequence kernels chosen, which must have run for each shape they
 * take (cuda_ops.h's counts) and left the others to the tiled ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* lse on a GPU: a running max and sum in fp32 against the reference's
 * double sum after the true max: a few ulp of the log of at most a few
 * hundred terms, relative to 1 + |lse|. */
#define FLASH_LSE_TOL 1e-5
/* A GPU's out and gradients against the flash reference: every input and
 * rounding the same, but sums ordered otherwise, so a bf16 rounding of p,
 * ds or out near a tie can fall the other way: a term moves by 2^-8 of
 * itself, rarely. 2^-7 of the tensor's scale is far below a wrong index,
 * mask or missing term (O(1) of that scale). */
#define FLASH_GPU_RTOL 0x1p-7
/* The flash reference against the exact attention: p rounded to bf16
 * (2^-9 relative) before p v, and the output rounded (2^-9): at most 2^-8
 * of sum_j p_ij |v_j| <= max |v| = 1 here, with 2x margin. */
#define FLASH_OUT_ATOL 0x1p-7
/* Its gradients against the exact backward: dout, p and ds each rounded
 * to bf16 (2^-9 relative) before their products; relative to the largest
 * increment. */
#define FLASH_GRAD_RTOL 0x1p-6

typedef struct {
    const char *name;
    const int32_t *k_len;
    int B, H, Tq, Tk, D;
    bool causal;
} FlashShape;

typedef struct {  // the host-side inputs and the reference's results
    float *q, *k, *v, *dout, *g0;  // q, k, v bf16 values; g0 the added gradients' start (dq, dk, dv)
    float *out, *lse, *delta, *grads;  // flash reference: out, lse, delta, the added gradients
    size_t nq, nk, nl;
} FlashRef;

static float *flash_work(const FlashShape *s) { return host_alloc(cpu_attention_flash_work(s->Tq, s->Tk, s->D) + 1); }

static void flash_ref(const FlashShape *s, FlashRef *r, Rng *rng) {
    const size_t HD = (size_t)s->H * s->D;
    r->nq = (size_t)s->B * s->Tq * HD, r->nk = (size_t)s->B * s->Tk * HD, r->nl = (size_t)s->B * s->H * s->Tq;
    float *raw[3] = {rand_floats(r->nq, rng, -1, 1), rand_floats(r->nk, rng, -1, 1), rand_floats(r->nk, rng, -1, 1)};
    r->q = host_bf16(raw[0], r->nq), r->k = host_bf16(raw[1], r->nk), r->v = host_bf16(raw[2], r->nk);
    for (int i = 0; i < 3; i++) free(raw[i]);
    r->dout = rand_floats(r->nq, rng, -1, 1);
    r->g0 = rand_floats(r->nq + 2 * r->nk, rng, -1, 1);
    uint16_t *out16 = malloc((r->nq + 1) * sizeof(uint16_t));
    r->lse = host_alloc(r->nl), r->delta = host_alloc(r->nl), r->out = host_alloc(r->nq);
    float *work = flash_work(s);
    cpu_attention_flash_fwd(out16, r->lse, r->q, r->k, r->v, s->k_len, s->B, s->H, s->Tq, s->Tk, s->D, s->causal,
                            work);
    cpu_from_bf16(r->out, out16, r->nq);
    r->grads = host_copy(r->g0, r->nq + 2 * r->nk);
    cpu_attention_flash_bwd(r->grads, r->grads + r->nq, r->grads + r->nq + r->nk, GRAD_ADD, r->dout, r->lse, r->q,
                            r->k, r->v, s->k_len, r->delta, s->B, s->H, s->Tq, s->Tk, s->D, s->causal, work);
    free(out16), free(work);
}

static void flash_ref_free(FlashRef *r) {
    float *bufs[] = {r->q, r->k, r->v, r->dout, r->g0, r->out, r->lse, r->delta, r->grads};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* The reference against the exact attention and against lse in double.
 * Run once per shape (on the first target): it checks the reference, not a
 * backend. */
static void flash_ref_vs_exact(const Target *t, const FlashShape *s, const FlashRef *r) {
    const int B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->D, HD = H * D;
    const size_t np = (size_t)B * H * Tq * Tk;
    float *out = host_alloc(r->nq), *P = host_alloc(np + 1), *scratch = host_alloc(np + 1);
    cpu_attention_fwd(out, P, r->q, r->k, r->v, s->k_len, B, H, Tq, Tk, D, s->causal);
    char what[200];
    snprintf(what, sizeof what, "flash reference out %s ~ exact attention", s->name);
    check_close(t, what, r->out, out, r->nq, 0, FLASH_OUT_ATOL);
    size_t bad = 0, rows_without = 0;
    const double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                int n = s->k_len[b] < Tk ? s->k_len[b] : Tk;
                if (s->causal && n > i + 1) n = i + 1;
                const float got = r->lse[((size_t)b * H + h) * Tq + i];
                if (n <= 0) {
                    rows_without++;
                    bad += !(isinf(got) && got < 0);
                    continue;
                }
                double z[2048], m = -INFINITY, sum = 0;
                for (int j = 0; j < n; j++) {
                    double dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += (double)r->q[((size_t)b * Tq + i) * HD + h * D + d] *
                               r->k[((size_t)b * Tk + j) * HD + h * D + d];
                    z[j] = scale * dot;
                    m = fmax(m, z[j]);
                }
                for (int j = 0; j < n; j++) sum += exp(z[j] - m);
                const double want = m + log(sum);
                bad += !(fabs(got - want) <= 1e-5 * (1 + fabs(want)));
            }
    TCHECK(bad == 0, "%s: flash reference lse %s: %zu rows off the double lse (%zu rows without keys)", t->name,
           s->name, bad, rows_without);
    float *grads = host_copy(r->g0, r->nq + 2 * r->nk);
    cpu_attention_bwd(grads, grads + r->nq, grads + r->nq + r->nk, GRAD_ADD, r->dout, P, r->q, r->k, r->v, scratch, B,
                      H, Tq, Tk, D);
    const char *names[3] = {"dq", "dk", "dv"};
    const size_t at[3] = {0, r->nq, r->nq + r->nk}, n[3] = {r->nq, r->nk, r->nk};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "flash reference %s %s ~ exact attention", names[i], s->name);
        check_rel(t, what, r->grads + at[i], grads + at[i], r->g0 + at[i], n[i], FLASH_GRAD_RTOL);
    }
    free(out), free(P), free(scratch), free(grads);
}

/* The target's forward and backward (added into g0, and written over NaN)
 * against the reference; written = added into zeros, bit for bit. */
static void flash_target(const Target *t, const FlashShape *s, const FlashRef *r) {
    Backend *be = t->be;
    const int B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->D;
    const double rtol = tol(t, FLASH_GPU_RTOL);
    uint16_t *d_q = dev_bits(t, r->q, r->nq), *d_k = dev_bits(t, r->k, r->nk), *d_v = dev_bits(t, r->v, r->nk);
    int32_t *d_klen = dev_from_i32(t, s->k_len, B);
    uint16_t *d_out = backend_alloc(be, (r->nq + 1) * sizeof(uint16_t), MEM_ACT);
    float *d_lse = dev_nan(t, r->nl), *d_delta = dev_nan(t, r->nl), *d_dout = dev_from(t, r->dout, r->nq);
    op_attention_flash_fwd(be, d_out, d_lse, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, s->causal);
    float *out = dev_fetch_bits(t, d_out, r->nq), *lse = dev_fetch(t, d_lse, r->nl);
    char what[200];
    snprintf(what, sizeof what, "attention_flash_fwd out %s", s->name);
    check_rel(t, what, out, r->out, NULL, r->nq, rtol);
    size_t bad = 0;
    for (size_t i = 0; i < r->nl; i++)
        bad += isinf(r->lse[i]) ? !(isinf(lse[i]) && lse[i] < 0)
                                : !(fabsf(lse[i] - r->lse[i]) <= tol(t, FLASH_LSE_TOL) * (1 + fabsf(r->lse[i])));
    TCHECK(bad == 0, "%s: attention_flash_fwd lse %s: %zu of %zu rows off", t->name, s->name, bad, r->nl);
    const char *names[3] = {"dq", "dk", "dv"};
    const size_t at[3] = {0, r->nq, r->nq + r->nk}, n[3] = {r->nq, r->nk, r->nk};
    float *add[3], *put[3], *got_add[3], *got_put[3];
    for (int i = 0; i < 3; i++) add[i] = dev_from(t, r->g0 + at[i], n[i]), put[i] = dev_nan(t, n[i]);
    op_attention_flash_bwd(be, add[0], add[1], add[2], NULL, NULL, NULL, GRAD_ADD, d_dout, d_lse, d_q, d_k, d_v,
                           d_klen, d_delta, B, H, Tq, Tk, D, s->causal);
    float *delta = dev_fetch(t, d_delta, r->nl);
    snprintf(what, sizeof what, "attention_flash_bwd delta %s", s->name);
    check_rel(t, what, delta, r->delta, NULL, r->nl, tol(t, ATTN_BWD_RTOL));
    op_attention_flash_bwd(be, put[0], put[1], put[2], NULL, NULL, NULL, GRAD_WRITE, d_dout, d_lse, d_q, d_k, d_v,
                           d_klen, d_delta, B, H, Tq, Tk, D, s->causal);
    uint16_t *put16[3];  // written as bf16 bits (bf16 mode's q, k, v gradients): the rounding of the fp32 ones
    for (int i = 0; i < 3; i++) put16[i] = dev_nan_bits(t, n[i]);
    op_attention_flash_bwd(be, NULL, NULL, NULL, put16[0], put16[1], put16[2], GRAD_WRITE, d_dout, d_lse, d_q, d_k,
                           d_v, d_klen, d_delta, B, H, Tq, Tk, D, s->causal);
    snprintf(what, sizeof what, "attention_flash_bwd %s", s->name);
    check_attn_grads16(t, what, put16, put, n);
    for (int i = 0; i < 3; i++) dev_free(t, put16[i]);
    for (int i = 0; i < 3; i++) {
        got_add[i] = dev_fetch(t, add[i], n[i]), got_put[i] = dev_fetch(t, put[i], n[i]);
        snprintf(what, sizeof what, "attention_flash_bwd %s %s (added)", names[i], s->name);
        check_rel(t, what, got_add[i], r->grads + at[i], r->g0 + at[i], n[i], rtol);
        op_zero(be, add[i], n[i]);
    }
    op_attention_flash_bwd(be, add[0], add[1], add[2], NULL, NULL, NULL, GRAD_ADD, d_dout, d_lse, d_q, d_k, d_v,
                           d_klen, d_delta, B, H, Tq, Tk, D, s->causal);
    size_t pad_nonzero = 0;
    const size_t HD = (size_t)H * D;
    for (int i = 0; i < 3; i++) {
        free(got_add[i]);
        got_add[i] = dev_fetch(t, add[i], n[i]);
        snprintf(what, sizeof what, "attention_flash_bwd %s %s written = added into zeros", names[i], s->name);
        check_exact(t, what, got_put[i], got_add[i], n[i]);
        for (int b = 0; i > 0 && b < B; b++)
            for (size_t e = (size_t)(s->k_len[b] < Tk ? s->k_len[b] : Tk) * HD; e < (size_t)Tk * HD; e++)
                pad_nonzero += got_put[i][(size_t)b * Tk * HD + e] != 0.0f;
    }
    TCHECK(pad_nonzero == 0, "%s: attention_flash_bwd %s written: %zu elements of padding keys' dk or dv rows nonzero",
           t->name, s->name, pad_nonzero);
    for (int i = 0; i < 3; i++) {
        free(got_add[i]), free(got_put[i]);
        dev_free(t, add[i]), dev_free(t, put[i]);
    }
    free(out), free(lse), free(delta);
    void *dev_bufs[] = {d_q, d_k, d_v, d_klen, d_out, d_lse, d_delta, d_dout};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

/* Tk == 0: out zeros and lse -inf forward; dq written zeros or left as it
 * was backward. Tq == 0: dk and dv written zeros or left. Written as bf16
 * bits (over NaN), zeros too. */
static void flash_empty(const Target *t, Rng *rng) {
    const int B = 2, H = 2, T = 3, D = 16;
    const size_t n = (size_t)B * T * H * D, nl = (size_t)B * H * T;
    float *start = rand_floats(n, rng, -1, 1), *zeros = host_alloc(n), *minus_inf = host_alloc(nl);
    for (size_t i = 0; i < nl; i++) minus_inf[i] = -INFINITY;
    uint16_t *d_out = backend_alloc(t->be, n * sizeof(uint16_t), MEM_ACT);
    float *d_lse = dev_nan(t, nl);
    op_attention_flash_fwd(t->be, d_out, d_lse, NULL, NULL, NULL, NULL, B, H, T, 0, D, false);
    float *out = dev_fetch_bits(t, d_out, n), *lse = dev_fetch(t, d_lse, nl);
    check_exact(t, "attention_flash_fwd Tk = 0: out zeros", out, zeros, n);
    check_exact(t, "attention_flash_fwd Tk = 0: lse -inf", lse, minus_inf, nl);
    for (int tk0 = 0; tk0 < 2; tk0++)
        for (int write = 0; write < 2; write++) {
            float *g[2] = {write ? dev_nan(t, n) : dev_from(t, start, n), NULL};
            if (!tk0) g[1] = write ? dev_nan(t, n) : dev_from(t, start, n);
            const GradMode mode = write ? GRAD_WRITE : GRAD_ADD;
            if (tk0)
                op_attention_flash_bwd(t->be, g[0], NULL, NULL, NULL, NULL, NULL, mode, NULL, d_lse, NULL, NULL, NULL,
                                       NULL, d_lse, B, H, T, 0, D, false);
            else
                op_attention_flash_bwd(t->be, NULL, g[0], g[1], NULL, NULL, NULL, mode, NULL, NULL, NULL, NULL, NULL,
                                       NULL, NULL, B, H, 0, T, D, false);
            for (int i = 0; i < (tk0 ? 1 : 2); i++) {
                float *got = dev_fetch(t, g[i], n);
                char what[120];
                snprintf(what, sizeof what, "attention_flash_bwd %s: %s %s", tk0 ? "Tk = 0" : "Tq = 0",
                         tk0 ? "dq" : i ? "dv" : "dk", write ? "written: zeros" : "added: as it was");
                check_exact(t, what, got, write ? zeros : start, n);
                free(got);
                dev_free(t, g[i]);
            }
        }
    for (int tk0 = 0; tk0 < 2; tk0++) {
        uint16_t *h[2] = {dev_nan_bits(t, n), tk0 ? NULL : dev_nan_bits(t, n)};
        if (tk0)
            op_attention_flash_bwd(t->be, NULL, NULL, NULL, h[0], NULL, NULL, GRAD_WRITE, NULL, d_lse, NULL, NULL, NULL,
                                   NULL, d_lse, B, H, T, 0, D, false);
        else
            op_attention_flash_bwd(t->be, NULL, NULL, NULL, NULL, h[0], h[1], GRAD_WRITE, NULL, NULL, NULL, NULL, NULL,
                                   NULL, NULL, B, H, 0, T, D, false);
        for (int i = 0; i < (tk0 ? 1 : 2); i++) {
            float *got = dev_fetch_bits(t, h[i], n);
            char what[120];
            snprintf(what, sizeof what, "attention_flash_bwd %s: %s written as bf16: zeros", tk0 ? "Tk = 0" : "Tq = 0",
                     tk0 ? "dq16" : i ? "dv16" : "dk16");
            check_exact(t, what, got, zeros, n);
            free(got);
            dev_free(t, h[i]);
        }
    }
    free(start), free(zeros), free(minus_inf), free(out), free(lse);
    dev_free(t, d_out), dev_free(t, d_lse);
}

#ifdef TPTRAIN_TEST_CUDA
/* The short-sequence kernels take a shape of at most
 * gpu_flash_short_max_t() queries and keys and a head width of 16, 32, 64
 * or 128, where the device grants the shared memory (attention_short.cu):
 * every sm_80 or newer GPU grants 99 KiB, so a shape whose backward needs
 * at most that must run there. */
#define FLASH_SHORT_SURE_SMEM (99 * 1024)
static bool flash_short_may_take(const FlashShape *s) {
    const int max_t = gpu_flash_short_max_t();
    return s->Tq <= max_t && s->Tk <= max_t && (s->D == 16 || s->D == 32 || s->D == 64 || s->D == 128);
}
static bool flash_short_must_take(const FlashShape *s) {
    const size_t tq = (size_t)(s->Tq + 15) / 16 * 16, tk = (size_t)(s->Tk + 15) / 16 * 16;
    return flash_short_may_take(s) && 2 * (tq + tk) * (size_t)(s->D + 8) * 2 + 8 * tq <= FLASH_SHORT_SURE_SMEM;
}

/* With the short kernels chosen (kernel 1): they ran exactly where they
 * must (one forward, four backward calls per shape: added, written, written
 * as bf16, added into zeros) and never where they
 * may not; with the tiled ones chosen, never. */
static void flash_check_route(const Target *t, const FlashShape *s, int kernel, GpuFlashCounts c0) {
    const GpuFlashCounts c = gpu_flash_counts();
    const long fwd_short = c.short_fwd - c0.short_fwd, bwd_short = c.short_bwd - c0.short_bwd;
    const long calls = fwd_short + c.tiled_fwd - c0.tiled_fwd + bwd_short + c.tiled_bwd - c0.tiled_bwd;
    const bool must = kernel == 1 && flash_short_must_take(s), may = kernel == 1 && flash_short_may_take(s);
    TCHECK(calls == 5 && (!must || (fwd_short == 1 && bwd_short == 4)) && (may || fwd_short + bwd_short == 0),
           "%s: attention_flash %s with the %s kernels chosen: %ld forward and %ld backward calls of %ld ran the "
           "short kernels",
           t->name, s->name, kernel ? "short" : "tiled", fwd_short, bwd_short, calls);
}
#endif

void test_attention_flash(const Target *t, Rng *rng) {
    static bool ref_checked;  // the reference against the exact attention: once, on the first target
    const int32_t cross_len[2] = {4, 0}, self_len[2] = {32, 20}, two_len[2] = {33, 7}, dec_len[2] = {70, 41};
    const int32_t enc_len[3] = {100, 57, 1}, wide_len[1] = {30}, w80_len[1] = {18}, long_len[2] = {128, 77}, mid_len[3] = {65, 64, 16};
    const int32_t past_len[1] = {150};
    const FlashShape shapes[] = {
        {"cross Tq5 Tk7 D16 (no keys in batch 1)", cross_len, 2, 3, 5, 7, 16, false},
        {"Tq=Tk=32 D64 (one tile)", self_len, 2, 2, 32, 32, 64, false},
        {"causal Tq=Tk=33 D64 (a second tile of one row)", two_len, 2, 2, 33, 33, 64, true},
        {"causal Tq=Tk=70 D32 (decoder, three tiles)", dec_len, 2, 2, 70, 70, 32, true},
        {"cross Tq45 Tk100 D128", enc_len, 3, 2, 45, 100, 128, false},
        {"Tq=Tk=30 D48 (k_len = Tk)", wide_len, 1, 3, 30, 30, 48, false},
        {"causal Tq=Tk=128 D64 (the short kernels' longest)", long_len, 2, 2, 128, 128, 64, true},
        {"cross Tq17 Tk65 D32 (eight chunks of keys)", mid_len, 3, 2, 17, 65, 32, false},
        {"causal Tq=Tk=150 D64 (past the short kernels)", past_len, 1, 2, 150, 150, 64, true},
        {"Tq=Tk=20 D80 (a head width the short kernels leave)", w80_len, 1, 2, 20, 20, 80, false},
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    const int kernels = t->is_cpu ? 1 : 2;  // a GPU: the tiled kernels, then the short ones chosen
    for (int kernel = 0; kernel < kernels; kernel++) {
#ifdef TPTRAIN_TEST_CUDA
        if (!t->is_cpu) gpu_set_flash_short(kernel == 1);
#endif
        for (int i = 0; i < n_shapes; i++) {
            const FlashShape *s = &shapes[i];
#ifdef TPTRAIN_TEST_CUDA
            const GpuFlashCounts c0 = t->is_cpu ? (GpuFlashCounts){0} : gpu_flash_counts();
#endif
            FlashRef r;
            flash_ref(s, &r, rng);
            if (!ref_checked) flash_ref_vs_exact(t, s, &r);
            flash_target(t, s, &r);
            flash_ref_free(&r);
#ifdef TPTRAIN_TEST_CUDA
            if (!t->is_cpu) flash_check_route(t, s, kernel, c0);
#endif
        }
        ref_checked = true;
    }
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) gpu_set_flash_short(false);
#endif
    flash_empty(t, rng);
}
