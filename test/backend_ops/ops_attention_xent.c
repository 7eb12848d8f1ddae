/* ops_attention_xent.c: masked softmax, attention (with realistic lengths,
 * T >= 128, and more (batch, head) pairs than a grid dimension holds) and
 * the cross-entropy ops, full-row and vocab-parallel, through a backend,
 * against the CPU reference. Masked scores and padding columns hold NaN, so
 * an op that reads them fails. Attention's backward also writes its
 * gradients over NaN garbage (GRAD_WRITE; on CUDA on the fused and the
 * general path), bit for bit what the same backend adds into zeros. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "harness.h"

/* The CPU's mask rule, written out again: keys [0, n) of row i are valid. */
static int ref_valid_keys(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && n > i + 1) n = i + 1;
    return n < 0 ? 0 : n;
}

/* mask[(b, h, i, j)] = 1 where key j of row i is masked. */
static unsigned char *masked_entries(const int32_t *k_len, int B, int H, int Tq, int Tk, bool causal) {
    unsigned char *m = TP_CALLOC((size_t)B * H * Tq * Tk + 1, 1);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                int nv = ref_valid_keys(k_len[b], i, Tk, causal);
                for (int j = nv; j < Tk; j++) m[(((size_t)b * H + h) * Tq + i) * Tk + j] = 1;
            }
    return m;
}

/* ---- softmax ---------------------------------------------------------------------- */

static void softmax_case(const Target *t, const int32_t *k_len, int B, int H, int Tq, int Tk, bool causal, Rng *rng) {
    Backend *be = t->be;
    char what[128];
    const size_t n = (size_t)B * H * Tq * Tk;
    const float scale = 0.7f;
    unsigned char *masked = masked_entries(k_len, B, H, Tq, Tk, causal);
    float *S = rand_floats(n, rng, -3, 3);
    for (size_t i = 0; i < n; i++)
        if (masked[i]) S[i] = NAN;  // masked scores must never be read
    float *P = host_alloc(n);
    cpu_softmax_fwd(P, S, k_len, B, H, Tq, Tk, scale, causal);
    float *d_S = dev_from(t, S, n), *d_P = dev_from(t, S, n);
    int32_t *d_klen = dev_from_i32(t, k_len, B);
    op_softmax_fwd(be, d_P, d_S, d_klen, B, H, Tq, Tk, scale, causal);
    float *got = dev_fetch(t, d_P, n);
    snprintf(what, sizeof what, "softmax fwd B%d H%d Tq%d Tk%d%s", B, H, Tq, Tk, causal ? " causal" : "");
    check_rel(t, what, got, P, NULL, n, tol(t, SUM_RTOL));
    check_exact_where(t, what, got, P, masked, n);  // exact zeros

    op_softmax_fwd(be, d_S, d_S, d_klen, B, H, Tq, Tk, scale, causal);  // in place, as attention uses it
    float *got_in = dev_fetch(t, d_S, n);
    snprintf(what, sizeof what, "softmax fwd in place B%d Tk%d", B, Tk);
    check_exact(t, what, got_in, got, n);

    // backward: dS += scale * P * (dP - sum(dP * P)), also with dS == dP
    float *dP = rand_floats(n, rng, -1, 1), *dS0 = rand_floats(n, rng, -1, 1);
    float *dS = host_copy(dS0, n);
    cpu_softmax_bwd(dS, dP, P, B, H, Tq, Tk, scale);
    float *d_dP = dev_from(t, dP, n), *d_dS = dev_from(t, dS0, n);
    backend_upload(be, d_P, P, n * sizeof(float));
    op_softmax_bwd(be, d_dS, d_dP, d_P, B, H, Tq, Tk, scale);
    float *got_dS = dev_fetch(t, d_dS, n);
    snprintf(what, sizeof what, "softmax bwd B%d Tk%d", B, Tk);
    check_rel(t, what, got_dS, dS, dS0, n, tol(t, SUM_RTOL));

    float *alias = host_copy(dP, n);
    cpu_softmax_bwd(alias, alias, P, B, H, Tq, Tk, scale);
    op_softmax_bwd(be, d_dP, d_dP, d_P, B, H, Tq, Tk, scale);
    float *got_alias = dev_fetch(t, d_dP, n);
    snprintf(what, sizeof what, "softmax bwd dS == dP B%d Tk%d", B, Tk);
    check_rel(t, what, got_alias, alias, dP, n, tol(t, SUM_RTOL));

    float *host_bufs[] = {S, P, got, got_in, dP, dS0, dS, got_dS, alias, got_alias};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    free(masked);
    void *dev_bufs[] = {d_S, d_P, d_klen, d_dP, d_dS};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

void test_softmax(const Target *t, Rng *rng) {
    const int32_t k_len3[3] = {20, 0, 50};  // k_len < Tk, an empty row, k_len > Tk
    softmax_case(t, k_len3, 3, 2, 5, 37, false, rng);
    softmax_case(t, k_len3, 3, 2, 5, 37, true, rng);
    const int32_t k_len2[2] = {40, 33};
    softmax_case(t, k_len2, 2, 3, 40, 40, true, rng);
    const int32_t k_len1[1] = {300};
    softmax_case(t, k_len1, 1, 1, 3, 300, false, rng);  // rows much longer than a warp
}

/* ---- attention ------------------------------------------------------------------- */

/* The backward's inputs on the target, and its shape. */
typedef struct {
    const float *dout, *P, *q, *k, *v;
    float *scratch;
    const int32_t *k_len;  // on the host
    int B, H, Tq, Tk, D;
} AttnBwdIn;

/* dq, dk, dv written (GRAD_WRITE) over NaN garbage against the same
 * backend's backward added into zeros, bit for bit; the rows of padding
 * keys (t >= k_len[b]) of dk and dv are zeros (by value). */
static void attention_written(const Target *t, const char *name, const AttnBwdIn *in) {
    const int B = in->B, H = in->H, Tq = in->Tq, Tk = in->Tk, D = in->D;
    const size_t HD = (size_t)H * D, n[3] = {(size_t)B * Tq * HD, (size_t)B * Tk * HD, (size_t)B * Tk * HD};
    float *add[3], *put[3], *got_add[3], *got_put[3];
    for (int i = 0; i < 3; i++) {
        add[i] = dev_nan(t, n[i]);
        op_zero(t->be, add[i], n[i]);
        put[i] = dev_nan(t, n[i]);
    }
    op_attention_bwd(t->be, add[0], add[1], add[2], GRAD_ADD, in->dout, in->P, in->q, in->k, in->v, in->scratch, B,
                     H, Tq, Tk, D);
    op_attention_bwd(t->be, put[0], put[1], put[2], GRAD_WRITE, in->dout, in->P, in->q, in->k, in->v, in->scratch,
                     B, H, Tq, Tk, D);
    const char *grad[3] = {"dq", "dk", "dv"};
    char what[200];
    for (int i = 0; i < 3; i++) {
        got_add[i] = dev_fetch(t, add[i], n[i]), got_put[i] = dev_fetch(t, put[i], n[i]);
        snprintf(what, sizeof what, "attention bwd %s %s written = added into zeros", grad[i], name);
        check_exact(t, what, got_put[i], got_add[i], n[i]);
    }
    size_t nonzero = 0;
    for (int b = 0; b < B; b++)
        for (size_t e = (size_t)(in->k_len[b] < Tk ? in->k_len[b] : Tk) * HD; e < (size_t)Tk * HD; e++)
            nonzero += got_put[1][(size_t)b * Tk * HD + e] != 0.0f || got_put[2][(size_t)b * Tk * HD + e] != 0.0f;
    TCHECK(nonzero == 0, "%s: attention bwd %s written: %zu elements of padding keys' dk or dv rows nonzero",
           t->name, name, nonzero);
    for (int i = 0; i < 3; i++) {
        free(got_add[i]), free(got_put[i]);
        dev_free(t, add[i]), dev_free(t, put[i]);
    }
}

static void attention_case(const Target *t, const char *name, const int32_t *k_len, int B, int H, int Tq, int Tk,
                           int D, bool causal, Rng *rng) {
    Backend *be = t->be;
    char what[160];
    const int HD = H * D;
    const size_t nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD, np = (size_t)B * H * Tq * Tk;
    unsigned char *masked = masked_entries(k_len, B, H, Tq, Tk, causal);
    float *q = rand_floats(nq, rng, -1, 1), *k = rand_floats(nk, rng, -1, 1), *v = rand_floats(nk, rng, -1, 1);
    float *out = host_alloc(nq), *P = host_alloc(np);
    cpu_attention_fwd(out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal);

    float *d_q = dev_from(t, q, nq), *d_k = dev_from(t, k, nk), *d_v = dev_from(t, v, nk);
    int32_t *d_klen = dev_from_i32(t, k_len, B);
    float *d_out = dev_nan(t, nq), *d_P = dev_nan(t, np);  // garbage: the forward overwrites both
    op_attention_fwd(be, d_out, d_P, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, causal);
    float *got_out = dev_fetch(t, d_out, nq), *got_P = dev_fetch(t, d_P, np);
    snprintf(what, sizeof what, "attention fwd out %s", name);
    check_rel(t, what, got_out, out, NULL, nq, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "attention fwd P %s", name);
    check_rel(t, what, got_P, P, NULL, np, tol(t, SUM_RTOL));
    check_exact_where(t, what, got_P, P, masked, np);
    {  // out NULL: P alone (selective recomputation), the same bits
        float *d_P1 = dev_nan(t, np);
        op_attention_fwd(be, NULL, d_P1, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, causal);
        float *p1 = dev_fetch(t, d_P1, np);
        snprintf(what, sizeof what, "attention fwd P alone (out NULL) %s", name);
        check_exact(t, what, p1, got_P, np);
#ifdef TPTRAIN_TEST_CUDA
        if (!t->is_cpu) {  // and on the general path
            gpu_set_fused_attention(false);
            op_attention_fwd(be, NULL, d_P1, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, causal);
            gpu_set_fused_attention(true);
            free(p1);
            p1 = dev_fetch(t, d_P1, np);
            snprintf(what, sizeof what, "attention fwd P alone (out NULL, general path) %s", name);
            check_exact(t, what, p1, got_P, np);
        }
#endif
        free(p1);
        dev_free(t, d_P1);
    }
    for (int b = 0; b < B; b++) {  // rows of a batch without keys are zeros (by value: the sign may vary)
        if (k_len[b] > 0) continue;
        size_t n_nonzero = 0;
        for (size_t i = 0; i < (size_t)Tq * HD; i++) n_nonzero += got_out[(size_t)b * Tq * HD + i] != 0.0f;
        TCHECK(n_nonzero == 0, "%s: attention fwd out %s: batch %d has no keys but %zu nonzero outputs", t->name,
               name, b, n_nonzero);
    }

    // backward from the CPU's P, into random starting gradients
    float *dout = rand_floats(nq, rng, -1, 1);
    float *dq0 = rand_floats(nq, rng, -1, 1), *dk0 = rand_floats(nk, rng, -1, 1), *dv0 = rand_floats(nk, rng, -1, 1);
    float *dq = host_copy(dq0, nq), *dk = host_copy(dk0, nk), *dv = host_copy(dv0, nk), *scratch = host_alloc(np);
    cpu_attention_bwd(dq, dk, dv, GRAD_ADD, dout, P, q, k, v, scratch, B, H, Tq, Tk, D);
    float *d_dout = dev_from(t, dout, nq), *d_dq = dev_from(t, dq0, nq), *d_dk = dev_from(t, dk0, nk);
    float *d_dv = dev_from(t, dv0, nk), *d_scratch = dev_nan(t, np);
    backend_upload(be, d_P, P, np * sizeof(float));
    op_attention_bwd(be, d_dq, d_dk, d_dv, GRAD_ADD, d_dout, d_P, d_q, d_k, d_v, d_scratch, B, H, Tq, Tk, D);
    float *got_dq = dev_fetch(t, d_dq, nq), *got_dk = dev_fetch(t, d_dk, nk), *got_dv = dev_fetch(t, d_dv, nk);
    snprintf(what, sizeof what, "attention bwd dq %s", name);
    check_rel(t, what, got_dq, dq, dq0, nq, tol(t, ATTN_BWD_RTOL));
    snprintf(what, sizeof what, "attention bwd dk %s", name);
    check_rel(t, what, got_dk, dk, dk0, nk, tol(t, ATTN_BWD_RTOL));
    snprintf(what, sizeof what, "attention bwd dv %s", name);
    check_rel(t, what, got_dv, dv, dv0, nk, tol(t, ATTN_BWD_RTOL));
    const AttnBwdIn in = {d_dout, d_P, d_q, d_k, d_v, d_scratch, k_len, B, H, Tq, Tk, D};
    attention_written(t, name, &in);

#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) {  // the general path (fused kernels off) gives the fused path's bits
        gpu_set_fused_attention(false);
        snprintf(what, sizeof what, "%s (general path)", name);
        attention_written(t, what, &in);
        op_attention_fwd(be, d_out, d_P, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, causal);
        float *gen_out = dev_fetch(t, d_out, nq), *gen_P = dev_fetch(t, d_P, np);
        backend_upload(be, d_P, P, np * sizeof(float));
        backend_upload(be, d_dq, dq0, nq * sizeof(float));
        backend_upload(be, d_dk, dk0, nk * sizeof(float));
        backend_upload(be, d_dv, dv0, nk * sizeof(float));
        op_attention_bwd(be, d_dq, d_dk, d_dv, GRAD_ADD, d_dout, d_P, d_q, d_k, d_v, d_scratch, B, H, Tq, Tk, D);
        float *gen_dq = dev_fetch(t, d_dq, nq), *gen_dk = dev_fetch(t, d_dk, nk), *gen_dv = dev_fetch(t, d_dv, nk);
        gpu_set_fused_attention(true);
        const float *gen[] = {gen_out, gen_P, gen_dq, gen_dk, gen_dv}, *fused[] = {got_out, got_P, got_dq, got_dk, got_dv};
        const char *names[] = {"fwd out", "fwd P", "bwd dq", "bwd dk", "bwd dv"};
        const size_t sizes[] = {nq, np, nq, nk, nk};
        for (int i = 0; i < 5; i++) {
            snprintf(what, sizeof what, "attention %s %s: general path = fused path", names[i], name);
            check_exact(t, what, gen[i], fused[i], sizes[i]);
            free((void *)gen[i]);
        }
    }
#endif
    float *host_bufs[] = {q, k, v, out, P, got_out, got_P, dout, dq0, dk0, dv0, dq, dk, dv, scratch, got_dq, got_dk, got_dv};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    free(masked);
    void *dev_bufs[] = {d_q, d_k, d_v, d_klen, d_out, d_P, d_dout, d_dq, d_dk, d_dv, d_scratch};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

/* Tk == 0 (no keys) and Tq == 0 (no queries): no product runs. Added, the
 * gradients (dq, or dk and dv) stay as they were; written over NaN garbage,
 * they become zeros; the empty tensors' pointers are NULL. */
static void attention_bwd_empty(const Target *t, Rng *rng) {
    const int B = 2, H = 2, T = 3, D = 4;
    const size_t n = (size_t)B * T * H * D;
    float *start = rand_floats(n, rng, -1, 1), *zeros = host_alloc(n);
    for (int tk0 = 0; tk0 < 2; tk0++)
        for (int mode = 0; mode < 2; mode++) {
            const bool write = mode == 1;
            float *g[2] = {write ? dev_nan(t, n) : dev_from(t, start, n), NULL};
            if (tk0 == 0) g[1] = write ? dev_nan(t, n) : dev_from(t, start, n);
            if (tk0)  // dq (B, T, H*D) with no keys
                op_attention_bwd(t->be, g[0], NULL, NULL, write ? GRAD_WRITE : GRAD_ADD, NULL, NULL, NULL, NULL,
                                 NULL, NULL, B, H, T, 0, D);
            else  // dk, dv (B, T, H*D) with no queries
                op_attention_bwd(t->be, NULL, g[0], g[1], write ? GRAD_WRITE : GRAD_ADD, NULL, NULL, NULL, NULL,
                                 NULL, NULL, B, H, 0, T, D);
            char what[96];
            for (int i = 0; i < (tk0 ? 1 : 2); i++) {
                float *got = dev_fetch(t, g[i], n);
                snprintf(what, sizeof what, "attention bwd %s: %s %s", tk0 ? "Tk = 0" : "Tq = 0",
                         tk0 ? "dq" : i ? "dv" : "dk", write ? "written: zeros" : "added: as it was");
                check_exact(t, what, got, write ? zeros : start, n);
                free(got);
                dev_free(t, g[i]);
            }
        }
    free(start), free(zeros);
}

/* The _x16 forms on bf16 q, k, v give the fp32 forms' bits on the widened
 * values: out and P forward, dq, dk, dv added to and written over NaN; on
 * CUDA through the fused and the general path. */
static void attention_x16_case(const Target *t, const char *name, const int32_t *k_len, int B, int H, int Tq, int Tk,
                               int D, bool causal, Rng *rng) {
    Backend *be = t->be;
    const size_t HD = (size_t)H * D, nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD;
    const size_t np = (size_t)B * H * Tq * Tk;
    float *raw[3] = {rand_floats(nq, rng, -1, 1), rand_floats(nk, rng, -1, 1), rand_floats(nk, rng, -1, 1)};
    float *dout = rand_floats(nq, rng, -1, 1), *g0 = rand_floats(nq + 2 * nk, rng, -1, 1);
    float *w[3];
    uint16_t *h16[3];
    float *d_w[3];
    const size_t n3[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) {
        w[i] = host_bf16(raw[i], n3[i]);
        d_w[i] = dev_from(t, w[i], n3[i]);
        h16[i] = dev_bits(t, w[i], n3[i]);
    }
    int32_t *d_klen = dev_from_i32(t, k_len, B);
    float *d_dout = dev_from(t, dout, nq), *d_scratch = dev_nan(t, np);
    const char *outs[5] = {"fwd out", "fwd P", "bwd dq", "bwd dk", "bwd dv"};
    const size_t sizes[5] = {nq, np, nq, nk, nk};
    for (int path = 0; path < (t->is_cpu ? 1 : 2); path++) {
#ifdef TPTRAIN_TEST_CUDA
        if (!t->is_cpu) gpu_set_fused_attention(path == 0);
#endif
        for (int mode = 0; mode < 2; mode++) {
            const GradMode gm = mode ? GRAD_WRITE : GRAD_ADD;
            float *got[2][5];
            for (int x16 = 0; x16 < 2; x16++) {
                float *d_out = dev_nan(t, nq), *d_P = dev_nan(t, np), *d_g[3];
                for (int i = 0; i < 3; i++) {
                    const float *start = g0 + (i ? nq + (size_t)(i - 1) * nk : 0);
                    d_g[i] = mode ? dev_nan(t, n3[i]) : dev_from(t, start, n3[i]);
                }
                if (x16) {
                    op_attention_fwd_x16(be, d_out, NULL, d_P, h16[0], h16[1], h16[2], d_klen, B, H, Tq, Tk, D,
                                         causal);
                    op_attention_bwd_x16(be, d_g[0], d_g[1], d_g[2], NULL, NULL, NULL, gm, d_dout, d_P, h16[0],
                                         h16[1], h16[2], d_scratch, B, H, Tq, Tk, D);
                    if (mode) {  // written as bf16 bits (over NaN): the rounding of the fp32 ones
                        uint16_t *d_h[3];
                        for (int i = 0; i < 3; i++) d_h[i] = dev_nan_bits(t, n3[i]);
                        op_attention_bwd_x16(be, NULL, NULL, NULL, d_h[0], d_h[1], d_h[2], gm, d_dout, d_P, h16[0],
                                             h16[1], h16[2], d_scratch, B, H, Tq, Tk, D);
                        char what[160];
                        snprintf(what, sizeof what, "attention_bwd_x16 %s%s", name, path ? " (general path)" : "");
                        check_attn_grads16(t, what, d_h, d_g, n3);
                        for (int i = 0; i < 3; i++) dev_free(t, d_h[i]);
                    }
                } else {
                    op_attention_fwd(be, d_out, d_P, d_w[0], d_w[1], d_w[2], d_klen, B, H, Tq, Tk, D, causal);
                    op_attention_bwd(be, d_g[0], d_g[1], d_g[2], gm, d_dout, d_P, d_w[0], d_w[1], d_w[2], d_scratch,
                                     B, H, Tq, Tk, D);
                }
                got[x16][0] = dev_fetch(t, d_out, nq), got[x16][1] = dev_fetch(t, d_P, np);
                for (int i = 0; i < 3; i++) got[x16][2 + i] = dev_fetch(t, d_g[i], n3[i]), dev_free(t, d_g[i]);
                if (x16 && mode == 0) {  // the output stored as bf16: to_bf16 of the fp32 one, and the same P
                    uint16_t *d_o16 = backend_alloc(be, nq * sizeof(uint16_t), MEM_ACT), *d_w16 = NULL;
                    d_w16 = backend_alloc(be, nq * sizeof(uint16_t), MEM_ACT);
                    float *d_P2 = dev_nan(t, np);
                    op_attention_fwd_x16(be, NULL, d_o16, d_P2, h16[0], h16[1], h16[2], d_klen, B, H, Tq, Tk, D,
                                         causal);
                    op_to_bf16(be, d_w16, d_out, nq);
                    float *o16 = dev_fetch_bits(t, d_o16, nq), *w16 = dev_fetch_bits(t, d_w16, nq);
                    float *p2 = dev_fetch(t, d_P2, np);
                    char what[200];
                    snprintf(what, sizeof what, "attention_x16 out16 %s%s = to_bf16(out)", name,
                             path ? " (general path)" : "");
                    check_exact(t, what, o16, w16, nq);
                    snprintf(what, sizeof what, "attention_x16 out16 %s%s: P", name, path ? " (general path)" : "");
                    check_exact(t, what, p2, got[x16][1], np);
                    free(o16), free(w16), free(p2);
                    dev_free(t, d_o16), dev_free(t, d_w16), dev_free(t, d_P2);
                }
                dev_free(t, d_out), dev_free(t, d_P);
            }
            for (int j = 0; j < 5; j++) {
                char what[200];
                snprintf(what, sizeof what, "attention_x16 %s %s%s%s = on widened q, k, v", outs[j], name,
                         mode ? " written" : " added", path ? " (general path)" : "");
                check_exact(t, what, got[1][j], got[0][j], sizes[j]);
                free(got[0][j]), free(got[1][j]);
            }
        }
    }
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) gpu_set_fused_attention(true);
#endif
    for (int i = 0; i < 3; i++) free(raw[i]), free(w[i]), dev_free(t, d_w[i]), dev_free(t, h16[i]);
    free(dout), free(g0);
    dev_free(t, d_klen), dev_free(t, d_dout), dev_free(t, d_scratch);
}

void test_attention(const Target *t, Rng *rng) {
    const int32_t cross_len[2] = {4, 0};  // padding and a batch with no keys
    attention_case(t, "cross Tq5 Tk7 D16", cross_len, 2, 3, 5, 7, 16, false, rng);
    const int32_t self_len[2] = {40, 33};
    attention_case(t, "causal Tq=Tk=40 D64", self_len, 2, 2, 40, 40, 64, true, rng);
    const int32_t long_len[1] = {100};  // k_len > Tk
    attention_case(t, "Tq33 Tk70 D24", long_len, 1, 4, 33, 70, 24, false, rng);
    const int32_t rect_len[2] = {9, 3};
    attention_case(t, "causal Tq6 Tk9 D8", rect_len, 2, 1, 6, 9, 8, true, rng);
    // realistic lengths: decoder self-attention and cross-attention of a translation batch
    const int32_t dec_len[2] = {160, 97};
    attention_case(t, "causal Tq=Tk=160 D64 (decoder)", dec_len, 2, 4, 160, 160, 64, true, rng);
    const int32_t enc_len[2] = {200, 131};
    attention_case(t, "cross Tq130 Tk200 D32", enc_len, 2, 4, 130, 200, 32, false, rng);
    // keys beyond any device's shared memory (2 x 1700 x 65 floats): the general path both ways
    const int32_t ctx_len[1] = {1650};
    attention_case(t, "Tq2 Tk1700 D64 (long context)", ctx_len, 1, 2, 2, 1700, 64, false, rng);
    // more (batch, head) pairs than one grid dimension holds (65,535)
    int32_t *many_len = TP_MALLOC(35000 * sizeof(int32_t));
    for (int b = 0; b < 35000; b++) many_len[b] = 1 + b % 3;
    attention_case(t, "B*H = 70000, Tq=Tk=3 D4", many_len, 35000, 2, 3, 3, 4, false, rng);
    free(many_len);

    const int B = 2, H = 2, Tq = 3, D = 4;  // Tk == 0: every output row is zero
    const size_t nq = (size_t)B * Tq * H * D;
    float *garbage = rand_floats(nq, rng, -1, 1), *zeros = host_alloc(nq);
    float *d_out = dev_from(t, garbage, nq);
    const int32_t no_keys[2] = {0, 0};
    int32_t *d_klen = dev_from_i32(t, no_keys, B);
    op_attention_fwd(t->be, d_out, NULL, d_out, d_out, d_out, d_klen, B, H, Tq, 0, D, false);
    float *got = dev_fetch(t, d_out, nq);
    check_exact(t, "attention fwd Tk = 0", got, zeros, nq);
    free(garbage), free(zeros), free(got);
    dev_free(t, d_out), dev_free(t, d_klen);
    attention_bwd_empty(t, rng);
    attention_x16_case(t, "cross Tq5 Tk7 D16", cross_len, 2, 3, 5, 7, 16, false, rng);
    attention_x16_case(t, "causal Tq=Tk=40 D64", self_len, 2, 2, 40, 40, 64, true, rng);
    attention_x16_case(t, "Tq33 Tk70 D24", long_len, 1, 4, 33, 70, 24, false, rng);
    attention_x16_case(t, "causal Tq6 Tk9 D6", rect_len, 2, 1, 6, 9, 6, true, rng);  // D % 4 != 0: scalar loads
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

static void xent_case(const Target *t, int N, int V, Rng *rng) {
    Backend *be = t->be;
    char what[96];
    const float eps = 0.1f, dloss = 1.0f / 7.0f;
    const int32_t ignore_id = 3;  // a real vocabulary id, as a pad id is
    const size_t nv = (size_t)N * V;
    float *logits = rand_floats(nv, rng, -4, 4);
    int32_t *targets = TP_MALLOC((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) targets[n] = (int32_t)(rng_next(rng) % (uint64_t)V);
    targets[0] = 0;
    targets[1] = ignore_id;
    targets[2] = V - 1;
    targets[N - 1] = ignore_id;
    float *losses = host_alloc(N), *lse = host_alloc(N);
    cpu_xent_fwd(losses, lse, logits, targets, N, V, eps, ignore_id);

    float *d_logits = dev_from(t, logits, nv);
    int32_t *d_t = dev_from_i32(t, targets, N);
    float *d_losses = dev_nan(t, N), *d_lse = dev_nan(t, N);
    op_xent_fwd(be, d_losses, d_lse, d_logits, d_t, N, V, eps, ignore_id);
    float *got_losses = dev_fetch(t, d_losses, N), *got_lse = dev_fetch(t, d_lse, N);
    snprintf(what, sizeof what, "xent fwd N%d V%d", N, V);
    check_rel(t, what, got_losses, losses, NULL, N, tol(t, SUM_RTOL));
    check_rel(t, what, got_lse, lse, NULL, N, tol(t, SUM_RTOL));

    float *dl0 = rand_floats(nv, rng, -1, 1);
    float *dl = host_copy(dl0, nv);
    cpu_xent_bwd(dl, logits, lse, targets, dloss, N, V, eps, ignore_id);
    float *d_dl = dev_from(t, dl0, nv);
    backend_upload(be, d_lse, lse, N * sizeof(float));
    op_xent_bwd(be, d_dl, d_logits, d_lse, d_t, dloss, N, V, eps, ignore_id);
    float *got_dl = dev_fetch(t, d_dl, nv);
    snprintf(what, sizeof what, "xent bwd N%d V%d", N, V);
    check_rel(t, what, got_dl, dl, dl0, nv, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "xent bwd ignored rows N%d V%d", N, V);
    check_exact(t, what, got_dl + V, dl0 + V, (size_t)V);

    float *host_bufs[] = {logits, losses, lse, got_losses, got_lse, dl0, dl, got_dl};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    free(targets);
    void *dev_bufs[] = {d_logits, d_t, d_losses, d_lse, d_dl};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

/* Vocab-parallel pieces on a 2-way split of V = 50 real columns padded to
 * 52: shard s holds columns [26 s, 26 s + 26), shard 1 has 24 real ones and
 * two NaN padding columns. Every piece is compared with the CPU on both
 * shards; then the backend's pieces, reduced on the host, must give the
 * full-row loss of op_xent_fwd. */
static void test_xent_vp(const Target *t, Rng *rng) {
    enum { N = 11, V = 50, TP = 2, V_LOCAL = 26 };
    Backend *be = t->be;
    const float eps = 0.1f, dloss = 0.25f;
    const int32_t ignore_id = 0;
    float *full = rand_floats((size_t)N * V, rng, -4, 4);  // (N, V)
    int32_t targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int32_t)(rng_next(rng) % V);
    targets[0] = ignore_id;
    targets[1] = 25;  // last of shard 0
    targets[2] = 26;  // first of shard 1
    targets[3] = V - 1;
    targets[4] = ignore_id;
    int32_t *d_t = dev_from_i32(t, targets, N);
    char what[96];

    float *shard[TP], *d_shard[TP];
    int v_valid[TP];
    float max_cpu[TP][N], max_dev[TP][N];
    for (int s = 0; s < TP; s++) {
        v_valid[s] = V - s * V_LOCAL < V_LOCAL ? V - s * V_LOCAL : V_LOCAL;
        shard[s] = host_alloc((size_t)N * V_LOCAL);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < V_LOCAL; j++)
                shard[s][(size_t)n * V_LOCAL + j] = j < v_valid[s] ? full[(size_t)n * V + s * V_LOCAL + j] : NAN;
        d_shard[s] = dev_from(t, shard[s], (size_t)N * V_LOCAL);
        cpu_xent_vp_max(max_cpu[s], shard[s], N, V_LOCAL, v_valid[s]);
        float *d_max = dev_nan(t, N);
        op_xent_vp_max(be, d_max, d_shard[s], N, V_LOCAL, v_valid[s]);
        backend_download(be, max_dev[s], d_max, sizeof max_dev[s]);
        snprintf(what, sizeof what, "xent_vp_max shard %d", s);
        check_exact(t, what, max_dev[s], max_cpu[s], N);
        dev_free(t, d_max);
    }
    float row_max[N];  // the MAX reduction
    for (int n = 0; n < N; n++) row_max[n] = max_dev[0][n] > max_dev[1][n] ? max_dev[0][n] : max_dev[1][n];
    float *d_row_max = dev_from(t, row_max, N);

    float stats[N * 3] = {0};
    for (int s = 0; s < TP; s++) {
        float st_cpu[N * 3], st_dev[N * 3];
        cpu_xent_vp_sums(st_cpu, shard[s], row_max, targets, N, V_LOCAL, v_valid[s], s * V_LOCAL, ignore_id);
        float *d_st = dev_nan(t, N * 3);
        op_xent_vp_sums(be, d_st, d_shard[s], d_row_max, d_t, N, V_LOCAL, v_valid[s], s * V_LOCAL, ignore_id);
        backend_download(be, st_dev, d_st, sizeof st_dev);
        for (int c = 0; c < 3; c++) {  // sum exp, sum x, target logit: apart
            float a[N], b[N];
            for (int n = 0; n < N; n++) a[n] = st_dev[n * 3 + c], b[n] = st_cpu[n * 3 + c];
            snprintf(what, sizeof what, "xent_vp_sums shard %d stat %d", s, c);
            if (c == 2) check_exact(t, what, a, b, N);
            else check_rel(t, what, a, b, NULL, N, tol(t, SUM_RTOL));
        }
        for (int i = 0; i < N * 3; i++) stats[i] += st_dev[i];  // the SUM reduction
        dev_free(t, d_st);
    }
    float *d_stats = dev_from(t, stats, N * 3);

    float losses[N], lse[N], got_losses[N], got_lse[N];
    cpu_xent_vp_loss(losses, lse, row_max, stats, targets, N, V, eps, ignore_id);
    float *d_losses = dev_nan(t, N), *d_lse = dev_nan(t, N);
    op_xent_vp_loss(be, d_losses, d_lse, d_row_max, d_stats, d_t, N, V, eps, ignore_id);
    backend_download(be, got_losses, d_losses, sizeof got_losses);
    backend_download(be, got_lse, d_lse, sizeof got_lse);
    check_rel(t, "xent_vp_loss losses", got_losses, losses, NULL, N, tol(t, SUM_RTOL));
    check_rel(t, "xent_vp_loss lse", got_lse, lse, NULL, N, tol(t, SUM_RTOL));

    float full_losses[N], full_lse[N];  // the whole protocol equals the full-row loss
    cpu_xent_fwd(full_losses, full_lse, full, targets, N, V, eps, ignore_id);
    check_rel(t, "xent_vp protocol vs full-row loss", got_losses, full_losses, NULL, N, SUM_RTOL);

    for (int s = 0; s < TP; s++) {
        const size_t nl = (size_t)N * V_LOCAL;
        float *dl0 = rand_floats(nl, rng, -1, 1);
        float *dl = host_copy(dl0, nl);
        cpu_xent_vp_bwd(dl, shard[s], lse, targets, dloss, N, V_LOCAL, v_valid[s], s * V_LOCAL, V, eps, ignore_id);
        float *d_dl = dev_from(t, dl0, nl), *d_lse_cpu = dev_from(t, lse, N);
        op_xent_vp_bwd(be, d_dl, d_shard[s], d_lse_cpu, d_t, dloss, N, V_LOCAL, v_valid[s], s * V_LOCAL, V, eps,
                       ignore_id);
        float *got = dev_fetch(t, d_dl, nl);
        snprintf(what, sizeof what, "xent_vp_bwd shard %d", s);
        check_rel(t, what, got, dl, dl0, nl, tol(t, SUM_RTOL));
        unsigned char keep[N * V_LOCAL];  // padding columns and ignored rows are untouched
        for (int n = 0; n < N; n++)
            for (int j = 0; j < V_LOCAL; j++) keep[n * V_LOCAL + j] = j >= v_valid[s] || targets[n] == ignore_id;
        snprintf(what, sizeof what, "xent_vp_bwd shard %d untouched", s);
        check_exact_where(t, what, got, dl0, keep, nl);
        free(dl0), free(dl), free(got);
        dev_free(t, d_dl), dev_free(t, d_lse_cpu);
    }
    /* The gradient written over the logits: op_xent_vp_bwd's into zeros
     * (padding columns, NaN before, and ignored rows become 0). */
    for (int s = 0; s < TP; s++) {
        const size_t nl = (size_t)N * V_LOCAL;
        float *want = host_alloc(nl);
        cpu_xent_vp_bwd(want, shard[s], lse, targets, dloss, N, V_LOCAL, v_valid[s], s * V_LOCAL, V, eps, ignore_id);
        float *d_x = dev_from(t, shard[s], nl), *d_lse_cpu = dev_from(t, lse, N);
        op_xent_vp_grad_inplace(be, d_x, d_lse_cpu, d_t, dloss, N, V_LOCAL, v_valid[s], s * V_LOCAL, V, eps,
                                ignore_id);
        float *got = dev_fetch(t, d_x, nl);
        snprintf(what, sizeof what, "xent_vp_grad_inplace shard %d", s);
        check_rel(t, what, got, want, NULL, nl, tol(t, SUM_RTOL));
        unsigned char zero[N * V_LOCAL];  // exactly 0 where op_xent_vp_bwd adds nothing
        for (int n = 0; n < N; n++)
            for (int j = 0; j < V_LOCAL; j++) zero[n * V_LOCAL + j] = j >= v_valid[s] || targets[n] == ignore_id;
        snprintf(what, sizeof what, "xent_vp_grad_inplace shard %d zeros", s);
        check_exact_where(t, what, got, want, zero, nl);
        free(want), free(got);
        dev_free(t, d_x), dev_free(t, d_lse_cpu);
    }
    for (int s = 0; s < TP; s++) {
        free(shard[s]);
        dev_free(t, d_shard[s]);
    }
    free(full);
    dev_free(t, d_t), dev_free(t, d_row_max), dev_free(t, d_stats), dev_free(t, d_losses), dev_free(t, d_lse);
}

/* The bf16-logit forms on one backend against its fp32 forms on the
 * widened logits: the same bits (max, the three sums, and the in-place
 * gradient, which must equal the fp32 one rounded by to_bf16). A vocab-
 * parallel shard with NaN padding columns, some ignored rows. */
static void xent_vp16_case(const Target *t, int N, int V_local, int V_valid, int vocab_start, int V, Rng *rng) {
    Backend *be = t->be;
    const float eps = 0.1f, dloss = 0.37f;
    const int32_t ignore_id = 0;
    const size_t nl = (size_t)N * V_local;
    float *x = rand_floats(nl, rng, -6, 6);
    for (int n = 0; n < N; n++)
        for (int j = V_valid; j < V_local; j++) x[(size_t)n * V_local + j] = NAN;
    float *xw = host_bf16(x, nl);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    for (int n = 0; n < N; n++) targets[n] = n % 4 == 1 ? ignore_id : 1 + (int32_t)(rng_next(rng) % (uint64_t)(V - 1));
    targets[0] = vocab_start + V_valid - 1;  // in this shard, its last real column
    int32_t *d_t = dev_from_i32(t, targets, N);
    uint16_t *d_x16 = dev_bits(t, xw, nl);
    float *d_xw = dev_from(t, xw, nl);
    char what[160];
    float *d_max[2] = {dev_nan(t, N), dev_nan(t, N)}, *d_st[2] = {dev_nan(t, (size_t)N * 3), dev_nan(t, (size_t)N * 3)};
    op_xent_vp_max(be, d_max[0], d_xw, N, V_local, V_valid);
    op_xent_vp_max16(be, d_max[1], d_x16, N, V_local, V_valid);
    op_xent_vp_sums(be, d_st[0], d_xw, d_max[0], d_t, N, V_local, V_valid, vocab_start, ignore_id);
    op_xent_vp_sums16(be, d_st[1], d_x16, d_max[0], d_t, N, V_local, V_valid, vocab_start, ignore_id);
    float *m0 = dev_fetch(t, d_max[0], N), *m1 = dev_fetch(t, d_max[1], N);
    float *s0 = dev_fetch(t, d_st[0], (size_t)N * 3), *s1 = dev_fetch(t, d_st[1], (size_t)N * 3);
    snprintf(what, sizeof what, "xent_vp_max16 N=%d V_local=%d against xent_vp_max", N, V_local);
    check_exact(t, what, m1, m0, N);
    snprintf(what, sizeof what, "xent_vp_sums16 N=%d V_local=%d against xent_vp_sums", N, V_local);
    check_exact(t, what, s1, s0, (size_t)N * 3);
    float *lse = host_alloc(N);  // a plausible lse per row: max + log(sum exp)
    for (int n = 0; n < N; n++) lse[n] = m0[n] + logf(s0[n * 3] > 0 ? s0[n * 3] : 1.0f);
    float *d_lse = dev_from(t, lse, N);
    op_xent_vp_grad_inplace(be, d_xw, d_lse, d_t, dloss, N, V_local, V_valid, vocab_start, V, eps, ignore_id);
    uint16_t *d_want = backend_alloc(be, nl * sizeof(uint16_t), MEM_ACT);
    op_to_bf16(be, d_want, d_xw, nl);
    op_xent_vp_grad_inplace16(be, d_x16, d_lse, d_t, dloss, N, V_local, V_valid, vocab_start, V, eps, ignore_id);
    float *want = dev_fetch_bits(t, d_want, nl), *got = dev_fetch_bits(t, d_x16, nl);
    snprintf(what, sizeof what, "xent_vp_grad_inplace16 N=%d V_local=%d against grad_inplace then to_bf16", N,
             V_local);
    check_exact(t, what, got, want, nl);
    free(x), free(xw), free(targets), free(m0), free(m1), free(s0), free(s1), free(lse), free(want), free(got);
    dev_free(t, d_t), dev_free(t, d_x16), dev_free(t, d_xw), dev_free(t, d_lse), dev_free(t, d_want);
    for (int k = 0; k < 2; k++) dev_free(t, d_max[k]), dev_free(t, d_st[k]);
}

void test_xent(const Target *t, Rng *rng) {
    xent_vp16_case(t, 9, 26, 24, 26, 50, rng);       // the second of two shards, two padding columns
    xent_vp16_case(t, 7, 1000, 1000, 0, 1000, rng);  // one shard, rows wider than a block

    xent_case(t, 9, 1000, rng);   // rows wider than a block
    xent_case(t, 6, 37, rng);     // rows narrower than a block
    xent_case(t, 3, 32000, rng);  // a real vocabulary
    test_xent_vp(t, rng);
}
