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
    float *const *each; // when non-NULL, tensor i is bound to each[i]
    int index;          // tensors walked so far
    size_t offset;     // running offset in elements
    int tp;            // shards of tp-way tensor parallelism
    int vocab_local;   // rows of a VOCAB shard
    bool skip;         // the tensors walked now are not in this stage
} Walk;

/* The shard shape of a (rows, cols) tensor (cols 0: 1-D) under tp ways. */
static void local_shape(const Walk *w, int rows, int cols, SplitLabel split, int *lr, int *lc) {
    *lr = rows;
    *lc = cols;
    if (split == SPLIT_COL) *lr = rows / w->tp;
    else if (split == SPLIT_ROW) *lc = cols / w->tp;
    else if (split == SPLIT_VOCAB) *lr = w->vocab_local;
}

static float *add(Walk *w, const char *name, int rows, int cols, SplitLabel split) {
    if (w->skip) return NULL;
    int lr, lc;
    local_shape(w, rows, cols, split, &lr, &lc);
    size_t n = (size_t)lr * (size_t)(lc > 0 ? lc : 1);
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
        p->local[0] = lr;
        p->local[1] = lc > 0 ? lc : 0;
        p->split = split;
        p->decay = p->ndim == 2;
        p->offset = w->offset;
        p->n_elems = n;
        t->n_elems = w->offset + n;
    }
    float *ptr = w->each ? w->each[w->index] : w->base ? w->base + w->offset : NULL;
    w->index++;
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
    /* No key bias: softmax ignores a constant added to all scores of a
     * query, so its gradient is identically zero (only rounding noise, which
     * AdamW would turn into a random walk). */
    float **bs[4] = {&a->bq, NULL, &a->bv, &a->bo};
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%s.%s.%s.weight", prefix, kind, proj[i]);
        *ws[i] = add(w, name, C, C, i < 3 ? SPLIT_COL : SPLIT_ROW);
        if (!bs[i]) continue;
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

/* The tensors of stage st (NULL: the whole model) in buffer order:
 * embedding, encoder layers, encoder LayerNorm, decoder layers, decoder
 * LayerNorm; the others are skipped (their views stay NULL). */
static void walk_model(Walk *w, const ModelConfig *cfg, const ModelStage *st, Weights *out) {
    const int C = cfg->d_model, F = cfg->d_ff;
    const ModelStage whole = model_stage_whole(cfg);
    if (!st) st = &whole;
    char prefix[64];
    w->skip = !model_stage_has_embed(st);
    out->embed = add(w, "embed.weight", cfg->vocab_size, C, SPLIT_VOCAB);
    for (int l = 0; l < cfg->enc_layers; l++) {
        w->skip = l < st->enc_lo || l >= st->enc_hi;
        snprintf(prefix, sizeof prefix, "encoder.layers.%d", l);
        walk_attn(w, prefix, "self_attn", &out->enc[l].self, C);
        walk_ffn(w, prefix, &out->enc[l].ffn, C, F);
    }
    w->skip = !st->enc_ln;
    walk_ln(w, "encoder.final_ln", &out->enc_ln_g, &out->enc_ln_b, C);
    for (int l = 0; l < cfg->dec_layers; l++) {
        w->skip = l < st->dec_lo || l >= st->dec_hi;
        snprintf(prefix, sizeof prefix, "decoder.layers.%d", l);
        walk_attn(w, prefix, "self_attn", &out->dec[l].self, C);
        walk_attn(w, prefix, "cross_attn", &out->dec[l].cross, C);
        walk_ffn(w, prefix, &out->dec[l].ffn, C, F);
    }
    w->skip = !st->head;
    walk_ln(w, "decoder.final_ln", &out->dec_ln_g, &out->dec_ln_b, C);
    w->skip = false;
}

static void weights_alloc(Weights *w, const ModelConfig *cfg) {
    memset(w, 0, sizeof *w);
    w->enc = TP_CALLOC((size_t)cfg->enc_layers, sizeof *w->enc);
    w->dec = TP_CALLOC((size_t)cfg->dec_layers, sizeof *w->dec);
}

int vocab_padded(const ModelConfig *cfg, int tp) { return (cfg->vocab_size + tp - 1) / tp * tp; }

void param_table_build(const ModelConfig *cfg, int tp, ParamTable *tab) { param_table_build_stage(cfg, tp, NULL, tab); }

void param_table_build_stage(const ModelConfig *cfg, int tp, const ModelStage *st, ParamTable *tab) {
    TP_CHECK(tp >= 1 && cfg->n_heads % tp == 0 && cfg->d_ff % tp == 0,
             "tensor parallelism %d must divide n_heads %d and d_ff %d", tp, cfg->n_heads, cfg->d_ff);
    memset(tab, 0, sizeof *tab);
    tab->tp = tp;
    Weights scratch;
    weights_alloc(&scratch, cfg);
    Walk w = {.tab = tab, .tp = tp, .vocab_local = vocab_padded(cfg, tp) / tp};
    walk_model(&w, cfg, st, &scratch);
    weights_free(&scratch);
}

void param_table_free(ParamTable *tab) {
    free(tab->t);
    memset(tab, 0, sizeof *tab);
}

int param_table_index_at(const ParamTable *tab, size_t offset) {
    int lo = 0, hi = tab->n;  // the first tensor whose end is past offset
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (tab->t[mid].offset + tab->t[mid].n_elems <= offset) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

const ParamInfo *param_table_find(const ParamTable *tab, const char *name) {
    for (int i = 0; i < tab->n; i++)
        if (strcmp(tab->t[i].name, name) == 0) return &tab->t[i];
    return NULL;
}

void weights_bind(Weights *w, const ModelConfig *cfg, int tp, float *base) { weights_bind_stage(w, cfg, tp, NULL, base); }

void weights_bind_stage(Weights *w, const ModelConfig *cfg, int tp, const ModelStage *st, float *base) {
    weights_alloc(w, cfg);
    Walk walk = {.base = base, .tp = tp, .vocab_local = vocab_padded(cfg, tp) / tp};
    walk_model(&walk, cfg, st, w);
}

void weights_bind_each(Weights *w, const ModelConfig *cfg, int tp, const ModelStage *st, float *const *each) {
    if (!w->enc) weights_alloc(w, cfg);
    Walk walk = {.each = each, .tp = tp, .vocab_local = vocab_padded(cfg, tp) / tp};
    walk_model(&walk, cfg, st, w);
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

size_t param_global_elems(const ParamInfo *p) {
    return (size_t)p->shape[0] * (size_t)(p->ndim == 2 ? p->shape[1] : 1);
}

bool shard_to_global(const ParamInfo *p, int tp_rank, int r, int c, int *gr, int *gc) {
    *gr = r;
    *gc = c;
    if (p->split == SPLIT_COL || p->split == SPLIT_VOCAB) *gr = tp_rank * p->local[0] + r;
    else if (p->split == SPLIT_ROW) *gc = tp_rank * p->local[1] + c;
    return *gr < p->shape[0];  // false only for vocabulary padding rows
}

void shard_extract(const ParamInfo *p, int tp_rank, const float *global, float *shard) {
    const int cols = p->ndim == 2 ? p->local[1] : 1, gcols = p->ndim == 2 ? p->shape[1] : 1;
    for (int r = 0; r < p->local[0]; r++)
        for (int c = 0; c < cols; c++) {
            int gr, gc;
            bool real = shard_to_global(p, tp_rank, r, c, &gr, &gc);
            shard[(size_t)r * cols + c] = real ? global[(size_t)gr * gcols + gc] : 0.0f;
        }
}

void shard_place(const ParamInfo *p, int tp_rank, const float *shard, float *global) {
    const int cols = p->ndim == 2 ? p->local[1] : 1, gcols = p->ndim == 2 ? p->shape[1] : 1;
    for (int r = 0; r < p->local[0]; r++)
        for (int c = 0; c < cols; c++) {
            int gr, gc;
            if (shard_to_global(p, tp_rank, r, c, &gr, &gc)) global[(size_t)gr * gcols + gc] = shard[(size_t)r * cols + c];
        }
}

