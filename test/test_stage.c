/* test_stage: pipeline stages of the encoder-decoder (transformer/stage.h).
 * For every preset and p from 1 to the number of layers: the balanced
 * stages are contiguous, non-empty, in order, with one source embedding, one
 * encoder LayerNorm, one target embedding and one head; their largest cost
 * equals the optimum found by trying every split; the stages' parameter
 * tables hold every tensor of the whole model exactly once, except the tied
 * embedding, held by every stage of the embedding group. Layouts: the
 * issue's example round-trips through the formatter; gaps, overlaps, empty
 * stages, too many or too few stages and out-of-range layers are refused
 * with a sentence naming the problem.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "transformer/params.h"
#include "transformer/stage.h"

enum { SMAX = 64 };

/* The smallest largest-stage cost over every split of n positions into p
 * contiguous non-empty parts (exhaustive, small n only). */
static double brute(const ModelConfig *cfg, int n, int p) {
    double best = -1.0;
    /* cut positions as a bit mask over 1 .. n-1 */
    for (unsigned mask = 0; mask < (1u << (n - 1)); mask++) {
        if (__builtin_popcount(mask) != p - 1) continue;
        int lo = 0, s = 0;
        double worst = 0.0;
        ModelStage st[SMAX];
        char layout[512] = "";
        for (int i = 1; i <= n; i++) {
            if (i == n || (mask >> (i - 1) & 1u)) {
                /* the part [lo, i) as a layout stage */
                char part[64] = "";
                const int Le = cfg->enc_layers;
                if (lo < Le) snprintf(part, sizeof part, "enc:%d-%d", lo, (i < Le ? i : Le) - 1);
                if (i > Le) {
                    const size_t at = strlen(part);
                    snprintf(part + at, sizeof part - at, "%sdec:%d-%d", at ? "," : "", (lo > Le ? lo : Le) - Le, i - Le - 1);
                }
                const size_t at = strlen(layout);
                snprintf(layout + at, sizeof layout - at, "%s%s", s ? "|" : "", part);
                lo = i;
                s++;
            }
        }
        char err[256];
        if (model_stages_make(cfg, p, layout, st, err, sizeof err)) {
            CHECK(0, "brute layout %s refused: %s", layout, err);
            continue;
        }
        for (int k = 0; k < p; k++) {
            const double c = model_stage_cost(cfg, &st[k]);
            if (c > worst) worst = c;
        }
        if (best < 0.0 || worst < best) best = worst;
    }
    return best;
}

static void check_stages(const char *preset, const ModelConfig *cfg, int p, const ModelStage *st) {
    const int Le = cfg->enc_layers, Ld = cfg->dec_layers;
    int enc_embed = 0, enc_ln = 0, dec_embed = 0, head = 0, pos = 0;
    for (int s = 0; s < p; s++) {
        const ModelStage *x = &st[s];
        const int ne = x->enc_hi - x->enc_lo, nd = x->dec_hi - x->dec_lo;
        CHECK(ne + nd > 0, "%s p %d stage %d holds no layer", preset, p, s);
        if (ne > 0) {
            CHECK(x->enc_lo == pos, "%s p %d stage %d starts at encoder %d, want %d", preset, p, s, x->enc_lo, pos);
            pos = x->enc_hi;
        }
        if (nd > 0) {
            CHECK(x->dec_lo + Le == pos, "%s p %d stage %d starts at decoder %d, want position %d", preset, p, s,
                  x->dec_lo, pos);
            pos = Le + x->dec_hi;
        }
        enc_embed += x->enc_embed;
        enc_ln += x->enc_ln;
        dec_embed += x->dec_embed;
        head += x->head;
        CHECK(x->enc_embed == (s == 0), "%s p %d stage %d enc_embed", preset, p, s);
        CHECK(x->head == (s == p - 1), "%s p %d stage %d head", preset, p, s);
        CHECK(x->enc_ln == (ne > 0 && x->enc_hi == Le), "%s p %d stage %d enc_ln", preset, p, s);
        CHECK(x->dec_embed == (nd > 0 && x->dec_lo == 0), "%s p %d stage %d dec_embed", preset, p, s);
        /* what it receives: exactly one of the encoder stream or output
         * when it has layers to feed, the decoder states after decoder 0 */
        if (s > 0 && ne > 0) CHECK(model_stage_gets_enc_res(x), "%s p %d stage %d gets_enc_res", preset, p, s);
        if (s > 0 && ne == 0) CHECK(model_stage_gets_enc_out(x), "%s p %d stage %d gets_enc_out", preset, p, s);
        CHECK(model_stage_gets_dec(x) == (nd > 0 && x->dec_lo > 0), "%s p %d stage %d gets_dec", preset, p, s);
    }
    CHECK(pos == Le + Ld, "%s p %d: the stages end at %d of %d", preset, p, pos, Le + Ld);
    CHECK(enc_embed == 1 && enc_ln == 1 && dec_embed == 1 && head == 1,
          "%s p %d: %d source embeddings, %d encoder LayerNorms, %d target embeddings, %d heads", preset, p, enc_embed,
          enc_ln, dec_embed, head);

    /* the tables partition the whole model (the tied embedding repeated) */
    ParamTable whole;
    param_table_build(cfg, 2, &whole);
    int *seen = calloc((size_t)whole.n, sizeof *seen);
    size_t elems = 0;
    int embed_copies = 0;
    for (int s = 0; s < p; s++) {
        ParamTable t;
        param_table_build_stage(cfg, 2, &st[s], &t);
        elems += t.n_elems;
        for (int i = 0; i < t.n; i++) {
            const ParamInfo *w = param_table_find(&whole, t.t[i].name);
            CHECK(w != NULL, "%s p %d stage %d: %s not in the whole table", preset, p, s, t.t[i].name);
            if (!w) continue;
            CHECK(w->n_elems == t.t[i].n_elems, "%s: %s shard size", preset, w->name);
            seen[w - whole.t]++;
            if (strcmp(w->name, "embed.weight") == 0) embed_copies++;
        }
        if (s == 0) CHECK(t.n > 0 && t.t[0].offset == 0, "%s p %d: stage 0 buffer starts at 0", preset, p);
        param_table_free(&t);
    }
    for (int i = 0; i < whole.n; i++) {
        const int want = strcmp(whole.t[i].name, "embed.weight") == 0 ? embed_copies : 1;
        CHECK(seen[i] == want, "%s p %d: %s held by %d stages, want %d", preset, p, whole.t[i].name, seen[i], want);
    }
    const size_t embed_n = param_table_find(&whole, "embed.weight")->n_elems;
    CHECK(embed_copies >= 1 && embed_copies <= 3 && elems == whole.n_elems + (size_t)(embed_copies - 1) * embed_n,
          "%s p %d: %zu elements in the stages, %zu in the model, %d embedding copies", preset, p, elems, whole.n_elems,
          embed_copies);
    free(seen);
    param_table_free(&whole);
}

static void expect_refused(const ModelConfig *cfg, int p, const char *layout, const char *needle) {
    ModelStage st[SMAX];
    char err[512] = "";
    const int rc = model_stages_make(cfg, p, layout, st, err, sizeof err);
    CHECK(rc == -1, "layout '%s' p %d accepted", layout ? layout : "(balanced)", p);
    CHECK(strstr(err, needle) != NULL, "layout '%s': error '%s' lacks '%s'", layout ? layout : "(balanced)", err, needle);
}

int main(void) {
    const char *presets[] = {"tiny", "small", "base", "big"};
    for (size_t k = 0; k < sizeof presets / sizeof *presets; k++) {
        ModelConfig cfg;
        char err[256];
        CHECK(config_preset(presets[k], &cfg, err, sizeof err) == 0, "%s", err);
        const int n = cfg.enc_layers + cfg.dec_layers;
        for (int p = 1; p <= n; p++) {
            ModelStage st[SMAX];
            CHECK(model_stages_make(&cfg, p, NULL, st, err, sizeof err) == 0, "%s p %d: %s", presets[k], p, err);
            check_stages(presets[k], &cfg, p, st);
            if (n <= 12) {
                double worst = 0.0;
                for (int s = 0; s < p; s++) {
                    const double c = model_stage_cost(&cfg, &st[s]);
                    if (c > worst) worst = c;
                }
                const double opt = brute(&cfg, n, p);
                CHECK(worst <= opt * (1 + 1e-12), "%s p %d: balanced worst stage %.6g, optimum %.6g", presets[k], p,
                      worst, opt);
            }
            /* the format of a balanced split parses back to the same stages */
            char text[512];
            ModelStage back[SMAX];
            model_stages_format(st, p, text, sizeof text);
            CHECK(model_stages_make(&cfg, p, text, back, err, sizeof err) == 0, "%s p %d '%s': %s", presets[k], p, text,
                  err);
            CHECK(memcmp(st, back, (size_t)p * sizeof *st) == 0, "%s p %d: '%s' parses to other stages", presets[k], p,
                  text);
        }
        expect_refused(&cfg, n + 1, NULL, "must be between 1 and");
        expect_refused(&cfg, 0, NULL, "must be between 1 and");
    }

    /* base: 6 + 6 layers; decoder layers cost more, so balanced stages hold
     * more encoder than decoder layers */
    ModelConfig base;
    char err[256];
    CHECK(config_preset("base", &base, err, sizeof err) == 0, "%s", err);
    ModelStage st[SMAX];
    CHECK(model_stages_make(&base, 2, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(st[0].enc_hi == 6 && st[0].dec_hi > 0, "base p 2: stage 0 should end inside the decoder (enc %d-%d dec %d-%d)",
          st[0].enc_lo, st[0].enc_hi, st[0].dec_lo, st[0].dec_hi);

    const char *example = "enc:0-3|enc:4-5,dec:0-1|dec:2-5";
    CHECK(model_stages_make(&base, 3, example, st, err, sizeof err) == 0, "%s", err);
    char text[256];
    model_stages_format(st, 3, text, sizeof text);
    CHECK(strcmp(text, example) == 0, "'%s' formats as '%s'", example, text);
    CHECK(st[1].enc_ln && st[1].dec_embed && !st[2].dec_embed && st[2].head, "example flags");
    expect_refused(&base, 3, "enc:0-3|enc:5-5,dec:0-1|dec:2-5", "does not continue");   // gap
    expect_refused(&base, 3, "enc:0-3|enc:3-5,dec:0-1|dec:2-5", "does not continue");   // overlap
    expect_refused(&base, 3, "enc:0-5|dec:0-1|dec:2-4", "must give 3 stages");           // short
    expect_refused(&base, 2, "enc:0-5|dec:0-1|dec:2-5", "more than 2 stages");
    expect_refused(&base, 3, "enc:0-5||dec:0-5", "must give 3 stages");                  // strtok skips empties
    expect_refused(&base, 2, "enc:0-6|dec:0-5", "not a range of the 6 encoder layers");
    expect_refused(&base, 2, "enc:0-5|dec:5-4", "not a range");
    expect_refused(&base, 2, "enc:0-5|mid:0-5", "is not enc:A-B or dec:A-B");
    expect_refused(&base, 2, "dec:0-5|enc:0-5", "does not continue");
    return check_report("test_stage");
}
