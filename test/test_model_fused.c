/* test_model_fused.c: the model runs each residual + dropout + LayerNorm
 * boundary as one op (op_residual_ln_fwd / _bwd) where model.c says it
 * does, and the results do not depend on it.
 *
 * The backend's table is wrapped with counters (as --profile wraps it), and
 * one training step of a tiny model with dropout counts the fused and the
 * unfused LayerNorm and dropout calls: with activations kept, every
 * sub-block boundary of the forward pass is fused (the last layer's into the
 * stack's final LayerNorm) and the boundaries inside a layer in backward;
 * with full recomputation, which rebuilds each layer alone, only those
 * inside a layer, forward and again in the recomputed forward. The loss and
 * every gradient must be bit for bit the same in both modes (the CPU
 * reference of the fused op is the unfused sequence). The unfused model
 * fails the counts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "err.h"
#include "transformer/model.h"

static const int32_t SRC[2 * 4] = {5, 6, 7, 8, 9, 10, 0, 0};
static const int32_t SRC_LEN[2] = {4, 2};
static const int32_t TGT_IN[2 * 5] = {2, 16, 17, 18, 0, 2, 19, 20, 21, 22};
static const int32_t TGT_OUT[2 * 5] = {16, 17, 18, 3, 0, 19, 20, 21, 22, 3};
static const int32_t TGT_LEN[2] = {4, 5};

typedef struct {
    long res_fwd, res_bwd, ln_fwd, ln_bwd, drop_fwd, drop_bwd;
} Counts;

static const BackendOps *g_real;  // the table being counted
static Counts g_n;

static void c_res_fwd(Backend *be, float *ro, float *y, uint16_t *y16, float *mu, float *rs, const float *ri,
                      const float *br, const float *bias, const float *g, const float *b, int N, int C, float eps,
                      uint64_t f, float p, uint64_t seed, uint64_t st) {
    g_n.res_fwd++;
    g_real->residual_ln_fwd(be, ro, y, y16, mu, rs, ri, br, bias, g, b, N, C, eps, f, p, seed, st);
}
static void c_res_bwd(Backend *be, float *dr, float *dbr, uint16_t *dbr16, float *dg, float *db, float *dbias,
                      const float *dy,
                      const float *x, const float *mu, const float *rs, const float *g, int N, int C, uint64_t f,
                      float p, uint64_t seed, uint64_t st) {
    g_n.res_bwd++;
    g_real->residual_ln_bwd(be, dr, dbr, dbr16, dg, db, dbias, dy, x, mu, rs, g, N, C, f, p, seed, st);
}
static void c_ln_fwd(Backend *be, float *y, float *mu, float *rs, const float *x, const float *g, const float *b,
                     int N, int C, float eps) {
    g_n.ln_fwd++;
    g_real->layernorm_fwd(be, y, mu, rs, x, g, b, N, C, eps);
}
static void c_ln_bwd(Backend *be, float *dx, float *dg, float *db, const float *dy, const float *x, const float *mu,
                     const float *rs, const float *g, int N, int C) {
    g_n.ln_bwd++;
    g_real->layernorm_bwd(be, dx, dg, db, dy, x, mu, rs, g, N, C);
}
static void c_drop_fwd(Backend *be, float *o, const float *x, size_t n, uint64_t f, float p, uint64_t seed,
                       uint64_t st) {
    g_n.drop_fwd++;
    g_real->dropout_fwd_at(be, o, x, n, f, p, seed, st);
}
static void c_drop_bwd(Backend *be, float *dx, uint16_t *dx16, GradMode mode, const float *dy, size_t n, uint64_t f,
                       float p, uint64_t seed, uint64_t st) {
    g_n.drop_bwd++;
    g_real->dropout_bwd_at(be, dx, dx16, mode, dy, n, f, p, seed, st);
}

/* One step in recompute mode; the loss and a copy of the gradients out. */
static Counts step(Model *m, ModelRecompute mode, float *loss, float *grads) {
    Batch b = {.B = 2, .S = 4, .T = 5, .src = SRC, .src_len = SRC_LEN, .tgt_in = TGT_IN, .tgt_out = TGT_OUT,
               .tgt_len = TGT_LEN};
    char err[256];
    CHECK(model_check_batch(m, &b, err, sizeof err) == 0, "%s", err);
    model_set_recompute(m, mode);
    const DropoutKey key = {.seed = 11, .step = 2};
    model_zero_grad(m);
    memset(&g_n, 0, sizeof g_n);
    int n_tok = 0;
    *loss = model_forward(m, &b, true, key, &n_tok);
    model_backward(m, &b, true, key, 1.0f / (float)n_tok);
    memcpy(grads, m->grads, m->tab.n_elems * sizeof(float));
    return g_n;
}

static void expect(const char *what, long got, long want) {
    CHECK(got == want, "%s: %ld calls, want %ld", what, got, want);
}

int main(void) {
    ModelConfig cfg;
    char err[256];
    config_preset("tiny", &cfg, err, sizeof err);
    cfg.d_model = 16, cfg.n_heads = 2, cfg.d_ff = 24, cfg.vocab_size = 24, cfg.dropout = 0.2f;
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 5, err, sizeof err) == 0, "%s", err);
    const long E = cfg.enc_layers, D = cfg.dec_layers;
    CHECK(E >= 2 && D >= 2, "the tiny preset has %ld encoder and %ld decoder layers: want two of each", E, D);

    BackendOps counted = *m.be->ops;
    g_real = m.be->ops;
    counted.residual_ln_fwd = c_res_fwd, counted.residual_ln_bwd = c_res_bwd;
    counted.layernorm_fwd = c_ln_fwd, counted.layernorm_bwd = c_ln_bwd;
    counted.dropout_fwd_at = c_drop_fwd, counted.dropout_bwd_at = c_drop_bwd;
    m.be->ops = &counted;

    float *g_none = TP_MALLOC(m.tab.n_elems * sizeof(float)), *g_full = TP_MALLOC(m.tab.n_elems * sizeof(float));
    float loss_none, loss_full;
    /* activations kept: forward fuses every boundary (encoder 2 per layer,
     * decoder 3, the last into the final LayerNorm); only each stack's first
     * LayerNorm and the embeddings' dropout stand alone. Backward fuses the
     * boundaries inside a layer (E + 2D); the first LayerNorm of each layer
     * and the two final ones run alone, and so does the dropout of each
     * layer's last sub-block and of the two embeddings. */
    Counts n = step(&m, MODEL_RECOMPUTE_NONE, &loss_none, g_none);
    expect("none: fused forward", n.res_fwd, 2 * E + 3 * D);
    expect("none: LayerNorm forward", n.ln_fwd, 2);
    expect("none: dropout forward", n.drop_fwd, 2);
    expect("none: fused backward", n.res_bwd, E + 2 * D);
    expect("none: LayerNorm backward", n.ln_bwd, E + D + 2);
    expect("none: dropout backward", n.drop_bwd, E + D + 2);
    /* full recomputation: layers fuse only inside themselves, and backward
     * runs every layer's forward once more */
    n = step(&m, MODEL_RECOMPUTE_FULL, &loss_full, g_full);
    expect("full: fused forward", n.res_fwd, 2 * (E + 2 * D));
    expect("full: LayerNorm forward", n.ln_fwd, (E + D + 2) + (E + D));
    expect("full: dropout forward", n.drop_fwd, (E + D + 2) + (E + D));
    expect("full: fused backward", n.res_bwd, E + 2 * D);
    expect("full: LayerNorm backward", n.ln_bwd, E + D + 2);
    expect("full: dropout backward", n.drop_bwd, E + D + 2);

    CHECK(memcmp(&loss_none, &loss_full, sizeof loss_none) == 0, "loss %.9g kept vs %.9g recomputed", loss_none,
          loss_full);
    size_t n_diff = 0;
    for (size_t i = 0; i < m.tab.n_elems; i++) n_diff += memcmp(g_none + i, g_full + i, sizeof(float)) != 0;
    CHECK(n_diff == 0, "%zu of %zu gradients differ between kept and recomputed activations", n_diff,
          m.tab.n_elems);
    printf("test_model_fused: loss %.6f; %ld fused forward and %ld fused backward calls per step (E=%ld, D=%ld)\n",
           loss_none, 2 * E + 3 * D, E + 2 * D, E, D);

    m.be->ops = g_real;
    free(g_none), free(g_full);
    model_free(&m);
    return check_report("test_model_fused");
}
