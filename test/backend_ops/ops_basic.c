/* ops_basic.c: memory, element-wise, device scalars, bias, embedding,
 * positions, LayerNorm, dropout and AdamW through a backend, against the
 * CPU reference; and launches whose grids exceed 65,535 blocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "harness.h"

/* ---- memory ------------------------------------------------------------------------ */

void test_memory_ops(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const size_t n = 1001, pad = 9;
    float *h = rand_floats(n + pad, rng, -1, 1);
    float *d = dev_from(t, h, n + pad);

    float *want = host_copy(h, n + pad);  // zero: the first n become 0, the rest stay
    cpu_zero(want, n);
    op_zero(be, d, n);
    float *got = dev_fetch(t, d, n + pad);
    check_exact(t, "zero", got, want, n + pad);
    free(got);

    float *src = rand_floats(n, rng, -1, 1);  // copy between disjoint buffers
    float *d_src = dev_from(t, src, n);
    op_copy(be, d, d_src, n);
    memcpy(want, src, n * sizeof(float));
    got = dev_fetch(t, d, n + pad);
    check_exact(t, "copy", got, want, n + pad);
    free(got);

    for (int dir = 0; dir < 2; dir++) {  // overlapping copies, both directions: memmove semantics
        float *buf = rand_floats(n + pad, rng, -1, 1);
        float *d_buf = dev_from(t, buf, n + pad);
        memmove(dir ? buf : buf + pad, dir ? buf + pad : buf, n * sizeof(float));
        op_copy(be, dir ? d_buf : d_buf + pad, dir ? d_buf + pad : d_buf, n);
        got = dev_fetch(t, d_buf, n + pad);
        check_exact(t, dir ? "copy overlapping backward" : "copy overlapping forward", got, buf, n + pad);
        op_copy(be, d_buf, d_buf, n);  // onto itself: a no-op
        float *again = dev_fetch(t, d_buf, n + pad);
        check_exact(t, "copy onto itself", again, buf, n + pad);
        free(again);
        free(got);
        free(buf);
        dev_free(t, d_buf);
    }

    int32_t ids[37], got_ids[37];  // ids: disjoint and overlapping
    for (int i = 0; i < 37; i++) ids[i] = (int32_t)(rng_next(rng) % 50000) - 7;
    int32_t *d_ids = dev_from_i32(t, ids, 37), *d_ids2 = dev_from_i32(t, ids, 37);
    op_zero(be, (float *)d_ids2, 37);  // int zeros are float zeros
    op_copy_ids(be, d_ids2, d_ids, 37);
    backend_download(be, got_ids, d_ids2, sizeof got_ids);
    TCHECK(memcmp(got_ids, ids, sizeof ids) == 0, "%s: copy_ids", t->name);
    op_copy_ids(be, d_ids + 3, d_ids, 30);
    memmove(ids + 3, ids, 30 * sizeof(int32_t));
    backend_download(be, got_ids, d_ids, sizeof got_ids);
    TCHECK(memcmp(got_ids, ids, sizeof ids) == 0, "%s: copy_ids overlapping", t->name);

    free(h);
    free(want);
    free(src);
    dev_free(t, d);
    dev_free(t, d_src);
    dev_free(t, d_ids);
    dev_free(t, d_ids2);
}

/* ---- element-wise -------------------------------------------------------------------- */

static void check_act(const Target *t, const char *what, Activation act, const float *got, const float *want,
                      size_t n) {
    if (act == ACT_RELU || t->is_cpu) check_exact(t, what, got, want, n);
    else check_close(t, what, got, want, n, GELU_TOL, GELU_TOL);
}

void test_elementwise(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const size_t n = 100003;
    float *x = rand_floats(n, rng, -6, 6);
    x[0] = 0.0f;
    x[1] = -0.0f;
    float *dy = rand_floats(n, rng, -1, 1), *dx0 = rand_floats(n, rng, -1, 1);
    float *d_x = dev_from(t, x, n), *d_dy = dev_from(t, dy, n);
    char what[64];
    for (int act = 0; act < 2; act++) {
        const char *name = act == ACT_RELU ? "relu" : "gelu";
        float *y = host_alloc(n);
        cpu_act_fwd(y, x, n, (Activation)act);
        float *d_y = dev_from(t, dx0, n);  // garbage: the forward overwrites
        op_act_fwd(be, d_y, d_x, n, (Activation)act);
        float *got = dev_fetch(t, d_y, n);
        snprintf(what, sizeof what, "%s fwd", name);
        check_act(t, what, (Activation)act, got, y, n);

        float *dx = host_copy(dx0, n);
        cpu_act_bwd(dx, GRAD_ADD, dy, x, n, (Activation)act);
        float *d_dx = dev_from(t, dx0, n);
        op_act_bwd(be, d_dx, GRAD_ADD, d_dy, d_x, n, (Activation)act);
        float *got_dx = dev_fetch(t, d_dx, n);
        snprintf(what, sizeof what, "%s bwd", name);
        check_act(t, what, (Activation)act, got_dx, dx, n);
        free(got_dx);
        dev_free(t, d_dx);

        // written over NaN garbage: the reference added into zeros
        float *dx_w = host_alloc(n);
        cpu_act_bwd(dx_w, GRAD_ADD, dy, x, n, (Activation)act);
        d_dx = dev_nan(t, n);
        op_act_bwd(be, d_dx, GRAD_WRITE, d_dy, d_x, n, (Activation)act);
        got_dx = dev_fetch(t, d_dx, n);
        snprintf(what, sizeof what, "%s bwd written", name);
        check_act(t, what, (Activation)act, got_dx, dx_w, n);
        free(dx_w);

        float *d_xx = dev_from(t, x, n);  // in place (y aliases x)
        op_act_fwd(be, d_xx, d_xx, n, (Activation)act);
        float *got_in = dev_fetch(t, d_xx, n);
        snprintf(what, sizeof what, "%s fwd in place", name);
        check_exact(t, what, got_in, got, n);

        // rounded to bf16 as stored: to_bf16 of this backend's fp32 output, bit for bit
        uint16_t *d_y16 = backend_alloc(be, n * sizeof(uint16_t), MEM_ACT);
        op_act_fwd16(be, d_y16, d_x, n, (Activation)act);
        float *got16 = dev_fetch_bits(t, d_y16, n), *want16 = host_bf16(got, n);
        snprintf(what, sizeof what, "%s fwd16", name);
        check_exact(t, what, got16, want16, n);

        // the backward on those bits: act_bwd on them widened, added to and written over NaN
        float *d_xb = dev_from(t, want16, n);
        for (int m = 0; m < 2; m++) {
            const GradMode mode = m ? GRAD_WRITE : GRAD_ADD;
            float *d_g[2];
            for (int k = 0; k < 2; k++) {
                d_g[k] = m ? dev_nan(t, n) : dev_from(t, dx0, n);
                if (k) op_act_bwd_x16(be, d_g[k], mode, d_dy, d_y16, n, (Activation)act);
                else op_act_bwd(be, d_g[k], mode, d_dy, d_xb, n, (Activation)act);
            }
            float *g0 = dev_fetch(t, d_g[0], n), *g1 = dev_fetch(t, d_g[1], n);
            snprintf(what, sizeof what, "%s bwd_x16 %s", name, m ? "written" : "added");
            check_exact(t, what, g1, g0, n);
            if (mode == GRAD_WRITE) {  // written in place over dy (the model's FFN backward), both forms
                for (int k = 0; k < 2; k++) {
                    float *d_io = dev_from(t, dy, n);
                    if (k) op_act_bwd_x16(be, d_io, mode, d_io, d_y16, n, (Activation)act);
                    else op_act_bwd(be, d_io, mode, d_io, d_xb, n, (Activation)act);
                    float *gi = dev_fetch(t, d_io, n);
                    snprintf(what, sizeof what, "%s bwd%s written in place over dy", name, k ? "_x16" : "");
                    check_exact(t, what, gi, g0, n);
                    free(gi), dev_free(t, d_io);
                }
            }
            free(g0), free(g1), dev_free(t, d_g[0]), dev_free(t, d_g[1]);
        }
        dev_free(t, d_xb);
        free(got16), free(want16);
        dev_free(t, d_y16);
        free(y), free(got), free(dx), free(got_dx), free(got_in);
        dev_free(t, d_y), dev_free(t, d_dx), dev_free(t, d_xx);
    }

    // add, aliased add, accumulate, scale: single IEEE operations, exact everywhere
    float *a = rand_floats(n, rng, -2, 2), *b = rand_floats(n, rng, -2, 2);
    float *d_a = dev_from(t, a, n), *d_b = dev_from(t, b, n);
    float *want = host_alloc(n);
    cpu_add(want, a, b, n);
    float *d_out = dev_from(t, dx0, n);
    op_add(be, d_out, d_a, d_b, n);
    float *got = dev_fetch(t, d_out, n);
    check_exact(t, "add", got, want, n);
    op_add(be, d_a, d_a, d_b, n);
    float *got_alias = dev_fetch(t, d_a, n);
    check_exact(t, "add in place", got_alias, want, n);

    float *acc = host_copy(dx0, n);
    cpu_accumulate(acc, b, n);
    float *d_acc = dev_from(t, dx0, n);
    op_accumulate(be, d_acc, d_b, n);
    float *got_acc = dev_fetch(t, d_acc, n);
    check_exact(t, "accumulate", got_acc, acc, n);
    cpu_scale(acc, -0.37f, n);
    op_scale(be, d_acc, -0.37f, n);
    free(got_acc);
    got_acc = dev_fetch(t, d_acc, n);
    check_exact(t, "scale", got_acc, acc, n);

    free(x), free(dy), free(dx0), free(a), free(b), free(want), free(got), free(got_alias), free(acc), free(got_acc);
    dev_free(t, d_x), dev_free(t, d_dy), dev_free(t, d_a), dev_free(t, d_b), dev_free(t, d_out), dev_free(t, d_acc);
}

/* ---- device scalars: sums, norm, clip factor, scale_by ---------------------------------- */

static float fetch1(const Target *t, const float *d) {
    float v = 0.0f;
    backend_download(t->be, &v, d, sizeof v);
    return v;
}

void test_scalars(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const size_t n = 1000003;
    float *x = rand_floats(n, rng, -1, 1);
    float *d_x = dev_from(t, x, n);
    const float start[2] = {0.75f, 0.0f};
    float *d_acc = dev_from(t, start, 2);
    float want = start[0];
    cpu_sum_acc(&want, x, n);
    op_sum_acc(be, d_acc, d_x, n);
    float got = fetch1(t, d_acc);
    TCHECK(fabs((double)got - want) <= tol(t, SCALAR_RTOL) * fabs((double)want), "%s: sum_acc got %.9g want %.9g",
           t->name, got, want);
    cpu_sumsq_acc(&want, x, n);  // accumulates onto the sum
    op_sumsq_acc(be, d_acc, d_x, n);
    got = fetch1(t, d_acc);
    TCHECK(fabs((double)got - want) <= tol(t, SCALAR_RTOL) * fabs((double)want),
           "%s: sumsq_acc got %.9g want %.9g", t->name, got, want);
    float *d_acc2 = dev_from(t, start, 2);  // the same bits on a second run
    op_sum_acc(be, d_acc2, d_x, n);
    op_sumsq_acc(be, d_acc2, d_x, n);
    float got2 = fetch1(t, d_acc2);
    TCHECK(memcmp(&got, &got2, sizeof got) == 0, "%s: sum_acc/sumsq_acc run to run: %.9g %.9g", t->name, got, got2);
    op_sumsq_acc(be, d_acc2, d_x, 1);  // one element, and none
    op_sum_acc(be, d_acc2, d_x, 0);
    float one = got2;
    cpu_sumsq_acc(&one, x, 1);
    TCHECK(fetch1(t, d_acc2) == one, "%s: sumsq_acc of one element", t->name);

    // clip_coef: clipping, no clipping (norm below max), switched off (max <= 0); exact everywhere
    const float parts[3] = {3.0f, 4.5f, 1.25f};
    float *d_parts = dev_from(t, parts, 3), *d_nc = dev_nan(t, 2);
    const float max_norms[3] = {1.0f, 100.0f, 0.0f};
    for (int i = 0; i < 3; i++) {
        float nc_want[2], nc_got[2];
        cpu_clip_coef(nc_want, parts, 3, max_norms[i]);
        op_clip_coef(be, d_nc, d_parts, 3, max_norms[i]);
        backend_download(be, nc_got, d_nc, sizeof nc_got);
        TCHECK(memcmp(nc_got, nc_want, sizeof nc_got) == 0, "%s: clip_coef max_norm %g: got (%.9g, %.9g) want (%.9g, %.9g)",
               t->name, (double)max_norms[i], nc_got[0], nc_got[1], nc_want[0], nc_want[1]);
        if (i == 0) TCHECK(nc_want[1] < 1.0f && nc_want[0] > 2.9f, "%s: clip_coef case clips", t->name);
    }

    // scale_by a device scalar: exact
    float *d_y = dev_from(t, x, n);
    const float s = -0.3125f;
    float *d_s = dev_from(t, &s, 1);
    op_scale_by(be, d_y, d_s, n);
    float *ref = host_copy(x, n);
    cpu_scale_by(ref, &s, n);
    float *got_y = dev_fetch(t, d_y, n);
    check_exact(t, "scale_by", got_y, ref, n);

    free(x), free(ref), free(got_y);
    dev_free(t, d_x), dev_free(t, d_acc), dev_free(t, d_acc2), dev_free(t, d_parts), dev_free(t, d_nc);
    dev_free(t, d_y), dev_free(t, d_s);
}

/* ---- bias ---------------------------------------------------------------------------- */

/* ---- fp32 <-> bf16 staging casts: bit for bit, specials and ties included ---------------- */

void test_bf16_convert(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const size_t n = 70001;
    float *x = rand_floats(n, rng, -3, 3);
    const uint32_t specials[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000001u,
                                 0x80000000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x3f80ffffu};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) memcpy(&x[i], &specials[i], sizeof(float));
    uint16_t *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    cpu_to_bf16(want, x, n);
    TCHECK(want[7] == 0x3f80 && want[8] == 0x3f82, "%s: to_bf16 ties to even (%04x %04x)", t->name, want[7], want[8]);
    float *d_x = dev_from(t, x, n);
    uint16_t *d_h = backend_alloc(be, n * sizeof *d_h, MEM_ACT);
    op_to_bf16(be, d_h, d_x, n);
    backend_download(be, got, d_h, n * sizeof *got);
    TCHECK(memcmp(got, want, n * sizeof *got) == 0, "%s: to_bf16 differs from the CPU reference", t->name);
    float *d_y = dev_nan(t, n);
    op_from_bf16(be, d_y, d_h, n);
    float *y = dev_fetch(t, d_y, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &y[i], sizeof u);
        bad += u != (uint32_t)want[i] << 16;
    }
    TCHECK(bad == 0, "%s: from_bf16 is not exact (%zu elements)", t->name, bad);
    /* round_bf16 in place: the same rounding, kept in fp32 (specials too) */
    float *d_r = dev_from(t, x, n);
    op_round_bf16(be, d_r, n);
    free(y);
    y = dev_fetch(t, d_r, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &y[i], sizeof u);
        bad += u != (uint32_t)want[i] << 16;
    }
    TCHECK(bad == 0, "%s: round_bf16 differs from to_bf16's rounding (%zu elements)", t->name, bad);
    dev_free(t, d_r);
    free(x), free(want), free(got), free(y);
    dev_free(t, d_x), dev_free(t, d_h), dev_free(t, d_y);
}

void test_bias(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const int N = 700, C = 70;  // 700 rows: eleven row chunks of 64 on the GPU, the last partial
    const size_t nc = (size_t)N * C;
    float *y = rand_floats(nc, rng, -1, 1), *b = rand_floats(C, rng, -1, 1);
    float *d_y = dev_from(t, y, nc), *d_b = dev_from(t, b, C);
    cpu_bias_add(y, b, N, C);
    op_bias_add(be, d_y, d_b, N, C);
    float *got = dev_fetch(t, d_y, nc);
    check_exact(t, "bias_add", got, y, nc);

    float *dy = rand_floats(nc, rng, -1, 1), *db0 = rand_floats(C, rng, -1, 1);
    float *db = host_copy(db0, C), *dy_sum = t->bf16 ? host_bf16(dy, nc) : host_copy(dy, nc);
    cpu_bias_bwd(db, dy_sum, N, C);  // in bf16 mode the sum of dy's bf16 rounding (ops_list.h)
    free(dy_sum);
    float *d_dy = dev_from(t, dy, nc), *d_db = dev_from(t, db0, C), *d_db2 = dev_from(t, db0, C);
    op_bias_bwd(be, d_db, d_dy, N, C);
    op_bias_bwd(be, d_db2, d_dy, N, C);
    float *got_db = dev_fetch(t, d_db, C), *got_db2 = dev_fetch(t, d_db2, C);
    check_rel(t, "bias_bwd", got_db, db, db0, C, tol(t, SUM_RTOL));
    check_exact(t, "bias_bwd run to run", got_db2, got_db, C);

    free(y), free(b), free(got), free(dy), free(db0), free(db), free(got_db), free(got_db2);
    dev_free(t, d_y), dev_free(t, d_b), dev_free(t, d_dy), dev_free(t, d_db), dev_free(t, d_db2);
}

/* ---- embedding and positions ----------------------------------------------------------- */

/* Forward and backward of the ids given (freed here) against the CPU, bit for bit. */
static void embedding_check(const Target *t, const char *name, int32_t *ids, int N, int C, int vocab_start,
                            int V_local, Rng *rng) {
    Backend *be = t->be;
    char what[96];
    const size_t nc = (size_t)N * C, vc = (size_t)V_local * C;
    float *table = rand_floats(vc, rng, -1, 1);
    const float scale = sqrtf((float)C);
    int32_t *d_ids = dev_from_i32(t, ids, N);
    float *d_table = dev_from(t, table, vc);

    float *out0 = rand_floats(nc, rng, -1, 1);  // garbage: the forward overwrites
    float *out = host_copy(out0, nc);
    cpu_embedding_fwd(out, ids, table, scale, N, C, vocab_start, V_local);
    float *d_out = dev_from(t, out0, nc);
    op_embedding_fwd(be, d_out, d_ids, d_table, scale, N, C, vocab_start, V_local);
    float *got = dev_fetch(t, d_out, nc);
    snprintf(what, sizeof what, "embedding fwd %s", name);
    check_exact(t, what, got, out, nc);

    float *dout = rand_floats(nc, rng, -1, 1), *dtable0 = rand_floats(vc, rng, -1, 1);
    float *dtable = host_copy(dtable0, vc);
    cpu_embedding_bwd(dtable, dout, ids, scale, N, C, vocab_start, V_local);
    float *d_dout = dev_from(t, dout, nc), *d_dtable = dev_from(t, dtable0, vc);
    op_embedding_bwd(be, d_dtable, d_dout, d_ids, scale, N, C, vocab_start, V_local);
    float *got_dt = dev_fetch(t, d_dtable, vc);
    snprintf(what, sizeof what, "embedding bwd %s", name);
    check_exact(t, what, got_dt, dtable, vc);                 // bit-identical on every backend
    check_rel(t, what, got_dt, dtable, dtable0, vc, 0.0);     // and it did add something

    free(ids), free(table), free(out0), free(out), free(got), free(dout), free(dtable0), free(dtable), free(got_dt);
    dev_free(t, d_ids), dev_free(t, d_table), dev_free(t, d_out), dev_free(t, d_dout), dev_free(t, d_dtable);
}

static void embedding_case(const Target *t, const char *name, int N, int C, int V, int vocab_start, int V_local,
                           Rng *rng) {
    int32_t *ids = TP_MALLOC((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) ids[n] = (int32_t)(rng_next(rng) % (uint64_t)V);
    ids[0] = vocab_start;                    // first row of the shard
    ids[N - 1] = vocab_start + V_local - 1;  // last row of the shard
    embedding_check(t, name, ids, N, C, vocab_start, V_local, rng);
}

/* Ids with runs of given lengths (a token repeated runs[r][1] times, as EOS,
 * padding and punctuation are in a batch), the other rows random ids of [0, V)
 * outside the runs, then shuffled: the GPU's backward adds a run's rows in
 * chunks of 32, and must still add them in increasing row order. */
static void embedding_runs_case(const Target *t, const char *name, int N, int C, int V, int vocab_start,
                                int V_local, const int (*runs)[2], int n_runs, Rng *rng) {
    int32_t *ids = TP_MALLOC((size_t)N * sizeof(int32_t));
    int n = 0;
    for (int r = 0; r < n_runs; r++)
        for (int k = 0; k < runs[r][1]; k++) ids[n++] = runs[r][0];
    TP_CHECK(n <= N, "embedding_runs_case %s: runs of %d rows in %d", name, n, N);
    while (n < N) {
        const int32_t id = (int32_t)(rng_next(rng) % (uint64_t)V);
        int taken = 0;
        for (int r = 0; r < n_runs; r++) taken |= id == runs[r][0];
        if (!taken) ids[n++] = id;
    }
    for (int i = N - 1; i > 0; i--) {  // Fisher-Yates
        const int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        const int32_t x = ids[i];
        ids[i] = ids[j], ids[j] = x;
    }
    embedding_check(t, name, ids, N, C, vocab_start, V_local, rng);
}

void test_embedding(const Target *t, Rng *rng) {
    embedding_case(t, "one shard", 300, 96, 40, 0, 40, rng);
    embedding_case(t, "shard 10..23 of 40", 300, 96, 40, 10, 13, rng);
    embedding_case(t, "wide rows, many repeats", 1000, 300, 7, 2, 4, rng);
    embedding_case(t, "one row", 1, 33, 5, 0, 5, rng);
    /* past CUB's single-tile sort, two 8-bit passes: on a GPU, CUB's storage
     * must fit scratch_sort_pairs_bound (embedding.cu dies otherwise) */
    embedding_case(t, "20000 ids of 32000 (multi-pass sort)", 20000, 8, 32000, 0, 32000, rng);
    /* the shard's last id 3000 times, its first 500, one 64 (two full chunks of
     * 32), the rest random over 1000 ids (other shards' too); C = 300: two
     * column groups of 256, the last warp partly past C */
    const int long_runs[3][2] = {{499, 3000}, {100, 500}, {200, 64}};
    embedding_runs_case(t, "long runs (3000, 500, 64 of 4096 rows)", 4096, 300, 1000, 100, 400, long_runs, 3, rng);
    /* one shard, only runs of 32 and 96 rows: the last run ends the sort on a chunk boundary */
    const int chunk_runs[2][2] = {{0, 32}, {1, 96}};
    embedding_runs_case(t, "runs of 32 and 96 ending the sort", 128, 40, 2, 0, 2, chunk_runs, 2, rng);

}

void test_positions(const Target *t, Rng *rng) {
    const int shapes[2][3] = {{3, 67, 64}, {2, 513, 128}};
    for (int s = 0; s < 2; s++) {
        const int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        const size_t n = (size_t)B * T * C;
        float *x = rand_floats(n, rng, -1, 1);
        float *d_x = dev_from(t, x, n);
        cpu_add_positions(x, B, T, C);
        op_add_positions(t->be, d_x, B, T, C);
        float *got = dev_fetch(t, d_x, n);
        char what[64];
        snprintf(what, sizeof what, "positions (%d, %d, %d)", B, T, C);
        check_close(t, what, got, x, n, 0.0, tol(t, POS_ATOL));
        free(x), free(got);
        dev_free(t, d_x);
    }
}

/* ---- layernorm -------------------------------------------------------------------------- */

static void layernorm_case(const Target *t, int N, int C, Rng *rng) {
    Backend *be = t->be;
    char what[96];
    const size_t nc = (size_t)N * C;
    const float eps = 1e-5f;
    float *x = rand_floats(nc, rng, -1, 1);
    for (size_t i = 0; i < nc; i++) x[i] += 3.0f;  // an offset the two-pass mean must remove
    float *gamma = rand_floats(C, rng, 0.5f, 1.5f), *beta = rand_floats(C, rng, -0.5f, 0.5f);
    float *y = host_alloc(nc), *mean = host_alloc(N), *rstd = host_alloc(N);
    cpu_layernorm_fwd(y, mean, rstd, x, gamma, beta, N, C, eps);
    float *d_x = dev_from(t, x, nc), *d_gamma = dev_from(t, gamma, C), *d_beta = dev_from(t, beta, C);
    float *d_y = dev_nan(t, nc), *d_mean = dev_nan(t, N), *d_rstd = dev_nan(t, N);
    op_layernorm_fwd(be, d_y, d_mean, d_rstd, d_x, d_gamma, d_beta, N, C, eps);
    float *got_y = dev_fetch(t, d_y, nc), *got_mean = dev_fetch(t, d_mean, N), *got_rstd = dev_fetch(t, d_rstd, N);
    snprintf(what, sizeof what, "layernorm fwd y (%d, %d)", N, C);
    check_rel(t, what, got_y, y, NULL, nc, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "layernorm fwd mean (%d, %d)", N, C);
    check_rel(t, what, got_mean, mean, NULL, N, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "layernorm fwd rstd (%d, %d)", N, C);
    check_rel(t, what, got_rstd, rstd, NULL, N, tol(t, SUM_RTOL));

    // backward from the CPU's saved statistics, twice (the same bits)
    float *dy = rand_floats(nc, rng, -1, 1);
    float *dx0 = rand_floats(nc, rng, -1, 1), *dg0 = rand_floats(C, rng, -1, 1), *db0 = rand_floats(C, rng, -1, 1);
    float *dx = host_copy(dx0, nc), *dg = host_copy(dg0, C), *db = host_copy(db0, C);
    cpu_layernorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C);
    float *d_dy = dev_from(t, dy, nc);
    backend_upload(be, d_mean, mean, N * sizeof(float));
    backend_upload(be, d_rstd, rstd, N * sizeof(float));
    float *got_dx[2], *got_dg[2], *got_db[2];
    for (int run = 0; run < 2; run++) {
        float *d_dx = dev_from(t, dx0, nc), *d_dg = dev_from(t, dg0, C), *d_db = dev_from(t, db0, C);
        op_layernorm_bwd(be, d_dx, d_dg, d_db, d_dy, d_x, d_mean, d_rstd, d_gamma, N, C);
        got_dx[run] = dev_fetch(t, d_dx, nc);
        got_dg[run] = dev_fetch(t, d_dg, C);
        got_db[run] = dev_fetch(t, d_db, C);
        dev_free(t, d_dx), dev_free(t, d_dg), dev_free(t, d_db);
    }
    snprintf(what, sizeof what, "layernorm bwd dx (%d, %d)", N, C);
    check_rel(t, what, got_dx[0], dx, dx0, nc, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "layernorm bwd dgamma (%d, %d)", N, C);
    check_rel(t, what, got_dg[0], dg, dg0, C, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "layernorm bwd dbeta (%d, %d)", N, C);
    check_rel(t, what, got_db[0], db, db0, C, tol(t, SUM_RTOL));
    snprintf(what, sizeof what, "layernorm bwd run to run (%d, %d)", N, C);
    check_exact(t, what, got_dx[1], got_dx[0], nc);
    check_exact(t, what, got_dg[1], got_dg[0], C);
    check_exact(t, what, got_db[1], got_db[0], C);

    float *host_bufs[] = {x, gamma, beta, y, mean, rstd, got_y, got_mean, got_rstd, dy, dx0, dg0, db0, dx, dg, db,
                          got_dx[0], got_dx[1], got_dg[0], got_dg[1], got_db[0], got_db[1]};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    float *dev_bufs[] = {d_x, d_gamma, d_beta, d_y, d_mean, d_rstd, d_dy};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

void test_layernorm(const Target *t, Rng *rng) {
    layernorm_case(t, 37, 300, rng);  // C not a multiple of 32 (nor of the CPU's column block)
    layernorm_case(t, 700, 64, rng);  // eleven row chunks for dgamma / dbeta on the GPU
    layernorm_case(t, 5, 1024, rng);
    /* CUDA's paths (layernorm_row.cuh): the model's width in registers
     * (float4), C % 4 != 0 (scalar loads), rows wider than the registers
     * (1024), and more row chunks (64 rows) than pass 2's 32 row-threads
     * times its four loads in flight */
    layernorm_case(t, 72, 512, rng);
    layernorm_case(t, 19, 510, rng);
    layernorm_case(t, 7, 1030, rng);
    layernorm_case(t, 6, 1152, rng);
    layernorm_case(t, 8300, 32, rng);
}

/* ---- dropout -------------------------------------------------------------------------- */

/* dropout_bwd_at's dx16 form (GRAD_WRITE) on the target, dy and dx16 off
 * their allocations' alignment by off elements (CUDA's scalar path for
 * off 1, its 4-wide one for 0): exactly the bf16 rounding (ref_bf16, not
 * the backends' own) of want, the reference's fp32 written values, on
 * every target (ops_list.h: only the store narrows). */
static void dropout_bwd16_check(const Target *t, const char *what, const float *dy, const float *want, size_t n,
                                size_t off, uint64_t first, float p, uint64_t seed, uint64_t stream) {
    float *dy_off = host_alloc(n + off);
    memcpy(dy_off + off, dy, n * sizeof(float));
    float *d_dy = dev_from(t, dy_off, n + off);
    uint16_t *d16 = dev_nan_bits(t, n + off);
    op_dropout_bwd_at(t->be, NULL, d16 + off, GRAD_WRITE, d_dy + off, n, first, p, seed, stream);
    float *got = dev_fetch_bits(t, d16 + off, n), *ref = host_bf16(want, n);
    char full[160];
    snprintf(full, sizeof full, "%s dx16 (+%zu) = bf16 of the fp32 form", what, off);
    check_exact(t, full, got, ref, n);
    free(dy_off), free(got), free(ref);
    dev_free(t, d_dy), dev_free(t, d16);
}

static void dropout_case(const Target *t, size_t n, float p, uint64_t seed, uint64_t stream, Rng *rng) {
    Backend *be = t->be;
    char what[128];
    float *x = rand_floats(n, rng, 0.5f, 1.5f);  // nonzero, so a zero output means dropped
    float *garbage = rand_floats(n, rng, -1, 1);
    float *y = host_alloc(n);
    cpu_dropout_fwd(y, x, n, p, seed, stream);
    float *d_x = dev_from(t, x, n), *d_y = dev_from(t, garbage, n);
    op_dropout_fwd(be, d_y, d_x, n, p, seed, stream);
    float *got = dev_fetch(t, d_y, n);
    snprintf(what, sizeof what, "dropout fwd n=%zu p=%g", n, (double)p);
    check_exact(t, what, got, y, n);

    float *d_in = dev_from(t, x, n);  // in place
    op_dropout_fwd(be, d_in, d_in, n, p, seed, stream);
    float *got_in = dev_fetch(t, d_in, n);
    snprintf(what, sizeof what, "dropout fwd in place n=%zu p=%g", n, (double)p);
    check_exact(t, what, got_in, y, n);

    float *dy = rand_floats(n, rng, -1, 1), *dx0 = rand_floats(n, rng, -1, 1);
    float *dx = host_copy(dx0, n);
    cpu_dropout_bwd(dx, GRAD_ADD, dy, n, p, seed, stream);
    float *d_dy = dev_from(t, dy, n), *d_dx = dev_from(t, dx0, n);
    op_dropout_bwd(be, d_dx, GRAD_ADD, d_dy, n, p, seed, stream);
    float *got_dx = dev_fetch(t, d_dx, n);
    snprintf(what, sizeof what, "dropout bwd n=%zu p=%g", n, (double)p);
    check_exact(t, what, got_dx, dx, n);

    float *dx_w = host_alloc(n);  // written over NaN garbage: the reference added into zeros
    cpu_dropout_bwd(dx_w, GRAD_ADD, dy, n, p, seed, stream);
    float *d_dx_w = dev_nan(t, n);
    op_dropout_bwd(be, d_dx_w, GRAD_WRITE, d_dy, n, p, seed, stream);
    float *got_w = dev_fetch(t, d_dx_w, n);
    snprintf(what, sizeof what, "dropout bwd written n=%zu p=%g", n, (double)p);
    check_exact(t, what, got_w, dx_w, n);
    dropout_bwd16_check(t, what, dy, dx_w, n, 0, 0, p, seed, stream);
    dropout_bwd16_check(t, what, dy, dx_w, n, 1, 0, p, seed, stream);

    float *host_bufs[] = {x, garbage, y, got, got_in, dy, dx0, dx, got_dx, dx_w, got_w};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    float *dev_bufs[] = {d_x, d_y, d_in, d_dy, d_dx, d_dx_w};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}

/* A window of the mask (sequence parallelism), also one whose blocks need
 * the counter's high word: forward, accumulating backward and written
 * backward (over NaN garbage) against the CPU. */
static void dropout_window_case(const Target *t, size_t n, uint64_t first, float p, uint64_t seed, uint64_t stream,
                                Rng *rng) {
    char what[128];
    float *x = rand_floats(n, rng, 0.5f, 1.5f), *y = host_alloc(n);
    cpu_dropout_fwd_at(y, x, n, first, p, seed, stream);
    float *d_x = dev_from(t, x, n);
    op_dropout_fwd_at(t->be, d_x, d_x, n, first, p, seed, stream);
    float *got = dev_fetch(t, d_x, n);
    snprintf(what, sizeof what, "dropout fwd window n=%zu at %llu", n, (unsigned long long)first);
    check_exact(t, what, got, y, n);
    float *dx = rand_floats(n, rng, -1, 1), *d_dx = dev_from(t, dx, n), *d_y = dev_from(t, x, n);
    cpu_dropout_bwd_at(dx, NULL, GRAD_ADD, x, n, first, p, seed, stream);
    op_dropout_bwd_at(t->be, d_dx, NULL, GRAD_ADD, d_y, n, first, p, seed, stream);
    float *got_dx = dev_fetch(t, d_dx, n);
    snprintf(what, sizeof what, "dropout bwd window n=%zu at %llu", n, (unsigned long long)first);
    check_exact(t, what, got_dx, dx, n);
    float *dx_w = host_alloc(n), *d_dx_w = dev_nan(t, n);
    cpu_dropout_bwd_at(dx_w, NULL, GRAD_ADD, x, n, first, p, seed, stream);
    op_dropout_bwd_at(t->be, d_dx_w, NULL, GRAD_WRITE, d_y, n, first, p, seed, stream);
    float *got_w = dev_fetch(t, d_dx_w, n);
    snprintf(what, sizeof what, "dropout bwd written window n=%zu at %llu", n, (unsigned long long)first);
    check_exact(t, what, got_w, dx_w, n);
    dropout_bwd16_check(t, what, x, dx_w, n, 0, first, p, seed, stream);
    free(x); free(y); free(got); free(dx); free(got_dx); free(dx_w); free(got_w);
    dev_free(t, d_x);
    dev_free(t, d_dx);
    dev_free(t, d_dx_w);
    dev_free(t, d_y);
}

void test_dropout(const Target *t, Rng *rng) {
    const uint64_t stream = dropout_stream(5, 3, 2, 1, 7);  // both 32-bit halves non-zero
    const uint64_t seed = 0x9234567890abcdefull;            // both halves, top bit set
    dropout_window_case(t, 4099, 1000, 0.1f, seed, stream, rng);
    dropout_window_case(t, 1001, (1ull << 34) + 8, 0.3f, seed, stream, rng);
    dropout_case(t, (1u << 17) + 3, 0.1f, seed, stream, rng);  // a partial last group
    dropout_case(t, 1001, 0.5f, seed + 1, stream + 1, rng);
    dropout_case(t, 4, 0.3f, seed, dropout_stream(0xffffffffu, 255, 255, 63, 1023), rng);
    dropout_case(t, 999, 0.0f, seed, stream, rng);  // copies / accumulates
    dropout_case(t, 999, 1.0f, seed, stream, rng);  // drops everything

    const size_t n = 1u << 16;  // the mask is not trivial: about p of the elements are dropped
    float *ones = host_alloc(n);
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    float *d = dev_from(t, ones, n);
    op_dropout_fwd(t->be, d, d, n, 0.25f, seed, stream);
    float *got = dev_fetch(t, d, n);
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) dropped += got[i] == 0.0f;
    const double frac = (double)dropped / n, sd = sqrt(0.25 * 0.75 / n);
    TCHECK(fabs(frac - 0.25) < 6 * sd, "%s: dropout dropped fraction %.4f, want 0.25", t->name, frac);
    free(ones), free(got);
    dev_free(t, d);
}

/* ---- adamw -------------------------------------------------------------------------- */

void test_adamw(const Target *t, Rng *rng) {
    const size_t n = 10007;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    float *p = rand_floats(n, rng, -1, 1), *m = rand_floats(n, rng, -0.1f, 0.1f), *v = rand_floats(n, rng, 0.0f, 0.01f);
    float *d_p = dev_from(t, p, n), *d_m = dev_from(t, m, n), *d_v = dev_from(t, v, n);
    float *p0 = host_copy(p, n);
    for (int step = 1; step <= 3; step++) {  // three steps, new gradients each
        float *g = rand_floats(n, rng, -0.1f, 0.1f);
        float *d_g = dev_from(t, g, n);
        cpu_adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, step);
        op_adamw(t->be, d_p, d_g, d_m, d_v, n, lr, beta1, beta2, eps, wd, step);
        free(g);
        dev_free(t, d_g);
    }
    float *got_p = dev_fetch(t, d_p, n), *got_m = dev_fetch(t, d_m, n), *got_v = dev_fetch(t, d_v, n);
    check_rel(t, "adamw p", got_p, p, NULL, n, tol(t, ADAM_RTOL));  // p against its own scale (~1)
    double moved = 0.0;
    for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs((double)p[i] - p0[i]));
    TCHECK(moved > 1e-3, "%s: adamw: the CPU update moved p by at most %g", t->name, moved);
    check_rel(t, "adamw m", got_m, m, NULL, n, tol(t, ADAM_RTOL));
    check_rel(t, "adamw v", got_v, v, NULL, n, tol(t, ADAM_RTOL));
    size_t n_same = 0;
    for (size_t i = 0; i < n; i++) n_same += memcmp(got_p + i, p + i, sizeof(float)) == 0;
    printf("test_backend_ops: %s: adamw bit-identical to the CPU on %zu of %zu parameters\n", t->name, n_same, n);
    free(p), free(m), free(v), free(p0), free(got_p), free(got_m), free(got_v);
    dev_free(t, d_p), dev_free(t, d_m), dev_free(t, d_v);
}

/* ---- grids beyond 65,535 blocks ----------------------------------------------------------
 * The CUDA launchers cap 1-D grids at 65,535 blocks and loop grid-stride
 * past them; these sizes need more blocks than that, so an element, row or
 * (batch, head) the loop skipped would show. */
void test_big_grids(const Target *t, Rng *rng) {
    Backend *be = t->be;
    const size_t n = (size_t)65535 * 256 + 1000;  // element-wise: 256 threads per block, 65,539 blocks
    float *x = rand_floats(n, rng, -1, 1), *y = rand_floats(n, rng, -1, 1);
    float *d_x = dev_from(t, x, n), *d_y = dev_from(t, y, n);
    cpu_accumulate(y, x, n);
    op_accumulate(be, d_y, d_x, n);
    float *got = dev_fetch(t, d_y, n);
    check_exact(t, "accumulate, 65539 blocks of elements", got, y, n);
    free(got);
    dev_free(t, d_x), dev_free(t, d_y);
    free(x), free(y);

    const int N = 70001, C = 8, V = 50;  // one block per row: 70001 rows
    int32_t *ids = TP_MALLOC((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(rng_next(rng) % V);
    float *table = rand_floats((size_t)V * C, rng, -1, 1), *out = host_alloc((size_t)N * C);
    cpu_embedding_fwd(out, ids, table, 1.5f, N, C, 0, V);
    int32_t *d_ids = dev_from_i32(t, ids, N);
    float *d_table = dev_from(t, table, (size_t)V * C), *d_out = dev_nan(t, (size_t)N * C);
    op_embedding_fwd(be, d_out, d_ids, d_table, 1.5f, N, C, 0, V);
    got = dev_fetch(t, d_out, (size_t)N * C);
    check_exact(t, "embedding fwd, 70001 rows", got, out, (size_t)N * C);
    free(got);

    float *losses = host_alloc(N), *lse = host_alloc(N);  // cross-entropy: one block per row too
    float *wide = rand_floats((size_t)N * V, rng, -3, 3);     // (N, V) logits; the ids are the targets
    cpu_xent_fwd(losses, lse, wide, ids, N, V, 0.1f, 3);
    float *d_wide = dev_from(t, wide, (size_t)N * V), *d_losses = dev_nan(t, N), *d_lse = dev_nan(t, N);
    op_xent_fwd(be, d_losses, d_lse, d_wide, d_ids, N, V, 0.1f, 3);
    got = dev_fetch(t, d_losses, N);
    check_rel(t, "xent fwd, 70001 rows", got, losses, NULL, N, tol(t, SUM_RTOL));
    free(got);

    const int Nl = 600000, Cl = 4;  // layernorm: 8 rows per block, 75,000 blocks
    float *lx = rand_floats((size_t)Nl * Cl, rng, -1, 1), *g = rand_floats(Cl, rng, 0.5f, 1.5f);
    float *bta = rand_floats(Cl, rng, -0.5f, 0.5f), *ly = host_alloc((size_t)Nl * Cl);
    float *mean = host_alloc(Nl), *rstd = host_alloc(Nl);
    cpu_layernorm_fwd(ly, mean, rstd, lx, g, bta, Nl, Cl, 1e-5f);
    float *d_lx = dev_from(t, lx, (size_t)Nl * Cl), *d_g = dev_from(t, g, Cl), *d_b = dev_from(t, bta, Cl);
    float *d_ly = dev_nan(t, (size_t)Nl * Cl), *d_mean = dev_nan(t, Nl), *d_rstd = dev_nan(t, Nl);
    op_layernorm_fwd(be, d_ly, d_mean, d_rstd, d_lx, d_g, d_b, Nl, Cl, 1e-5f);
    got = dev_fetch(t, d_ly, (size_t)Nl * Cl);
    check_rel(t, "layernorm fwd, 600000 rows", got, ly, NULL, (size_t)Nl * Cl, tol(t, SUM_RTOL));
    free(got);

    free(ids), free(table), free(out), free(losses), free(lse), free(wide);
    free(lx), free(g), free(bta), free(ly), free(mean), free(rstd);
    void *dev_bufs[] = {d_ids, d_table, d_out, d_wide, d_losses, d_lse, d_lx, d_g, d_b, d_ly, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(t, dev_bufs[i]);
}
