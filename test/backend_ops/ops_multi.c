/* ops_multi.c: the multi-tensor ops (op_sumsq_segs, op_adamw_segs) over a
 * segment table shaped to reach every path of the one-launch kernels:
 * empty and one-element segments, sizes at and around the chunk length,
 * gaps the table skips, more segments than a block has threads (the last
 * block's batches), three accumulators, gradients and state at other
 * offsets than the parameters (ZeRO-2's shard). Each backend is compared
 * with the CPU reference (cpu_*_segs) and with its own one-op-per-segment
 * sequence, which the trainer ran before: bit for bit on the CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ops/harness.h"

#define N_SEGS 300  // > the 256 threads of the CUDA finishing block

typedef struct {
    OpSeg segs[N_SEGS];
    size_t nx, ng, ns;  // elements spanned in x (parameters), gradients, state
} SegCase;

static uint64_t seg_len(int i, Rng *rng) {
    static const uint64_t special[] = {0, 1, 31, OP_SEG_CHUNK_ELEMS - 1, OP_SEG_CHUNK_ELEMS, OP_SEG_CHUNK_ELEMS + 1,
                                       3 * OP_SEG_CHUNK_ELEMS + 7, 0, 2};
    const int n_special = (int)(sizeof special / sizeof special[0]);
    return i < n_special ? special[i] : 1 + rng_next(rng) % 700;
}

/* Segments laid out in order with gaps of 0..5 elements; the gradients
 * and state in another order of gaps, so their offsets differ from x's. */
static void make_case(SegCase *c, Rng *rng) {
    size_t x = 0, g = 3, s = 0;
    for (int i = 0; i < N_SEGS; i++) {
        const uint64_t n = seg_len(i, rng);
        x += rng_next(rng) % 6, g += rng_next(rng) % 4, s += (size_t)(i % 2);
        c->segs[i] = (OpSeg){.x_at = x, .g_at = g, .s_at = s, .n = n, .acc = (int32_t)(rng_next(rng) % 3),
                             .decay = (int32_t)(i % 3 != 0)};
        x += n, g += n, s += n;
    }
    c->nx = x + 5, c->ng = g + 5, c->ns = s + 5;
}

static void test_sumsq_segs(const Target *t, const SegCase *c, const OpSegTable *tab, Rng *rng) {
    Backend *be = t->be;
    float *x = rand_floats(c->nx, rng, -1, 1), *d_x = dev_from(t, x, c->nx);
    const float start[3] = {0.5f, 2.0f, 0.0f};
    float want[3];
    memcpy(want, start, sizeof want);
    cpu_sumsq_segs(want, x, c->segs, N_SEGS);
    float *d_acc = dev_from(t, start, 3), *d_loop = dev_from(t, start, 3);
    op_sumsq_segs(be, d_acc, d_x, tab);
    for (int i = 0; i < N_SEGS; i++) op_sumsq_acc(be, d_loop + c->segs[i].acc, d_x + c->segs[i].x_at, c->segs[i].n);
    float got[3], loop[3];
    backend_download(be, got, d_acc, sizeof got);
    backend_download(be, loop, d_loop, sizeof loop);
    for (int k = 0; k < 3; k++) {
        TCHECK(want[k] > start[k] + 100.0f, "%s: sumsq_segs: accumulator %d gained only %g", t->name, k,
               (double)(want[k] - start[k]));
        TCHECK(fabs((double)got[k] - want[k]) <= tol(t, SEGS_SCALAR_RTOL) * fabs((double)want[k]),
               "%s: sumsq_segs acc %d got %.9g want %.9g", t->name, k, got[k], want[k]);
        TCHECK(fabs((double)got[k] - loop[k]) <= tol(t, SEGS_SCALAR_RTOL) * fabs((double)loop[k]),
               "%s: sumsq_segs acc %d got %.9g, one sumsq_acc per segment %.9g", t->name, k, got[k], loop[k]);
    }
    op_sumsq_segs(be, d_acc, d_x, tab);  // a second launch adds as much again (its counter was reset)
    float again[3], want2[3];
    memcpy(want2, want, sizeof want2);
    cpu_sumsq_segs(want2, x, c->segs, N_SEGS);
    backend_download(be, again, d_acc, sizeof again);
    for (int k = 0; k < 3; k++)
        TCHECK(fabs((double)again[k] - want2[k]) <= tol(t, SEGS_SCALAR_RTOL) * fabs((double)want2[k]),
               "%s: sumsq_segs second launch, acc %d got %.9g want %.9g", t->name, k, again[k], want2[k]);
    free(x);
    dev_free(t, d_x), dev_free(t, d_acc), dev_free(t, d_loop);
}

static void test_adamw_segs(const Target *t, const SegCase *c, const OpSegTable *tab, Rng *rng) {
    Backend *be = t->be;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    float *p = rand_floats(c->nx, rng, -1, 1), *m = rand_floats(c->ns, rng, -0.1f, 0.1f);
    float *v = rand_floats(c->ns, rng, 0.0f, 0.01f), *p0 = host_copy(p, c->nx);
    float *d_p = dev_from(t, p, c->nx), *d_m = dev_from(t, m, c->ns), *d_v = dev_from(t, v, c->ns);
    float *d_pl = dev_from(t, p, c->nx), *d_ml = dev_from(t, m, c->ns), *d_vl = dev_from(t, v, c->ns);
    for (int step = 1; step <= 3; step++) {
        float *g = rand_floats(c->ng, rng, -0.1f, 0.1f), *d_g = dev_from(t, g, c->ng);
        cpu_adamw_segs(p, g, m, v, c->segs, N_SEGS, lr, b1, b2, eps, wd, step);
        op_adamw_segs(be, d_p, d_g, d_m, d_v, tab, lr, b1, b2, eps, wd, step);
        for (int i = 0; i < N_SEGS; i++) {  // the per-tensor sequence the trainer ran before
            const OpSeg *s = &c->segs[i];
            op_adamw(be, d_pl + s->x_at, d_g + s->g_at, d_ml + s->s_at, d_vl + s->s_at, s->n, lr, b1, b2, eps,
                     s->decay ? wd : 0.0f, step);
        }
        free(g);
        dev_free(t, d_g);
    }
    float *got_p = dev_fetch(t, d_p, c->nx), *got_m = dev_fetch(t, d_m, c->ns), *got_v = dev_fetch(t, d_v, c->ns);
    check_rel(t, "adamw_segs p", got_p, p, NULL, c->nx, tol(t, ADAM_RTOL));
    check_rel(t, "adamw_segs m", got_m, m, NULL, c->ns, tol(t, ADAM_RTOL));
    check_rel(t, "adamw_segs v", got_v, v, NULL, c->ns, tol(t, ADAM_RTOL));
    unsigned char *gap = calloc(c->nx, 1);  // parameters no segment covers stay as they were
    memset(gap, 1, c->nx);
    for (int i = 0; i < N_SEGS; i++) memset(gap + c->segs[i].x_at, 0, c->segs[i].n);
    check_exact_where(t, "adamw_segs leaves the gaps", got_p, p0, gap, c->nx);
    float *loop_p = dev_fetch(t, d_pl, c->nx), *loop_m = dev_fetch(t, d_ml, c->ns);
    check_exact(t, "adamw_segs p against one adamw per segment", got_p, loop_p, c->nx);
    check_exact(t, "adamw_segs m against one adamw per segment", got_m, loop_m, c->ns);
    double moved = 0.0;
    for (size_t i = 0; i < c->nx; i++) moved = fmax(moved, fabs((double)p[i] - p0[i]));
    TCHECK(moved > 1e-3, "%s: adamw_segs: the CPU update moved p by at most %g", t->name, moved);
    free(p), free(m), free(v), free(p0), free(gap), free(got_p), free(got_m), free(got_v), free(loop_p), free(loop_m);
    dev_free(t, d_p), dev_free(t, d_m), dev_free(t, d_v), dev_free(t, d_pl), dev_free(t, d_ml), dev_free(t, d_vl);
}

void test_multi_tensor(const Target *t, Rng *rng) {
    SegCase *c = calloc(1, sizeof *c);
    make_case(c, rng);
    OpSegTable *tab = op_segs_create(t->be, c->segs, N_SEGS, MEM_OPTIM);
    TCHECK(tab->n_segs == N_SEGS - 2, "%s: op_segs_create kept %d of %d segments (2 are empty)", t->name, tab->n_segs,
           N_SEGS);
    test_sumsq_segs(t, c, tab, rng);
    test_adamw_segs(t, c, tab, rng);
    OpSegTable *none = op_segs_create(t->be, c->segs, 0, MEM_OPTIM);  // an empty table adds nothing
    const float start = 1.5f;
    float *d_acc = dev_from(t, &start, 1), got = 0.0f;
    op_sumsq_segs(t->be, d_acc, d_acc, none);
    backend_download(t->be, &got, d_acc, sizeof got);
    TCHECK(got == start, "%s: sumsq_segs over no segments changed the accumulator to %g", t->name, got);
    op_segs_free(t->be, none);
    op_segs_free(t->be, tab);
    dev_free(t, d_acc);
    free(c);
}
