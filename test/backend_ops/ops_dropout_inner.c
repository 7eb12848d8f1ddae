/* ops_dropout_inner.c: the dropouts inside the sub-blocks through a
 * backend: the window dropout (dropout_fwd_win / _bwd_win: a tp rank's
 * columns of the FFN activations or its heads' probabilities) and attention
 * with dropout on the probabilities (attention_drop_fwd / _bwd).
 *
 * The window op is checked bit for bit against a reference built from the
 * one-row op (dropout_fwd_at on each row's aligned window, so the row
 * offsets and the alignment are worked out independently), its windows of
 * tp column blocks against the whole tensor's mask, and its statistics
 * (dropped fraction, the 1/(1-p) scale). Attention with dropout is checked
 * against the CPU reference, whose forward is checked in turn against the
 * textbook composition (attention_fwd's P, the window mask, Pd v summed
 * here) and whose dv against Pd^T dout; p = 0 is attention_fwd bit for bit.
 * The backward's dq and dk are checked by finite differences through the
 * whole model (test_model_grad). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* The composition against the CPU reference: fp32 sums in another order
 * (a loop here, OpenBLAS there) over at most 40 keys: a few 1e-7 of the
 * tensor's scale; a wrong mask or scale moves values by O(max). */
#define COMPOSE_RTOL 1e-5

static const uint64_t SEED = 0x9234567890abcdefull;  // both halves, top bit set

/* y = the window mask applied to x, one row at a time through dropout_fwd_at
 * on the row's window widened to its enclosing whole blocks. */
static void ref_win(float *y, const float *x, size_t rows, size_t cols, uint64_t ld, uint64_t first, float p,
                    uint64_t stream) {
    float *xx = host_alloc(cols + 4), *yy = host_alloc(cols + 4);
    for (size_t r = 0; r < rows; r++) {
        const uint64_t at = first + r * ld, start = at & ~(uint64_t)3;
        const size_t off = (size_t)(at - start);
        memset(xx, 0, (cols + 4) * sizeof(float));
        memcpy(xx + off, x + r * cols, cols * sizeof(float));
        cpu_dropout_fwd_at(yy, xx, off + cols, start, p, SEED, stream);
        memcpy(y + r * cols, yy + off, cols * sizeof(float));
    }
    free(xx), free(yy);
}

static void win_case(const Target *t, size_t rows, size_t cols, uint64_t ld, uint64_t first, float p, Rng *rng) {
    char what[160];
    const size_t n = rows * cols;
    const uint64_t stream = dropout_stream(7, 2, 3, 9, 0);
    float *x = rand_floats(n, rng, 0.5f, 1.5f), *y = host_alloc(n);
    ref_win(y, x, rows, cols, ld, first, p, stream);
    float *d_x = dev_from(t, x, n), *d_y = dev_nan(t, n);
    op_dropout_fwd_win(t->be, d_y, d_x, rows, cols, ld, first, p, SEED, stream);
    float *got = dev_fetch(t, d_y, n);
    snprintf(what, sizeof what, "dropout fwd win %zux%zu ld %llu at %llu p %g", rows, cols, (unsigned long long)ld,
             (unsigned long long)first, (double)p);
    check_exact(t, what, got, y, n);
    op_dropout_fwd_win(t->be, d_x, d_x, rows, cols, ld, first, p, SEED, stream);  // in place
    float *got_in = dev_fetch(t, d_x, n);
    check_exact(t, what, got_in, y, n);

    /* backward: the same mask on dy, added into dx0 or written over NaN */
    float *dy = rand_floats(n, rng, -1, 1), *dx0 = rand_floats(n, rng, -1, 1), *masked = host_alloc(n);
    ref_win(masked, dy, rows, cols, ld, first, p, stream);
    float *want = host_copy(dx0, n);
    for (size_t i = 0; i < n; i++) want[i] += masked[i];
    float *d_dy = dev_from(t, dy, n), *d_dx = dev_from(t, dx0, n), *d_w = dev_nan(t, n);
    op_dropout_bwd_win(t->be, d_dx, GRAD_ADD, d_dy, rows, cols, ld, first, p, SEED, stream);
    op_dropout_bwd_win(t->be, d_w, GRAD_WRITE, d_dy, rows, cols, ld, first, p, SEED, stream);
    float *got_dx = dev_fetch(t, d_dx, n), *got_w = dev_fetch(t, d_w, n);
    snprintf(what, sizeof what, "dropout bwd win %zux%zu ld %llu at %llu (added)", rows, cols,
             (unsigned long long)ld, (unsigned long long)first);
    check_close(t, what, got_dx, want, n, 0.0, 0.0);  // one fp32 add each side: exact
    snprintf(what, sizeof what, "dropout bwd win %zux%zu ld %llu at %llu (written)", rows, cols,
             (unsigned long long)ld, (unsigned long long)first);
    check_exact(t, what, got_w, masked, n);
    float *host_bufs[] = {x, y, got, got_in, dy, dx0, masked, want, got_dx, got_w};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    dev_free(t, d_x), dev_free(t, d_y), dev_free(t, d_dy), dev_free(t, d_dx), dev_free(t, d_w);
}

/* tp column blocks of a (rows, F) tensor, each its rank's window, together
 * draw the whole tensor's mask (the one-rank run's). */
static void win_tp_case(const Target *t, size_t rows, size_t F, int tp, Rng *rng) {
    const size_t n = rows * F, Fl = F / (size_t)tp;
    const uint64_t stream = dropout_stream(1, 0, 4, 8, 0);
    float *x = rand_floats(n, rng, 0.5f, 1.5f), *whole = host_alloc(n), *parts = host_alloc(n);
    cpu_dropout_fwd_at(whole, x, n, 0, 0.3f, SEED, stream);
    float *block = host_alloc(rows * Fl);
    for (int r = 0; r < tp; r++) {
        for (size_t i = 0; i < rows; i++) memcpy(block + i * Fl, x + i * F + (size_t)r * Fl, Fl * sizeof(float));
        float *d = dev_from(t, block, rows * Fl);
        op_dropout_fwd_win(t->be, d, d, rows, Fl, F, (uint64_t)r * Fl, 0.3f, SEED, stream);
        float *got = dev_fetch(t, d, rows * Fl);
        for (size_t i = 0; i < rows; i++) memcpy(parts + i * F + (size_t)r * Fl, got + i * Fl, Fl * sizeof(float));
        free(got);
        dev_free(t, d);
    }
    char what[96];
    snprintf(what, sizeof what, "dropout win: %d rank windows of %zux%zu = the whole mask", tp, rows, F);
    check_exact(t, what, parts, whole, n);
    free(x), free(whole), free(parts), free(block);
}

void test_dropout_win(const Target *t, Rng *rng) {
    win_case(t, 37, 53, 101, 7, 0.1f, rng);                   // rows and windows off the 4-element blocks
    win_case(t, 5, 16, 64, 32, 0.5f, rng);                    // a rank's aligned FFN columns
    win_case(t, 3, 1001, 2002, (1ull << 34) + 3, 0.3f, rng);  // the counter's high word
    win_case(t, 9, 13, 13, 0, 0.0f, rng);                     // p = 0: copies / accumulates
    win_tp_case(t, 24, 36, 2, rng);
    win_tp_case(t, 7, 36, 3, rng);                            // 12 columns a rank: windows off the blocks
    /* statistics: about p of the elements dropped, the kept ones x / (1 - p) exactly */
    const size_t rows = 256, cols = 250, n = rows * cols;
    const float p = 0.25f;
    float *ones = host_alloc(n);
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    float *d = dev_from(t, ones, n);
    op_dropout_fwd_win(t->be, d, d, rows, cols, 300, 5, p, SEED, 77);
    float *got = dev_fetch(t, d, n);
    size_t dropped = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        dropped += got[i] == 0.0f;
        bad += got[i] != 0.0f && got[i] != 1.0f / (1.0f - p);
    }
    const double frac = (double)dropped / n, sd = sqrt(p * (1.0 - p) / n);
    TCHECK(fabs(frac - p) < 6 * sd, "%s: dropout win dropped fraction %.4f, want %.2f", t->name, frac, (double)p);
    TCHECK(bad == 0, "%s: dropout win: %zu kept elements not scaled by 1/(1-p)", t->name, bad);
    free(ones), free(got);
    dev_free(t, d);
}

/* ---- attention with dropout on the probabilities ------------------------------------ */

/* The forward by hand from attention_fwd's P: Pd = the window mask of P
 * (this rank's H of H_all heads at head h0), out = Pd v; dv = Pd^T dout. */
static void compose(float *out, float *dv, const float *P, const float *v, const float *dout, int B, int H, int Tq,
                    int Tk, int D, uint64_t first, uint64_t ld, float p, uint64_t stream) {
    const size_t np = (size_t)B * H * Tq * Tk;
    float *Pd = host_alloc(np);
    ref_win(Pd, P, (size_t)B, (size_t)H * Tq * Tk, ld, first, p, stream);
    const int HD = H * D;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                const float *pd = Pd + ((size_t)b * H + h) * Tq * Tk;
                for (int i = 0; i < Tq; i++) {
                    float s = 0.0f;
                    for (int j = 0; j < Tk; j++) s += pd[(size_t)i * Tk + j] * v[((size_t)b * Tk + j) * HD + h * D + d];
                    out[((size_t)b * Tq + i) * HD + h * D + d] = s;
                }
                for (int j = 0; j < Tk; j++) {
                    float s = 0.0f;
                    for (int i = 0; i < Tq; i++)
                        s += pd[(size_t)i * Tk + j] * dout[((size_t)b * Tq + i) * HD + h * D + d];
                    dv[((size_t)b * Tk + j) * HD + h * D + d] = s;
                }
            }
    free(Pd);
}

typedef struct {
    int B, H, Tq, Tk, D;
    bool causal;
    const int32_t *k_len;
} AttnShape;

/* Rank 1 of 2 (heads H..2H-1 of 2H): its window of the whole mask. */
static void rank1_window(const AttnShape *s, uint64_t *first, uint64_t *ld) {
    const uint64_t per_head = (uint64_t)s->Tq * s->Tk;
    *first = (uint64_t)s->H * per_head;
    *ld = 2 * (uint64_t)s->H * per_head;
}

static void attn_drop_case(const Target *t, const AttnShape *s, float p, bool x16, Rng *rng) {
    Backend *be = t->be;
    char what[200];
    const int B = s->B, H = s->H, Tq = s->Tq, Tk = s->Tk, D = s->D, HD = H * D;
    const size_t nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD, np = (size_t)B * H * Tq * Tk;
    const uint64_t stream = dropout_stream(3, 1, 2, 7, 0);
    uint64_t first, ld;
    rank1_window(s, &first, &ld);
    float *q0 = rand_floats(nq, rng, -1, 1), *k0 = rand_floats(nk, rng, -1, 1), *v0 = rand_floats(nk, rng, -1, 1);
    float *q = host_bf16(q0, nq), *k = host_bf16(k0, nk), *v = host_bf16(v0, nk);  // bf16 values: both forms agree
    float *out = host_alloc(nq), *P = host_alloc(np), *Pd = host_alloc(np), *dout = rand_floats(nq, rng, -1, 1);
    cpu_attention_drop_fwd(out, P, Pd, q, k, v, s->k_len, B, H, Tq, Tk, D, s->causal, first, ld, p, SEED, stream);
    snprintf(what, sizeof what, "attention drop B%d H%d Tq%d Tk%d D%d%s p %g%s", B, H, Tq, Tk, D,
             s->causal ? " causal" : "", (double)p, x16 ? " (bf16 q, k, v)" : "");
    if (t->is_cpu && !x16) {  // the reference against the composition, once per shape
        float *P0 = host_alloc(np), *out0 = host_alloc(nq), *o2 = host_alloc(nq), *dv2 = host_alloc(nk);
        cpu_attention_fwd(out0, P0, q, k, v, s->k_len, B, H, Tq, Tk, D, s->causal);
        check_exact(t, "attention drop: P is attention_fwd's", P, P0, np);
        compose(o2, dv2, P0, v, dout, B, H, Tq, Tk, D, first, ld, p, stream);
        check_rel(t, "attention drop: out = Dropout(P) v", out, o2, NULL, nq, COMPOSE_RTOL);
        float *dq = host_alloc(nq), *dk = host_alloc(nk), *dv = host_alloc(nk), *scr = host_alloc(np);
        cpu_attention_drop_bwd(dq, dk, dv, GRAD_WRITE, dout, P, q, k, v, scr, B, H, Tq, Tk, D, first, ld, p, SEED,
                               stream);
        check_rel(t, "attention drop: dv = Dropout(P)^T dout", dv, dv2, NULL, nk, COMPOSE_RTOL);
        free(P0), free(out0), free(o2), free(dv2), free(dq), free(dk), free(dv), free(scr);
    }
    int32_t *d_klen = dev_from_i32(t, s->k_len, B);
    float *d_q = dev_from(t, q, nq), *d_k = dev_from(t, k, nk), *d_v = dev_from(t, v, nk);
    uint16_t *h_q = dev_bits(t, q, nq), *h_k = dev_bits(t, k, nk), *h_v = dev_bits(t, v, nk);
    const float *fq = x16 ? NULL : d_q, *fk = x16 ? NULL : d_k, *fv = x16 ? NULL : d_v;
    const uint16_t *bq = x16 ? h_q : NULL, *bk = x16 ? h_k : NULL, *bv = x16 ? h_v : NULL;
    float *d_out = dev_nan(t, nq), *d_P = dev_nan(t, np), *d_Pd = dev_nan(t, np);
    op_attention_drop_fwd(be, d_out, NULL, d_P, d_Pd, fq, fk, fv, bq, bk, bv, d_klen, B, H, Tq, Tk, D, s->causal,
                          first, ld, p, SEED, stream);
    float *got_out = dev_fetch(t, d_out, nq), *got_P = dev_fetch(t, d_P, np);
    check_rel(t, what, got_out, out, NULL, nq, tol(t, SUM_RTOL));
    check_rel(t, what, got_P, P, NULL, np, tol(t, SUM_RTOL));
    if (p == 0.0f) {  // attention_fwd's bits
        float *d_o2 = dev_nan(t, nq);
        if (x16) op_attention_fwd_x16(be, d_o2, NULL, d_P, h_q, h_k, h_v, d_klen, B, H, Tq, Tk, D, s->causal);
        else op_attention_fwd(be, d_o2, d_P, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, s->causal);
        float *o2 = dev_fetch(t, d_o2, nq);
        check_exact(t, "attention drop p = 0: attention_fwd's output", got_out, o2, nq);
        free(o2);
        dev_free(t, d_o2);
    }
    /* backward from the CPU's P into random starts, and written over NaN */
    float *dq0 = rand_floats(nq, rng, -1, 1), *dk0 = rand_floats(nk, rng, -1, 1), *dv0 = rand_floats(nk, rng, -1, 1);
    float *dq = host_copy(dq0, nq), *dk = host_copy(dk0, nk), *dv = host_copy(dv0, nk), *scr = host_alloc(np);
    cpu_attention_drop_bwd(dq, dk, dv, GRAD_ADD, dout, P, q, k, v, scr, B, H, Tq, Tk, D, first, ld, p, SEED, stream);
    backend_upload(be, d_P, P, np * sizeof(float));
    float *d_dout = dev_from(t, dout, nq), *d_scr = dev_nan(t, np);
    float *d_g[3] = {dev_from(t, dq0, nq), dev_from(t, dk0, nk), dev_from(t, dv0, nk)};
    op_attention_drop_bwd(be, d_g[0], d_g[1], d_g[2], NULL, NULL, NULL, GRAD_ADD, d_dout, d_P, fq, fk, fv, bq, bk, bv,
                          d_scr, B, H, Tq, Tk, D, first, ld, p, SEED, stream);
    const float *want[3] = {dq, dk, dv}, *start[3] = {dq0, dk0, dv0};
    const size_t sizes[3] = {nq, nk, nk};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        float *got = dev_fetch(t, d_g[i], sizes[i]);
        char w2[240];
        snprintf(w2, sizeof w2, "%s bwd %s", what, names[i]);
        check_rel(t, w2, got, want[i], start[i], sizes[i], tol(t, ATTN_BWD_RTOL));
        free(got);
        dev_free(t, d_g[i]);
    }
    /* written over NaN in fp32 and as bf16 bits (bf16 mode's q, k, v gradients) */
    float *d_w[3];
    uint16_t *d_h[3];
    for (int i = 0; i < 3; i++) d_w[i] = dev_nan(t, sizes[i]), d_h[i] = dev_nan_bits(t, sizes[i]);
    op_attention_drop_bwd(be, d_w[0], d_w[1], d_w[2], NULL, NULL, NULL, GRAD_WRITE, d_dout, d_P, fq, fk, fv, bq, bk,
                          bv, d_scr, B, H, Tq, Tk, D, first, ld, p, SEED, stream);
    op_attention_drop_bwd(be, NULL, NULL, NULL, d_h[0], d_h[1], d_h[2], GRAD_WRITE, d_dout, d_P, fq, fk, fv, bq, bk,
                          bv, d_scr, B, H, Tq, Tk, D, first, ld, p, SEED, stream);
    check_attn_grads16(t, what, d_h, d_w, sizes);
    for (int i = 0; i < 3; i++) dev_free(t, d_w[i]), dev_free(t, d_h[i]);
    float *host_bufs[] = {q0, k0, v0, q, k, v, out, P, Pd, dout, got_out, got_P, dq0, dk0, dv0, dq, dk, dv, scr};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    void *dev_bufs[] = {d_klen, d_q, d_k, d_v, h_q, h_k, h_v, d_out, d_P, d_Pd, d_dout, d_scr};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

void test_attention_drop(const Target *t, Rng *rng) {
    static const int32_t len_a[2] = {7, 3}, len_b[3] = {40, 17, 0};
    const AttnShape small = {2, 2, 5, 7, 8, false, len_a}, causal = {2, 2, 7, 7, 8, true, len_a};
    const AttnShape big = {3, 3, 33, 40, 16, false, len_b};  // more than one 32-wide tile; a batch without keys
    const AttnShape *shapes[3] = {&small, &causal, &big};
    for (int i = 0; i < 3; i++)
        for (int x16 = 0; x16 <= 1; x16++) {
            attn_drop_case(t, shapes[i], 0.3f, x16, rng);
            attn_drop_case(t, shapes[i], 0.0f, x16, rng);
        }
}
