/* test_model_stages.c: the model cut into pipeline stages computes what the
 * whole model computes. In one process, for several splits of a 3 + 3
 * layer model (balanced for p = 2, 3, 4, 6, and layouts where a stage ends
 * exactly at the encoder's end, spans encoder and decoder, or holds only
 * the head's decoder layer), stage models are run in order: each stage's
 * forward output is copied into the next one's input, the loss comes from
 * the last, each backward's input gradient is copied into the previous
 * stage's output gradient, and the embedding group's gradients are summed.
 * Two micro-batches of different shapes are in flight at once (two
 * activation slots: F0 F1 B0 B1), with dropout on (attention and activation
 * dropout too). Checked against the
 * whole model accumulating the same two micro-batches: the loss sum, and
 * every gradient tensor by name, to 1e-6 relative (the tied embedding's
 * three contributions are summed in another order; everything else is
 * bitwise, asserted separately). Each stage holds activations only for its
 * own layers: its slot bytes are less than the whole model's.
 * Every split runs again with selective and with full recomputation, checked
 * against the same whole model without it: loss and gradients as above (the
 * recomputed values are bitwise the kept ones), and the whole model's
 * activation bytes shrink from none to selective to full.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "transformer/model.h"
#include "testmodel.h"

enum { PMAX = 6, NMB = 2 };

/* micro-batch 0: B 3, S 5, T 6; micro-batch 1: B 2, S 4, T 3 */
static const int32_t SRC0[3 * 5] = {5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 12, 13, 14, 15, 0};
static const int32_t SRC_LEN0[3] = {5, 2, 4};
static const int32_t TGT_IN0[3 * 6] = {2, 16, 17, 18, 0, 0, 2, 19, 20, 21, 22, 23, 2, 7, 0, 0, 0, 0};
static const int32_t TGT_OUT0[3 * 6] = {16, 17, 18, 3, 0, 0, 19, 20, 21, 22, 23, 3, 7, 3, 0, 0, 0, 0};
static const int32_t TGT_LEN0[3] = {4, 6, 2};
static const int32_t SRC1[2 * 4] = {9, 8, 7, 6, 21, 22, 0, 0};
static const int32_t SRC_LEN1[2] = {4, 2};
static const int32_t TGT_IN1[2 * 3] = {2, 11, 12, 2, 13, 0};
static const int32_t TGT_OUT1[2 * 3] = {11, 12, 3, 13, 3, 0};
static const int32_t TGT_LEN1[2] = {3, 2};

static ModelConfig config(void) {
    ModelConfig c = test_model_config(16, 2, 24, 24, 3, 0.1f);
    c.attn_dropout = 0.1f;  // every dropout site keyed by its global layer
    c.act_dropout = 0.1f;
    return c;
}

static void batches(Batch b[NMB]) {
    b[0] = (Batch){.B = 3, .S = 5, .T = 6, .src = SRC0, .src_len = SRC_LEN0, .tgt_in = TGT_IN0,
                   .tgt_out = TGT_OUT0, .tgt_len = TGT_LEN0};
    b[1] = (Batch){.B = 2, .S = 4, .T = 3, .src = SRC1, .src_len = SRC_LEN1, .tgt_in = TGT_IN1,
                   .tgt_out = TGT_OUT1, .tgt_len = TGT_LEN1};
}

static DropoutKey key_of(int i) { return (DropoutKey){.seed = 99, .step = 3, .micro = (uint32_t)i}; }

/* Returns the activation bytes of the stages together. */
static size_t run_split(const char *what, const ModelConfig *cfg, const ModelStage *st, int p, const Model *whole,
                        float whole_loss, float scale, ModelRecompute rc) {
    Model sm[PMAX];
    char err[256];
    Batch b[NMB];
    batches(b);
    float *loss = calloc(1, sizeof *loss);
    for (int s = 0; s < p; s++) {
        CHECK(model_create_stage(&sm[s], NULL, cfg, NULL, &st[s], 7, 0, err, sizeof err) == 0, "%s: %s", what, err);
        model_set_slots(&sm[s], NMB);
        model_set_recompute(&sm[s], rc);
        model_zero_grad(&sm[s]);
    }
    /* F0 F1 through every stage */
    for (int i = 0; i < NMB; i++)
        for (int s = 0; s < p; s++) {
            model_use_slot(&sm[s], i);
            if (s > 0) {
                StageIO in = model_stage_input(&sm[s], b[i].B, b[i].S, b[i].T);
                StageIO out = model_stage_output(&sm[s - 1]);
                const bool fits = in.enc && out.enc && (in.dec != NULL) == (out.dec != NULL) &&
                                  in.n_enc == out.n_enc && in.n_dec == out.n_dec &&
                                  out.n_enc == (size_t)b[i].B * b[i].S * cfg->d_model &&
                                  out.n_dec == (out.dec ? (size_t)b[i].B * b[i].T * cfg->d_model : 0);
                CHECK(fits, "%s: stage %d input does not match stage %d's output", what, s, s - 1);
                if (!fits) return 0;
                memcpy(in.enc, out.enc, out.n_enc * sizeof(float));
                if (out.n_dec) memcpy(in.dec, out.dec, out.n_dec * sizeof(float));
            }
            model_forward_step(&sm[s], &b[i], true, key_of(i), loss);
        }
    CHECK(*loss == whole_loss, "%s: loss sum %.9g, whole model %.9g", what, *loss, whole_loss);
    /* B0 B1 back through every stage */
    for (int i = 0; i < NMB; i++)
        for (int s = p - 1; s >= 0; s--) {
            model_use_slot(&sm[s], i);
            if (s < p - 1) {
                StageIO d_out = model_stage_output_grad(&sm[s], b[i].B, b[i].S, b[i].T);
                StageIO d_in = model_stage_input_grad(&sm[s + 1]);
                const bool fits = d_in.enc && (d_in.dec != NULL) == (d_out.dec != NULL) && d_in.n_enc == d_out.n_enc &&
                                  d_in.n_dec == d_out.n_dec;
                CHECK(fits, "%s: stage %d input gradient does not match stage %d's output gradient", what, s + 1, s);
                if (!fits) return 0;
                memcpy(d_out.enc, d_in.enc, d_in.n_enc * sizeof(float));
                if (d_in.n_dec) memcpy(d_out.dec, d_in.dec, d_in.n_dec * sizeof(float));
            }
            model_backward(&sm[s], &b[i], true, key_of(i), scale);
        }
    /* every tensor against the whole model; the embedding summed over its copies */
    const ParamInfo *pe = param_table_find(&whole->tab, "embed.weight");
    float *embed = calloc(pe->n_elems, sizeof *embed);
    int copies = 0;
    for (int s = 0; s < p; s++) {
        CHECK(model_activation_bytes(&sm[s]) < model_activation_bytes(whole) * NMB || p == 1,
              "%s: stage %d keeps %zu activation bytes for two slots, the whole model %zu for one", what, s,
              model_activation_bytes(&sm[s]), model_activation_bytes(whole));
        for (int i = 0; i < sm[s].tab.n; i++) {
            const ParamInfo *t = &sm[s].tab.t[i];
            const ParamInfo *w = param_table_find(&whole->tab, t->name);
            CHECK(w && w->n_elems == t->n_elems, "%s: %s", what, t->name);
            if (!w) continue;
            const float *g = sm[s].grads + t->offset, *want = whole->grads + w->offset;
            if (w == pe) {
                for (size_t k = 0; k < t->n_elems; k++) embed[k] += g[k];
                copies++;
                continue;
            }
            /* the same ops in the same order: bitwise */
            CHECK(memcmp(g, want, t->n_elems * sizeof(float)) == 0, "%s: stage %d %s differs from the whole model",
                  what, s, t->name);
            const float *pw = sm[s].params + t->offset, *pwant = whole->params + w->offset;
            CHECK(memcmp(pw, pwant, t->n_elems * sizeof(float)) == 0, "%s: stage %d %s initialised differently",
                  what, s, t->name);
        }
    }
    CHECK(copies >= 1 && copies <= 3, "%s: %d embedding copies", what, copies);
    double err2 = 0.0, ref2 = 0.0;
    for (size_t k = 0; k < pe->n_elems; k++) {
        const double d = (double)embed[k] - whole->grads[pe->offset + k];
        err2 += d * d;
        ref2 += (double)whole->grads[pe->offset + k] * whole->grads[pe->offset + k];
    }
    CHECK(ref2 > 0.0 && sqrt(err2) <= 1e-6 * sqrt(ref2), "%s: embedding gradient relative error %.3g", what,
          sqrt(err2 / ref2));
    /* one stage holds the only copy: bitwise (recomputation changes nothing) */
    CHECK(p > 1 || memcmp(embed, whole->grads + pe->offset, pe->n_elems * sizeof(float)) == 0,
          "%s: embedding gradient differs from the whole model", what);
    size_t bytes = 0;
    for (int s = 0; s < p; s++) {
        bytes += model_activation_bytes(&sm[s]);
        model_free(&sm[s]);
    }
    free(embed);
    free(loss);
    return bytes;
}

int main(void) {
    const ModelConfig cfg = config();
    char err[256];
    Batch b[NMB];
    batches(b);
    int n_tok = 0;
    for (int i = 0; i < NMB; i++) n_tok += batch_target_tokens(&b[i], cfg.pad_id);
    const float scale = 1.0f / (float)n_tok;

    Model whole;
    CHECK(model_create(&whole, NULL, &cfg, NULL, 7, err, sizeof err) == 0, "%s", err);
    float *loss = calloc(1, sizeof *loss);
    model_zero_grad(&whole);
    for (int i = 0; i < NMB; i++) {
        model_forward_step(&whole, &b[i], true, key_of(i), loss);
        model_backward(&whole, &b[i], true, key_of(i), scale);
    }
    CHECK(*loss > 0.0f && isfinite(*loss), "whole loss %g", *loss);

    ModelStage st[PMAX];
    const int ps[] = {1, 2, 3, 4, 6};
    size_t whole_bytes[3] = {0};
    for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
        for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
            char what[256];
            CHECK(model_stages_make(&cfg, ps[k], NULL, st, err, sizeof err) == 0, "%s", err);
            char text[128];
            model_stages_format(st, ps[k], text, sizeof text);
            snprintf(what, sizeof what, "balanced p %d (%s), recompute %s", ps[k], text,
                     model_recompute_name((ModelRecompute)rc));
            const size_t bytes = run_split(what, &cfg, st, ps[k], &whole, *loss, scale, (ModelRecompute)rc);
            if (ps[k] == 1) whole_bytes[rc] = bytes;
        }
    }
    CHECK(whole_bytes[2] < whole_bytes[1] && whole_bytes[1] < whole_bytes[0],
          "activation bytes (two slots) do not shrink: none %zu, selective %zu, full %zu", whole_bytes[0],
          whole_bytes[1], whole_bytes[2]);
    const struct { int p; const char *layout; } layouts[] = {
        {2, "enc:0-2|dec:0-2"},                  // the first stage ends at the encoder's end
        {3, "enc:0-1|enc:2,dec:0|dec:1-2"},      // a stage spans encoder and decoder
        {3, "enc:0|enc:1-2|dec:0-2"},            // two encoder stages
        {3, "enc:0-2,dec:0|dec:1|dec:2"},        // only decoder layers after the first
        {4, "enc:0-2|dec:0|dec:1|dec:2"},        // one layer per decoder stage
    };
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
        CHECK(model_stages_make(&cfg, layouts[k].p, layouts[k].layout, st, err, sizeof err) == 0, "%s", err);
        for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
            char what[256];
            snprintf(what, sizeof what, "%s, recompute %s", layouts[k].layout, model_recompute_name((ModelRecompute)rc));
            run_split(what, &cfg, st, layouts[k].p, &whole, *loss, scale, (ModelRecompute)rc);
        }
    }
    model_free(&whole);
    free(loss);
    return check_report("test_model_stages");
}
