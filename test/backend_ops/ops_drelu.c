/* ops_drelu.c: the FFN's ReLU through its bit-mask (ops_list.h's
 * linear_relu_fwd16 and linear_bwd16_drelu: on CUDA cuBLASLt's
 * RELU_AUX_BIAS and DRELU_BGRAD epilogues), against their compositions on
 * the same backend: linear_fwd16 with relu and the mask of the fp32
 * pre-activation; linear_bwd16 writing dx16, the mask applied to it and
 * its column sums. Bit for bit on the CPU and on CUDA's separate path; the
 * epilogues within their bands. The shapes include ReLU widths whose mask
 * rows are not whole 128-bit words (53, 160, 200: the rows are padded to
 * the aux leading dimension cuBLASLt requires) and unaligned GEMMs (in 53,
 * out 29: the fallback). On a bf16 GPU each epilogue must have run at
 * least once. Split from ops_gemm.c, whose cases these extend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "harness.h"

/* A mask bit of the epilogue may differ from the host's where the fp32
 * pre-activation is this close to 0 (relative to its largest magnitude):
 * the epilogue's fp32 sums are ordered otherwise (BF16_SAME_INPUT_TOL), so
 * a value that near 0 may change sign. */
#define MASK_ZERO_BAND BF16_SAME_INPUT_TOL
/* DRELU_BGRAD sums the masked fp32 products before their rounding, the
 * contract sums the rounded bf16 values: each term differs by at most half
 * a bf16 step (2^-9 relative), plus fp32 accumulation; 2^-8 of the sum of
 * the terms' magnitudes leaves a 2x margin, far below a term left out or
 * let through the mask (a whole term). */
#define DRELU_BGRAD_TERM_TOL 0x1p-8

static uint8_t *dev_bytes(const Target *t, const uint8_t *h, size_t n) {
    uint8_t *d = backend_alloc(t->be, n ? n : 1, MEM_ACT);
    if (n) backend_upload(t->be, d, h, n);
    return d;
}

static uint8_t *fetch_bytes(const Target *t, const uint8_t *d, size_t n) {
    uint8_t *h = TP_MALLOC(n ? n : 1);
    if (n) backend_download(t->be, h, d, n);
    return h;
}

static bool bit_of(const uint8_t *mask, size_t row_bytes, int n, int j) {
    return (mask[(size_t)n * row_bytes + (size_t)(j >> 3)] >> (j & 7)) & 1u;
}

#ifdef TPTRAIN_TEST_CUDA
static GpuGemmCounts counts_of(const Target *t) { return t->is_cpu ? (GpuGemmCounts){0} : gpu_gemm_counts(t->be); }
#endif
static int g_mask_fused, g_drelu_fused;  // cases where the epilogue ran (CUDA)

/* The mask against the host's of h: every bit where the mask was not the
 * epilogue's; else every bit but those of values within MASK_ZERO_BAND. */
static void check_mask(const Target *t, const char *what, const uint8_t *got, const float *h, int N, int out,
                       bool fused) {
    const size_t row_bytes = relu_mask_row_bytes(out);
    float hmax = 0.0f;
    for (size_t i = 0; i < (size_t)N * out; i++) hmax = fmaxf(hmax, fabsf(h[i]));
    size_t bad = 0, first = 0;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < out; j++) {
            const float v = h[(size_t)n * out + j];
            if (bit_of(got, row_bytes, n, j) == (v > 0.0f)) continue;
            if (fused && fabsf(v) <= MASK_ZERO_BAND * hmax) continue;
            if (!bad++) first = (size_t)n * out + j;
        }
    TCHECK(bad == 0, "%s: %s: %zu mask bits wrong, first at [%zu] (pre-activation %g)", t->name, what, bad, first,
           bad ? (double)h[first] : 0.0);
}

#ifdef TPTRAIN_TEST_CUDA
/* One call's route from its counts: exactly one of fused and separate on a
 * GPU, and the fused epilogue never with fusion off (mode 1) or in fp32.
 * Whether it fused. */
static bool one_route(const Target *t, const char *what, long fused, long separate, int mode) {
    TCHECK(t->is_cpu || fused + separate == 1, "%s: %s counted %ld fused + %ld separate for one call", t->name, what,
           fused, separate);
    TCHECK(!(fused > 0 && (mode || !t->bf16)), "%s: %s's epilogue ran with fusion off or in fp32", t->name, what);
    return fused > 0;
}
#endif

/* linear_relu_fwd16 against linear_fwd16's composition through the
 * separate kernels (linear_fwd or _x16 into fp32, act_fwd16) and the mask
 * of that fp32 pre-activation. */
static void relu_fwd_case(const Target *t, int mode, bool bias, bool x16, bool has_tmp, int N, int in, int out,
                          Rng *rng) {
    Backend *be = t->be;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out, nm = N * relu_mask_row_bytes(out);
    float *x = rand_floats(nx, rng, -1, 1), *xw = host_bf16(x, nx), *W = rand_floats(nw, rng, -1, 1);
    float *b = rand_floats(out, rng, -1, 1);
    uint8_t *garbage = TP_MALLOC(nm ? nm : 1);
    memset(garbage, 0xA5, nm);
    uint16_t *d_x16 = dev_bits(t, xw, nx), *d_y16 = backend_alloc(be, ny * 2, MEM_ACT);
    uint16_t *d_w16 = backend_alloc(be, ny * 2, MEM_ACT);
    uint8_t *d_mask = dev_bytes(t, garbage, nm);
    float *d_x = dev_from(t, x16 ? xw : x, nx), *d_W = dev_from(t, W, nw), *d_b = dev_from(t, b, out);
    float *d_tmp = dev_nan(t, ny), *d_h = dev_nan(t, ny);
    set_mode(t, mode);
#ifdef TPTRAIN_TEST_CUDA
    const GpuGemmCounts g0 = counts_of(t);
#endif
    op_linear_relu_fwd16(be, d_y16, has_tmp ? d_tmp : NULL, d_mask, x16 ? NULL : d_x, x16 ? d_x16 : NULL, d_W,
                         bias ? d_b : NULL, N, in, out);
    bool fused = false;
#ifdef TPTRAIN_TEST_CUDA
    const GpuGemmCounts g1 = counts_of(t);
    fused = one_route(t, "linear_relu_fwd16's mask", g1.relu_mask_fused - g0.relu_mask_fused,
                      g1.relu_mask_separate - g0.relu_mask_separate, mode);
    g_mask_fused += fused;
#endif
    set_mode(t, 1);  // the composition through the separate kernels
    if (x16) op_linear_fwd_x16(be, d_h, d_x16, d_W, bias ? d_b : NULL, N, in, out);
    else op_linear_fwd(be, d_h, d_x, d_W, bias ? d_b : NULL, N, in, out);
    op_act_fwd16(be, d_w16, d_h, ny, ACT_RELU);
    set_mode(t, 0);
    float *got = dev_fetch_bits(t, d_y16, ny), *want = dev_fetch_bits(t, d_w16, ny), *h = dev_fetch(t, d_h, ny);
    uint8_t *mask = fetch_bytes(t, d_mask, nm);
    char what[200];
    snprintf(what, sizeof what, "linear_relu_fwd16 N=%d in=%d out=%d bias=%d x16=%d%s%s", N, in, out, bias, x16,
             has_tmp ? "" : " no tmp", mode ? " separate" : "");
    if (fused) check_close(t, what, got, want, ny, BF16_STEP_RTOL, BF16_STEP_ATOL);
    else check_exact(t, what, got, want, ny);
    check_mask(t, what, mask, h, N, out, fused);
    free(x), free(xw), free(W), free(b), free(garbage), free(got), free(want), free(h), free(mask);
    dev_free(t, d_x16), dev_free(t, d_y16), dev_free(t, d_w16), dev_free(t, d_mask), dev_free(t, d_x);
    dev_free(t, d_W), dev_free(t, d_b), dev_free(t, d_tmp), dev_free(t, d_h);
}

/* The inputs of one backward case: the ReLU (width in) as its pre-activation
 * r, its output's bf16 bits and its mask; dy as fp32 and as bf16 bits. */
typedef struct {
    int N, in, out;
    float *r, *dy, *dyb, *W, *g0;  // g0: the gradients' random start (dW, db, db_h)
    uint8_t *mask;
} DreluIn;

static DreluIn drelu_in(int N, int in, int out, Rng *rng) {
    DreluIn c = {N, in, out, NULL, NULL, NULL, NULL, NULL, NULL};
    const size_t nh = (size_t)N * in, ny = (size_t)N * out, nw = (size_t)out * in;
    c.r = rand_floats(nh, rng, -1, 1);
    for (size_t i = 0; i < nh; i += 5) c.r[i] = i % 2 ? -0.0f : 0.0f;  // zeros of both signs: not positive
    c.dy = rand_floats(ny, rng, -1, 1);
    c.dyb = host_bf16(c.dy, ny);
    c.W = rand_floats(nw, rng, -1, 1);
    c.g0 = rand_floats(nw + (size_t)out + (size_t)in, rng, -1, 1);
    c.mask = TP_MALLOC(N * relu_mask_row_bytes(in) + 1);
    cpu_relu_mask(c.mask, c.r, N, in);
    return c;
}

static void drelu_in_free(DreluIn *c) { free(c->r), free(c->dy), free(c->dyb), free(c->W), free(c->g0), free(c->mask); }

/* host: db_h0 + the column sums of dh (N, in) in double, and of |dh| */
static void col_sums(const float *dh, const float *db_h0, int N, int in, float *sum, float *mag) {
    for (int j = 0; j < in; j++) {
        double s = 0.0, a = 0.0;
        for (int n = 0; n < N; n++) s += dh[(size_t)n * in + j], a += fabs(dh[(size_t)n * in + j]);
        sum[j] = db_h0[j] + (float)s;
        mag[j] = (float)a;
    }
}

/* linear_bwd16_drelu against linear_bwd16 writing dx16 on the same
 * backend (dW, db, the unmasked dh16), the mask applied here and db_h
 * summed here. */
static void drelu_bwd_case(const Target *t, int mode, bool dy16, int N, int in, int out, Rng *rng) {
    Backend *be = t->be;
    DreluIn c = drelu_in(N, in, out, rng);
    const size_t nh = (size_t)N * in, ny = (size_t)N * out, nw = (size_t)out * in;
    float *relu = host_alloc(nh);
    for (size_t i = 0; i < nh; i++) relu[i] = ref_bf16(c.r[i] > 0.0f ? c.r[i] : 0.0f);
    uint16_t *d_x16 = dev_bits(t, relu, nh), *d_dy16 = dev_bits(t, c.dyb, ny);
    uint16_t *d_dh16 = backend_alloc(be, nh * 2 + 2, MEM_ACT), *d_want16 = backend_alloc(be, nh * 2 + 2, MEM_ACT);
    uint8_t *d_mask = dev_bytes(t, c.mask, N * relu_mask_row_bytes(in));
    float *d_dy = dev_from(t, c.dy, ny), *d_W = dev_from(t, c.W, nw);
    float *d_g[2][3];  // [0 the op, 1 the composition][dW, db, db_h]
    for (int k = 0; k < 2; k++)
        d_g[k][0] = dev_from(t, c.g0, nw), d_g[k][1] = dev_from(t, c.g0 + nw, out),
        d_g[k][2] = dev_from(t, c.g0 + nw + out, in);
    set_mode(t, mode);
#ifdef TPTRAIN_TEST_CUDA
    const GpuGemmCounts g0 = counts_of(t);
#endif
    op_linear_bwd16_drelu(be, d_dh16, d_g[0][0], d_g[0][1], d_g[0][2], dy16 ? NULL : d_dy, dy16 ? d_dy16 : NULL,
                          d_mask, d_x16, d_W, N, in, out);
    bool fused = false;
#ifdef TPTRAIN_TEST_CUDA
    const GpuGemmCounts g1 = counts_of(t);
    fused = one_route(t, "linear_bwd16_drelu (DRELU_BGRAD)", g1.drelu_fused - g0.drelu_fused,
                      g1.drelu_separate - g0.drelu_separate, mode);
    g_drelu_fused += fused;
#endif
    op_linear_bwd16(be, NULL, d_want16, GRAD_WRITE, d_g[1][0], d_g[1][1], dy16 ? NULL : d_dy, dy16 ? d_dy16 : NULL,
                    NULL, NULL, d_x16, d_W, N, in, out);
    set_mode(t, 0);
    char what[200];
    snprintf(what, sizeof what, "linear_bwd16_drelu N=%d in=%d out=%d dy%s%s", N, in, out, dy16 ? "16" : "",
             mode ? " separate" : "");
    float *got = dev_fetch_bits(t, d_dh16, nh), *want = dev_fetch_bits(t, d_want16, nh);
    for (int n = 0; n < N; n++)  // the mask on the composition's dx16 (+0 where clear)
        for (int j = 0; j < in; j++)
            if (!bit_of(c.mask, relu_mask_row_bytes(in), n, j)) want[(size_t)n * in + j] = 0.0f;
    char part[240];
    snprintf(part, sizeof part, "%s dh16", what);
    if (t->is_cpu) check_exact(t, part, got, want, nh);
    else check_close(t, part, got, want, nh, BF16_STEP_RTOL, BF16_STEP_ATOL);
    float *sum = host_alloc((size_t)in), *mag = host_alloc((size_t)in), *db_h = dev_fetch(t, d_g[0][2], in);
    col_sums(want, c.g0 + nw + out, N, in, sum, mag);
    snprintf(part, sizeof part, "%s db_h", what);
    if (t->is_cpu) check_exact(t, part, db_h, sum, in);
    else check_terms(t, part, db_h, sum, mag, in, DRELU_BGRAD_TERM_TOL);
    static const char *names[2] = {"dW", "db"};
    const size_t n2[2] = {nw, (size_t)out};
    for (int j = 0; j < 2; j++) {
        float *gj = dev_fetch(t, d_g[0][j], n2[j]), *wj = dev_fetch(t, d_g[1][j], n2[j]);
        snprintf(part, sizeof part, "%s %s", what, names[j]);
        if (t->is_cpu) check_exact(t, part, gj, wj, n2[j]);
        else check_rel(t, part, gj, wj, j ? c.g0 + nw : c.g0, n2[j], tol(t, BF16_SAME_INPUT_TOL));
        free(gj), free(wj);
    }
    free(relu), free(got), free(want), free(sum), free(mag), free(db_h);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) dev_free(t, d_g[k][j]);
    dev_free(t, d_x16), dev_free(t, d_dy16), dev_free(t, d_dh16), dev_free(t, d_want16), dev_free(t, d_mask);
    dev_free(t, d_dy), dev_free(t, d_W);
    drelu_in_free(&c);
}

/* A planted error must be caught: one mask bit cleared changes dh16 and db_h. */
static void drelu_negative_control(const Target *t, Rng *rng) {
    const int N = 8, in = 24, out = 16;
    DreluIn c = drelu_in(N, in, out, rng);
    const size_t nh = (size_t)N * in, ny = (size_t)N * out;
    int j = 0;
    while (!(c.r[j] > 0.0f)) j++;  // a set bit in row 0
    float *relu = host_alloc(nh);
    for (size_t i = 0; i < nh; i++) relu[i] = ref_bf16(c.r[i] > 0.0f ? c.r[i] : 0.0f);
    uint16_t *d_x16 = dev_bits(t, relu, nh), *d_dh16[2];
    float *d_dy = dev_from(t, c.dy, ny), *d_W = dev_from(t, c.W, (size_t)out * in), *d_dbh[2];
    for (int k = 0; k < 2; k++) {
        if (k) c.mask[j >> 3] &= (uint8_t)~(1u << (j & 7));
        uint8_t *d_mask = dev_bytes(t, c.mask, N * relu_mask_row_bytes(in));
        d_dh16[k] = backend_alloc(t->be, nh * 2, MEM_ACT);
        d_dbh[k] = dev_from(t, c.g0, in);
        op_linear_bwd16_drelu(t->be, d_dh16[k], NULL, NULL, d_dbh[k], d_dy, NULL, d_mask, d_x16, d_W, N, in, out);
        dev_free(t, d_mask);
    }
    float *a = dev_fetch_bits(t, d_dh16[0], nh), *b = dev_fetch_bits(t, d_dh16[1], nh);
    float *da = dev_fetch(t, d_dbh[0], in), *dbb = dev_fetch(t, d_dbh[1], in);
    TCHECK(a[j] != 0.0f && b[j] == 0.0f && da[j] != dbb[j],
           "%s: linear_bwd16_drelu ignored a cleared mask bit (dh16 %g -> %g, db_h %g -> %g)", t->name, (double)a[j],
           (double)b[j], (double)da[j], (double)dbb[j]);
    free(relu), free(a), free(b), free(da), free(dbb);
    for (int k = 0; k < 2; k++) dev_free(t, d_dh16[k]), dev_free(t, d_dbh[k]);
    dev_free(t, d_x16), dev_free(t, d_dy), dev_free(t, d_W);
    drelu_in_free(&c);
}

void test_linear_drelu(const Target *t, Rng *rng) {
    // (N, in, out); the ReLU width is out forward, in backward: 29 and 53 unaligned, 160 and 200 rows of
    // mask padded to 256 bits, 96 padded to 128, 256 and 384 whole words
    static const int fwd[][3] = {{37, 53, 29}, {200, 96, 160}, {300, 64, 200}, {1, 5, 3}, {512, 256, 384}};
    static const int bwd[][3] = {{37, 53, 29}, {200, 160, 96}, {300, 200, 64}, {1, 5, 3}, {512, 384, 256}};
    g_mask_fused = g_drelu_fused = 0;
    for (size_t i = 0; i < sizeof fwd / sizeof fwd[0]; i++)
        for (int mode = 0; mode < n_modes(t); mode++) {
            for (int v = 0; v < 8; v++)
                relu_fwd_case(t, mode, v & 1, v & 2, v & 4, fwd[i][0], fwd[i][1], fwd[i][2], rng);
            for (int dy16 = 0; dy16 < 2; dy16++) drelu_bwd_case(t, mode, dy16, bwd[i][0], bwd[i][1], bwd[i][2], rng);
        }
    drelu_negative_control(t, rng);
    if (t->is_cpu) return;
    printf("test_backend_ops: %s: the ReLU mask from RELU_AUX_BIAS in %d cases, dh16 and db_h from DRELU_BGRAD in %d\n",
           t->name, g_mask_fused, g_drelu_fused);
    // the model's FFN shapes are aligned: on a bf16 GPU both epilogues must have run (else the fallbacks cost the
    // passes the epilogues exist to save: see the refusal counts)
    if (t->bf16) {
        TCHECK(g_mask_fused > 0, "%s: no linear_relu_fwd16 wrote its mask from RELU_AUX_BIAS", t->name);
        TCHECK(g_drelu_fused > 0, "%s: no linear_bwd16_drelu took dh16 and db_h from DRELU_BGRAD", t->name);
    }
}
