/* params_init.c: the parameters' first values, drawn on the host.
 *
 * Every element is a pure function of (seed, tensor index in the whole
 * model's table, global position): Philox4x32-10 of counter (g lo, g hi,
 * tensor, 0x1A17) under key (seed lo, seed hi). So a rank computes only
 * its own shard's elements (each mapped to its global position, never the
 * whole tensor), and the buffer is cut into equal ranges filled by threads
 * without any state between them: the values are those of one thread, bit
 * for bit, whatever the thread count or layout (test_params_init).
 */
#include "transformer/params.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "philox.h"
#include "tp/threads.h"

/* Below this many elements per thread, another thread costs more than it saves. */
#define INIT_MIN_ELEMS_PER_THREAD ((size_t)1 << 18)
#define INIT_MAX_THREADS 64

typedef struct {
    const ParamInfo *p;
    uint32_t index;  // in the whole model's table: the Philox counter's tensor word
    bool one;        // 1-D: a LayerNorm gain ("*.weight") is 1, anything else 0
} InitTensor;

typedef struct {
    const InitTensor *t;
    int n;
    float *base;
    int tp_rank;
    unsigned long long seed;
    int d_model;
    size_t lo, hi;  // this job's range of buffer elements
} InitJob;

static float unit(uint32_t u) { return ((float)(u >> 8) + 1.0f) * (1.0f / 16777216.0f); }  // (0, 1]

/* Element e of the shard of t. */
static float init_value(const InitTensor *t, const InitJob *j, size_t e) {
    const ParamInfo *p = t->p;
    if (p->split != SPLIT_VOCAB && p->ndim != 2) return t->one ? 1.0f : 0.0f;
    const int cols = p->ndim == 2 ? p->local[1] : 1, gcols = p->ndim == 2 ? p->shape[1] : 1;
    int gr, gc;
    if (!shard_to_global(p, j->tp_rank, (int)(e / (size_t)cols), (int)(e % (size_t)cols), &gr, &gc))
        return 0.0f;  // vocabulary padding
    const size_t g = (size_t)gr * (size_t)gcols + (size_t)gc;
    const uint32_t key[2] = {(uint32_t)j->seed, (uint32_t)(j->seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)g, (uint32_t)((uint64_t)g >> 32), t->index, 0x1A17u};
    uint32_t w[4];
    philox4x32_10_inline(ctr, key, w);
    if (p->split == SPLIT_VOCAB)  // N(0, C^-1/2) by Box-Muller: the embedding is scaled by sqrt(C)
        return sqrtf(-2.0f * logf(unit(w[0]))) * cosf(6.2831853f * unit(w[1])) / sqrtf((float)j->d_model);
    /* Xavier uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)). */
    return sqrtf(6.0f / (float)(p->shape[0] + p->shape[1])) * (2.0f * unit(w[0]) - 1.0f);
}

static void *init_range(void *arg) {
    const InitJob *j = arg;
    for (int i = 0; i < j->n; i++) {
        const ParamInfo *p = j->t[i].p;
        const size_t lo = p->offset > j->lo ? p->offset : j->lo;
        const size_t hi = p->offset + p->n_elems < j->hi ? p->offset + p->n_elems : j->hi;
        for (size_t k = lo; k < hi; k++) j->base[k] = init_value(&j->t[i], j, k - p->offset);
    }
    return NULL;
}

void params_init_threads(float *base, const ParamTable *tab, const ModelConfig *cfg, int tp_rank,
                         unsigned long long seed, int n_threads) {
    /* a tensor's values are keyed by its index in the whole model's table,
     * so a pipeline stage's table gets the values the whole model has */
    ParamTable all;
    param_table_build(cfg, tab->tp, &all);
    InitTensor *t = TP_MALLOC((size_t)(tab->n > 0 ? tab->n : 1) * sizeof *t);
    size_t end = 0;
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i], *pw = param_table_find(&all, p->name);
        TP_CHECK(pw, "parameter %s is not in the model", p->name);
        const char *leaf = strrchr(p->name, '.');
        t[i] = (InitTensor){.p = p, .index = (uint32_t)(pw - all.t), .one = leaf && strcmp(leaf, ".weight") == 0};
        if (p->offset + p->n_elems > end) end = p->offset + p->n_elems;
    }
    int nt = n_threads < 1 ? 1 : n_threads > INIT_MAX_THREADS ? INIT_MAX_THREADS : n_threads;
    if ((size_t)nt > end) nt = end > 0 ? (int)end : 1;  // a range of one element at least
    InitJob jobs[INIT_MAX_THREADS];
    pthread_t th[INIT_MAX_THREADS];
    bool started[INIT_MAX_THREADS] = {false};
    for (int k = 0; k < nt; k++) {
        jobs[k] = (InitJob){.t = t, .n = tab->n, .base = base, .tp_rank = tp_rank, .seed = seed,
                            .d_model = cfg->d_model, .lo = end / (size_t)nt * (size_t)k,
                            .hi = k == nt - 1 ? end : end / (size_t)nt * (size_t)(k + 1)};
        if (k > 0) started[k] = pthread_create(&th[k], NULL, init_range, &jobs[k]) == 0;
    }
    init_range(&jobs[0]);
    for (int k = 1; k < nt; k++) {
        if (started[k]) pthread_join(th[k], NULL);
        else init_range(&jobs[k]);  // no thread to be had: this one does it
    }
    free(t);
    param_table_free(&all);
}

void params_init(float *base, const ParamTable *tab, const ModelConfig *cfg, int tp_rank,
                 unsigned long long seed) {
    const size_t most = tab->n_elems / INIT_MIN_ELEMS_PER_THREAD + 1;
    const long nt = tp_threads_here();
    params_init_threads(base, tab, cfg, tp_rank, seed, (size_t)nt > most ? (int)most : (int)nt);
}
