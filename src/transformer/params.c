/* params.c: the table of named tensors and the views onto one buffer.
 *
 * One walk over the model (walk_model) both lists the tensors (names,
 * shapes, split labels, offsets) and binds a Weights view to a buffer, so
 * the order can never differ between the table and the pointers.
 */
#include "transformer/params.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include "err.h"

typedef struct {
    ParamTable *tab;   // when non-NULL, tensors are appended here
    int cap;
    float *base;       // when non-NULL, pointers are bound into it
    size_t offset;     // running offset in elements
} Walk;

static float *add(Walk *w, const char *name, int rows, int cols, SplitLabel split) {
    size_t n = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    if (w->tab) {
        ParamTable *t = w->tab;
        if (t->n == w->cap) {
            w->cap = w->cap ? 2 * w->cap : 64;
            t->t = realloc(t->t, (size_t)w->cap * sizeof *t->t);
            TP_CHECK(t->t, "out of memory growing the parameter table");
        }
        ParamInfo *p = &t->t[t->n++];
        memset(p, 0, sizeof *p);
        TP_CHECK(strlen(name) < sizeof p->name, "parameter name too long: %s", name);
        strcpy(p->name, name);
        p->ndim = cols > 0 ? 2 : 1;
        p->shape[0] = rows;
        p->shape[1] = cols > 0 ? cols : 0;
        p->split = split;
        p->decay = p->ndim == 2;
        p->offset = w->offset;
        p->n_elems = n;
        t->n_elems = w->offset + n;
    }
    float *ptr = w->base ? w->base + w->offset : NULL;
    w->offset += n;
    return ptr;
}

static void walk_ln(Walk *w, const char *prefix, float **g, float **b, int C) {
    char name[128];
    snprintf(name, sizeof name, "%s.weight", prefix);
    *g = add(w, name, C, 0, SPLIT_REPL);
    snprintf(name, sizeof name, "%s.bias", prefix);
    *b = add(w, name, C, 0, SPLIT_REPL);
}

static void walk_attn(Walk *w, const char *prefix, const char *kind, AttnW *a, int C) {
    char name[128], ln[128];
    snprintf(ln, sizeof ln, "%s.%s_ln", prefix, kind);
    walk_ln(w, ln, &a->ln_g, &a->ln_b, C);
    const char *proj[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    float **ws[4] = {&a->wq, &a->wk, &a->wv, &a->wo};
    float **bs[4] = {&a->bq, &a->bk, &a->bv, &a->bo};
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%s.%s.%s.weight", prefix, kind, proj[i]);
        *ws[i] = add(w, name, C, C, i < 3 ? SPLIT_COL : SPLIT_ROW);
        snprintf(name, sizeof name, "%s.%s.%s.bias", prefix, kind, proj[i]);
        *bs[i] = add(w, name, C, 0, i < 3 ? SPLIT_COL : SPLIT_REPL);
    }
}

static void walk_ffn(Walk *w, const char *prefix, FfnW *f, int C, int F) {
    char name[128];
    snprintf(name, sizeof name, "%s.ffn_ln", prefix);
    walk_ln(w, name, &f->ln_g, &f->ln_b, C);
    snprintf(name, sizeof name, "%s.ffn.fc1.weight", prefix);
    f->w1 = add(w, name, F, C, SPLIT_COL);
    snprintf(name, sizeof name, "%s.ffn.fc1.bias", prefix);
    f->b1 = add(w, name, F, 0, SPLIT_COL);
    snprintf(name, sizeof name, "%s.ffn.fc2.weight", prefix);
    f->w2 = add(w, name, C, F, SPLIT_ROW);
    snprintf(name, sizeof name, "%s.ffn.fc2.bias", prefix);
    f->b2 = add(w, name, C, 0, SPLIT_REPL);
}

static void walk_model(Walk *w, const ModelConfig *cfg, Weights *out) {
    const int C = cfg->d_model, F = cfg->d_ff;
    char prefix[64];
    out->embed = add(w, "embed.weight", cfg->vocab_size, C, SPLIT_VOCAB);
    for (int l = 0; l < cfg->enc_layers; l++) {
        snprintf(prefix, sizeof prefix, "encoder.layers.%d", l);
        walk_attn(w, prefix, "self_attn", &out->enc[l].self, C);
        walk_ffn(w, prefix, &out->enc[l].ffn, C, F);
    }
    walk_ln(w, "encoder.final_ln", &out->enc_ln_g, &out->enc_ln_b, C);
    for (int l = 0; l < cfg->dec_layers; l++) {
        snprintf(prefix, sizeof prefix, "decoder.layers.%d", l);
        walk_attn(w, prefix, "self_attn", &out->dec[l].self, C);
        walk_attn(w, prefix, "cross_attn", &out->dec[l].cross, C);
        walk_ffn(w, prefix, &out->dec[l].ffn, C, F);
    }
    walk_ln(w, "decoder.final_ln", &out->dec_ln_g, &out->dec_ln_b, C);
}

static void weights_alloc(Weights *w, const ModelConfig *cfg) {
    memset(w, 0, sizeof *w);
    w->enc = TP_CALLOC((size_t)cfg->enc_layers, sizeof *w->enc);
    w->dec = TP_CALLOC((size_t)cfg->dec_layers, sizeof *w->dec);
}

void param_table_build(const ModelConfig *cfg, ParamTable *tab) {
    memset(tab, 0, sizeof *tab);
    Weights scratch;
    weights_alloc(&scratch, cfg);
    Walk w = {.tab = tab};
    walk_model(&w, cfg, &scratch);
    weights_free(&scratch);
}

void param_table_free(ParamTable *tab) {
    free(tab->t);
    memset(tab, 0, sizeof *tab);
}

const ParamInfo *param_table_find(const ParamTable *tab, const char *name) {
    for (int i = 0; i < tab->n; i++)
        if (strcmp(tab->t[i].name, name) == 0) return &tab->t[i];
    return NULL;
}

void weights_bind(Weights *w, const ModelConfig *cfg, float *base) {
    weights_alloc(w, cfg);
    Walk walk = {.base = base};
    walk_model(&walk, cfg, w);
}

void weights_free(Weights *w) {
    free(w->enc);
    free(w->dec);
    memset(w, 0, sizeof *w);
}

const char *split_label_name(SplitLabel s) {
    switch (s) {
    case SPLIT_COL: return "COL";
    case SPLIT_ROW: return "ROW";
    case SPLIT_VOCAB: return "VOCAB";
    default: return "REPL";
    }
}

/* Uniform in (0, 1] from the counter-based generator: word (tensor, i). */
typedef struct { uint32_t key[2]; uint32_t tensor; uint64_t counter; uint32_t buf[4]; int left; } InitRng;

static float init_uniform(InitRng *r) {
    if (r->left == 0) {
        uint32_t ctr[4] = {(uint32_t)r->counter, (uint32_t)(r->counter >> 32), r->tensor, 0x1A17u};
        philox4x32_10(ctr, r->key, r->buf);
        r->counter++;
        r->left = 4;
    }
    uint32_t u = r->buf[--r->left];
    return ((float)(u >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

void params_init(float *base, const ParamTable *tab, const ModelConfig *cfg,
                 unsigned long long seed) {
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        float *x = base + p->offset;
        InitRng r = {.key = {(uint32_t)seed, (uint32_t)(seed >> 32)}, .tensor = (uint32_t)i};
        const char *leaf = strrchr(p->name, '.');
        if (p->split == SPLIT_VOCAB) {
            /* N(0, C^-1/2) by Box-Muller: the embedding is scaled by sqrt(C). */
            float sd = 1.0f / sqrtf((float)cfg->d_model);
            for (size_t j = 0; j < p->n_elems; j++) {
                float u1 = init_uniform(&r), u2 = init_uniform(&r);
                x[j] = sd * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
            }
        } else if (p->ndim == 2) {
            /* Xavier uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)). */
            float a = sqrtf(6.0f / (float)(p->shape[0] + p->shape[1]));
            for (size_t j = 0; j < p->n_elems; j++) x[j] = a * (2.0f * init_uniform(&r) - 1.0f);
        } else {
            /* 1-D: LayerNorm gains ("*.weight") are 1, every bias is 0. */
            float v = strcmp(leaf, ".weight") == 0 ? 1.0f : 0.0f;
            for (size_t j = 0; j < p->n_elems; j++) x[j] = v;
        }
    }
}
