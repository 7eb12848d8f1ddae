/* test_params_init: the parameters' first values (transformer/params_init.c)
 * are those of the definition, bit for bit, on any number of threads.
 *
 * The reference below is the definition written the plain way: each whole
 * tensor drawn element by element on one thread (Philox of (g, tensor,
 * 0x1A17) under the seed; Box-Muller for the embedding, Xavier-uniform for
 * matrices, 1 for LayerNorm gains, 0 for biases), then this rank's shard
 * cut out of it. params_init_threads must equal it (memcmp) for tp 1, 2, 3
 * (every rank; a vocabulary that leaves padding rows), for pipeline stages,
 * and for 1 to 16 threads, so cut points fall inside tensors. The buffer is
 * filled with NaN bytes first: an element no thread writes fails. And the
 * tp shards placed back together are the tp = 1 model.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/ops.h"
#include "transformer/params.h"
#include "transformer/stage.h"

static float unit(uint32_t u) { return ((float)(u >> 8) + 1.0f) * (1.0f / 16777216.0f); }

static void reference(float *base, const ParamTable *tab, const ModelConfig *cfg, int tp_rank, unsigned long long seed) {
    ParamTable all;
    param_table_build(cfg, tab->tp, &all);
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (int k = 0; k < tab->n; k++) {
        const ParamInfo *p = &tab->t[k];
        const uint32_t i = (uint32_t)(param_table_find(&all, p->name) - all.t);
        const size_t n = param_global_elems(p);
        float *whole = malloc(n * sizeof(float));
        const char *leaf = strrchr(p->name, '.');
        for (size_t g = 0; g < n; g++) {
            const uint32_t ctr[4] = {(uint32_t)g, (uint32_t)((uint64_t)g >> 32), i, 0x1A17u};
            uint32_t w[4];
            philox4x32_10(ctr, key, w);
            if (p->split == SPLIT_VOCAB)
                whole[g] = sqrtf(-2.0f * logf(unit(w[0]))) * cosf(6.2831853f * unit(w[1])) / sqrtf((float)cfg->d_model);
            else if (p->ndim == 2)
                whole[g] = sqrtf(6.0f / (float)(p->shape[0] + p->shape[1])) * (2.0f * unit(w[0]) - 1.0f);
            else
                whole[g] = strcmp(leaf, ".weight") == 0 ? 1.0f : 0.0f;
        }
        shard_extract(p, tp_rank, whole, base + p->offset);
        free(whole);
    }
    param_table_free(&all);
}

/* Every thread count against the reference, for one table. */
static void check_table(const ParamTable *tab, const ModelConfig *cfg, int tp_rank, const char *what) {
    const size_t bytes = tab->n_elems * sizeof(float);
    float *want = malloc(bytes), *got = malloc(bytes);
    memset(want, 0xFF, bytes);
    reference(want, tab, cfg, tp_rank, 0x123456789ABCDEFull);
    static const int threads[] = {1, 2, 3, 7, 16};
    for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
        memset(got, 0xFF, bytes);  // NaN: an element left unwritten fails
        params_init_threads(got, tab, cfg, tp_rank, 0x123456789ABCDEFull, threads[k]);
        CHECK(memcmp(want, got, bytes) == 0, "%s, tp rank %d, %d threads: differs from the reference", what, tp_rank,
              threads[k]);
    }
    memset(got, 0xFF, bytes);
    params_init(got, tab, cfg, tp_rank, 0x123456789ABCDEFull);  // the default thread count
    CHECK(memcmp(want, got, bytes) == 0, "%s, tp rank %d, params_init: differs from the reference", what, tp_rank);
    free(want);
    free(got);
}

int main(void) {
    ModelConfig cfg;
    char err[256];
    config_preset("tiny", &cfg, err, sizeof err);
    cfg.d_model = 96, cfg.n_heads = 6, cfg.d_ff = 192, cfg.vocab_size = 1001;  // tp 2 and 3 pad the vocabulary
    CHECK(config_validate(&cfg, err, sizeof err) == 0, "%s", err);
    ParamTable one;
    param_table_build(&cfg, 1, &one);
    check_table(&one, &cfg, 0, "tp 1");
    float *whole = malloc(one.n_elems * sizeof(float));
    params_init_threads(whole, &one, &cfg, 0, 7, 3);
    size_t ones = 0, distinct = 0;
    for (size_t e = 0; e < one.n_elems; e++) ones += whole[e] == 1.0f, distinct += e && whole[e] != whole[e - 1];
    CHECK(distinct > one.n_elems / 2 && ones > 0, "tp 1: %zu distinct neighbours, %zu ones: not drawn values", distinct,
          ones);
    for (int tp = 2; tp <= 3; tp++) {
        ParamTable t;
        param_table_build(&cfg, tp, &t);
        float *placed = malloc(one.n_elems * sizeof(float)), *shard = malloc(t.n_elems * sizeof(float));
        memset(placed, 0xFF, one.n_elems * sizeof(float));
        for (int r = 0; r < tp; r++) {
            char what[32];
            snprintf(what, sizeof what, "tp %d", tp);
            check_table(&t, &cfg, r, what);
            params_init_threads(shard, &t, &cfg, r, 7, 5);
            for (int i = 0; i < t.n; i++) shard_place(&t.t[i], r, shard + t.t[i].offset, placed + one.t[i].offset);
        }
        CHECK(memcmp(placed, whole, one.n_elems * sizeof(float)) == 0, "tp %d: the shards placed are not the tp 1 model",
              tp);
        free(placed);
        free(shard);
        param_table_free(&t);
    }
    ModelStage st[4];
    CHECK(model_stages_make(&cfg, 3, NULL, st, err, sizeof err) == 0, "%s", err);
    for (int s = 0; s < 3; s++) {
        ParamTable t;
        param_table_build_stage(&cfg, 2, &st[s], &t);
        char what[32];
        snprintf(what, sizeof what, "tp 2, stage %d of 3", s);
        check_table(&t, &cfg, 1, what);
        param_table_free(&t);
    }
    free(whole);
    param_table_free(&one);
    return check_report("test_params_init");
}
