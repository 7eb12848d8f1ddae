/* test_ops.c: every op of kernels/ops.h on the CPU backend.
 *
 * Backward ops are checked against central finite differences of a scalar
 * L = sum(out * R) with a fixed random R (accumulated in double), so the
 * backward op is called with dout = R. Gradient buffers start from random
 * values and the test subtracts them afterwards, which also checks that
 * backward accumulates (+=) instead of overwriting. Forward ops without a
 * gradient (gemm, xent value, adamw, positions, sumsq) are compared with a
 * direct double-precision computation written here. Everything is small
 * and seeded, so the test is deterministic and runs in well under a second.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "err.h"
#include "check.h"
#include "testrng.h"

/* ---- tolerances -------------------------------------------------------------
 * Finite differences in fp32. The step is applied as x +- FD_STEP and the
 * difference is divided by the step actually stored ((float)(x+h) -
 * (float)(x-h)), so rounding of x +- h costs nothing. Outputs that do not
 * depend on the perturbed element are recomputed bit-identically and cancel
 * in L(x+h) - L(x-h); the rest carry ~1e-7 relative rounding each, so the
 * rounding error of the quotient is about 1e-7 * sum|out*R| / (2h), a few
 * 1e-5 for the tensors here. The truncation error is h^2/6 * |f'''|, about
 * 2e-5 for the O(1) curvatures here (inputs are kept O(1); ReLU inputs stay
 * away from its kink by more than h). Gradients are O(0.1..1), so
 * FD_ATOL = 5e-4 with FD_RTOL = 5e-3 leaves a 10x margin over the observed
 * errors and still catches any wrong term (a missing term or factor shifts
 * a gradient by O(0.1)). */
static const float FD_STEP = 1e-2f;
static const double FD_RTOL = 5e-3;
static const double FD_ATOL = 5e-4;
/* Larger tensors are checked on this many sampled elements. */
enum { FD_MAX_SAMPLES = 400 };
/* A gradient check that compares zeros with zeros cannot fail: every checked
 * tensor must have some gradient of at least this size. */
static const double FD_MIN_SIGNAL = 1e-2;

/* fp32 GEMM against a double triple loop: each product and addition rounds
 * once (relative 2^-24), so |error| <= (K + 2) * FLT_EPSILON * sum|terms|
 * is a safe bound (the classical one is about K * 2^-24). */
static double gemm_tol(int K, double abs_terms) {
    return (K + 2) * (double)FLT_EPSILON * abs_terms + 1e-30;
}
/* Forward values against double: a handful of fp32 roundings on O(1)
 * quantities (softmax probabilities, normalised rows, losses). */
static const double FWD_RTOL = 1e-5;
static const double FWD_ATOL = 1e-6;
/* AdamW: parameters ~1 and steps ~1e-2 in fp32; the difference to a double
 * implementation is a few ulps of p. A wrong bias correction, decay or eps
 * placement moves p by >= 1e-4 with the settings used. */
static const double ADAM_RTOL = 1e-5;
static const double ADAM_ATOL = 1e-6;

/* ---- small helpers ------------------------------------------------------- */


static float *alloc_copy(const float *src, size_t n) {
    float *x = TP_MALLOC(n * sizeof(float));
    memcpy(x, src, n * sizeof(float));
    return x;
}

static float *alloc_zero(size_t n) { return TP_CALLOC(n, sizeof(float)); }
static float *alloc_nan(size_t n) {  // garbage that an op which writes its output must not keep
    float *x = TP_CALLOC(n, sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static double dot_d(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* g -= g0: turns an accumulated gradient buffer back into the increment. */
static void subtract_start(float *g, const float *g0, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] -= g0[i];
}

/* ---- finite-difference driver ---------------------------------------------
 * loss(ctx) runs the forward op on the current inputs and returns L. */
typedef double (*LossFn)(void *ctx);

static void fd_check(const char *what, float *x, size_t n_elems,
                     const float *grad,  // analytic dL/dx, (n_elems)
                     LossFn loss, void *ctx, Rng *rng) {
    bool sample = n_elems > FD_MAX_SAMPLES;
    size_t n_check = sample ? FD_MAX_SAMPLES : n_elems;
    double worst = 0.0, max_grad = 0.0;
    for (size_t i = 0; i < n_elems; i++)
        if (fabs(grad[i]) > max_grad) max_grad = fabs(grad[i]);
    for (size_t s = 0; s < n_check; s++) {
        size_t i = sample ? (size_t)(rng_next(rng) % n_elems) : s;
        float x0 = x[i];
        float xp = x0 + FD_STEP, xm = x0 - FD_STEP;
        x[i] = xp;
        double lp = loss(ctx);
        x[i] = xm;
        double lm = loss(ctx);
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double err = fabs((double)grad[i] - fd);
        if (err > worst) worst = err;
        char label[96];
        snprintf(label, sizeof label, "%s[%zu]", what, i);
        CHECK_CLOSE(grad[i], fd, FD_RTOL, FD_ATOL, label);
    }
    CHECK(max_grad >= FD_MIN_SIGNAL, "%s: gradient is all ~0 (max %g)", what, max_grad);
    printf("  fd %-26s %4zu elems checked, max |grad| %.3f, worst err %.1e\n", what,
           n_check, max_grad, worst);
}

/* An accumulated gradient g (start values g0) turned back into the op's
 * increment, then checked against the finite differences of loss in x. */
static void fd_check_increment(const char *what, float *x, size_t n_elems, float *g, const float *g0, LossFn loss,
                               void *ctx, Rng *rng) {
    subtract_start(g, g0, n_elems);
    fd_check(what, x, n_elems, g, loss, ctx, rng);
}

/* ---- gemm ------------------------------------------------------------------- */

static void gemm_case(bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                      Rng *rng) {
    float *A = rand_floats((size_t)M * K + 1, rng, -1, 1);  // (M, K) or (K, M)
    float *B = rand_floats((size_t)K * N + 1, rng, -1, 1);  // (K, N) or (N, K)
    float *C = rand_floats((size_t)M * N + 1, rng, -1, 1);  // (M, N)
    float *C0 = alloc_copy(C, (size_t)M * N + 1);
    cpu_gemm(ta, tb, M, N, K, alpha, A, B, beta, C);
    int n_bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0.0, abs_terms = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                ref += a * b;
                abs_terms += fabs(a * b);
            }
            double c0 = C0[(size_t)i * N + j];
            ref = alpha * ref + beta * c0;
            abs_terms = fabs(alpha) * abs_terms + fabs(beta * c0);
            if (fabs(C[(size_t)i * N + j] - ref) > gemm_tol(K, abs_terms)) n_bad++;
        }
    CHECK(n_bad == 0, "gemm ta=%d tb=%d M=%d N=%d K=%d: %d wrong entries", ta, tb, M, N, K,
          n_bad);
    free(A);
    free(B);
    free(C);
    free(C0);
}

static void test_gemm(Rng *rng) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ta, tb, 5, 7, 3, 0.7f, 0.3f, rng);
            gemm_case(ta, tb, 33, 17, 29, 1.0f, 1.0f, rng);
            gemm_case(ta, tb, 1, 9, 64, -0.5f, 0.0f, rng);
        }

    // beta == 0 overwrites: NaN in C must not survive
    int M = 4, N = 3, K = 5;
    float *A = rand_floats((size_t)M * K, rng, -1, 1);
    float *B = rand_floats((size_t)K * N, rng, -1, 1);
    float C[12];
    for (int i = 0; i < M * N; i++) C[i] = NAN;
    cpu_gemm(false, false, M, N, K, 1.0f, A, B, 0.0f, C);
    bool finite = true;
    for (int i = 0; i < M * N; i++) finite = finite && isfinite(C[i]);
    CHECK(finite, "gemm with beta=0 kept a NaN from C");

    // zero sizes: nothing is touched when M or N is 0; K = 0 leaves beta * C
    float D[12];
    for (int i = 0; i < 12; i++) D[i] = (float)i;
    cpu_gemm(false, false, 0, N, K, 1.0f, A, B, 0.0f, D);
    cpu_gemm(true, true, M, 0, K, 1.0f, A, B, 0.0f, D);
    cpu_gemm(false, false, 0, 0, 0, 1.0f, NULL, NULL, 0.0f, NULL);
    bool untouched = true;
    for (int i = 0; i < 12; i++) untouched = untouched && D[i] == (float)i;
    CHECK(untouched, "gemm with M or N = 0 wrote to C");
    cpu_gemm(false, false, M, N, 0, 1.0f, A, B, 0.5f, D);
    bool halved = true;
    for (int i = 0; i < 12; i++) halved = halved && D[i] == 0.5f * (float)i;
    CHECK(halved, "gemm with K = 0 must give beta * C");
    for (int i = 0; i < 12; i++) D[i] = NAN;
    cpu_gemm(true, false, M, N, 0, 1.0f, A, B, 0.0f, D);
    bool zeros = true;
    for (int i = 0; i < 12; i++) zeros = zeros && D[i] == 0.0f;
    CHECK(zeros, "gemm with K = 0 and beta = 0 must give zeros");
    free(A);
    free(B);
}

/* ---- linear and bias --------------------------------------------------------- */

typedef struct {
    float *x, *W, *b;  // (N, in), (out, in), (out)
    float *y, *R;      // (N, out)
    int N, in, out;
} LinearCtx;

static double linear_loss(void *p) {
    LinearCtx *c = p;
    cpu_linear_fwd(c->y, c->x, c->W, c->b, c->N, c->in, c->out);
    return dot_d(c->y, c->R, (size_t)c->N * c->out);
}

static void test_linear(Rng *rng) {
    int N = 6, in = 5, out = 4;
    size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    LinearCtx c = {rand_floats(nx, rng, -1, 1), rand_floats(nw, rng, -1, 1),
                   rand_floats(out, rng, -1, 1), alloc_zero(ny), rand_floats(ny, rng, -1, 1),
                   N, in, out};

    // forward against a direct sum, with and without bias
    cpu_linear_fwd(c.y, c.x, c.W, NULL, N, in, out);
    float *y_nobias = alloc_copy(c.y, ny);
    cpu_linear_fwd(c.y, c.x, c.W, c.b, N, in, out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            double ref = 0.0;
            for (int i = 0; i < in; i++) ref += (double)c.x[n * in + i] * c.W[o * in + i];
            CHECK_CLOSE(y_nobias[n * out + o], ref, FWD_RTOL, FWD_ATOL, "linear y (no bias)");
            CHECK_CLOSE(c.y[n * out + o], ref + c.b[o], FWD_RTOL, FWD_ATOL, "linear y");
        }

    float *dx = rand_floats(nx, rng, -1, 1), *dx0 = alloc_copy(dx, nx);
    float *dW = rand_floats(nw, rng, -1, 1), *dW0 = alloc_copy(dW, nw);
    float *db = rand_floats(out, rng, -1, 1), *db0 = alloc_copy(db, out);
    cpu_linear_bwd(dx, GRAD_ADD, dW, db, c.R, c.x, c.W, N, in, out);
    cpu_linear_bwd(NULL, GRAD_ADD, NULL, NULL, c.R, c.x, c.W, N, in, out);  // all skipped: no-op
    fd_check_increment("linear dx", c.x, nx, dx, dx0, linear_loss, &c, rng);
    fd_check_increment("linear dW", c.W, nw, dW, dW0, linear_loss, &c, rng);
    fd_check_increment("linear db", c.b, out, db, db0, linear_loss, &c, rng);

    // each gradient alone equals its part of the full call; so does dx written over NaN garbage
    float *dx_only = alloc_zero(nx), *dx_written = alloc_nan(nx);
    cpu_linear_bwd(dx_only, GRAD_ADD, NULL, NULL, c.R, c.x, c.W, N, in, out);
    cpu_linear_bwd(dx_written, GRAD_WRITE, NULL, NULL, c.R, c.x, c.W, N, in, out);
    bool same = true, written = true;
    for (size_t i = 0; i < nx; i++) same = same && fabsf(dx_only[i] - dx[i]) <= 1e-5f;
    for (size_t i = 0; i < nx; i++) written = written && dx_written[i] == dx_only[i];
    CHECK(same, "linear_bwd with only dx differs from the full call");
    CHECK(written, "linear_bwd writing dx differs from adding it to zeros");
    free(dx_written);

    free(c.x); free(c.W); free(c.b); free(c.y); free(c.R); free(y_nobias);
    free(dx); free(dx0); free(dW); free(dW0); free(db); free(db0); free(dx_only);
}

typedef struct {
    float *y0, *y, *b, *R;  // (N, C), (N, C), (C), (N, C)
    int N, C;
} BiasCtx;

static double bias_loss(void *p) {
    BiasCtx *c = p;
    memcpy(c->y, c->y0, (size_t)c->N * c->C * sizeof(float));
    cpu_bias_add(c->y, c->b, c->N, c->C);
    return dot_d(c->y, c->R, (size_t)c->N * c->C);
}

static void test_bias(Rng *rng) {
    int N = 7, C = 5;
    size_t n = (size_t)N * C;
    BiasCtx c = {rand_floats(n, rng, -1, 1), alloc_zero(n), rand_floats(C, rng, -1, 1),
                 rand_floats(n, rng, -1, 1), N, C};
    float *db = rand_floats(C, rng, -1, 1), *db0 = alloc_copy(db, C);
    cpu_bias_bwd(db, c.R, N, C);
    subtract_start(db, db0, C);
    fd_check("bias db", c.b, C, db, bias_loss, &c, rng);
    free(c.y0); free(c.y); free(c.b); free(c.R); free(db); free(db0);
}

/* ---- embedding ------------------------------------------------------------- */

typedef struct {
    float *out, *table, *R;  // (N, C), (V_local, C), (N, C)
    const int32_t *ids;      // (N)
    float scale;
    int N, C, vocab_start, V_local;
} EmbCtx;

static double emb_loss(void *p) {
    EmbCtx *c = p;
    cpu_embedding_fwd(c->out, c->ids, c->table, c->scale, c->N, c->C, c->vocab_start,
                     c->V_local);
    return dot_d(c->out, c->R, (size_t)c->N * c->C);
}

static void test_embedding(Rng *rng) {
    // full vocabulary 12, this shard owns ids [4, 9); ids 4 and 8 repeat,
    // 0, 3, 9, 11 belong to other shards, local rows 2 and 3 are never used
    static const int32_t ids[10] = {4, 8, 5, 4, 0, 11, 8, 4, 3, 9};
    int N = 10, C = 3, vocab_start = 4, V_local = 5;
    size_t n_out = (size_t)N * C, n_tab = (size_t)V_local * C;
    EmbCtx c = {alloc_zero(n_out), rand_floats(n_tab, rng, -1, 1), rand_floats(n_out, rng, -1, 1),
                ids, 1.7f, N, C, vocab_start, V_local};

    emb_loss(&c);
    for (int n = 0; n < N; n++) {
        int local = ids[n] - vocab_start;
        bool own = local >= 0 && local < V_local;
        bool ok = true;
        for (int j = 0; j < C; j++)
            ok = ok && c.out[n * C + j] == (own ? c.scale * c.table[local * C + j] : 0.0f);
        CHECK(ok, "embedding row %d (id %d) wrong", n, ids[n]);
    }

    float *dt = rand_floats(n_tab, rng, -1, 1), *dt0 = alloc_copy(dt, n_tab);
    cpu_embedding_bwd(dt, c.R, ids, c.scale, N, C, vocab_start, V_local);
    bool unused_rows_kept = true;
    for (int j = 2 * C; j < 4 * C; j++) unused_rows_kept = unused_rows_kept && dt[j] == dt0[j];
    CHECK(unused_rows_kept, "embedding_bwd wrote to rows no id refers to");
    subtract_start(dt, dt0, n_tab);
    fd_check("embedding dtable", c.table, n_tab, dt, emb_loss, &c, rng);
    free(c.out); free(c.table); free(c.R); free(dt); free(dt0);
}

/* ---- layernorm --------------------------------------------------------------- */

typedef struct {
    float *x, *gamma, *beta;  // (N, C), (C), (C)
    float *y, *mean, *rstd;   // (N, C), (N), (N)
    float *R;                 // (N, C)
    int N, C;
    float eps;
} LnCtx;

static double ln_loss(void *p) {
    LnCtx *c = p;
    cpu_layernorm_fwd(c->y, c->mean, c->rstd, c->x, c->gamma, c->beta, c->N, c->C, c->eps);
    return dot_d(c->y, c->R, (size_t)c->N * c->C);
}

static void test_layernorm(Rng *rng) {
    int N = 4, C = 16;
    size_t n = (size_t)N * C;
    LnCtx c = {rand_floats(n, rng, -2, 2), rand_floats(C, rng, 0.5f, 1.5f),
               rand_floats(C, rng, -0.5f, 0.5f), alloc_zero(n), alloc_zero(N), alloc_zero(N),
               rand_floats(n, rng, -1, 1), N, C, 1e-5f};
    for (int r = 0; r < N; r++)  // rows with different offsets
        for (int j = 0; j < C; j++) c.x[r * C + j] += 0.5f * r;

    ln_loss(&c);
    for (int r = 0; r < N; r++) {
        double mu = 0.0, var = 0.0;
        for (int j = 0; j < C; j++) mu += c.x[r * C + j];
        mu /= C;
        for (int j = 0; j < C; j++) var += (c.x[r * C + j] - mu) * (c.x[r * C + j] - mu);
        var /= C;
        double rs = 1.0 / sqrt(var + c.eps);
        CHECK_CLOSE(c.mean[r], mu, FWD_RTOL, FWD_ATOL, "layernorm mean");
        CHECK_CLOSE(c.rstd[r], rs, FWD_RTOL, FWD_ATOL, "layernorm rstd");
        for (int j = 0; j < C; j++)
            CHECK_CLOSE(c.y[r * C + j], (c.x[r * C + j] - mu) * rs * c.gamma[j] + c.beta[j],
                        FWD_RTOL, FWD_ATOL, "layernorm y");
    }

    float *dx = rand_floats(n, rng, -1, 1), *dx0 = alloc_copy(dx, n);
    float *dg = rand_floats(C, rng, -1, 1), *dg0 = alloc_copy(dg, C);
    float *dbt = rand_floats(C, rng, -1, 1), *dbt0 = alloc_copy(dbt, C);
    cpu_layernorm_bwd(dx, dg, dbt, c.R, c.x, c.mean, c.rstd, c.gamma, N, C);
    fd_check_increment("layernorm dx", c.x, n, dx, dx0, ln_loss, &c, rng);
    fd_check_increment("layernorm dgamma", c.gamma, C, dg, dg0, ln_loss, &c, rng);
    fd_check_increment("layernorm dbeta", c.beta, C, dbt, dbt0, ln_loss, &c, rng);
    free(c.x); free(c.gamma); free(c.beta); free(c.y); free(c.mean); free(c.rstd); free(c.R);
    free(dx); free(dx0); free(dg); free(dg0); free(dbt); free(dbt0);
}

/* ---- activations -------------------------------------------------------------- */

typedef struct {
    float *x, *y, *R;  // (n)
    size_t n;
    Activation act;
} ActCtx;

static double act_loss(void *p) {
    ActCtx *c = p;
    cpu_act_fwd(c->y, c->x, c->n, c->act);
    return dot_d(c->y, c->R, c->n);
}

static void test_activations(Rng *rng) {
    size_t n = 64;
    for (int a = 0; a < 2; a++) {
        Activation act = a == 0 ? ACT_RELU : ACT_GELU;
        ActCtx c = {rand_floats(n, rng, -3, 3), alloc_zero(n), rand_floats(n, rng, -1, 1), n, act};
        if (act == ACT_RELU)  // keep |x| >= 0.1 > FD_STEP: no kink inside a step
            for (size_t i = 0; i < n; i++) {
                float mag = 0.1f + rng_uniform(rng, 0.0f, 1.9f);
                c.x[i] = (i % 2) ? mag : -mag;
            }
        float *dx = rand_floats(n, rng, -1, 1), *dx0 = alloc_copy(dx, n);
        cpu_act_bwd(dx, GRAD_ADD, c.R, c.x, n, act);
        subtract_start(dx, dx0, n);
        fd_check(act == ACT_RELU ? "relu dx" : "gelu dx", c.x, n, dx, act_loss, &c, rng);
        float *into_zeros = alloc_zero(n), *written = alloc_nan(n);  // written over garbage: as added to zeros
        cpu_act_bwd(into_zeros, GRAD_ADD, c.R, c.x, n, act);
        cpu_act_bwd(written, GRAD_WRITE, c.R, c.x, n, act);
        CHECK(memcmp(written, into_zeros, n * sizeof(float)) == 0, "%s bwd written differs from added to zeros",
              act == ACT_RELU ? "relu" : "gelu");
        free(c.x); free(c.y); free(c.R); free(dx); free(dx0); free(into_zeros); free(written);
    }

    // forward values: relu exact; gelu(x) = x Phi(x) at known Phi values
    float x[5] = {-2.0f, -1.0f, 0.0f, 1.0f, 2.0f}, y[5];
    cpu_act_fwd(y, x, 5, ACT_RELU);
    CHECK(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 1.0f && y[4] == 2.0f,
          "relu forward wrong");
    static const double phi_1 = 0.8413447460685429, phi_2 = 0.9772498680518208;
    cpu_act_fwd(y, x, 5, ACT_GELU);
    CHECK_CLOSE(y[0], -2.0 * (1.0 - phi_2), FWD_RTOL, FWD_ATOL, "gelu(-2)");
    CHECK_CLOSE(y[1], -1.0 * (1.0 - phi_1), FWD_RTOL, FWD_ATOL, "gelu(-1)");
    CHECK(y[2] == 0.0f, "gelu(0) = %g", (double)y[2]);
    CHECK_CLOSE(y[3], phi_1, FWD_RTOL, FWD_ATOL, "gelu(1)");
    CHECK_CLOSE(y[4], 2.0 * phi_2, FWD_RTOL, FWD_ATOL, "gelu(2)");
}

/* ---- element-wise and reductions ------------------------------------------- */

static void test_elementwise(Rng *rng) {
    size_t n = 37;
    float *a = rand_floats(n, rng, -1, 1), *b = rand_floats(n, rng, -1, 1);
    float *out = alloc_zero(n), *a0 = alloc_copy(a, n);
    cpu_add(out, a, b, n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok = ok && out[i] == a[i] + b[i];
    CHECK(ok, "op_add wrong");
    cpu_add(a, a, b, n);  // aliased output
    ok = true;
    for (size_t i = 0; i < n; i++) ok = ok && a[i] == out[i];
    CHECK(ok, "op_add with out == a wrong");
    cpu_accumulate(out, b, n);
    ok = true;
    for (size_t i = 0; i < n; i++) ok = ok && out[i] == (a0[i] + b[i]) + b[i];
    CHECK(ok, "op_accumulate wrong");
    cpu_scale(out, -0.25f, n);
    ok = true;
    for (size_t i = 0; i < n; i++) ok = ok && out[i] == ((a0[i] + b[i]) + b[i]) * -0.25f;
    CHECK(ok, "op_scale wrong");

    float *z = rand_floats(n, rng, -1, 1);
    cpu_copy(z, b, n);
    CHECK(memcmp(z, b, n * sizeof(float)) == 0, "op_copy wrong");
    cpu_copy(z, z, n);  // same buffer: a no-op
    CHECK(memcmp(z, b, n * sizeof(float)) == 0, "op_copy onto itself wrong");
    cpu_zero(z, n);
    ok = true;
    for (size_t i = 0; i < n; i++) ok = ok && z[i] == 0.0f;
    CHECK(ok, "op_zero wrong");

    double ref = 0.0;
    for (size_t i = 0; i < n; i++) ref += (double)b[i] * b[i];
    CHECK_CLOSE(cpu_sumsq(b, n), ref, 1e-12, 0.0, "sumsq");
    // 4096^2 = 2^24, then 1000 * 0.25: an fp32 accumulator would drop every
    // 0.25 (the fp32 spacing at 2^24 is 2); double keeps the exact sum
    size_t m = 1001;
    float *big = alloc_zero(m);
    big[0] = 4096.0f;
    for (size_t i = 1; i < m; i++) big[i] = 0.5f;
    CHECK(cpu_sumsq(big, m) == 16777216.0 + 250.0, "sumsq not accumulated in double: %.1f",
          cpu_sumsq(big, m));
    CHECK(cpu_sumsq(big, 0) == 0.0, "sumsq of nothing");
    free(a); free(b); free(out); free(a0); free(big); free(z);
}

static void test_positions(void) {
    int B = 2, T = 7, C = 8;
    size_t n = (size_t)B * T * C;
    float *x = alloc_zero(n);
    cpu_add_positions(x, B, T, C);
    // literal values: t = 1, i = 0 -> angle 1; t = 3, i = 1 -> 3 / 10000^(2/8) = 0.3
    CHECK_CLOSE(x[1 * C + 0], 0.8414709848078965, 0, 1e-6, "pe[1, 0] = sin(1)");
    CHECK_CLOSE(x[1 * C + 1], 0.5403023058681398, 0, 1e-6, "pe[1, 1] = cos(1)");
    CHECK_CLOSE(x[3 * C + 2], 0.29552020666133955, 0, 1e-6, "pe[3, 2] = sin(0.3)");
    CHECK_CLOSE(x[3 * C + 3], 0.955336489125606, 0, 1e-6, "pe[3, 3] = cos(0.3)");
    CHECK(x[0] == 0.0f && x[1] == 1.0f, "pe[0] must be (sin 0, cos 0) = (0, 1)");
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C / 2; i++) {
                double angle = t / pow(10000.0, 2.0 * i / C);
                const float *row = x + ((size_t)b * T + t) * C;
                CHECK_CLOSE(row[2 * i], sin(angle), 0, 1e-6, "pe sin");
                CHECK_CLOSE(row[2 * i + 1], cos(angle), 0, 1e-6, "pe cos");
            }
    // positions are added, not written
    cpu_add_positions(x, B, T, C);
    CHECK_CLOSE(x[(size_t)(T + 1) * C], 2 * 0.8414709848078965, 0, 2e-6, "pe added twice");
    free(x);
}

/* ---- masked softmax ----------------------------------------------------------- */

typedef struct {
    float *S, *P, *R;  // (B, H, Tq, Tk)
    const int32_t *k_len;
    int B, H, Tq, Tk;
    float scale;
    bool causal;
} SoftmaxCtx;

static double softmax_loss(void *p) {
    SoftmaxCtx *c = p;
    cpu_softmax_fwd(c->P, c->S, c->k_len, c->B, c->H, c->Tq, c->Tk, c->scale, c->causal);
    return dot_d(c->P, c->R, (size_t)c->B * c->H * c->Tq * c->Tk);
}

static int expect_valid(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && i + 1 < n) n = i + 1;
    return n;
}

static void test_softmax(Rng *rng) {
    static const int32_t k_len[3] = {6, 3, 0};
    int B = 3, H = 2, Tq = 5, Tk = 6;
    size_t n = (size_t)B * H * Tq * Tk;
    for (int causal = 0; causal < 2; causal++) {
        SoftmaxCtx c = {rand_floats(n, rng, -2, 2), alloc_zero(n), rand_floats(n, rng, -1, 1),
                        k_len, B, H, Tq, Tk, 0.7f, causal};
        // masked scores are large, so reading them would show in every check
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < Tq; i++)
                    for (int j = expect_valid(k_len[b], i, Tk, causal); j < Tk; j++)
                        c.S[(((size_t)b * H + h) * Tq + i) * Tk + j] = 20.0f;
        softmax_loss(&c);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < Tq; i++) {
                    size_t row = (((size_t)b * H + h) * Tq + i) * Tk;
                    int nv = expect_valid(k_len[b], i, Tk, causal);
                    double max = -INFINITY, z = 0.0, sum = 0.0;
                    for (int j = 0; j < nv; j++) max = fmax(max, c.scale * (double)c.S[row + j]);
                    for (int j = 0; j < nv; j++) z += exp(c.scale * (double)c.S[row + j] - max);
                    bool masked_zero = true;
                    for (int j = 0; j < Tk; j++) {
                        if (j < nv) {
                            sum += c.P[row + j];
                            CHECK_CLOSE(c.P[row + j], exp(c.scale * (double)c.S[row + j] - max) / z,
                                        FWD_RTOL, FWD_ATOL, "softmax P");
                        } else {
                            masked_zero = masked_zero && c.P[row + j] == 0.0f;
                        }
                    }
                    CHECK(masked_zero, "softmax: masked keys of row (%d,%d,%d) not 0", b, h, i);
                    if (nv > 0)
                        CHECK_CLOSE(sum, 1.0, 0, Tk * FLT_EPSILON, "softmax row sum");
                }

        float *dS = rand_floats(n, rng, -1, 1), *dS0 = alloc_copy(dS, n);
        cpu_softmax_bwd(dS, c.R, c.P, B, H, Tq, Tk, c.scale);
        subtract_start(dS, dS0, n);
        fd_check(causal ? "softmax dS (causal)" : "softmax dS (padding)", c.S, n, dS,
                 softmax_loss, &c, rng);
        free(c.S); free(c.P); free(c.R); free(dS); free(dS0);
    }
}

/* ---- attention --------------------------------------------------------------- */

typedef struct {
    float *q, *k, *v;  // (B, Tq, H*D), (B, Tk, H*D), (B, Tk, H*D)
    float *out, *P;    // (B, Tq, H*D), (B, H, Tq, Tk)
    float *R;          // (B, Tq, H*D)
    const int32_t *k_len;
    int B, H, Tq, Tk, D;
    bool causal;
} AttnCtx;

static double attn_loss(void *p) {
    AttnCtx *c = p;
    cpu_attention_fwd(c->out, c->P, c->q, c->k, c->v, c->k_len, c->B, c->H, c->Tq, c->Tk,
                     c->D, c->causal);
    return dot_d(c->out, c->R, (size_t)c->B * c->Tq * c->H * c->D);
}

/* dq, dk, dv written over NaN garbage (GRAD_WRITE) against the same backward
 * added into zeros, bit for bit; the rows of padding keys (t >= k_len[b])
 * of dk and dv are zeros. */
static void attention_written(const char *name, const AttnCtx *c, float *scratch) {
    const int B = c->B, H = c->H, Tq = c->Tq, Tk = c->Tk, D = c->D, HD = H * D;
    const size_t nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD;
    float *add[3] = {alloc_zero(nq), alloc_zero(nk), alloc_zero(nk)};
    float *put[3] = {alloc_nan(nq), alloc_nan(nk), alloc_nan(nk)};
    cpu_attention_bwd(add[0], add[1], add[2], GRAD_ADD, c->R, c->P, c->q, c->k, c->v, scratch, B, H, Tq, Tk, D);
    cpu_attention_bwd(put[0], put[1], put[2], GRAD_WRITE, c->R, c->P, c->q, c->k, c->v, scratch, B, H, Tq, Tk, D);
    const size_t n[3] = {nq, nk, nk};
    const char *grad[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++)
        CHECK(memcmp(put[i], add[i], n[i] * sizeof(float)) == 0, "%s: %s written differs from added to zeros", name,
              grad[i]);
    size_t nonzero = 0;
    for (int b = 0; b < B; b++)
        for (size_t e = (size_t)(c->k_len[b] < Tk ? c->k_len[b] : Tk) * HD; e < (size_t)Tk * HD; e++)
            nonzero += put[1][(size_t)b * Tk * HD + e] != 0.0f || put[2][(size_t)b * Tk * HD + e] != 0.0f;
    CHECK(nonzero == 0, "%s: %zu elements of padding keys' dk or dv rows written nonzero", name, nonzero);
    for (int i = 0; i < 3; i++) free(add[i]), free(put[i]);
}

static void attention_case(const char *name, const int32_t *k_len, int B, int H, int Tq,
                           int Tk, int D, bool causal, Rng *rng) {
    int HD = H * D;
    size_t nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD, np = (size_t)B * H * Tq * Tk;
    AttnCtx c = {rand_floats(nq, rng, -1.5f, 1.5f), rand_floats(nk, rng, -1.5f, 1.5f),
                 rand_floats(nk, rng, -1, 1), alloc_zero(nq), alloc_zero(np),
                 rand_floats(nq, rng, -1, 1), k_len, B, H, Tq, Tk, D, causal};
    attn_loss(&c);
    float *out_ref = alloc_copy(c.out, nq), *P_ref = alloc_copy(c.P, np);

    // forward against a direct per-head computation in double
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                int nv = expect_valid(k_len[b], i, Tk, causal);
                double s[16], max = -INFINITY, z = 0.0;
                for (int j = 0; j < nv; j++) {
                    s[j] = 0.0;
                    for (int d = 0; d < D; d++)
                        s[j] += (double)c.q[((size_t)b * Tq + i) * HD + h * D + d] *
                                c.k[((size_t)b * Tk + j) * HD + h * D + d];
                    s[j] /= sqrt((double)D);
                    max = fmax(max, s[j]);
                }
                for (int j = 0; j < nv; j++) z += exp(s[j] - max);
                for (int d = 0; d < D; d++) {
                    double o = 0.0;
                    for (int j = 0; j < nv; j++)
                        o += exp(s[j] - max) / z * c.v[((size_t)b * Tk + j) * HD + h * D + d];
                    CHECK_CLOSE(c.out[((size_t)b * Tq + i) * HD + h * D + d], o, FWD_RTOL,
                                FWD_ATOL, "attention out");
                }
            }

    // padded keys (and, if causal, future keys) must not influence any row
    float *k2 = alloc_copy(c.k, nk), *v2 = alloc_copy(c.v, nk);
    for (int b = 0; b < B; b++)
        for (int t = k_len[b]; t < Tk; t++)
            for (int j = 0; j < HD; j++) {
                c.k[((size_t)b * Tk + t) * HD + j] = rng_uniform(rng, -100, 100);
                c.v[((size_t)b * Tk + t) * HD + j] = rng_uniform(rng, -100, 100);
            }
    attn_loss(&c);
    CHECK(memcmp(c.out, out_ref, nq * sizeof(float)) == 0 &&
              memcmp(c.P, P_ref, np * sizeof(float)) == 0,
          "%s: changing padded keys changed the output", name);
    memcpy(c.k, k2, nk * sizeof(float));
    memcpy(c.v, v2, nk * sizeof(float));
    if (causal) {  // change key/value 3 of batch 0: rows 0..2 must not move
        int t = 3;
        for (int j = 0; j < HD; j++) {
            c.k[(size_t)t * HD + j] += 1.0f;
            c.v[(size_t)t * HD + j] -= 1.0f;
        }
        attn_loss(&c);
        CHECK(memcmp(c.out, out_ref, (size_t)t * HD * sizeof(float)) == 0,
              "%s: a future key changed an earlier row", name);
        CHECK(memcmp(c.out + (size_t)t * HD, out_ref + (size_t)t * HD, HD * sizeof(float)) != 0,
              "%s: key 3 did not change row 3", name);
        memcpy(c.k, k2, nk * sizeof(float));
        memcpy(c.v, v2, nk * sizeof(float));
    }
    attn_loss(&c);  // back at the base point: P is the one backward needs

    float *dq = rand_floats(nq, rng, -1, 1), *dq0 = alloc_copy(dq, nq);
    float *dk = rand_floats(nk, rng, -1, 1), *dk0 = alloc_copy(dk, nk);
    float *dv = rand_floats(nk, rng, -1, 1), *dv0 = alloc_copy(dv, nk);
    float *scratch = rand_floats(np, rng, -1, 1);  // garbage on entry is fine
    cpu_attention_bwd(dq, dk, dv, GRAD_ADD, c.R, c.P, c.q, c.k, c.v, scratch, B, H, Tq, Tk, D);
    subtract_start(dq, dq0, nq);
    subtract_start(dk, dk0, nk);
    subtract_start(dv, dv0, nk);
    char label[64];
    snprintf(label, sizeof label, "%s dq", name);
    fd_check(label, c.q, nq, dq, attn_loss, &c, rng);
    snprintf(label, sizeof label, "%s dk", name);
    fd_check(label, c.k, nk, dk, attn_loss, &c, rng);
    snprintf(label, sizeof label, "%s dv", name);
    fd_check(label, c.v, nk, dv, attn_loss, &c, rng);
    attention_written(name, &c, scratch);

    free(c.q); free(c.k); free(c.v); free(c.out); free(c.P); free(c.R);
    free(out_ref); free(P_ref); free(k2); free(v2);
    free(dq); free(dq0); free(dk); free(dk0); free(dv); free(dv0); free(scratch);
}

static void test_attention(Rng *rng) {
    static const int32_t self_len[2] = {5, 3};
    static const int32_t cross_len[3] = {6, 2, 0};
    attention_case("self-attn", self_len, 2, 2, 5, 5, 4, true, rng);
    attention_case("cross-attn", cross_len, 3, 2, 3, 6, 4, false, rng);
}

/* ---- dropout --------------------------------------------------------------------- */

static void test_dropout(Rng *rng) {
    // Random123 known-answer vectors for philox4x32-10: counter, key, result
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        philox4x32_10(kat[t], kat[t] + 4, out);
        CHECK(memcmp(out, kat[t] + 6, sizeof out) == 0, "philox known answer %d", t);
    }

    uint64_t stream = dropout_stream(5, 3, 2, 1, 7);
    CHECK(stream == ((5ull << 32) | (3ull << 24) | (2ull << 16) | (1ull << 10) | 7ull),
          "dropout_stream packing: %llx", (unsigned long long)stream);
    CHECK(dropout_stream(0xffffffffu, 255, 255, 63, 1023) == UINT64_MAX,
          "dropout_stream fields must fill all 64 bits");

    size_t n = (1u << 17) + 3;  // not a multiple of 4: the last block is partial
    float p = 0.1f;
    uint64_t seed = 0x1234567890abcdefull;
    float *x = rand_floats(n, rng, 0.5f, 1.5f);  // nonzero, so a zero output means dropped
    float *y = alloc_zero(n), *y2 = alloc_zero(n), *y3 = alloc_zero(n);
    cpu_dropout_fwd(y, x, n, p, seed, stream);
    cpu_dropout_fwd(y2, x, n, p, seed, stream);
    CHECK(memcmp(y, y2, n * sizeof(float)) == 0, "dropout: same seed and stream differ");

    size_t kept = 0;
    bool kept_scaled = true;
    for (size_t i = 0; i < n; i++)
        if (y[i] != 0.0f) {
            kept++;
            kept_scaled = kept_scaled && y[i] == x[i] * (1.0f / (1.0f - p));
        }
    CHECK(kept_scaled, "dropout: kept elements not scaled by 1/(1-p)");
    // binomial: the kept fraction is within 6 standard deviations of 1-p
    double frac = (double)kept / n, sd = sqrt(p * (1.0 - p) / n);
    CHECK(fabs(frac - (1.0 - p)) < 6 * sd, "dropout kept fraction %.4f, want %.4f", frac,
          1.0 - p);

    // the mask follows the documented counter layout
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    bool layout_ok = true;
    for (size_t i = 0; i < n; i++) {
        uint64_t block = i / 4;
        uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
        uint32_t w[4];
        philox4x32_10(ctr, key, w);
        bool keep = (double)(w[i % 4] >> 8) / 16777216.0 >= p;
        layout_ok = layout_ok && keep == (y[i] != 0.0f);
    }
    CHECK(layout_ok, "dropout mask does not follow counter (i/4, stream), word i%%4");

    cpu_dropout_fwd(y3, x, n, p, seed, stream + 1);
    size_t n_diff = 0;
    for (size_t i = 0; i < n; i++) n_diff += (y3[i] != 0.0f) != (y[i] != 0.0f);
    // two independent masks disagree on 2p(1-p) = 18% of elements
    CHECK(n_diff > n / 10, "dropout: another stream gives nearly the same mask (%zu)", n_diff);
    cpu_dropout_fwd(y3, x, n, p, seed + 1, stream);
    n_diff = 0;
    for (size_t i = 0; i < n; i++) n_diff += (y3[i] != 0.0f) != (y[i] != 0.0f);
    CHECK(n_diff > n / 10, "dropout: another seed gives nearly the same mask (%zu)", n_diff);

    // in place equals out of place
    memcpy(y2, x, n * sizeof(float));
    cpu_dropout_fwd(y2, y2, n, p, seed, stream);
    CHECK(memcmp(y, y2, n * sizeof(float)) == 0, "dropout in place differs");

    // backward is the same mask and scale, and accumulates
    float *dy = rand_floats(n, rng, -1, 1);
    float *dx = alloc_zero(n), *fwd_dy = alloc_zero(n);
    cpu_dropout_bwd(dx, GRAD_ADD, dy, n, p, seed, stream);
    cpu_dropout_fwd(fwd_dy, dy, n, p, seed, stream);
    CHECK(memcmp(dx, fwd_dy, n * sizeof(float)) == 0, "dropout bwd differs from its mask");
    float *dx_w = alloc_nan(n);  // written over garbage: the same mask and scale, nothing of the garbage
    cpu_dropout_bwd(dx_w, GRAD_WRITE, dy, n, p, seed, stream);
    CHECK(memcmp(dx_w, fwd_dy, n * sizeof(float)) == 0, "dropout bwd written differs from its mask");
    cpu_dropout_bwd(dx, GRAD_ADD, dy, n, p, seed, stream);
    bool doubled = true;
    for (size_t i = 0; i < n; i++) doubled = doubled && dx[i] == 2.0f * fwd_dy[i];
    CHECK(doubled, "dropout bwd does not accumulate");

    // p = 0 is the identity, forward and backward
    cpu_dropout_fwd(y2, x, n, 0.0f, seed, stream);
    CHECK(memcmp(y2, x, n * sizeof(float)) == 0, "dropout with p = 0 is not a copy");
    memset(dx, 0, n * sizeof(float));
    cpu_dropout_bwd(dx, GRAD_ADD, dy, n, 0.0f, seed, stream);
    CHECK(memcmp(dx, dy, n * sizeof(float)) == 0, "dropout bwd with p = 0 is not a copy");
    for (size_t i = 0; i < n; i++) dx_w[i] = NAN;
    cpu_dropout_bwd(dx_w, GRAD_WRITE, dy, n, 0.0f, seed, stream);
    CHECK(memcmp(dx_w, dy, n * sizeof(float)) == 0, "dropout bwd written with p = 0 is not a copy");
    free(dx_w);

    // windows (sequence parallelism): pieces of the tensor, each drawn at its
    // own start, together give the whole mask, forward and backward
    const size_t cut[] = {0, 4, 1000, 65536 + 12, n};
    memset(y2, 0, n * sizeof(float));
    memset(dx, 0, n * sizeof(float));
    memset(fwd_dy, 0, n * sizeof(float));
    cpu_dropout_bwd(fwd_dy, GRAD_ADD, dy, n, p, seed, stream);
    for (size_t k = 0; k + 1 < sizeof cut / sizeof *cut; k++) {
        cpu_dropout_fwd_at(y2 + cut[k], x + cut[k], cut[k + 1] - cut[k], cut[k], p, seed, stream);
        cpu_dropout_bwd_at(dx + cut[k], NULL, GRAD_ADD, dy + cut[k], cut[k + 1] - cut[k], cut[k], p, seed, stream);
    }
    CHECK(memcmp(y, y2, n * sizeof(float)) == 0, "dropout windows do not make up the whole mask");
    CHECK(memcmp(dx, fwd_dy, n * sizeof(float)) == 0, "dropout bwd windows do not make up the whole mask");
    cpu_dropout_fwd_at(y3, x, 1000, 4, p, seed, stream);  // another start, another mask
    n_diff = 0;
    for (size_t i = 0; i < 1000; i++) n_diff += (y3[i] == 0.0f) != (y[i] == 0.0f);
    CHECK(n_diff > 20, "dropout window at 4 draws the mask at 0 (%zu differences)", n_diff);
    free(x); free(y); free(y2); free(y3); free(dy); free(dx); free(fwd_dy);
}

/* ---- cross-entropy ------------------------------------------------------------- */

typedef struct {
    float *logits, *losses, *lse;  // (N, V), (N), (N)
    const int32_t *targets;        // (N)
    int N, V;
    float eps, dloss;
    int32_t ignore_id;
} XentCtx;

static double xent_loss(void *p) {
    XentCtx *c = p;
    cpu_xent_fwd(c->losses, c->lse, c->logits, c->targets, c->N, c->V, c->eps, c->ignore_id);
    double sum = 0.0;
    for (int n = 0; n < c->N; n++) sum += c->losses[n];
    return c->dloss * sum;
}

/* torch's label-smoothed cross-entropy of one row, in double */
static double xent_ref(const float *row, int V, int y, double eps) {
    double max = -INFINITY, z = 0.0, nll_sum = 0.0;
    for (int v = 0; v < V; v++) max = fmax(max, row[v]);
    for (int v = 0; v < V; v++) z += exp(row[v] - max);
    double lse = max + log(z);
    for (int v = 0; v < V; v++) nll_sum += lse - row[v];
    return (1.0 - eps) * (lse - row[y]) + eps / V * nll_sum;
}

static void test_xent(Rng *rng) {
    static const int32_t targets[6] = {3, -100, 0, 6, -100, 2};
    int N = 6, V = 7;
    size_t n = (size_t)N * V;
    XentCtx c = {rand_floats(n, rng, -2, 2), alloc_zero(N), alloc_zero(N), targets, N, V,
                 0.1f, 0.37f, -100};
    for (int v = 0; v < V; v++) c.logits[5 * V + v] += 200.0f;  // exp would overflow unshifted

    int count = cpu_xent_fwd(c.losses, c.lse, c.logits, targets, N, V, c.eps, c.ignore_id);
    CHECK(count == 4, "xent counted %d rows, want 4", count);
    for (int r = 0; r < N; r++) {
        if (targets[r] == c.ignore_id) {
            CHECK(c.losses[r] == 0.0f, "xent: ignored row %d has loss %g", r, (double)c.losses[r]);
            continue;
        }
        CHECK_CLOSE(c.losses[r], xent_ref(c.logits + (size_t)r * V, V, targets[r], c.eps),
                    FWD_RTOL, FWD_ATOL, "xent loss");
    }
    // eps = 0 is plain cross-entropy
    cpu_xent_fwd(c.losses, c.lse, c.logits, targets, N, V, 0.0f, c.ignore_id);
    CHECK_CLOSE(c.losses[0], xent_ref(c.logits, V, targets[0], 0.0), FWD_RTOL, FWD_ATOL,
                "xent loss, eps = 0");

    xent_loss(&c);  // lse at the base point
    float *dl = rand_floats(n, rng, -1, 1), *dl0 = alloc_copy(dl, n);
    cpu_xent_bwd(dl, c.logits, c.lse, targets, c.dloss, N, V, c.eps, c.ignore_id);
    bool ignored_kept = true;
    for (int r = 0; r < N; r++)
        if (targets[r] == c.ignore_id)
            for (int v = 0; v < V; v++)
                ignored_kept = ignored_kept && dl[r * V + v] == dl0[r * V + v];
    CHECK(ignored_kept, "xent bwd touched an ignored row");
    subtract_start(dl, dl0, n);
    fd_check("xent dlogits", c.logits, n, dl, xent_loss, &c, rng);
    free(c.logits); free(c.losses); free(c.lse); free(dl); free(dl0);
}

/* ---- AdamW ------------------------------------------------------------------------ */

static void test_adamw(Rng *rng) {
    size_t n = 64;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-3f, wd = 0.1f;
    float *p = rand_floats(n, rng, -1, 1), *m = alloc_zero(n), *v = alloc_zero(n);
    double *pr = TP_MALLOC(n * sizeof(double)), *mr = TP_CALLOC(n, sizeof(double)),
           *vr = TP_CALLOC(n, sizeof(double));
    for (size_t i = 0; i < n; i++) pr[i] = p[i];
    for (int t = 1; t <= 2; t++) {
        float *g = rand_floats(n, rng, -1, 1);
        cpu_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t);
        // torch.optim.AdamW, written out in double
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            pr[i] *= 1.0 - (double)lr * wd;
            mr[i] = b1 * mr[i] + (1.0 - b1) * g[i];
            vr[i] = b2 * vr[i] + (1.0 - b2) * (double)g[i] * g[i];
            pr[i] -= lr / bc1 * mr[i] / (sqrt(vr[i]) / sqrt(bc2) + eps);
        }
        char label[32];
        snprintf(label, sizeof label, "adamw step %d", t);
        for (size_t i = 0; i < n; i++) {
            CHECK_CLOSE(p[i], pr[i], ADAM_RTOL, ADAM_ATOL, label);
            CHECK_CLOSE(m[i], mr[i], ADAM_RTOL, ADAM_ATOL, label);
            CHECK_CLOSE(v[i], vr[i], ADAM_RTOL, ADAM_ATOL * 1e-3, label);
        }
        free(g);
    }
    free(p); free(m); free(v); free(pr); free(mr); free(vr);
}

int main(void) {
    Rng rng = {0x7470747261696eull};
    test_gemm(&rng);
    test_linear(&rng);
    test_bias(&rng);
    test_embedding(&rng);
    test_layernorm(&rng);
    test_activations(&rng);
    test_elementwise(&rng);
    test_positions();
    test_softmax(&rng);
    test_attention(&rng);
    test_dropout(&rng);
    test_xent(&rng);
    test_adamw(&rng);
    return check_report("test_ops");
}
