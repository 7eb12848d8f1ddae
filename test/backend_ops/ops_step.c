/* ops_step.c: the ops that read the backend's StepVars (backend.h) while
 * they are set: each is run twice on the target, once with StepVars off and
 * the whole stream id (or the loss scale) as its argument, once with them
 * set, a base of the step's fields in device memory and an argument of the
 * rest (a loss scale argument that must be ignored), and the two results
 * must agree bit for bit. Without the base the masks differ, so a backend
 * that ignored the StepVars would fail (the cases drop about 30%). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define STEP_SEED 0x5eed5eed0badf00dull

typedef struct {
    const Target *t;
    StepVars *sv;  // device
} StepCtx;

/* StepVars on (base, scale) or off. */
static void step_vars(const StepCtx *c, bool on, uint64_t base, float scale) {
    if (!on) {
        backend_set_step_vars(c->t->be, NULL);
        return;
    }
    const StepVars v = {.stream_base = base, .loss_scale = scale};
    backend_upload(c->t->be, c->sv, &v, sizeof v);
    backend_set_step_vars(c->t->be, c->sv);
}

static void same(const StepCtx *c, const char *op, float *d_a, float *d_b, size_t n) {
    float *a = dev_fetch(c->t, d_a, n), *b = dev_fetch(c->t, d_b, n);
    char what[96];
    snprintf(what, sizeof what, "%s with StepVars against its arguments", op);
    check_exact(c->t, what, b, a, n);
    free(a), free(b);
}

static void dropout_cases(const StepCtx *c, Rng *rng, uint64_t full, uint64_t base, uint64_t rel) {
    const Target *t = c->t;
    const size_t n = 3001;
    float *x = rand_floats(n, rng, 0.5f, 1.5f), *dx = rand_floats(n, rng, -1, 1);
    float *d_x = dev_from(t, x, n), *ya = dev_nan(t, n), *yb = dev_nan(t, n);
    op_dropout_fwd_at(t->be, ya, d_x, n, 8, 0.3f, STEP_SEED, full);
    step_vars(c, true, base, 0.0f);
    op_dropout_fwd_at(t->be, yb, d_x, n, 8, 0.3f, STEP_SEED, rel);
    step_vars(c, false, 0, 0.0f);
    same(c, "dropout_fwd_at", ya, yb, n);
    float *dxa = dev_from(t, dx, n), *dxb = dev_from(t, dx, n);
    op_dropout_bwd_at(t->be, dxa, NULL, GRAD_ADD, d_x, n, 8, 0.3f, STEP_SEED, full);
    step_vars(c, true, base, 0.0f);
    op_dropout_bwd_at(t->be, dxb, NULL, GRAD_ADD, d_x, n, 8, 0.3f, STEP_SEED, rel);
    step_vars(c, false, 0, 0.0f);
    same(c, "dropout_bwd_at", dxa, dxb, n);
    uint16_t *ha = dev_nan_bits(t, n), *hb = dev_nan_bits(t, n);  // the dx16 form: its own kernel path
    op_dropout_bwd_at(t->be, NULL, ha, GRAD_WRITE, d_x, n, 8, 0.3f, STEP_SEED, full);
    step_vars(c, true, base, 0.0f);
    op_dropout_bwd_at(t->be, NULL, hb, GRAD_WRITE, d_x, n, 8, 0.3f, STEP_SEED, rel);
    step_vars(c, false, 0, 0.0f);
    float *wa = dev_fetch_bits(t, ha, n), *wb = dev_fetch_bits(t, hb, n);
    check_exact(t, "dropout_bwd_at dx16 with StepVars against its arguments", wb, wa, n);
    free(wa), free(wb);
    dev_free(t, ha), dev_free(t, hb);
    float *y = dev_fetch(t, ya, n);
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) dropped += y[i] == 0.0f;
    TCHECK(dropped > n / 5 && dropped < n * 2 / 5, "%s: StepVars case dropped %zu of %zu", t->name, dropped, n);
    free(x), free(dx), free(y);
    dev_free(t, d_x), dev_free(t, ya), dev_free(t, yb), dev_free(t, dxa), dev_free(t, dxb);
}

static void residual_ln_cases(const StepCtx *c, Rng *rng, uint64_t full, uint64_t base, uint64_t rel) {
    const Target *t = c->t;
    const int N = 37, C = 64;
    const size_t nc = (size_t)N * C;
    float *res = rand_floats(nc, rng, -1, 1), *br = rand_floats(nc, rng, -1, 1), *bias = rand_floats(C, rng, -1, 1);
    float *g = rand_floats(C, rng, 0.5f, 1.5f), *b = rand_floats(C, rng, -0.5f, 0.5f);
    float *d_res = dev_from(t, res, nc), *d_br = dev_from(t, br, nc), *d_bias = dev_from(t, bias, C);
    float *d_g = dev_from(t, g, C), *d_b = dev_from(t, b, C);
    float *out[2], *y[2], *mean[2], *rstd[2];
    for (int k = 0; k < 2; k++) {
        out[k] = dev_nan(t, nc), y[k] = dev_nan(t, nc), mean[k] = dev_nan(t, N), rstd[k] = dev_nan(t, N);
        step_vars(c, k == 1, base, 0.0f);
        op_residual_ln_fwd(t->be, out[k], y[k], NULL, mean[k], rstd[k], d_res, d_br, d_bias, d_g, d_b, N, C, 1e-5f, 0,
                           0.3f, STEP_SEED, k ? rel : full);
    }
    step_vars(c, false, 0, 0.0f);
    same(c, "residual_ln_fwd res_out", out[0], out[1], nc);
    same(c, "residual_ln_fwd y", y[0], y[1], nc);
    float *dy = rand_floats(nc, rng, -1, 1), *d_dy = dev_from(t, dy, nc);
    float *dres[2], *dbr[2], *dg[2], *db[2], *dbias[2];
    for (int k = 0; k < 2; k++) {
        dres[k] = dev_from(t, res, nc), dbr[k] = dev_nan(t, nc);
        dg[k] = dev_from(t, g, C), db[k] = dev_from(t, b, C), dbias[k] = dev_from(t, bias, C);
        step_vars(c, k == 1, base, 0.0f);
        op_residual_ln_bwd(t->be, dres[k], dbr[k], NULL, dg[k], db[k], dbias[k], d_dy, out[0], mean[0], rstd[0], d_g, N, C,
                           0, 0.3f, STEP_SEED, k ? rel : full);
    }
    step_vars(c, false, 0, 0.0f);
    same(c, "residual_ln_bwd d_res", dres[0], dres[1], nc);
    same(c, "residual_ln_bwd d_branch", dbr[0], dbr[1], nc);
    same(c, "residual_ln_bwd d_bias", dbias[0], dbias[1], C);
    for (int k = 0; k < 2; k++) {
        float *bufs[] = {out[k], y[k], mean[k], rstd[k], dres[k], dbr[k], dg[k], db[k], dbias[k]};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(t, bufs[i]);
    }
    float *dev_bufs[] = {d_res, d_br, d_bias, d_g, d_b, d_dy};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
    free(res), free(br), free(bias), free(g), free(b), free(dy);
}

static void xent_cases(const StepCtx *c, Rng *rng) {
    const Target *t = c->t;
    const int N = 9, V = 50;
    const size_t nv = (size_t)N * V;
    float *logits = rand_floats(nv, rng, -3, 3), *lse = rand_floats(N, rng, 3, 5);
    int32_t targets[9] = {0, 7, -1, 49, 3, 3, 12, -1, 25};
    int32_t *d_t = dev_from_i32(t, targets, N);
    float *d_lse = dev_from(t, lse, N);
    float *la = dev_from(t, logits, nv), *lb = dev_from(t, logits, nv);
    op_xent_vp_grad_inplace(t->be, la, d_lse, d_t, 0.125f, N, V, V - 2, 0, V, 0.1f, -1);
    step_vars(c, true, 0, 0.125f);
    op_xent_vp_grad_inplace(t->be, lb, d_lse, d_t, 3.0f, N, V, V - 2, 0, V, 0.1f, -1);
    step_vars(c, false, 0, 0.0f);
    same(c, "xent_vp_grad_inplace", la, lb, nv);
    float *lbits = host_bf16(logits, nv);
    uint16_t *ha = dev_bits(t, lbits, nv), *hb = dev_bits(t, lbits, nv);
    op_xent_vp_grad_inplace16(t->be, ha, d_lse, d_t, 0.125f, N, V, V - 2, 0, V, 0.1f, -1);
    step_vars(c, true, 0, 0.125f);
    op_xent_vp_grad_inplace16(t->be, hb, d_lse, d_t, 3.0f, N, V, V - 2, 0, V, 0.1f, -1);
    step_vars(c, false, 0, 0.0f);
    float *ga = dev_fetch_bits(t, ha, nv), *gb = dev_fetch_bits(t, hb, nv);
    check_exact(t, "xent_vp_grad_inplace16 with StepVars against its arguments", gb, ga, nv);
    free(logits), free(lse), free(lbits), free(ga), free(gb);
    dev_free(t, d_t), dev_free(t, d_lse), dev_free(t, la), dev_free(t, lb), dev_free(t, ha), dev_free(t, hb);
}

void test_step_vars(const Target *t, Rng *rng) {
    StepCtx c = {.t = t, .sv = backend_alloc(t->be, sizeof(StepVars), MEM_WORKSPACE)};
    const uint64_t full = dropout_stream(0x80000009u, 4, 2, 1, 3), base = dropout_stream(0x80000009u, 4, 0, 0, 0);
    const uint64_t rel = dropout_stream(0, 0, 2, 1, 3);
    TCHECK(base + rel == full, "%s: dropout_stream's fields overlap", t->name);
    dropout_cases(&c, rng, full, base, rel);
    residual_ln_cases(&c, rng, full, base, rel);
    xent_cases(&c, rng);
    backend_free(t->be, c.sv);
}
