/* ops_gemm.c: GEMM and the linear layers through a backend, in the
 * backend's precision, against the CPU reference: every transpose, odd
 * sizes, alpha != 1, beta 0 over NaN garbage and beta 1, K = 0; the linear
 * forward with and without bias and the backward with every subset of
 * dx, dW, db (dx added to, or written over NaN garbage) and with out = 0,
 * with the weight inside a registered master range (its bf16 twin on
 * CUDA) and outside; on CUDA with the fused epilogues and the
 * separate bias kernels; run-to-run determinism; on CUDA the weight
 * gradient's tuned GEMM against the untuned one and inside a capture; the
 * compute weights' rounding. In bf16 the reference is the fp32 one on operands rounded to
 * bf16 here (ref_bf16), the forward's bias rounded as well (backend.h's
 * rule), bias gradients from fp32 values; the CPU
 * backend must match it bit for bit, the GPU within BF16_SAME_INPUT_TOL.
 * Negative controls show the comparisons reject a wrong transpose and a
 * planted error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "harness.h"
#include "scratch_sizes.h"

/* ---- epilogue modes: CUDA runs each linear case fused and separate ---------------------- */

int n_modes(const Target *t) { return t->is_cpu ? 1 : 2; }

void set_mode(const Target *t, int mode) {
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) gpu_set_fused_epilogues(t->be, mode == 0);
#else
    (void)t, (void)mode;
#endif
}

typedef struct {
    long bias_fused, bias_separate, bgrad_fused, bgrad_separate;
} EpilogueCounts;

static EpilogueCounts counts(const Target *t) {
    EpilogueCounts c = {0, 0, 0, 0};
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) {
        GpuGemmCounts g = gpu_gemm_counts(t->be);
        c = (EpilogueCounts){g.bias_fused, g.bias_separate, g.bgrad_fused, g.bgrad_separate};
    }
#else
    (void)t;
#endif
    return c;
}

/* ---- gemm ---------------------------------------------------------------------------- */

static bool any_differs(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return true;
    return false;
}

/* A_in_master: A lives in a registered master range (the GEMM may use its twin). */
/* Operand values at least GEMM_MIN_OPERAND in magnitude (a draw nearer 0
 * moved out by it, its sign kept): a 1x1x1 product of two uniform draws
 * can otherwise fall below the comparison's MIN_SIGNAL. */
#define GEMM_MIN_OPERAND 0.1f
static float *gemm_operand(size_t n, Rng *rng) {
    float *x = rand_floats(n, rng, -1, 1);
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) < GEMM_MIN_OPERAND) x[i] += x[i] < 0.0f ? -GEMM_MIN_OPERAND : GEMM_MIN_OPERAND;
    return x;
}

static void gemm_case(const Target *t, bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                      bool A_in_master, Rng *rng) {
    Backend *be = t->be;
    char what[160];
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = gemm_operand(na, rng), *B = gemm_operand(nb, rng), *C0 = rand_floats(nc, rng, -1, 1);
    float *dA = dev_from(t, A, na), *dB = dev_from(t, B, nb);
    if (A_in_master) {
        backend_add_compute_weights(be, dA, na);  // casts the twin where the backend keeps one
        backend_recast_weights(be);
    }
    float *dC = beta == 0.0f ? dev_nan(t, nc) : dev_from(t, C0, nc);
    op_gemm(be, ta, tb, M, N, K, alpha, dA, dB, beta, dC);
    float *got = dev_fetch(t, dC, nc);
    float *want = host_copy(C0, nc);
    cpu_gemm(ta, tb, M, N, K, alpha, A, B, beta, want);
    const float *start = beta == 0.0f ? NULL : C0;
    snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d alpha=%g beta=%g%s", ta, tb, M, N, K, (double)alpha,
             (double)beta, A_in_master ? " (A registered)" : "");
    if (!t->bf16) {
        check_rel(t, what, got, want, start, nc, tol(t, FP32_TOL));
    } else {
        float *Ab = host_bf16(A, na), *Bb = host_bf16(B, nb), *want_b = host_copy(C0, nc);
        cpu_gemm(ta, tb, M, N, K, alpha, Ab, Bb, beta, want_b);
        check_rel(t, what, got, want_b, start, nc, tol(t, BF16_SAME_INPUT_TOL));
        // and near the fp32 result: within BF16_TERM_TOL of |alpha| |A| |B| + |beta C0|
        float *Aa = host_abs(A, na), *Ba = host_abs(B, nb), *mag = host_abs(C0, nc);
        cpu_gemm(ta, tb, M, N, K, fabsf(alpha), Aa, Ba, fabsf(beta), mag);
        check_terms(t, what, got, want, mag, nc, BF16_TERM_TOL);
        free(Aa), free(Ba), free(mag);
        TCHECK(any_differs(got, want, nc), "%s: %s: bf16 result equals the fp32 one: no rounding", t->name, what);
        free(Ab), free(Bb), free(want_b);
    }
    if (A_in_master) backend_remove_compute_weights(be, dA);
    free(A), free(B), free(C0), free(got), free(want);
    dev_free(t, dA), dev_free(t, dB), dev_free(t, dC);
}

/* K = 0: C = beta C, with beta = 0 clearing NaN garbage. */
static void gemm_k0(const Target *t, Rng *rng) {
    const int M = 7, N = 9;
    const size_t nc = (size_t)M * N;
    float *C0 = rand_floats(nc, rng, -1, 1);
    float *dA = dev_nan(t, 1), *dB = dev_nan(t, 1);
    const float betas[] = {0.0f, 1.0f, 0.5f};
    for (int i = 0; i < 3; i++) {
        float *dC = betas[i] == 0.0f ? dev_nan(t, nc) : dev_from(t, C0, nc);
        op_gemm(t->be, false, false, M, N, 0, 1.0f, dA, dB, betas[i], dC);
        float *got = dev_fetch(t, dC, nc);
        bool ok = true;
        for (size_t j = 0; j < nc; j++) ok &= got[j] == betas[i] * C0[j];
        TCHECK(ok, "%s: gemm K=0 beta=%g leaves beta*C", t->name, (double)betas[i]);
        free(got);
        dev_free(t, dC);
    }
    dev_free(t, dA), dev_free(t, dB);
    free(C0);
}

/* The comparison can fail: a wrong transpose and a planted error are caught. */
static void negative_controls(const Target *t, Rng *rng) {
    const int M = 37, N = 53, K = 29;
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = rand_floats(na, rng, -1, 1), *B = rand_floats(nb, rng, -1, 1);
    float *dA = dev_from(t, A, na), *dB = dev_from(t, B, nb), *dC = dev_nan(t, nc);
    op_gemm(t->be, true, false, M, N, K, 1.0f, dA, dB, 0.0f, dC);
    float *got = dev_fetch(t, dC, nc);
    float *wrong = host_alloc(nc), *want = host_alloc(nc);
    cpu_gemm(false, false, M, N, K, 1.0f, A, B, 0.0f, wrong);  // the same bytes read without the transpose
    cpu_gemm(true, false, M, N, K, 1.0f, A, B, 0.0f, want);
    want[nc / 2] += 0.05f;  // planted: 5e-2 of an O(1) entry, above bf16 rounding, far above fp32's
    const double e_wrong = rel_err(got, wrong, NULL, nc), e_planted = rel_err(got, want, NULL, nc);
    if (t->bf16) {  // bf16 is judged against its terms' magnitudes (check_terms)
        float *Aa = host_abs(A, na), *Ba = host_abs(B, nb), *mag = host_alloc(nc);
        cpu_gemm(true, false, M, N, K, 1.0f, Aa, Ba, 0.0f, mag);
        const size_t n_wrong = terms_violations(got, wrong, mag, nc, BF16_TERM_TOL);
        TCHECK(n_wrong > nc / 2, "%s: a wrong transpose goes unnoticed (%zu of %zu beyond bf16's bound)", t->name,
               n_wrong, nc);
        free(Aa), free(Ba), free(mag);
    } else {
        TCHECK(e_wrong > FP32_TOL, "%s: a wrong transpose goes unnoticed (error %.3g <= %.1g)", t->name, e_wrong,
               FP32_TOL);
    }
    TCHECK(e_planted > (t->bf16 ? 1e-3 : FP32_TOL), "%s: a planted error goes unnoticed (error %.3g)", t->name,
           e_planted);
    free(A), free(B), free(got), free(wrong), free(want);
    dev_free(t, dA), dev_free(t, dB), dev_free(t, dC);
}

void test_gemm(const Target *t, Rng *rng) {
    static const int sizes[][3] = {{37, 53, 29}, {1, 1, 1}, {5, 130, 7}, {64, 48, 96}, {128, 96, 256}, {200, 160, 1024}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case(t, ta, tb, sizes[i][0], sizes[i][1], sizes[i][2], 1.0f, 0.0f, false, rng);
                gemm_case(t, ta, tb, sizes[i][0], sizes[i][1], sizes[i][2], 1.0f, 1.0f, false, rng);
            }
    gemm_case(t, true, false, 37, 53, 29, 0.5f, 1.0f, false, rng);
    gemm_case(t, false, true, 37, 53, 29, -2.0f, 0.0f, false, rng);
    gemm_case(t, false, true, 64, 300, 96, 1.0f, 0.0f, true, rng);  // logits = x E^T with E registered
    gemm_case(t, true, false, 64, 48, 96, 1.0f, 1.0f, true, rng);
    gemm_k0(t, rng);
    negative_controls(t, rng);
}

/* ---- linear layers ---------------------------------------------------------------------- */

/* Where a case's weight lives: a master range [pad | W (out, in) | b (out) | pad]
 * registered as compute weights (at an odd offset or a 16-byte aligned one:
 * carved parameters have both; the CUDA backend uses only aligned twins),
 * or plain buffers. */
typedef struct {
    float *master;  // the registered range, or NULL
    float *W, *b;   // device pointers
} Weights;

static Weights weights_make(const Target *t, const float *W, const float *b, int in, int out, bool registered) {
    Weights w = {NULL, NULL, NULL};
    const size_t nw = (size_t)out * in;
    if (!registered) {
        w.W = dev_from(t, W, nw);
        w.b = dev_from(t, b, out);
        return w;
    }
    const size_t pad = in % 2 ? 37 : 40, n = pad + nw + out + 3;  // a twin 2- or 16-byte aligned
    w.master = backend_alloc(t->be, n * sizeof(float), MEM_MASTER);
    w.W = w.master + pad;
    w.b = w.W + nw;
    backend_upload(t->be, w.W, W, nw * sizeof(float));
    backend_upload(t->be, w.b, b, out * sizeof(float));
    backend_add_compute_weights(t->be, w.master, n);
    backend_recast_weights(t->be);
    return w;
}

static void weights_free(const Target *t, Weights *w) {
    if (w->master) {
        backend_remove_compute_weights(t->be, w->master);
        dev_free(t, w->master);
    } else {
        dev_free(t, w->W), dev_free(t, w->b);
    }
}

static void linear_fwd_case(const Target *t, int mode, bool with_bias, bool registered, int N, int in, int out,
                            Rng *rng) {
    char what[160];
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *b = rand_floats(out, rng, -1, 1);
    Weights w = weights_make(t, W, b, in, out, registered);
    float *d_x = dev_from(t, x, nx), *d_y = dev_nan(t, ny);
    set_mode(t, mode);
    EpilogueCounts c0 = counts(t);
    op_linear_fwd(t->be, d_y, d_x, w.W, with_bias ? w.b : NULL, N, in, out);
    EpilogueCounts c1 = counts(t);
    float *got = dev_fetch(t, d_y, ny), *want = host_alloc(ny);
    snprintf(what, sizeof what, "linear_fwd N=%d in=%d out=%d bias=%d %s%s", N, in, out, with_bias,
             registered ? "registered W" : "plain W", mode ? " separate" : "");
    cpu_linear_fwd(want, x, W, with_bias ? b : NULL, N, in, out);
    if (!t->bf16) {
        check_rel(t, what, got, want, NULL, ny, tol(t, FP32_TOL));
    } else {
        float *xa = host_abs(x, nx), *Wa = host_abs(W, nw), *ba = host_abs(b, out), *mag = host_alloc(ny);
        cpu_linear_fwd(mag, xa, Wa, with_bias ? ba : NULL, N, in, out);  // the terms' magnitudes
        check_terms(t, what, got, want, mag, ny, BF16_TERM_TOL);
        free(xa), free(Wa), free(ba), free(mag);
        float *xb = host_bf16(x, nx), *Wb = host_bf16(W, nw), *bb = host_bf16(b, out);
        cpu_linear_fwd(want, xb, Wb, with_bias ? bb : NULL, N, in, out);  // the bias rounded like W
        check_rel(t, what, got, want, NULL, ny, tol(t, BF16_SAME_INPUT_TOL));
        free(xb), free(Wb), free(bb);
    }
    if (!t->is_cpu) {
        const long fused = c1.bias_fused - c0.bias_fused, separate = c1.bias_separate - c0.bias_separate;
        TCHECK(fused + separate == (with_bias ? 1 : 0), "%s: %s: %ld fused + %ld separate biases", t->name, what,
               fused, separate);
        if (mode) TCHECK(fused == 0, "%s: %s: fusion off but the bias was fused", t->name, what);
    }
    free(x), free(W), free(b), free(got), free(want);
    weights_free(t, &w);
    dev_free(t, d_x), dev_free(t, d_y);
}

/* linear_bwd cases whose db came from the dW GEMM's BGRADB epilogue (CUDA, fusion on). */
static int g_bgrad_fused_cases;

/* which: bit 0 dx, bit 1 dW, bit 2 db. Gradients start random: the backward adds to them; except a written
 * dx (dx_mode GRAD_WRITE), which starts as NaN garbage and is judged against the reference added into zeros. */
static void linear_bwd_case(const Target *t, int mode, int which, GradMode dx_mode, bool registered, int N, int in,
                            int out, Rng *rng) {
    Backend *be = t->be;
    char what[160];
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *b = rand_floats(out, rng, -1, 1);
    float *dy = rand_floats(ny, rng, -1, 1);
    float *gx0 = rand_floats(nx, rng, -1, 1), *gW0 = rand_floats(nw, rng, -1, 1), *gb0 = rand_floats(out, rng, -1, 1);
    Weights w = weights_make(t, W, b, in, out, registered);
    float *d_x = dev_from(t, x, nx), *d_dy = dev_from(t, dy, ny);
    const bool write = dx_mode == GRAD_WRITE;
    float *d_gx = write ? dev_nan(t, nx) : dev_from(t, gx0, nx), *d_gW = dev_from(t, gW0, nw);
    float *d_gb = dev_from(t, gb0, out);
    const bool want_dx = which & 1, want_dW = which & 2, want_db = which & 4;
    set_mode(t, mode);
    EpilogueCounts c0 = counts(t);
    op_linear_bwd(be, want_dx ? d_gx : NULL, dx_mode, want_dW ? d_gW : NULL, want_db ? d_gb : NULL, d_dy, d_x, w.W,
                  N, in, out);
    EpilogueCounts c1 = counts(t);
    float *got_gx = dev_fetch(t, d_gx, nx), *got_gW = dev_fetch(t, d_gW, nw), *got_gb = dev_fetch(t, d_gb, out);

    float *ref_gx = write ? host_alloc(nx) : host_copy(gx0, nx), *ref_gW = host_copy(gW0, nw);
    float *ref_gb = host_copy(gb0, out);
    if (!t->bf16) {
        cpu_linear_bwd(want_dx ? ref_gx : NULL, GRAD_ADD, want_dW ? ref_gW : NULL, want_db ? ref_gb : NULL, dy, x, W,
                       N, in, out);
    } else {  // operands rounded to bf16; db the sum of the bf16 dy (what BGRADB sums)
        float *xb = host_bf16(x, nx), *Wb = host_bf16(W, nw), *dyb = host_bf16(dy, ny);
        cpu_linear_bwd(want_dx ? ref_gx : NULL, GRAD_ADD, want_dW ? ref_gW : NULL, want_db ? ref_gb : NULL, dyb, xb,
                       Wb, N, in, out);
        free(xb), free(Wb), free(dyb);
    }
    const double gemm_tol = tol(t, t->bf16 ? BF16_SAME_INPUT_TOL : FP32_TOL);
    const long fused = c1.bgrad_fused - c0.bgrad_fused, separate = c1.bgrad_separate - c0.bgrad_separate;
    const double db_tol = tol(t, fused ? BGRAD_FP32_TOL : SUM_RTOL);
    snprintf(what, sizeof what, "linear_bwd which=%d N=%d in=%d out=%d %s%s%s", which, N, in, out,
             registered ? "registered W" : "plain W", mode ? " separate" : "", write ? " dx written" : "");
    char part[200];
    const float *gx_start = write ? NULL : gx0;
    if (want_dx) snprintf(part, sizeof part, "%s dx", what), check_rel(t, part, got_gx, ref_gx, gx_start, nx, gemm_tol);
    else snprintf(part, sizeof part, "%s dx untouched", what), check_exact(t, part, got_gx, gx0, nx);
    if (want_dW) snprintf(part, sizeof part, "%s dW", what), check_rel(t, part, got_gW, ref_gW, gW0, nw, gemm_tol);
    else snprintf(part, sizeof part, "%s dW untouched", what), check_exact(t, part, got_gW, gW0, nw);
    if (want_db) snprintf(part, sizeof part, "%s db", what), check_rel(t, part, got_gb, ref_gb, gb0, out, db_tol);
    else snprintf(part, sizeof part, "%s db untouched", what), check_exact(t, part, got_gb, gb0, out);
    if (!t->is_cpu) {
        TCHECK(fused + separate == (want_db ? 1 : 0), "%s: %s: %ld fused + %ld separate bias gradients", t->name,
               what, fused, separate);
        if (mode || !want_dW) TCHECK(fused == 0, "%s: %s: db must come from the separate kernel", t->name, what);
        if (!mode && want_db && want_dW) g_bgrad_fused_cases += fused > 0;
    }
    float *host_bufs[] = {x, W, b, dy, gx0, gW0, gb0, got_gx, got_gW, got_gb, ref_gx, ref_gW, ref_gb};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    weights_free(t, &w);
    dev_free(t, d_x), dev_free(t, d_dy), dev_free(t, d_gx), dev_free(t, d_gW), dev_free(t, d_gb);
}

/* out = 0: dy W is an (N, in) zero matrix. A written dx becomes zeros (NaN garbage gone, as beta = 0 clears
 * it), an added-to dx stays as it was, and dW, db (0 rows) are untouched. */
static void linear_bwd_out0(const Target *t, Rng *rng) {
    const int N = 5, in = 7;
    const size_t nx = (size_t)N * in;
    float *gx0 = rand_floats(nx, rng, -1, 1), *zeros = host_alloc(nx);
    float *d_x = dev_from(t, gx0, nx), *d_dy = dev_nan(t, 1), *d_W = dev_nan(t, 1);
    for (int k = 0; k < 2; k++) {
        const GradMode m = k ? GRAD_WRITE : GRAD_ADD;
        float *d_gx = m == GRAD_WRITE ? dev_nan(t, nx) : dev_from(t, gx0, nx);
        op_linear_bwd(t->be, d_gx, m, NULL, NULL, d_dy, d_x, d_W, N, in, 0);
        float *got = dev_fetch(t, d_gx, nx);
        check_exact(t, m == GRAD_WRITE ? "linear_bwd out=0 dx written: zeros" : "linear_bwd out=0 dx added: as it was",
                    got, m == GRAD_WRITE ? zeros : gx0, nx);
        free(got);
        dev_free(t, d_gx);
    }
    free(gx0), free(zeros);
    dev_free(t, d_x), dev_free(t, d_dy), dev_free(t, d_W);
}

/* One backward call of a case: form k (0 the reference, 1 the op tested)
 * into the gradients given (NULL: not wanted). */
typedef void (*BwdCall)(const Target *t, const void *ctx, int k, float *gx, GradMode mode, float *gW, float *gb);

/* Every subset of dx (bit 0), dW (bit 1) and, with_db, db (bit 2), dx
 * written over NaN garbage and added to: form 1's gradients against form
 * 0's, bit for bit, on the same backend. g0: the gradients' starting
 * values, nx + nw + out floats. */
static void bwd_subsets(const Target *t, const char *op, const char *against, int N, int in, int out, bool with_db,
                        const float *g0, BwdCall call, const void *ctx) {
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, n[3] = {nx, nw, (size_t)out};
    static const char *names[3] = {"dx", "dW", "db"};
    const int n_out = with_db ? 3 : 2;
    char what[192];
    for (int which = 1; which < (1 << n_out); which++)
        for (int m = 0; m < 2; m++) {
            const GradMode mode = m ? GRAD_WRITE : GRAD_ADD;
            if (mode == GRAD_WRITE && !(which & 1)) continue;
            float *got[2][3];
            for (int k = 0; k < 2; k++) {
                float *d_g[3] = {mode == GRAD_WRITE ? dev_nan(t, nx) : dev_from(t, g0, nx), dev_from(t, g0 + nx, nw),
                                 dev_from(t, g0 + nx + nw, out)};
                call(t, ctx, k, which & 1 ? d_g[0] : NULL, mode, which & 2 ? d_g[1] : NULL,
                     which & 4 ? d_g[2] : NULL);
                for (int j = 0; j < 3; j++) {
                    got[k][j] = dev_fetch(t, d_g[j], n[j]);
                    dev_free(t, d_g[j]);
                }
            }
            for (int j = 0; j < 3; j++) {
                snprintf(what, sizeof what, "%s which=%d %s N=%d in=%d out=%d %s against %s", op, which,
                         mode == GRAD_WRITE ? "dx written" : "added", N, in, out, names[j], against);
                if (j < n_out) check_exact(t, what, got[1][j], got[0][j], n[j]);
                free(got[0][j]), free(got[1][j]);
            }
        }
}

typedef struct {
    int N, in, out;
    const float *dy, *tmp, *xw, *W, *dyw;  // device
    const uint16_t *x16, *r16, *dy16;      // device bf16 bits
} BwdCtx;

static void x16_call(const Target *t, const void *ctx, int k, float *gx, GradMode mode, float *gW, float *gb) {
    const BwdCtx *c = ctx;
    if (k) op_linear_bwd_x16(t->be, gx, mode, gW, gb, c->dy, c->x16, c->W, c->N, c->in, c->out);
    else op_linear_bwd(t->be, gx, mode, gW, gb, c->dy, c->xw, c->W, c->N, c->in, c->out);
}

/* The x16 forms on bf16 bits give, on the same backend, the bits of the
 * fp32 forms on those values widened: in bf16 mode the fp32 forms round x
 * to exactly those bits before multiplying, in fp32 the widening is exact.
 * Every gradient subset, dx written over NaN garbage and added to. */
static void linear_x16_case(const Target *t, int N, int in, int out, Rng *rng) {
    Backend *be = t->be;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *xw = host_bf16(x, nx), *W = rand_floats(nw, rng, -1, 1);
    float *b = rand_floats(out, rng, -1, 1), *dy = rand_floats(ny, rng, -1, 1);
    float *g0 = rand_floats(nx + nw + out, rng, -1, 1);
    uint16_t *d_x16 = dev_bits(t, xw, nx);
    float *d_xw = dev_from(t, xw, nx), *d_W = dev_from(t, W, nw), *d_b = dev_from(t, b, out);
    float *d_dy = dev_from(t, dy, ny);
    char what[160];
    float *d_y[2];
    for (int k = 0; k < 2; k++) {
        d_y[k] = dev_nan(t, ny);
        if (k) op_linear_fwd_x16(be, d_y[k], d_x16, d_W, d_b, N, in, out);
        else op_linear_fwd(be, d_y[k], d_xw, d_W, d_b, N, in, out);
    }
    float *y0 = dev_fetch(t, d_y[0], ny), *y1 = dev_fetch(t, d_y[1], ny);
    snprintf(what, sizeof what, "linear_fwd_x16 N=%d in=%d out=%d against linear_fwd", N, in, out);
    check_exact(t, what, y1, y0, ny);
    free(y0), free(y1), dev_free(t, d_y[0]), dev_free(t, d_y[1]);
    const BwdCtx c = {.N = N, .in = in, .out = out, .dy = d_dy, .xw = d_xw, .W = d_W, .x16 = d_x16};
    bwd_subsets(t, "linear_bwd_x16", "linear_bwd", N, in, out, true, g0, x16_call, &c);
    free(x), free(xw), free(W), free(b), free(dy), free(g0);
    dev_free(t, d_x16), dev_free(t, d_xw), dev_free(t, d_W), dev_free(t, d_b), dev_free(t, d_dy);
}

static void relu_call(const Target *t, const void *ctx, int k, float *gx, GradMode mode, float *gW, float *gb) {
    const BwdCtx *c = ctx;
    const size_t ny = (size_t)c->N * c->out;
    if (k) {
        op_linear_bwd_relu_x16(t->be, gx, mode, gW, gb, c->dy, c->r16, c->x16, c->W, c->N, c->in, c->out);
        return;
    }
    op_act_bwd_x16(t->be, (float *)c->tmp, GRAD_WRITE, c->dy, c->r16, ny, ACT_RELU);
    op_linear_bwd_x16(t->be, gx, mode, gW, gb, c->tmp, c->x16, c->W, c->N, c->in, c->out);
}

/* linear_bwd_relu_x16 gives, on the same backend, the bits of act_bwd_x16's
 * ReLU gradient (written into a temporary) followed by linear_bwd_x16 on
 * it: every subset of dx, dW and db, dx written over NaN garbage and added
 * to; the ReLU outputs include zeros of both signs and negatives; dy is
 * left as it was. */
static void linear_relu_case(const Target *t, int N, int in, int out, Rng *rng) {
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *xw = host_bf16(x, nx), *W = rand_floats(nw, rng, -1, 1);
    float *dy = rand_floats(ny, rng, -1, 1), *r = rand_floats(ny, rng, -1, 1), *g0 = rand_floats(nx + nw + out, rng, -1, 1);
    for (size_t i = 0; i < ny; i += 7) r[i] = i % 2 ? -0.0f : 0.0f;
    float *rw = host_bf16(r, ny);
    uint16_t *d_x16 = dev_bits(t, xw, nx), *d_r16 = dev_bits(t, rw, ny);
    float *d_W = dev_from(t, W, nw), *d_dy = dev_from(t, dy, ny), *d_tmp = dev_nan(t, ny);
    const BwdCtx c = {.N = N, .in = in, .out = out, .dy = d_dy, .tmp = d_tmp, .W = d_W, .x16 = d_x16, .r16 = d_r16};
    bwd_subsets(t, "linear_bwd_relu_x16", "act_bwd_x16 + linear_bwd_x16", N, in, out, true, g0, relu_call, &c);
    float *dy_after = dev_fetch(t, d_dy, ny);
    char what[160];
    snprintf(what, sizeof what, "linear_bwd_relu_x16 N=%d in=%d out=%d: dy only read", N, in, out);
    check_exact(t, what, dy_after, dy, ny);
    free(dy_after), free(x), free(xw), free(W), free(dy), free(r), free(rw), free(g0);
    dev_free(t, d_x16), dev_free(t, d_r16), dev_free(t, d_W), dev_free(t, d_dy), dev_free(t, d_tmp);
}

static void dy16_call(const Target *t, const void *ctx, int k, float *gx, GradMode mode, float *gW, float *gb) {
    const BwdCtx *c = ctx;
    (void)gb;  // no bias: with_db off
    if (k) op_linear_bwd_dy16(t->be, gx, mode, gW, c->dy16, c->xw, c->W, c->N, c->in, c->out);
    else op_linear_bwd(t->be, gx, mode, gW, NULL, c->dyw, c->xw, c->W, c->N, c->in, c->out);
}

/* linear_bwd_dy16 on bf16 bits of dy gives, on the same backend, the bits
 * of linear_bwd (no db) on those values widened: every subset of dx and
 * dW, dx written over NaN garbage and added to. */
static void linear_dy16_case(const Target *t, int N, int in, int out, Rng *rng) {
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *dy = rand_floats(ny, rng, -1, 1);
    float *dyw = host_bf16(dy, ny), *g0 = rand_floats(nx + nw + out, rng, -1, 1);
    uint16_t *d_dy16 = dev_bits(t, dyw, ny);
    float *d_x = dev_from(t, x, nx), *d_W = dev_from(t, W, nw), *d_dyw = dev_from(t, dyw, ny);
    const BwdCtx c = {.N = N, .in = in, .out = out, .xw = d_x, .W = d_W, .dyw = d_dyw, .dy16 = d_dy16};
    bwd_subsets(t, "linear_bwd_dy16", "linear_bwd", N, in, out, false, g0, dy16_call, &c);
    free(x), free(W), free(dy), free(dyw), free(g0);
    dev_free(t, d_dy16), dev_free(t, d_x), dev_free(t, d_W), dev_free(t, d_dyw);
}

/* linear_bwd16 cases that stored dx16 from the GEMM (CUDA, bf16, fusion on). */
static int g_dx16_fused;

/* One result of linear_bwd16 against its composition: exact on the CPU,
 * on CUDA within the band of GEMM sums ordered otherwise (tol for fp32,
 * one bf16 step for bits). */
static void bwd16_check(const Target *t, const char *what, const float *got, const float *want, size_t n, bool bits) {
    if (t->is_cpu) check_exact(t, what, got, want, n);
    else if (bits) check_close(t, what, got, want, n, BF16_STEP_RTOL, BF16_STEP_ATOL);
    else check_rel(t, what, got, want, NULL, n, tol(t, BF16_SAME_INPUT_TOL));
}

/* linear_bwd16 gives its composition on the same backend: fc2's form (fp32
 * dy, db, x16, dx written as bf16) is linear_bwd_x16 into an fp32 dx, then
 * to_bf16; fc1's form (dy as bf16 bits masked by a ReLU's output, db, x16,
 * fp32 dx) is act_bwd_x16 on the widened dy, then linear_bwd_x16. The ReLU
 * outputs include zeros of both signs and negatives. */
static void linear_bwd16_case(const Target *t, int N, int in, int out, Rng *rng) {
    Backend *be = t->be;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *xw = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *dy = rand_floats(ny, rng, -1, 1);
    float *r = rand_floats(ny, rng, -1, 1);
    for (size_t i = 0; i < ny; i += 7) r[i] = i % 2 ? -0.0f : 0.0f;
    float *xb = host_bf16(xw, nx), *rb = host_bf16(r, ny), *dyb = host_bf16(dy, ny);
    uint16_t *d_x16 = dev_bits(t, xb, nx), *d_r16 = dev_bits(t, rb, ny), *d_dy16 = dev_bits(t, dyb, ny);
    uint16_t *d_dx16 = backend_alloc(be, nx * 2, MEM_ACT), *d_want16 = backend_alloc(be, nx * 2, MEM_ACT);
    float *d_W = dev_from(t, W, nw), *d_dy = dev_from(t, dy, ny), *d_dyw = dev_from(t, dyb, ny);
    float *d_tmp = dev_nan(t, ny > nx ? ny : nx);
    float *d_g[2][3];  // [form k][dx, dW, db]: 0 the composition, 1 the op
    char what[200];
    for (int form = 0; form < 2; form++) {
        for (int k = 0; k < 2; k++)
            d_g[k][0] = dev_nan(t, nx), d_g[k][1] = dev_from(t, W, nw), d_g[k][2] = dev_from(t, dy, out);
#ifdef TPTRAIN_TEST_CUDA
        const GpuGemmCounts c0 = t->is_cpu ? (GpuGemmCounts){0} : gpu_gemm_counts(be);
#endif
        if (form == 0) {  // fc2: dx stored as bf16
            op_linear_bwd16(be, NULL, d_dx16, GRAD_WRITE, d_g[1][1], d_g[1][2], d_dy, NULL, NULL, NULL, d_x16, d_W, N,
                            in, out);
            op_linear_bwd_x16(be, d_g[0][0], GRAD_WRITE, d_g[0][1], d_g[0][2], d_dy, d_x16, d_W, N, in, out);
            op_to_bf16(be, d_want16, d_g[0][0], nx);
        } else {  // fc1: dy as bits behind a ReLU
            op_linear_bwd16(be, d_g[1][0], NULL, GRAD_WRITE, d_g[1][1], d_g[1][2], NULL, d_dy16, d_r16, NULL, d_x16,
                            d_W, N, in, out);
            op_act_bwd_x16(be, d_tmp, GRAD_WRITE, d_dyw, d_r16, ny, ACT_RELU);
            op_linear_bwd_x16(be, d_g[0][0], GRAD_WRITE, d_g[0][1], d_g[0][2], d_tmp, d_x16, d_W, N, in, out);
        }
#ifdef TPTRAIN_TEST_CUDA
        if (!t->is_cpu && form == 0) g_dx16_fused += gpu_gemm_counts(be).dx16_fused > c0.dx16_fused;
#endif
        static const char *names[3] = {"dx", "dW", "db"};
        const size_t n[3] = {nx, nw, (size_t)out};
        for (int j = form == 0 ? 1 : 0; j < 3; j++) {
            float *got = dev_fetch(t, d_g[1][j], n[j]), *want = dev_fetch(t, d_g[0][j], n[j]);
            snprintf(what, sizeof what, "linear_bwd16 %s N=%d in=%d out=%d %s", form ? "dy16 relu" : "dx16", N, in,
                     out, names[j]);
            bwd16_check(t, what, got, want, n[j], false);
            free(got), free(want);
        }
        if (form == 0) {
            float *got = dev_fetch_bits(t, d_dx16, nx), *want = dev_fetch_bits(t, d_want16, nx);
            snprintf(what, sizeof what, "linear_bwd16 dx16 N=%d in=%d out=%d dx16", N, in, out);
            bwd16_check(t, what, got, want, nx, true);
            free(got), free(want);
        }
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++) dev_free(t, d_g[k][j]);
    }
    free(xw), free(W), free(dy), free(r), free(xb), free(rb), free(dyb);
    dev_free(t, d_x16), dev_free(t, d_r16), dev_free(t, d_dy16), dev_free(t, d_dx16), dev_free(t, d_want16);
    dev_free(t, d_W), dev_free(t, d_dy), dev_free(t, d_dyw), dev_free(t, d_tmp);
}

/* The bias gradient of linear_bwd is bias_bwd's on the same backend, bit
 * for bit, whenever it does not come from the GEMM's epilogue (fusion
 * off): on CUDA in bf16 it is computed in the pass that also makes dy's
 * bf16 copy for the GEMMs, which must change neither; in bf16 both sum the
 * bf16 rounding of dy (ops_list.h). */
static void linear_db_case(const Target *t, int mode, int N, int in, int out, Rng *rng) {
    if (mode == 0 && !t->is_cpu) return;  // with fusion: the epilogue's own sums (linear_bwd_case's band)
    Backend *be = t->be;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *dy = rand_floats(ny, rng, -1, 1);
    float *db0 = rand_floats(out, rng, -1, 1);
    float *d_x = dev_from(t, x, nx), *d_W = dev_from(t, W, nw), *d_dy = dev_from(t, dy, ny);
    float *d_db[2] = {dev_from(t, db0, out), dev_from(t, db0, out)}, *d_gx = dev_nan(t, nx);
    float *d_gW = dev_from(t, W, nw);
    set_mode(t, mode);
    op_linear_bwd(be, d_gx, GRAD_WRITE, d_gW, d_db[0], d_dy, d_x, d_W, N, in, out);
    op_bias_bwd(be, d_db[1], d_dy, N, out);
    set_mode(t, 0);
    float *got = dev_fetch(t, d_db[0], out), *want = dev_fetch(t, d_db[1], out);
    char what[120];
    snprintf(what, sizeof what, "linear_bwd db N=%d in=%d out=%d%s against bias_bwd", N, in, out,
             mode ? " separate" : "");
    check_exact(t, what, got, want, out);
    free(x), free(W), free(dy), free(db0), free(got), free(want);
    dev_free(t, d_x), dev_free(t, d_W), dev_free(t, d_dy), dev_free(t, d_db[0]), dev_free(t, d_db[1]);
    dev_free(t, d_gx), dev_free(t, d_gW);
}

/* How many linear_fwd16 cases ran cuBLASLt's bf16-output path (CUDA): printed, for the GPU report. */
static int g_out16_fused, g_out16_cases, g_out16_unplanned, g_out16_bias_fused;

/* linear_fwd16 (bias or none, ReLU or none, x fp32 or bf16 bits) against
 * the same backend's linear_fwd (or _x16) then act_fwd16 / to_bf16: bit for
 * bit on the CPU and on CUDA's separate path (fusion off); CUDA's one-GEMM
 * path within one bf16 step (its fp32 sums may be ordered otherwise), and
 * the counts say which path ran. */
static void linear_fwd16_case(const Target *t, int mode, bool bias, bool relu, bool x16, bool has_tmp, int N, int in,
                              int out, Rng *rng) {
    Backend *be = t->be;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *xw = host_bf16(x, nx), *W = rand_floats(nw, rng, -1, 1);
    float *b = rand_floats(out, rng, -1, 1);
    uint16_t *d_x16 = dev_bits(t, xw, nx), *d_y16 = backend_alloc(be, ny * 2, MEM_ACT);
    uint16_t *d_w16 = backend_alloc(be, ny * 2, MEM_ACT);
    float *d_x = dev_from(t, x16 ? xw : x, nx), *d_W = dev_from(t, W, nw), *d_b = dev_from(t, b, out);
    float *d_tmp = dev_nan(t, ny), *d_y = dev_nan(t, ny);
    set_mode(t, mode);
#ifdef TPTRAIN_TEST_CUDA
    const GpuGemmCounts g0 = t->is_cpu ? (GpuGemmCounts){0} : gpu_gemm_counts(be);
#endif
    op_linear_fwd16(be, d_y16, has_tmp ? d_tmp : NULL, x16 ? NULL : d_x, x16 ? d_x16 : NULL, d_W, bias ? d_b : NULL,
                    relu, N, in, out);
#ifdef TPTRAIN_TEST_CUDA
    const GpuGemmCounts g1 = t->is_cpu ? (GpuGemmCounts){0} : gpu_gemm_counts(be);
#endif
    set_mode(t, 1);  // the reference sequence through the separate kernels
    if (x16) op_linear_fwd_x16(be, d_y, d_x16, d_W, bias ? d_b : NULL, N, in, out);
    else op_linear_fwd(be, d_y, d_x, d_W, bias ? d_b : NULL, N, in, out);
    if (relu) op_act_fwd16(be, d_w16, d_y, ny, ACT_RELU);
    else op_to_bf16(be, d_w16, d_y, ny);
    set_mode(t, 0);
    float *got = dev_fetch_bits(t, d_y16, ny), *want = dev_fetch_bits(t, d_w16, ny);
    char what[200];
    snprintf(what, sizeof what, "linear_fwd16 N=%d in=%d out=%d bias=%d relu=%d x16=%d%s%s", N, in, out, bias, relu,
             x16, has_tmp ? "" : " no tmp", mode ? " separate" : "");
    bool fused = false;
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) {
        fused = g1.out16_fused > g0.out16_fused;
        g_out16_fused += fused;
        g_out16_bias_fused += fused && bias;
        g_out16_unplanned += g1.out16_unplanned > g0.out16_unplanned;
        g_out16_cases++;
        TCHECK(g1.out16_unplanned - g0.out16_unplanned <= g1.out16_separate - g0.out16_separate,
               "%s: %s: counted as unplanned but not as separate", t->name, what);
        TCHECK((g1.out16_fused - g0.out16_fused) + (g1.out16_separate - g0.out16_separate) == 1,
               "%s: %s: one call, %ld fused + %ld separate", t->name, what, g1.out16_fused - g0.out16_fused,
               g1.out16_separate - g0.out16_separate);
        if (mode || !t->bf16) TCHECK(!fused, "%s: %s: the one-GEMM path ran with fusion off or in fp32", t->name, what);
        // an unaligned shape's plan rounded the product before adding the bias (H200, ab749a9): such shapes
        // must take the fp32 product and one rounding
        if (in % 8 || out % 8)
            TCHECK(!fused, "%s: %s: the one-GEMM path ran on rows that are not 16-byte vectors", t->name, what);
    }
#endif
    if (fused) check_close(t, what, got, want, ny, BF16_STEP_RTOL, BF16_STEP_ATOL);
    else check_exact(t, what, got, want, ny);
    free(x), free(xw), free(W), free(b), free(got), free(want);
    dev_free(t, d_x16), dev_free(t, d_y16), dev_free(t, d_w16), dev_free(t, d_x), dev_free(t, d_W), dev_free(t, d_b);
    dev_free(t, d_tmp), dev_free(t, d_y);
}

/* The same backward twice from the same state gives the same bits. */
static void linear_determinism(const Target *t, Rng *rng) {
    const int N = 300, in = 192, out = 224;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *dy = rand_floats(ny, rng, -1, 1);
    float *d_x = dev_from(t, x, nx), *d_W = dev_from(t, W, nw), *d_dy = dev_from(t, dy, ny);
    set_mode(t, 0);
    float *runs[2][3];
    for (int r = 0; r < 2; r++) {
        float *d_gx = dev_from(t, x, nx), *d_gW = dev_from(t, W, nw), *d_gb = dev_from(t, dy, out);
        op_linear_bwd(t->be, d_gx, GRAD_ADD, d_gW, d_gb, d_dy, d_x, d_W, N, in, out);
        runs[r][0] = dev_fetch(t, d_gx, nx), runs[r][1] = dev_fetch(t, d_gW, nw), runs[r][2] = dev_fetch(t, d_gb, out);
        dev_free(t, d_gx), dev_free(t, d_gW), dev_free(t, d_gb);
    }
    check_exact(t, "linear_bwd dx run to run", runs[1][0], runs[0][0], nx);
    check_exact(t, "linear_bwd dW run to run", runs[1][1], runs[0][1], nw);
    check_exact(t, "linear_bwd db run to run", runs[1][2], runs[0][2], out);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) free(runs[r][k]);
    free(x), free(W), free(dy);
    dev_free(t, d_x), dev_free(t, d_W), dev_free(t, d_dy);
}

#ifdef TPTRAIN_TEST_CUDA
/* ---- the weight-gradient GEMM's tuning (kernels/cuda/gemm_tune.cu) ------------------------ */

static long tune_decisions(GpuGemmCounts g) { return g.tuned + g.tune_single + g.tune_captured + g.tune_skipped; }

/* dW += dy^T x alone, from gW0 in a fresh device buffer, inside a graph capture (then launched) when captured. */
static float *dw_run(const Target *t, const float *gW0, const float *d_dy, const float *d_x, const float *d_W, int N,
                     int in, int out, bool captured) {
    const size_t nw = (size_t)out * in;
    float *d_gW = dev_from(t, gW0, nw);
    void *graph = NULL;
    if (captured) backend_capture_begin(t->be);
    op_linear_bwd(t->be, NULL, GRAD_ADD, d_gW, NULL, d_dy, d_x, d_W, N, in, out);
    if (captured) {
        char err[256] = "";
        graph = backend_capture_end(t->be, err, sizeof err);
        TCHECK(graph != NULL, "%s: linear_bwd dW inside a capture: %s", t->name, err[0] ? err : "no graph");
        if (graph) backend_graph_launch(t->be, graph);
    }
    float *got = dev_fetch(t, d_gW, nw);
    backend_graph_free(t->be, graph);
    dev_free(t, d_gW);
    return got;
}

/* gW0 + dy[:N]^T x[:N] in the target's arithmetic (bf16: on the rounded operands). */
static float *dw_ref(const Target *t, const float *gW0, const float *dy, const float *x, const float *W, int N, int in,
                     int out) {
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *ref = host_copy(gW0, nw);
    float *xr = t->bf16 ? host_bf16(x, nx) : host_copy(x, nx), *dyr = t->bf16 ? host_bf16(dy, ny) : host_copy(dy, ny);
    cpu_linear_bwd(NULL, GRAD_ADD, ref, NULL, dyr, xr, W, N, in, out);
    free(xr), free(dyr);
    return ref;
}

/* Untuned, then tuned, on a shape no other case used: both within the band of the reference (beta 1 applied
 * once to the random start, whatever the timed runs did), tuned against untuned within twice it (another
 * summation order), the same bits as untuned where the heuristic's first was kept, the tuned call again the
 * same bits, and the shape's first call decided exactly once. Then a shape first called inside a capture:
 * not timed (captured counted), and the eager call after it neither tunes nor changes the graph's bits. */
static void linear_tuning(const Target *t, Rng *rng) {
    const int N = 2048, in = 256, out = 192, Nc = 600;  // dW: M = out, N = in, K = tokens
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W = rand_floats(nw, rng, -1, 1), *dy = rand_floats(ny, rng, -1, 1);
    float *gW0 = rand_floats(nw, rng, -1, 1);
    float *d_x = dev_from(t, x, nx), *d_W = dev_from(t, W, nw), *d_dy = dev_from(t, dy, ny);
    const double gemm_tol = tol(t, t->bf16 ? BF16_SAME_INPUT_TOL : FP32_TOL);
    set_mode(t, 0);
    gpu_set_gemm_tuning(t->be, false);
    GpuGemmCounts g0 = gpu_gemm_counts(t->be);
    float *untuned = dw_run(t, gW0, d_dy, d_x, d_W, N, in, out, false);
    GpuGemmCounts g1 = gpu_gemm_counts(t->be);
    gpu_set_gemm_tuning(t->be, true);
    float *tuned = dw_run(t, gW0, d_dy, d_x, d_W, N, in, out, false);
    GpuGemmCounts g2 = gpu_gemm_counts(t->be);
    float *again = dw_run(t, gW0, d_dy, d_x, d_W, N, in, out, false);
    GpuGemmCounts g3 = gpu_gemm_counts(t->be);
    TCHECK(tune_decisions(g1) == tune_decisions(g0), "%s: tuning off, yet a dW shape was tuned", t->name);
    TCHECK(tune_decisions(g2) - tune_decisions(g1) == 1, "%s: a dW shape's first tuned call decided %ld times",
           t->name, tune_decisions(g2) - tune_decisions(g1));
    TCHECK(tune_decisions(g3) == tune_decisions(g2), "%s: a dW shape's second call tuned it again", t->name);
    float *ref = dw_ref(t, gW0, dy, x, W, N, in, out);
    check_rel(t, "linear_bwd dW untuned", untuned, ref, gW0, nw, gemm_tol);
    check_rel(t, "linear_bwd dW tuned", tuned, ref, gW0, nw, gemm_tol);
    check_rel(t, "linear_bwd dW tuned against untuned", tuned, untuned, gW0, nw, 2 * gemm_tol);
    check_exact(t, "linear_bwd dW tuned, run to run", again, tuned, nw);
    if (g2.tune_changed == g1.tune_changed)
        check_exact(t, "linear_bwd dW tuned, the heuristic's first kept: the untuned bits", tuned, untuned, nw);
    float *graph = dw_run(t, gW0, d_dy, d_x, d_W, Nc, in, out, true);
    GpuGemmCounts g4 = gpu_gemm_counts(t->be);
    float *eager = dw_run(t, gW0, d_dy, d_x, d_W, Nc, in, out, false);
    GpuGemmCounts g5 = gpu_gemm_counts(t->be);
    TCHECK(g4.tune_captured - g3.tune_captured == 1 && tune_decisions(g4) - tune_decisions(g3) == 1,
           "%s: a dW shape first called inside a capture: %ld captured of %ld decisions", t->name,
           g4.tune_captured - g3.tune_captured, tune_decisions(g4) - tune_decisions(g3));
    TCHECK(tune_decisions(g5) == tune_decisions(g4), "%s: the eager call after a capture tuned the shape", t->name);
    float *ref_c = dw_ref(t, gW0, dy, x, W, Nc, in, out);
    check_rel(t, "linear_bwd dW inside a capture", graph, ref_c, gW0, nw, gemm_tol);
    check_exact(t, "linear_bwd dW eager after its capture: the graph's bits", eager, graph, nw);
    float *bufs[] = {x, W, dy, gW0, untuned, tuned, again, ref, graph, eager, ref_c};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    dev_free(t, d_x), dev_free(t, d_W), dev_free(t, d_dy);
}
#endif

void test_linear(const Target *t, Rng *rng) {
    static const int shapes[][3] = {{37, 53, 29}, {200, 96, 160}, {1, 5, 3}, {512, 256, 384}};
#ifdef TPTRAIN_TEST_CUDA
    // every case below with the dW GEMMs tuned (off by default: TPTRAIN_GEMM_TUNE=1), so each shape's kept
    // algorithm meets the reference; linear_tuning compares it against the untuned plans
    if (!t->is_cpu) gpu_set_gemm_tuning(t->be, true);
#endif
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int mode = 0; mode < n_modes(t); mode++)
            for (int reg = 0; reg < 2; reg++) {
                const int N = shapes[i][0], in = shapes[i][1], out = shapes[i][2];
                linear_fwd_case(t, mode, true, reg, N, in, out, rng);
                linear_fwd_case(t, mode, false, reg, N, in, out, rng);
                for (int which = 1; which < 8; which++) {
                    linear_bwd_case(t, mode, which, GRAD_ADD, reg, N, in, out, rng);
                    if (which & 1) linear_bwd_case(t, mode, which, GRAD_WRITE, reg, N, in, out, rng);
                }
            }
    // cuBLASLt has had BGRADB with a transposed B (our dy) since CUDA 11.4, for fp32 and bf16 operands: the
    // epilogue must have given db at least once
    if (!t->is_cpu)
        TCHECK(g_bgrad_fused_cases > 0, "%s: no linear_bwd took db from the dW GEMM's BGRADB epilogue", t->name);
    set_mode(t, 0);
    g_out16_fused = g_out16_cases = g_out16_unplanned = g_dx16_fused = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        linear_x16_case(t, shapes[i][0], shapes[i][1], shapes[i][2], rng);
        linear_dy16_case(t, shapes[i][0], shapes[i][1], shapes[i][2], rng);
        linear_relu_case(t, shapes[i][0], shapes[i][1], shapes[i][2], rng);
        linear_bwd16_case(t, shapes[i][0], shapes[i][1], shapes[i][2], rng);
        for (int mode = 0; mode < n_modes(t); mode++) linear_db_case(t, mode, shapes[i][0], shapes[i][1], shapes[i][2], rng);
        for (int mode = 0; mode < n_modes(t); mode++)
            for (int v = 0; v < 16; v++)
                linear_fwd16_case(t, mode, v & 1, v & 2, v & 4, v & 8, shapes[i][0], shapes[i][1], shapes[i][2], rng);
    }
    // cuBLASLt stores bf16 from fp32 sums of bf16 products on every shape of the model: at least once here
    if (!t->is_cpu && t->bf16)
        TCHECK(g_dx16_fused > 0, "%s: no linear_bwd16 stored dx16 from the GEMM", t->name);
    /* no tmp, more than one chunk of rows (scratch_out16_rows) on the fallback: the output layer's shape */
    const int rows = scratch_out16_rows(1 << 20, 4003);
    for (int mode = 0; mode < n_modes(t); mode++)
        linear_fwd16_case(t, mode, false, false, false, false, 2 * rows + 5, 24, 4003, rng);
    if (!t->is_cpu)
        printf("test_backend_ops: %s: linear_fwd16 stored bf16 from the GEMM in %d of %d cases (the rest: fp32, "
               "then rounded; %d of them found no bf16-output plan before copying any operand)\n", t->name,
               g_out16_fused, g_out16_cases, g_out16_unplanned);
    // the bf16 bias epilogue (cuBLASLt's bias has D's type) must have found a plan at least once
    if (!t->is_cpu && t->bf16)
        TCHECK(g_out16_bias_fused > 0, "%s: no biased linear_fwd16 stored bf16 from the GEMM", t->name);
    linear_bwd_out0(t, rng);
    linear_determinism(t, rng);
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) {
        linear_tuning(t, rng);
        GpuGemmCounts g = gpu_gemm_counts(t->be);
        printf("test_backend_ops: %s: dW tuning: %ld shapes timed (%ld kept another than the heuristic's first), "
               "%ld with one candidate, %ld first called in a capture, %ld skipped, %ld recalled; %.1f ms\n",
               t->name, g.tuned, g.tune_changed, g.tune_single, g.tune_captured, g.tune_skipped, g.tune_recalled,
               g.tune_ms);
        // the dW shapes above (K up to 2048) give cuBLASLt several candidates: tuning must have timed some
        TCHECK(g.tuned > 0, "%s: no weight-gradient GEMM shape had its candidates timed", t->name);
        gpu_set_gemm_tuning(t->be, false);  // the default again for the tests after this one
        printf("test_backend_ops: %s: bias %ld fused / %ld separate, db %ld fused / %ld separate, %ld epilogue "
               "refusals, %ld plans, %ld evictions\n",
               t->name, g.bias_fused, g.bias_separate, g.bgrad_fused, g.bgrad_separate, g.refusals, g.plans,
               g.evictions);
        // cuBLASLt has had the fp32 bias epilogue since CUDA 11: the fused path must have run at least once
        // (which other epilogues run, and refusals, depend on the library: reported above, not required)
        if (!t->bf16) TCHECK(g.bias_fused > 0, "%s: no linear bias ran in the fused epilogue", t->name);

    }
#endif
}

/* ---- compute weights: the bf16 twin and its re-cast ------------------------------------ */

/* The GEMMs read registered weights from the compute copy where there is
 * one: until the re-cast, CUDA in bf16 still multiplies the old values (so
 * the twin is what ran), while the CPU's emulation rounds the master values
 * on every call and fp32 reads them directly. After the re-cast all agree. */
static void stale_twin_case(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const int N = 16, in = 32, out = 24;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rand_floats(nx, rng, -1, 1), *W_old = rand_floats(nw, rng, -1, 1), *W_new = host_alloc(nw);
    for (size_t i = 0; i < nw; i++) W_new[i] = 0.5f - W_old[i];
    float *d_x = dev_from(t, x, nx), *d_y = dev_nan(t, ny), *master = dev_from(t, W_old, nw);
    backend_add_compute_weights(be, master, nw);
    backend_upload(be, master, W_new, nw * sizeof(float));  // the optimizer moved the weights; no re-cast yet
    const bool keeps_copy = !t->is_cpu && t->bf16;
    float *want_old = host_alloc(ny), *want_new = host_alloc(ny);
    float *xr = t->bf16 ? host_bf16(x, nx) : host_copy(x, nx);
    float *Wo = t->bf16 ? host_bf16(W_old, nw) : host_copy(W_old, nw), *Wn = t->bf16 ? host_bf16(W_new, nw) : host_copy(W_new, nw);
    cpu_linear_fwd(want_old, xr, Wo, NULL, N, in, out);
    cpu_linear_fwd(want_new, xr, Wn, NULL, N, in, out);
    const double rtol = tol(t, t->bf16 ? BF16_SAME_INPUT_TOL : FP32_TOL);
    for (int pass = 0; pass < 2; pass++) {
        op_linear_fwd(be, d_y, d_x, master, NULL, N, in, out);
        float *got = dev_fetch(t, d_y, ny);
        const bool old = keeps_copy && pass == 0;
        check_rel(t, old ? "linear_fwd before the re-cast: the old compute copy" : "linear_fwd: the current weights",
                  got, old ? want_old : want_new, NULL, ny, rtol);
        free(got);
        backend_recast_weights(be);
    }
    backend_remove_compute_weights(be, master);
    free(x), free(W_old), free(W_new), free(want_old), free(want_new), free(xr), free(Wo), free(Wn);
    dev_free(t, d_x), dev_free(t, d_y), dev_free(t, master);
}

void test_compute_weights(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* 1 + 2^-8: tie, stays 1 */,
                              1.01171875f /* 1 + 3*2^-8: tie, up to 1 + 2^-6 */, 3.14159265f, 65504.0f,
                              1e-40f /* denormal */, 3.0e38f, INFINITY, -INFINITY, NAN};
    const size_t n_special = sizeof specials / sizeof specials[0], n = n_special + 4102;  // 8-wide conversion and a 3-element tail
    float *h = rand_floats(n, rng, -1000, 1000);
    memcpy(h, specials, sizeof specials);
    float *master = backend_alloc(be, n * sizeof(float), MEM_MASTER);
    backend_upload(be, master, h, n * sizeof(float));
    const size_t compute_before = be->mem.cur[MEM_COMPUTE];
    backend_add_compute_weights(be, master, n);
    const uint16_t *twin = backend_compute_twin(be, master + 5);
    const bool keeps_copy = !t->is_cpu && t->bf16;
    TCHECK((twin != NULL) == keeps_copy, "%s: a compute copy exists exactly on CUDA in bf16 (%p)", t->name,
           (const void *)twin);
    TCHECK(be->mem.cur[MEM_COMPUTE] - compute_before == (keeps_copy ? n * sizeof(uint16_t) : 0),
           "%s: compute weights account %zu bytes", t->name, be->mem.cur[MEM_COMPUTE] - compute_before);
    TCHECK(backend_compute_twin(be, h) == NULL, "%s: a pointer outside the range has no twin", t->name);
    for (int pass = 0; pass < 2 && keeps_copy; pass++) {
        uint16_t *bits = TP_MALLOC(n * sizeof(uint16_t));
        backend_download(be, bits, twin - 5, n * sizeof(uint16_t));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            float want = ref_bf16(h[i]), got;
            uint32_t u = (uint32_t)bits[i] << 16;
            memcpy(&got, &u, 4);
            if (isnan(want) ? !isnan(got) : memcmp(&got, &want, 4) != 0) bad++;
        }
        TCHECK(bad == 0, "%s: %zu of %zu compute weights differ from round-to-nearest-even (pass %d)", t->name, bad,
               n, pass);
        free(bits);
        for (size_t i = n_special; i < n; i++) h[i] = -h[i] * 0.5f;  // new master values, then the re-cast
        backend_upload(be, master, h, n * sizeof(float));
        backend_recast_weights(be);
    }
    backend_remove_compute_weights(be, master);
    TCHECK(be->mem.cur[MEM_COMPUTE] == compute_before, "%s: removing the range frees its copy", t->name);
    dev_free(t, master);
    free(h);
    stale_twin_case(t, rng);
}
