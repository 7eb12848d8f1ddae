/* test_cuda_gemm.c: the cuBLASLt GEMM and linear layers against the CPU
 * reference (kernels/cpu/gemm.c), in fp32 and bf16.
 *
 * Covered: cuda_op_gemm with all four transpose combinations, odd sizes,
 * alpha != 1, beta 0 (over NaN garbage) and 1 (accumulate), K = 0;
 * cuda_op_linear_fwd with and without bias, fused epilogue and separate
 * kernel; cuda_op_linear_bwd with every subset of dx, dW, db, fused
 * bias-gradient epilogue and separate kernel; the bf16 conversion on ties
 * and special values; run-to-run determinism; the context's memory figures.
 * Negative controls check that the comparison rejects a wrong transpose and
 * a planted error, so a pass means something.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bf16.h"
#include "check.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_gemm.h"
#include "cpu_ops.h"

/* Tolerances: max |got - want| <= TOL * max |want| over the tensor.
 *
 * FP32_TOL: both sides multiply fp32 values and accumulate in fp32 (unit
 * roundoff u = 2^-24 ~ 6e-8), in different orders. Rounding errors of K <=
 * 1024 terms behave like a random walk, ~ sqrt(K) u times the partial sums,
 * i.e. below 1e-6 of max |C| here; 1e-5 leaves a 10x margin, while any
 * indexing, transpose or accumulate mistake is an O(1) error.
 *
 * BF16_SAME_INPUT_TOL: the CPU reference runs on the same bf16-rounded
 * inputs, so every product is exact in fp32 (8 x 8 significant bits) and
 * only the fp32 accumulation differs (tensor cores may truncate instead of
 * rounding when they align partial sums: <= 2^-23 per step, K/16 steps).
 * 1e-4 is 10x above that for K <= 1024, yet far below the ~2^-9 relative
 * error of a wrong input rounding (truncation, bf16 of the wrong tensor).
 *
 * BF16_TOL: against the fp32 reference. bf16 keeps 8 significant bits, so
 * each input is off by up to 2^-9 relative and each product by ~2^-8; over K
 * terms of random sign that gives ~2^-8 / sqrt(K) ... 2^-8 of max |C| (a
 * few 1e-3 at most for K up to a few hundred): 1e-2. Bias gradients summed
 * from bf16 dy obey the same bound. */
#define FP32_TOL 1e-5
#define BF16_SAME_INPUT_TOL 1e-4
#define BF16_TOL 1e-2


/* ---- host helpers ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static float urand(void) {  // uniform in [-1, 1)
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (double)(1ULL << 23)) - 1.0);
}

static float *host_rand(size_t n) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = urand();
    return x;
}

static float *host_copy(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof *y);
    if (n) memcpy(y, x, n * sizeof *y);
    return y;
}

/* fp32 -> nearest bf16 (ties to even), returned as fp32; NaN kept (common/bf16.h). */
static float bf16_round(float x) { return tp_bf16_round(x); }

static float *host_bf16(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = bf16_round(x[i]);
    return y;
}

static float *dev_from(const float *h, size_t n) {
    float *d = NULL;
    CUDA_CHECK(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)));
    if (n) CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static float *dev_nan(size_t n) {  // all bits set: NaN, as stale garbage
    float *d = NULL;
    CUDA_CHECK(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)));
    CUDA_CHECK(cudaMemset(d, 0xff, (n ? n : 1) * sizeof(float)));
    return d;
}

static float *to_host(cudaStream_t s, const float *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    CUDA_CHECK(cudaStreamSynchronize(s));
    if (n) CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

/* max |got - want| / max |want| (NaN -> infinity). */
static double rel_err(const float *got, const float *want, size_t n) {
    double max_want = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d != d) return INFINITY;
        if (d > max_diff) max_diff = d;
        if (fabs((double)want[i]) > max_want) max_want = fabs((double)want[i]);
    }
    return max_want > 0.0 ? max_diff / max_want : max_diff;
}

#define CHECK_CLOSE_TENSOR(got, want, n, tol, ...)                                              \
    do {                                                                                        \
        double e_ = rel_err((got), (want), (n));                                                \
        char what_[256];                                                                        \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                             \
        CHECK(e_ <= (tol), "%s: relative error %.3g > %.3g", what_, e_, (double)(tol));      \
    } while (0)

static const char *prec_name(CudaGemmPrecision p) { return p == CUDA_GEMM_BF16 ? "bf16" : "fp32"; }

/* ---- cuda_op_gemm ---- */

static void test_gemm_case(CudaGemmCtx *ctx, bool ta, bool tb, int M, int N, int K, float alpha, float beta) {
    cudaStream_t s = cuda_gemm_stream(ctx);
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = host_rand(na), *B = host_rand(nb), *C0 = host_rand(nc);
    float *dA = dev_from(A, na), *dB = dev_from(B, nb);
    for (int pi = 0; pi < 2; pi++) {
        const CudaGemmPrecision prec = pi ? CUDA_GEMM_BF16 : CUDA_GEMM_FP32;
        cuda_gemm_set_precision(ctx, prec);
        float *dC = beta == 0.0f ? dev_nan(nc) : dev_from(C0, nc);
        cuda_op_gemm(ctx, ta, tb, M, N, K, alpha, dA, dB, beta, dC);
        float *got = to_host(s, dC, nc);
        float *want = host_copy(C0, nc);
        cpu_gemm(ta, tb, M, N, K, alpha, A, B, beta, want);
        if (prec == CUDA_GEMM_FP32) {
            CHECK_CLOSE_TENSOR(got, want, nc, FP32_TOL, "gemm fp32 ta=%d tb=%d %dx%dx%d alpha=%g beta=%g", ta, tb, M,
                               N, K, alpha, beta);
        } else {
            CHECK_CLOSE_TENSOR(got, want, nc, BF16_TOL, "gemm bf16 vs fp32 ta=%d tb=%d %dx%dx%d beta=%g", ta, tb, M,
                               N, K, beta);
            float *Ab = host_bf16(A, na), *Bb = host_bf16(B, nb);
            float *want_b = host_copy(C0, nc);
            cpu_gemm(ta, tb, M, N, K, alpha, Ab, Bb, beta, want_b);
            CHECK_CLOSE_TENSOR(got, want_b, nc, BF16_SAME_INPUT_TOL,
                               "gemm bf16 vs bf16 inputs ta=%d tb=%d %dx%dx%d beta=%g", ta, tb, M, N, K, beta);
            free(Ab);
            free(Bb);
            free(want_b);
        }
        free(got);
        free(want);
        CUDA_CHECK(cudaFree(dC));
    }
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    free(A);
    free(B);
    free(C0);
}

static void test_gemm(CudaGemmCtx *ctx) {
    static const int sizes[][3] = {{37, 53, 29}, {1, 1, 1}, {5, 130, 7},
                                   {64, 48, 96}, {128, 96, 256}, {200, 160, 1024}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                test_gemm_case(ctx, ta, tb, sizes[i][0], sizes[i][1], sizes[i][2], 1.0f, 0.0f);
                test_gemm_case(ctx, ta, tb, sizes[i][0], sizes[i][1], sizes[i][2], 1.0f, 1.0f);
            }
    test_gemm_case(ctx, true, false, 37, 53, 29, 0.5f, 1.0f);
    test_gemm_case(ctx, false, true, 37, 53, 29, -2.0f, 0.0f);
}

/* K = 0: C = beta C, with beta = 0 clearing NaN garbage. */
static void test_gemm_k0(CudaGemmCtx *ctx) {
    cudaStream_t s = cuda_gemm_stream(ctx);
    const int M = 7, N = 9;
    const size_t nc = (size_t)M * N;
    float *C0 = host_rand(nc);
    float *dA = dev_nan(1), *dB = dev_nan(1);
    const float betas[] = {0.0f, 1.0f, 0.5f};
    for (int i = 0; i < 3; i++) {
        float *dC = betas[i] == 0.0f ? dev_nan(nc) : dev_from(C0, nc);
        cuda_op_gemm(ctx, false, false, M, N, 0, 1.0f, dA, dB, betas[i], dC);
        float *got = to_host(s, dC, nc);
        int ok = 1;
        for (size_t j = 0; j < nc; j++) ok &= got[j] == betas[i] * C0[j];
        CHECK(ok, "gemm K=0 beta=%g leaves beta*C", betas[i]);
        free(got);
        CUDA_CHECK(cudaFree(dC));
    }
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    free(C0);
}

/* The comparison can fail: a wrong transpose and a planted error are caught. */
static void test_negative_controls(CudaGemmCtx *ctx) {
    cudaStream_t s = cuda_gemm_stream(ctx);
    cuda_gemm_set_precision(ctx, CUDA_GEMM_FP32);
    const int M = 37, N = 53, K = 29;
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = host_rand(na), *B = host_rand(nb);
    float *dA = dev_from(A, na), *dB = dev_from(B, nb), *dC = dev_nan(nc);
    cuda_op_gemm(ctx, true, false, M, N, K, 1.0f, dA, dB, 0.0f, dC);
    float *got = to_host(s, dC, nc);
    float *wrong = host_copy(got, nc);
    cpu_gemm(false, false, M, N, K, 1.0f, A, B, 0.0f, wrong);  // same bytes read without the transpose
    CHECK(rel_err(got, wrong, nc) > BF16_TOL, "a wrong transpose is detected (error %.3g)", rel_err(got, wrong, nc));
    float *want = host_copy(got, nc);
    cpu_gemm(true, false, M, N, K, 1.0f, A, B, 0.0f, want);
    want[nc / 2] += 1e-3f;  // planted: 1e-3 of an O(1) entry
    CHECK(rel_err(got, want, nc) > FP32_TOL, "a planted error of 1e-3 is detected (error %.3g)",
          rel_err(got, want, nc));
    free(got);
    free(wrong);
    free(want);
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC));
    free(A);
    free(B);
}

/* ---- linear layers ---- */

static void test_linear_fwd_case(CudaGemmCtx *ctx, CudaGemmPrecision prec, bool fuse, bool with_bias, int N, int in,
                                 int out) {
    cudaStream_t s = cuda_gemm_stream(ctx);
    cuda_gemm_set_precision(ctx, prec);
    cuda_gemm_set_fused_epilogues(ctx, fuse);
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = host_rand(nx), *W = host_rand(nw), *b = host_rand((size_t)out);
    float *dx = dev_from(x, nx), *dW = dev_from(W, nw), *db = dev_from(b, (size_t)out), *dy = dev_nan(ny);
    CudaGemmStats before = cuda_gemm_stats(ctx);
    cuda_op_linear_fwd(ctx, dy, dx, dW, with_bias ? db : NULL, N, in, out);
    CudaGemmStats after = cuda_gemm_stats(ctx);
    float *got = to_host(s, dy, ny);
    float *want = malloc(ny * sizeof *want);
    cpu_linear_fwd(want, x, W, with_bias ? b : NULL, N, in, out);
    const char *name = prec_name(prec);
    if (prec == CUDA_GEMM_FP32) {
        CHECK_CLOSE_TENSOR(got, want, ny, FP32_TOL, "linear_fwd %s fuse=%d bias=%d N=%d in=%d out=%d", name, fuse,
                           with_bias, N, in, out);
    } else {
        CHECK_CLOSE_TENSOR(got, want, ny, BF16_TOL, "linear_fwd %s vs fp32 fuse=%d bias=%d N=%d in=%d out=%d", name,
                           fuse, with_bias, N, in, out);
        float *xb = host_bf16(x, nx), *Wb = host_bf16(W, nw);
        cpu_linear_fwd(want, xb, Wb, with_bias ? b : NULL, N, in, out);  // the bias stays fp32
        CHECK_CLOSE_TENSOR(got, want, ny, BF16_SAME_INPUT_TOL,
                           "linear_fwd %s vs bf16 inputs fuse=%d bias=%d N=%d in=%d out=%d", name, fuse, with_bias, N,
                           in, out);
        free(xb);
        free(Wb);
    }
    const long fused = after.n_bias_fused - before.n_bias_fused;
    const long separate = after.n_bias_separate - before.n_bias_separate;
    if (with_bias) {
        CHECK(fused + separate == 1, "linear_fwd counts one bias (%ld fused, %ld separate)", fused, separate);
        if (!fuse) CHECK(separate == 1, "fusion off: the bias is added by the separate kernel");
        printf("linear_fwd %s N=%d in=%d out=%d fuse=%d: bias %s\n", name, N, in, out, fuse,
               fused ? "in the epilogue" : "separate");
    } else {
        CHECK(fused + separate == 0, "linear_fwd without bias counts no bias");
    }
    free(got);
    free(want);
    free(x);
    free(W);
    free(b);
    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dW));
    CUDA_CHECK(cudaFree(db));
    CUDA_CHECK(cudaFree(dy));
}

/* which: bit 0 dx, bit 1 dW, bit 2 db. Gradients start random: the
 * backward must add to them. */
static void test_linear_bwd_case(CudaGemmCtx *ctx, CudaGemmPrecision prec, bool fuse, int which, int N, int in,
                                 int out) {
    cudaStream_t s = cuda_gemm_stream(ctx);
    cuda_gemm_set_precision(ctx, prec);
    cuda_gemm_set_fused_epilogues(ctx, fuse);
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out, nb = (size_t)out;
    float *x = host_rand(nx), *W = host_rand(nw), *gy = host_rand(ny);
    float *gx0 = host_rand(nx), *gW0 = host_rand(nw), *gb0 = host_rand(nb);
    float *d_x = dev_from(x, nx), *d_W = dev_from(W, nw), *d_gy = dev_from(gy, ny);
    float *d_gx = dev_from(gx0, nx), *d_gW = dev_from(gW0, nw), *d_gb = dev_from(gb0, nb);
    const bool want_dx = which & 1, want_dW = which & 2, want_db = which & 4;
    CudaGemmStats before = cuda_gemm_stats(ctx);
    cuda_op_linear_bwd(ctx, want_dx ? d_gx : NULL, want_dW ? d_gW : NULL, want_db ? d_gb : NULL, d_gy, d_x, d_W, N,
                       in, out);
    CudaGemmStats after = cuda_gemm_stats(ctx);
    float *got_gx = to_host(s, d_gx, nx), *got_gW = to_host(s, d_gW, nw), *got_gb = to_host(s, d_gb, nb);

    // fp32 reference; and for bf16 the reference on bf16-rounded x, W, dy (db from fp32 dy: see below)
    float *ref_gx = host_copy(gx0, nx), *ref_gW = host_copy(gW0, nw), *ref_gb = host_copy(gb0, nb);
    cpu_linear_bwd(want_dx ? ref_gx : NULL, want_dW ? ref_gW : NULL, want_db ? ref_gb : NULL, gy, x, W, N, in, out);
    const char *name = prec_name(prec);
    const double tol = prec == CUDA_GEMM_FP32 ? FP32_TOL : BF16_TOL;
    CHECK_CLOSE_TENSOR(got_gx, ref_gx, nx, tol, "linear_bwd %s dx (which=%d fuse=%d N=%d in=%d out=%d)", name, which,
                       fuse, N, in, out);
    CHECK_CLOSE_TENSOR(got_gW, ref_gW, nw, tol, "linear_bwd %s dW (which=%d fuse=%d N=%d in=%d out=%d)", name, which,
                       fuse, N, in, out);
    CHECK_CLOSE_TENSOR(got_gb, ref_gb, nb, tol, "linear_bwd %s db (which=%d fuse=%d N=%d in=%d out=%d)", name, which,
                       fuse, N, in, out);
    if (prec == CUDA_GEMM_BF16) {
        float *xb = host_bf16(x, nx), *Wb = host_bf16(W, nw), *gyb = host_bf16(gy, ny);
        float *rb_gx = host_copy(gx0, nx), *rb_gW = host_copy(gW0, nw);
        cpu_linear_bwd(want_dx ? rb_gx : NULL, want_dW ? rb_gW : NULL, NULL, gyb, xb, Wb, N, in, out);
        CHECK_CLOSE_TENSOR(got_gx, rb_gx, nx, BF16_SAME_INPUT_TOL, "linear_bwd bf16 dx vs bf16 inputs (which=%d)",
                           which);
        CHECK_CLOSE_TENSOR(got_gW, rb_gW, nw, BF16_SAME_INPUT_TOL, "linear_bwd bf16 dW vs bf16 inputs (which=%d)",
                           which);
        free(xb);
        free(Wb);
        free(gyb);
        free(rb_gx);
        free(rb_gW);
    }
    const long fused = after.n_bgrad_fused - before.n_bgrad_fused;
    const long separate = after.n_bgrad_separate - before.n_bgrad_separate;
    if (want_db) {
        CHECK(fused + separate == 1, "linear_bwd counts one bias gradient (%ld fused, %ld separate)", fused, separate);
        if (!fuse || !want_dW) CHECK(separate == 1, "no fusion possible or wanted: db by the separate kernel");
        if (want_dW)
            printf("linear_bwd %s N=%d in=%d out=%d fuse=%d: db %s\n", name, N, in, out, fuse,
                   fused ? "in the dW epilogue (BGRADB)" : "separate");
    } else {
        CHECK(fused + separate == 0, "linear_bwd without db counts no bias gradient");
    }
    free(got_gx);
    free(got_gW);
    free(got_gb);
    free(ref_gx);
    free(ref_gW);
    free(ref_gb);
    free(x);
    free(W);
    free(gy);
    free(gx0);
    free(gW0);
    free(gb0);
    float *to_free[] = {d_x, d_W, d_gy, d_gx, d_gW, d_gb};
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(to_free[i]));
}

static void test_linear(CudaGemmCtx *ctx) {
    static const int shapes[][3] = {{37, 53, 29}, {200, 96, 160}, {1, 5, 3}, {512, 256, 384}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int pi = 0; pi < 2; pi++)
            for (int fuse = 0; fuse < 2; fuse++) {
                const CudaGemmPrecision prec = pi ? CUDA_GEMM_BF16 : CUDA_GEMM_FP32;
                const int N = shapes[i][0], in = shapes[i][1], out = shapes[i][2];
                test_linear_fwd_case(ctx, prec, fuse, true, N, in, out);
                test_linear_fwd_case(ctx, prec, fuse, false, N, in, out);
                for (int which = 1; which < 8; which++) test_linear_bwd_case(ctx, prec, fuse, which, N, in, out);
            }
    cuda_gemm_set_fused_epilogues(ctx, true);
}

/* The same call twice from the same state gives the same bits. */
static void test_determinism(CudaGemmCtx *ctx) {
    cudaStream_t s = cuda_gemm_stream(ctx);
    cuda_gemm_set_precision(ctx, CUDA_GEMM_BF16);
    cuda_gemm_set_fused_epilogues(ctx, true);
    const int N = 300, in = 192, out = 224;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = host_rand(nx), *W = host_rand(nw), *gy = host_rand(ny);
    float *d_x = dev_from(x, nx), *d_W = dev_from(W, nw), *d_gy = dev_from(gy, ny);
    float *runs[2][3];
    for (int r = 0; r < 2; r++) {
        float *d_gx = dev_from(x, nx), *d_gW = dev_from(W, nw), *d_gb = dev_from(gy, (size_t)out);
        cuda_op_linear_bwd(ctx, d_gx, d_gW, d_gb, d_gy, d_x, d_W, N, in, out);
        runs[r][0] = to_host(s, d_gx, nx);
        runs[r][1] = to_host(s, d_gW, nw);
        runs[r][2] = to_host(s, d_gb, (size_t)out);
        CUDA_CHECK(cudaFree(d_gx));
        CUDA_CHECK(cudaFree(d_gW));
        CUDA_CHECK(cudaFree(d_gb));
    }
    CHECK(memcmp(runs[0][0], runs[1][0], nx * sizeof(float)) == 0, "dx is the same bits on a second run");
    CHECK(memcmp(runs[0][1], runs[1][1], nw * sizeof(float)) == 0, "dW is the same bits on a second run");
    CHECK(memcmp(runs[0][2], runs[1][2], (size_t)out * sizeof(float)) == 0, "db is the same bits on a second run");
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) free(runs[r][k]);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_W));
    CUDA_CHECK(cudaFree(d_gy));
    free(x);
    free(W);
    free(gy);
}

/* The conversion rounds to nearest even and keeps specials, bit for bit. */
static void test_bf16_conversion(cudaStream_t s) {
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* 1 + 2^-8: tie, stays 1 */,
                              1.01171875f /* 1 + 3*2^-8: tie, goes up to 1 + 2^-6 */, 3.14159265f, 65504.0f,
                              1e-40f /* denormal */, 3.0e38f, INFINITY, -INFINITY, NAN};
    const size_t n_special = sizeof specials / sizeof specials[0];
    const size_t n = n_special + 4096;
    float *h = malloc(n * sizeof *h);
    memcpy(h, specials, sizeof specials);
    for (size_t i = n_special; i < n; i++) h[i] = urand() * 1000.0f;
    float *d = dev_from(h, n), *back = dev_nan(n);
    uint16_t *bits = NULL;
    CUDA_CHECK(cudaMalloc((void **)&bits, n * sizeof(uint16_t)));
    cuda_gemm_f32_to_bf16(s, bits, d, n);
    cuda_gemm_bf16_to_f32(s, back, bits, n);
    float *got = to_host(s, back, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = bf16_round(h[i]);
        uint32_t gw, ww;
        memcpy(&gw, &got[i], 4);
        memcpy(&ww, &want, 4);
        if (want != want ? got[i] == got[i] : gw != ww) bad++;
    }
    CHECK(bad == 0, "%zu of %zu bf16 conversions differ from round-to-nearest-even", bad, n);
    CHECK(got[4] == 1.0f && got[5] == 1.015625f, "ties go to even (got %.9g, %.9g)", got[4], got[5]);
    free(h);
    free(got);
    CUDA_CHECK(cudaFree(d));
    CUDA_CHECK(cudaFree(back));
    CUDA_CHECK(cudaFree(bits));
}

static void test_memory(CudaGemmCtx *ctx) {
    CudaGemmStats st = cuda_gemm_stats(ctx);
    CHECK(st.workspace_bytes == CUDA_GEMM_DEFAULT_WORKSPACE_BYTES, "default workspace is %zu bytes",
          (size_t)CUDA_GEMM_DEFAULT_WORKSPACE_BYTES);
    printf("gemm context: workspace %.1f MiB, cuBLASLt handle %.1f MiB, scratch %.1f MiB, %ld matmuls, %ld plans\n",
           st.workspace_bytes / 1048576.0, st.handle_bytes / 1048576.0, st.scratch_bytes / 1048576.0, st.n_matmuls,
           st.n_plans);
    // Reserving the largest need up front: no growth afterwards.
    const int N = 1024, in = 512, out = 2048;
    cuda_gemm_reserve(ctx, cuda_gemm_scratch_bytes(CUDA_GEMM_BF16, N, in, out));
    const size_t reserved = cuda_gemm_stats(ctx).scratch_bytes;
    CHECK(reserved >= cuda_gemm_scratch_bytes(CUDA_GEMM_BF16, N, in, out), "reserve grows the scratch");
    cuda_gemm_set_precision(ctx, CUDA_GEMM_BF16);
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *d_x = dev_nan(nx), *d_W = dev_nan(nw), *d_y = dev_nan(ny), *d_gx = dev_nan(nx), *d_gW = dev_nan(nw);
    float *d_gb = dev_nan((size_t)out);
    CUDA_CHECK(cudaMemset(d_x, 0, nx * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_W, 0, nw * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_gx, 0, nx * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_gW, 0, nw * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_gb, 0, (size_t)out * sizeof(float)));
    cuda_op_linear_fwd(ctx, d_y, d_x, d_W, NULL, N, in, out);
    cuda_op_linear_bwd(ctx, d_gx, d_gW, d_gb, d_y, d_x, d_W, N, in, out);
    CUDA_CHECK(cudaStreamSynchronize(cuda_gemm_stream(ctx)));
    CHECK(cuda_gemm_stats(ctx).scratch_bytes == reserved, "a reserved context does not grow its scratch");
    float *to_free[] = {d_x, d_W, d_y, d_gx, d_gW, d_gb};
    for (int i = 0; i < 6; i++) CUDA_CHECK(cudaFree(to_free[i]));
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "test_cuda_gemm: no CUDA device: this test needs a GPU (label gpu)\n");
        return 1;
    }
    CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    CudaGemmCtx *ctx = cuda_gemm_ctx_create(s, CUDA_GEMM_FP32, 0);
    test_bf16_conversion(s);
    test_gemm(ctx);
    test_gemm_k0(ctx);
    test_negative_controls(ctx);
    test_linear(ctx);
    test_determinism(ctx);
    test_memory(ctx);
    cuda_gemm_ctx_destroy(ctx);
    CUDA_CHECK(cudaStreamDestroy(s));
    return check_report("test_cuda_gemm");
}
