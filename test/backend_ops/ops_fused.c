/* ops_fused.c: the fused residual + dropout + LayerNorm ops
 * (op_residual_ln_fwd / _bwd) against the unfused sequence of reference ops
 * written out here (bias add, dropout window, residual add, LayerNorm; and
 * LayerNorm backward, dropout backward into zeros, bias gradient), so the
 * CPU's fused reference is itself checked bit for bit. The cases cover
 * dropout on and off, with and without a bias, mask windows (sequence
 * parallelism), in place (res_out == res_in), widths on and off the CUDA
 * kernels' float4 path and a misaligned row start (its scalar path).
 * Each case also runs the unfused ops on the target itself: the fused ops
 * must equal them bit for bit there too (on CUDA they share the LayerNorm
 * row code and the column sums' order), which is what lets the model fuse a
 * boundary in one recompute mode and not in another. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

typedef struct {
    int N, C;
    uint64_t first;  // the mask window's start (a multiple of 4)
    float p;
    bool bias, in_place;
    int offset;      // floats by which the device tensors start past an aligned address
} RlnCase;

static const uint64_t RLN_SEED = 0x9234567890abcdefull;  // both halves non-zero, top bit set

/* A device copy of h starting `offset` floats into its allocation (base: the allocation). */
static float *dev_at(const Target *t, const float *h, size_t n, int offset, float **base) {
    float *pad = host_alloc(n + (size_t)offset);
    memcpy(pad + offset, h, n * sizeof(float));
    *base = dev_from(t, pad, n + (size_t)offset);
    free(pad);
    return *base + offset;
}

/* The unfused forward on the host: returns res_out, fills y, mean, rstd. */
static float *unfused_fwd(const RlnCase *k, const float *res_in, const float *branch, const float *bias,
                          const float *gamma, const float *beta, uint64_t stream, float *y, float *mean,
                          float *rstd) {
    const size_t nc = (size_t)k->N * k->C;
    float *out = host_copy(branch, nc), *res_out = host_alloc(nc);
    if (bias) cpu_bias_add(out, bias, k->N, k->C);
    cpu_dropout_fwd_at(out, out, nc, k->first, k->p, RLN_SEED, stream);
    cpu_add(res_out, res_in, out, nc);
    cpu_layernorm_fwd(y, mean, rstd, res_out, gamma, beta, k->N, k->C, 1e-5f);
    free(out);
    return res_out;
}

/* The same forward with the LayerNorm output as bf16 bits (y16): res_out,
 * mean and rstd are the fp32 form's bits and y16 is to_bf16 of its y, on
 * the same backend. */
static void rln_fwd16_case(const Target *t, const RlnCase *k, const float *res_in, const float *branch,
                           const float *d_bias, const float *d_g, const float *d_b, int N, int C, uint64_t stream,
                           const float *want_out, const float *want_y, const float *want_mean, const float *want_rstd) {
    const size_t nc = (size_t)N * C;
    float *d_in = dev_from(t, res_in, nc), *d_br = dev_from(t, branch, nc);
    float *d_out = k->in_place ? d_in : dev_nan(t, nc), *d_mean = dev_nan(t, N), *d_rstd = dev_nan(t, N);
    uint16_t *d_y16 = backend_alloc(t->be, (nc ? nc : 1) * sizeof(uint16_t), MEM_ACT);
    op_residual_ln_fwd(t->be, d_out, NULL, d_y16, d_mean, d_rstd, d_in, d_br, d_bias, d_g, d_b, N, C, 1e-5f,
                       k->first, k->p, RLN_SEED, stream);
    float *got_y = dev_fetch_bits(t, d_y16, nc), *want_yb = host_bf16(want_y, nc);
    float *got_out = dev_fetch(t, d_out, nc), *got_mean = dev_fetch(t, d_mean, N), *got_rstd = dev_fetch(t, d_rstd, N);
    char what[160];
    snprintf(what, sizeof what, "residual_ln fwd y16 (%d, %d) p=%g%s against its fp32 y", N, C, (double)k->p,
             k->in_place ? " in place" : "");
    check_exact(t, what, got_y, want_yb, nc);
    check_exact(t, what, got_out, want_out, nc);
    check_exact(t, what, got_mean, want_mean, N);
    check_exact(t, what, got_rstd, want_rstd, N);
    free(got_y), free(want_yb), free(got_out), free(got_mean), free(got_rstd);
    if (!k->in_place) dev_free(t, d_out);
    dev_free(t, d_in), dev_free(t, d_br), dev_free(t, d_mean), dev_free(t, d_rstd), dev_free(t, d_y16);
}

static void rln_fwd_case(const Target *t, const RlnCase *k, Rng *rng, float **x_out, float **mean_out,
                         float **rstd_out, float **gamma_out) {
    char what[160];
    const int N = k->N, C = k->C, off = k->offset;
    const size_t nc = (size_t)N * C;
    const uint64_t stream = dropout_stream(3, 1, 2, 4, 0);
    float *res_in = rand_floats(nc, rng, -1, 1), *branch = rand_floats(nc, rng, -1, 1);
    for (size_t i = 0; i < nc; i++) res_in[i] += 2.0f;  // an offset the LayerNorm's mean must remove
    float *bias = k->bias ? rand_floats(C, rng, -0.5f, 0.5f) : NULL;
    float *gamma = rand_floats(C, rng, 0.5f, 1.5f), *beta = rand_floats(C, rng, -0.5f, 0.5f);
    float *y = host_alloc(nc), *mean = host_alloc(N), *rstd = host_alloc(N);
    float *res_out = unfused_fwd(k, res_in, branch, bias, gamma, beta, stream, y, mean, rstd);
    size_t dropped = 0;  // the case exercises the mask: about p of the branch is gone
    for (size_t i = 0; i < nc; i++) dropped += res_out[i] == res_in[i];
    TCHECK(k->p == 0.0f ? dropped == 0 : dropped > nc * k->p / 2, "%s: residual_ln reference dropped %zu of %zu",
           t->name, dropped, nc);

    float *b_in, *b_br, *b_bias = NULL, *b_g, *b_b, *b_out = NULL, *b_y;
    float *d_in = dev_at(t, res_in, nc, off, &b_in), *d_br = dev_at(t, branch, nc, off, &b_br);
    float *d_bias = bias ? dev_at(t, bias, C, off, &b_bias) : NULL;
    float *d_g = dev_at(t, gamma, C, off, &b_g), *d_b = dev_at(t, beta, C, off, &b_b);
    float *nan = host_alloc(nc);
    for (size_t i = 0; i < nc; i++) nan[i] = NAN;
    float *d_out = k->in_place ? d_in : dev_at(t, nan, nc, off, &b_out), *d_y = dev_at(t, nan, nc, off, &b_y);
    float *d_mean = dev_nan(t, N), *d_rstd = dev_nan(t, N);
    op_residual_ln_fwd(t->be, d_out, d_y, NULL, d_mean, d_rstd, d_in, d_br, d_bias, d_g, d_b, N, C, 1e-5f, k->first,
                       k->p, RLN_SEED, stream);
    float *got_out = dev_fetch(t, d_out, nc), *got_y = dev_fetch(t, d_y, nc);
    float *got_mean = dev_fetch(t, d_mean, N), *got_rstd = dev_fetch(t, d_rstd, N);
    snprintf(what, sizeof what, "residual_ln fwd (%d, %d) p=%g at %llu%s%s+%d", N, C, (double)k->p,
             (unsigned long long)k->first, k->bias ? " bias" : "", k->in_place ? " in place" : "", off);
    check_exact(t, what, got_out, res_out, nc);  // the residual stream: bit-identical on every backend
    check_rel(t, what, got_y, y, NULL, nc, tol(t, SUM_RTOL));
    check_rel(t, what, got_mean, mean, NULL, N, tol(t, SUM_RTOL));
    check_rel(t, what, got_rstd, rstd, NULL, N, tol(t, SUM_RTOL));

    /* the unfused ops on the target, from fresh copies of the inputs */
    float *u_tmp = dev_from(t, branch, nc), *u_in = dev_from(t, res_in, nc), *u_out = dev_nan(t, nc);
    float *u_y = dev_nan(t, nc), *u_mean = dev_nan(t, N), *u_rstd = dev_nan(t, N);
    if (bias) op_bias_add(t->be, u_tmp, d_bias, N, C);
    op_dropout_fwd_at(t->be, u_tmp, u_tmp, nc, k->first, k->p, RLN_SEED, stream);
    op_add(t->be, u_out, u_in, u_tmp, nc);
    op_layernorm_fwd(t->be, u_y, u_mean, u_rstd, u_out, d_g, d_b, N, C, 1e-5f);
    float *u_got[4] = {dev_fetch(t, u_out, nc), dev_fetch(t, u_y, nc), dev_fetch(t, u_mean, N),
                       dev_fetch(t, u_rstd, N)};
    snprintf(what, sizeof what, "residual_ln fwd (%d, %d) p=%g vs the unfused ops on %s", N, C, (double)k->p,
             t->name);
    check_exact(t, what, got_out, u_got[0], nc);
    check_exact(t, what, got_y, u_got[1], nc);
    check_exact(t, what, got_mean, u_got[2], N);
    check_exact(t, what, got_rstd, u_got[3], N);
    for (int i = 0; i < 4; i++) free(u_got[i]);
    float *u_bufs[] = {u_tmp, u_in, u_out, u_y, u_mean, u_rstd};
    for (size_t i = 0; i < sizeof u_bufs / sizeof u_bufs[0]; i++) dev_free(t, u_bufs[i]);
    rln_fwd16_case(t, k, res_in, branch, d_bias, d_g, d_b, N, C, stream, got_out, got_y, got_mean, got_rstd);

    *x_out = res_out, *mean_out = mean, *rstd_out = rstd, *gamma_out = gamma;
    float *host_bufs[] = {res_in, branch, bias, beta, y, nan, got_out, got_y, got_mean, got_rstd};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    float *dev_bufs[] = {b_in, b_br, b_bias, b_g, b_b, b_out, b_y, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++)
        if (dev_bufs[i]) dev_free(t, dev_bufs[i]);
}

/* Backward from the forward's res_out and statistics (the CPU's). */
static void rln_bwd_case(const Target *t, const RlnCase *k, Rng *rng, const float *x, const float *mean,
                         const float *rstd, const float *gamma) {
    char what[160];
    const int N = k->N, C = k->C, off = k->offset;
    const size_t nc = (size_t)N * C;
    const uint64_t stream = dropout_stream(3, 1, 2, 4, 0);
    float *dy = rand_floats(nc, rng, -1, 1), *dres0 = rand_floats(nc, rng, -1, 1);
    float *dg0 = rand_floats(C, rng, -1, 1), *db0 = rand_floats(C, rng, -1, 1), *dbias0 = rand_floats(C, rng, -1, 1);
    float *dres = host_copy(dres0, nc), *dg = host_copy(dg0, C), *db = host_copy(db0, C);
    float *dbias = host_copy(dbias0, C), *dbr = host_alloc(nc);
    cpu_layernorm_bwd(dres, dg, db, dy, x, mean, rstd, gamma, N, C);
    cpu_dropout_bwd_at(dbr, NULL, GRAD_ADD, dres, nc, k->first, k->p, RLN_SEED, stream);  // into zeros
    if (k->bias) {  // in bf16 mode the sum of d_branch's bf16 rounding (a ROW layer's db, ops_list.h)
        float *dbr_sum = t->bf16 ? host_bf16(dbr, nc) : host_copy(dbr, nc);
        cpu_bias_bwd(dbias, dbr_sum, N, C);
        free(dbr_sum);
    }

    float *b_dy, *b_x, *b_g, *b_dres, *b_dbr;
    float *d_dy = dev_at(t, dy, nc, off, &b_dy), *d_x = dev_at(t, x, nc, off, &b_x);
    float *d_g = dev_at(t, gamma, C, off, &b_g), *d_mean = dev_from(t, mean, N), *d_rstd = dev_from(t, rstd, N);
    float *nan = host_alloc(nc);
    for (size_t i = 0; i < nc; i++) nan[i] = NAN;
    float *got_dres[2], *got_dbr[2], *got_dg[2], *got_db[2], *got_dbias[2];
    for (int run = 0; run < 2; run++) {  // twice: the same bits
        float *d_dres = dev_at(t, dres0, nc, off, &b_dres), *d_dbr = dev_at(t, nan, nc, off, &b_dbr);
        float *d_dg = dev_from(t, dg0, C), *d_db = dev_from(t, db0, C), *d_dbias = dev_from(t, dbias0, C);
        op_residual_ln_bwd(t->be, d_dres, d_dbr, NULL, d_dg, d_db, k->bias ? d_dbias : NULL, d_dy, d_x, d_mean, d_rstd,
                           d_g, N, C, k->first, k->p, RLN_SEED, stream);
        got_dres[run] = dev_fetch(t, d_dres, nc), got_dbr[run] = dev_fetch(t, d_dbr, nc);
        got_dg[run] = dev_fetch(t, d_dg, C), got_db[run] = dev_fetch(t, d_db, C);
        got_dbias[run] = dev_fetch(t, d_dbias, C);
        float *bufs[] = {b_dres, b_dbr, d_dg, d_db, d_dbias};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(t, bufs[i]);
    }
    snprintf(what, sizeof what, "residual_ln bwd (%d, %d) p=%g at %llu%s+%d", N, C, (double)k->p,
             (unsigned long long)k->first, k->bias ? " bias" : "", off);
    check_rel(t, what, got_dres[0], dres, dres0, nc, tol(t, SUM_RTOL));
    check_rel(t, what, got_dbr[0], dbr, NULL, nc, tol(t, SUM_RTOL));
    check_rel(t, what, got_dg[0], dg, dg0, C, tol(t, SUM_RTOL));
    check_rel(t, what, got_db[0], db, db0, C, tol(t, SUM_RTOL));
    if (k->bias) check_rel(t, what, got_dbias[0], dbias, dbias0, C, tol(t, SUM_RTOL));
    else check_exact(t, what, got_dbias[0], dbias0, C);  // NULL: untouched (the buffer was not passed)
    float *own = host_alloc(nc);  // d_branch is exactly the mask applied to the op's own d_res
    cpu_dropout_bwd_at(own, NULL, GRAD_ADD, got_dres[0], nc, k->first, k->p, RLN_SEED, stream);
    check_exact(t, what, got_dbr[0], own, nc);
    /* the unfused ops on the target */
    float *u_dres = dev_from(t, dres0, nc), *u_dbr = dev_nan(t, nc), *u_dg = dev_from(t, dg0, C);
    float *u_db = dev_from(t, db0, C), *u_dbias = dev_from(t, dbias0, C);
    op_layernorm_bwd(t->be, u_dres, u_dg, u_db, d_dy, d_x, d_mean, d_rstd, d_g, N, C);
    op_zero(t->be, u_dbr, nc);
    op_dropout_bwd_at(t->be, u_dbr, NULL, GRAD_ADD, u_dres, nc, k->first, k->p, RLN_SEED, stream);
    if (k->bias) op_bias_bwd(t->be, u_dbias, u_dbr, N, C);
    float *u_got[5] = {dev_fetch(t, u_dres, nc), dev_fetch(t, u_dbr, nc), dev_fetch(t, u_dg, C),
                       dev_fetch(t, u_db, C), dev_fetch(t, u_dbias, C)};
    snprintf(what, sizeof what, "residual_ln bwd (%d, %d) p=%g vs the unfused ops on %s", N, C, (double)k->p,
             t->name);
    check_exact(t, what, got_dres[0], u_got[0], nc);
    check_exact(t, what, got_dbr[0], u_got[1], nc);
    check_exact(t, what, got_dg[0], u_got[2], C);
    check_exact(t, what, got_db[0], u_got[3], C);
    check_exact(t, what, got_dbias[0], u_got[4], C);
    for (int i = 0; i < 5; i++) free(u_got[i]);
    float *u_bufs[] = {u_dres, u_dbr, u_dg, u_db, u_dbias};
    for (size_t i = 0; i < sizeof u_bufs / sizeof u_bufs[0]; i++) dev_free(t, u_bufs[i]);

    snprintf(what, sizeof what, "residual_ln bwd run to run (%d, %d)", N, C);
    check_exact(t, what, got_dres[1], got_dres[0], nc);
    check_exact(t, what, got_dbr[1], got_dbr[0], nc);
    check_exact(t, what, got_dg[1], got_dg[0], C);
    check_exact(t, what, got_db[1], got_db[0], C);
    check_exact(t, what, got_dbias[1], got_dbias[0], C);

    float *host_bufs[] = {dy, dres0, dg0, db0, dbias0, dres, dg, db, dbias, dbr, nan, own};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    for (int run = 0; run < 2; run++) {
        free(got_dres[run]), free(got_dbr[run]), free(got_dg[run]), free(got_db[run]), free(got_dbias[run]);
    }
    float *dev_bufs[] = {b_dy, b_x, b_g, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

/* In bf16 mode the d_branch16 form against the fp32 form on the same
 * target: d_res, dgamma, dbeta the same bits, d_branch16 exactly the bf16
 * rounding of the fp32 d_branch, d_bias (which sums that rounding in bf16
 * mode) the same bits; at an odd element offset (k->offset) the scalar
 * stores. */
static void rln_bwd16_case(const Target *t, const RlnCase *k, Rng *rng, const float *x, const float *mean,
                           const float *rstd, const float *gamma) {
    if (!t->bf16) return;  // the form is bf16 mode's (its d_bias sums bf16 values)
    char what[160];
    const int N = k->N, C = k->C;
    const size_t nc = (size_t)N * C;
    const uint64_t stream = dropout_stream(3, 1, 2, 5, 0);
    float *dy = rand_floats(nc, rng, -1, 1), *dres0 = rand_floats(nc, rng, -1, 1);
    float *dg0 = rand_floats(C, rng, -1, 1), *db0 = rand_floats(C, rng, -1, 1), *dbias0 = rand_floats(C, rng, -1, 1);
    float *d_dy = dev_from(t, dy, nc), *d_x = dev_from(t, x, nc), *d_g = dev_from(t, gamma, C);
    float *d_mean = dev_from(t, mean, N), *d_rstd = dev_from(t, rstd, N);
    float *got[2][5];
    uint16_t *raw16 = backend_alloc(t->be, (nc + 1) * sizeof(uint16_t), MEM_ACT);
    uint16_t *d_br16 = raw16 + k->offset;
    for (int form = 0; form < 2; form++) {  // 0: fp32 d_branch; 1: d_branch16
        float *d_dres = dev_from(t, dres0, nc), *d_dbr = form ? NULL : dev_from(t, dres0, nc);
        float *d_dg = dev_from(t, dg0, C), *d_db = dev_from(t, db0, C), *d_dbias = dev_from(t, dbias0, C);
        op_residual_ln_bwd(t->be, d_dres, d_dbr, form ? d_br16 : NULL, d_dg, d_db, k->bias ? d_dbias : NULL, d_dy,
                           d_x, d_mean, d_rstd, d_g, N, C, k->first, k->p, RLN_SEED, stream);
        got[form][0] = dev_fetch(t, d_dres, nc);
        got[form][1] = form ? dev_fetch_bits(t, d_br16, nc) : dev_fetch(t, d_dbr, nc);
        got[form][2] = dev_fetch(t, d_dg, C), got[form][3] = dev_fetch(t, d_db, C);
        got[form][4] = dev_fetch(t, d_dbias, C);
        float *bufs[] = {d_dres, d_dbr, d_dg, d_db, d_dbias};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) dev_free(t, bufs[i]);
    }
    snprintf(what, sizeof what, "residual_ln bwd d_branch16 (%d, %d) p=%g%s+%d", N, C, (double)k->p,
             k->bias ? " bias" : "", k->offset);
    float *want16 = host_bf16(got[0][1], nc);
    check_exact(t, what, got[1][1], want16, nc);
    check_exact(t, what, got[1][0], got[0][0], nc);
    check_exact(t, what, got[1][2], got[0][2], C);
    check_exact(t, what, got[1][3], got[0][3], C);
    check_exact(t, what, got[1][4], got[0][4], C);
    for (int form = 0; form < 2; form++)
        for (int i = 0; i < 5; i++) free(got[form][i]);
    float *host_bufs[] = {dy, dres0, dg0, db0, dbias0, want16};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    float *dev_bufs[] = {d_dy, d_x, d_g, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
    dev_free(t, raw16);
}

void test_residual_ln(const Target *t, Rng *rng) {
    static const RlnCase cases[] = {
        {37, 300, 0, 0.1f, true, false, 0},              // C a multiple of 4, not of 32 (nor the CPU's column block)
        {29, 301, 0, 0.1f, true, false, 0},              // C odd: the scalar path, words across row ends
        {700, 64, 0, 0.0f, false, false, 0},             // dropout off, no bias; eleven row chunks of column sums
        {5, 1024, 4096 + 64, 0.5f, true, true, 0},       // a window of the mask, in place
        {40, 128, (1ull << 34) + 8, 0.1f, true, false, 1},  // the counter's high word; misaligned: scalar path
        {300, 96, 96, 0.1f, false, true, 0},             // window, in place, no bias, five chunks
        /* the CUDA paths of layernorm_row.cuh (a lane holds 128-column groups j):
         * the model's width in registers, float4 loads and scalar loads of the
         * same elements (the same bits); rows wider than the registers' 1024
         * read from global memory, 4-wide and not; more chunks than pass 2's
         * 32 row-threads times its four loads in flight */
        {72, 512, 0, 0.1f, true, false, 0},              // d_model 512: 4 groups a lane, float4
        {21, 512, 4, 0.1f, true, false, 3},              // d_model 512 misaligned by 3 floats: scalar loads
        {9, 1028, 8, 0.1f, false, false, 0},             // wider than the registers, 4-wide
        {11, 1030, 0, 0.1f, true, true, 0},              // wider and C % 4 = 2: scalar, in place
        {8300, 64, 0, 0.1f, true, false, 0},             // 130 chunks of column sums
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float *x, *mean, *rstd, *gamma;
        rln_fwd_case(t, &cases[i], rng, &x, &mean, &rstd, &gamma);
        rln_bwd_case(t, &cases[i], rng, x, mean, rstd, gamma);
        rln_bwd16_case(t, &cases[i], rng, x, mean, rstd, gamma);
        free(x), free(mean), free(rstd), free(gamma);
    }
}
