/* stage.c: pipeline stages of the encoder-decoder stack (see stage.h). */
#include "transformer/stage.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "parse.h"

/* Flags from the layer ranges: position i of the stack list is encoder
 * layer i (i < Le) or decoder layer i - Le. */
static ModelStage stage_of(const ModelConfig *cfg, int lo, int hi, bool last) {
    const int Le = cfg->enc_layers;
    ModelStage st = {0};
    st.enc_lo = lo < Le ? lo : Le;
    st.enc_hi = hi < Le ? hi : Le;
    st.dec_lo = lo > Le ? lo - Le : 0;
    st.dec_hi = hi > Le ? hi - Le : 0;
    if (st.dec_hi <= st.dec_lo) st.dec_lo = st.dec_hi = 0;
    if (st.enc_hi <= st.enc_lo) st.enc_lo = st.enc_hi = 0;
    st.enc_embed = lo == 0;
    st.enc_ln = lo < Le && hi >= Le;
    st.dec_embed = lo <= Le && hi > Le;
    st.head = last;
    return st;
}

ModelStage model_stage_whole(const ModelConfig *cfg) {
    return stage_of(cfg, 0, cfg->enc_layers + cfg->dec_layers, true);
}

bool model_stage_has_embed(const ModelStage *st) { return st->enc_embed || st->dec_embed || st->head; }
bool model_stage_gets_enc_res(const ModelStage *st) { return !st->enc_embed && st->enc_hi > st->enc_lo; }
bool model_stage_gets_enc_out(const ModelStage *st) { return !st->enc_embed && st->enc_hi == st->enc_lo; }
bool model_stage_gets_dec(const ModelStage *st) { return st->dec_hi > st->dec_lo && !st->dec_embed; }

/* Per-token cost of each list position (multiply-adds of the GEMMs, with
 * the attention's score and value products at a nominal length of 64):
 * encoder layer: q k v o + 2 ffn; decoder layer: twice the attention
 * (self and cross) + ffn; the last position also carries the output layer. */
static double layer_cost(const ModelConfig *c, int i) {
    const double C = c->d_model, F = c->d_ff, T = 64.0;
    const double attn = 4.0 * C * C + 2.0 * T * C, ffn = 2.0 * C * F;
    return i < c->enc_layers ? attn + ffn : 2.0 * attn + ffn;
}

static double head_cost(const ModelConfig *c) { return (double)c->vocab_size * c->d_model; }

double model_stage_cost(const ModelConfig *cfg, const ModelStage *st) {
    double sum = 0.0;
    for (int l = st->enc_lo; l < st->enc_hi; l++) sum += layer_cost(cfg, l);
    for (int l = st->dec_lo; l < st->dec_hi; l++) sum += layer_cost(cfg, cfg->enc_layers + l);
    if (st->head) sum += head_cost(cfg);
    return sum;
}

/* Contiguous split of the n positions into p non-empty parts minimising the
 * largest part's cost (dynamic programming over prefixes). */
static void balance(const ModelConfig *cfg, int n, int p, int *bounds /* p + 1 */) {
    double *w = TP_MALLOC((size_t)n * sizeof *w), *pre = TP_MALLOC((size_t)(n + 1) * sizeof *pre);
    for (int i = 0; i < n; i++) w[i] = layer_cost(cfg, i) + (i == n - 1 ? head_cost(cfg) : 0.0);
    pre[0] = 0.0;
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + w[i];
    /* best[k][j]: the smallest largest-part cost of the first j positions in k parts */
    double *best = TP_MALLOC((size_t)(p + 1) * (size_t)(n + 1) * sizeof *best);
    int *cut = TP_MALLOC((size_t)(p + 1) * (size_t)(n + 1) * sizeof *cut);
#define BEST(k, j) best[(size_t)(k) * (size_t)(n + 1) + (size_t)(j)]
#define CUT(k, j) cut[(size_t)(k) * (size_t)(n + 1) + (size_t)(j)]
    for (int j = 0; j <= n; j++) BEST(1, j) = pre[j], CUT(1, j) = 0;
    for (int k = 2; k <= p; k++)
        for (int j = k; j <= n; j++) {
            BEST(k, j) = -1.0;
            for (int i = k - 1; i < j; i++) {  // the last part is [i, j)
                const double part = pre[j] - pre[i], worst = BEST(k - 1, i) > part ? BEST(k - 1, i) : part;
                if (BEST(k, j) < 0.0 || worst < BEST(k, j) - 1e-9) BEST(k, j) = worst, CUT(k, j) = i;
            }
        }
    bounds[p] = n;
    for (int k = p; k >= 1; k--) bounds[k - 1] = k == 1 ? 0 : CUT(k, bounds[k]);
#undef BEST
#undef CUT
    free(w);
    free(pre);
    free(best);
    free(cut);
}

/* One item "enc:A-B" or "dec:A" (inclusive) as list positions [*lo, *hi). */
static int parse_item(const ModelConfig *cfg, const char *item, int *lo, int *hi, char *err, size_t err_len) {
    const bool enc = strncmp(item, "enc:", 4) == 0, dec = strncmp(item, "dec:", 4) == 0;
    if (!enc && !dec) {
        tp_error_set(err, err_len, "'%s' is not enc:A-B or dec:A-B", item);
        return -1;
    }
    const int n = enc ? cfg->enc_layers : cfg->dec_layers;
    char a[32] = {0}, b[32] = {0};
    const char *dash = strchr(item + 4, '-');
    const size_t la = dash ? (size_t)(dash - (item + 4)) : strlen(item + 4);
    if (la == 0 || la >= sizeof a || (dash && (strlen(dash + 1) == 0 || strlen(dash + 1) >= sizeof b))) {
        tp_error_set(err, err_len, "'%s' is not enc:A-B or dec:A-B", item);
        return -1;
    }
    memcpy(a, item + 4, la);
    strcpy(b, dash ? dash + 1 : a);
    long x, y;
    char why[160];
    if (parse_int("layer", a, 0, n - 1, &x, why, sizeof why) || parse_int("layer", b, 0, n - 1, &y, why, sizeof why) ||
        y < x) {
        tp_error_set(err, err_len, "'%s' is not a range of the %d %s layers (0-%d)", item, n,
                     enc ? "encoder" : "decoder", n - 1);
        return -1;
    }
    const int base = enc ? 0 : cfg->enc_layers;
    *lo = base + (int)x;
    *hi = base + (int)y + 1;
    return 0;
}

static int parse_layout(const ModelConfig *cfg, int p, const char *layout, int *bounds, char *err, size_t err_len) {
    char *copy = strdup(layout);
    TP_CHECK(copy, "out of memory");
    int k = 0, pos = 0, rc = 0;
    char why[200] = "";
    char *save_stage = NULL;
    for (char *stage = strtok_r(copy, "|", &save_stage); stage && rc == 0; stage = strtok_r(NULL, "|", &save_stage)) {
        if (k == p) {
            snprintf(why, sizeof why, "it has more than %d stages", p);
            rc = -1;
            break;
        }
        bounds[k] = pos;
        char *save_item = NULL;
        for (char *item = strtok_r(stage, ",", &save_item); item; item = strtok_r(NULL, ",", &save_item)) {
            int lo, hi;
            if (parse_item(cfg, item, &lo, &hi, why, sizeof why)) {
                rc = -1;
                break;
            }
            if (lo != pos) {
                snprintf(why, sizeof why, "'%s' does not continue the stack where stage %d is (%s layer %d)", item, k,
                         pos < cfg->enc_layers ? "encoder" : "decoder",
                         pos < cfg->enc_layers ? pos : pos - cfg->enc_layers);
                rc = -1;
                break;
            }
            pos = hi;
        }
        if (rc == 0 && pos == bounds[k]) {
            snprintf(why, sizeof why, "stage %d holds no layer", k);
            rc = -1;
        }
        k++;
    }
    const int n = cfg->enc_layers + cfg->dec_layers;
    if (rc == 0 && (k != p || pos != n)) {
        snprintf(why, sizeof why, "it must give %d stages covering encoder layers 0-%d then decoder layers 0-%d "
                 "(it gives %d stages up to position %d of %d)", p, cfg->enc_layers - 1, cfg->dec_layers - 1, k, pos, n);
        rc = -1;
    }
    bounds[p] = n;
    free(copy);
    if (rc) tp_error_set(err, err_len, "--pp-layout '%s': %s", layout, why);
    return rc;
}

int model_stages_make(const ModelConfig *cfg, int p, const char *layout, ModelStage *out, char *err, size_t err_len) {
    const int n = cfg->enc_layers + cfg->dec_layers;
    if (p < 1 || p > n) {
        tp_error_set(err, err_len, "pp (%d) must be between 1 and the %d layers (%d encoder + %d decoder): a stage "
                     "holds at least one", p, n, cfg->enc_layers, cfg->dec_layers);
        return -1;
    }
    int *bounds = TP_MALLOC((size_t)(p + 1) * sizeof *bounds);
    if (layout) {
        if (parse_layout(cfg, p, layout, bounds, err, err_len)) {
            free(bounds);
            return -1;
        }
    } else {
        balance(cfg, n, p, bounds);
    }
    for (int s = 0; s < p; s++) out[s] = stage_of(cfg, bounds[s], bounds[s + 1], s == p - 1);
    free(bounds);
    return 0;
}

void model_stages_format(const ModelStage *st, int p, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int s = 0; s < p && at < len; s++) {
        const ModelStage *x = &st[s];
        char e[32] = "", d[32] = "";
        if (x->enc_hi > x->enc_lo) snprintf(e, sizeof e, "enc:%d-%d", x->enc_lo, x->enc_hi - 1);
        if (x->dec_hi > x->dec_lo) snprintf(d, sizeof d, "dec:%d-%d", x->dec_lo, x->dec_hi - 1);
        at += (size_t)snprintf(buf + at, len - at, "%s%s%s%s", s ? "|" : "", e, *e && *d ? "," : "", d);
    }
}
