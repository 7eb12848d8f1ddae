/* testmodel.h: the small models the model tests build: the tiny preset
 * with the dimensions a test names and label smoothing 0.1 (what every one
 * of them trains with). One place, so the preset's other fields reach every
 * test the same way. */
#ifndef TPTRAIN_TEST_TESTMODEL_H
#define TPTRAIN_TEST_TESTMODEL_H
#include "err.h"
#include "transformer/config.h"

/* d_model, heads, d_ff, vocabulary, encoder and decoder layers (each), dropout. */
static inline ModelConfig test_model_config(int d_model, int n_heads, int d_ff, int vocab_size, int layers,
                                            float dropout) {
    ModelConfig cfg;
    char err[256];
    TP_CHECK(config_preset("tiny", &cfg, err, sizeof err) == 0, "%s", err);
    cfg.d_model = d_model;
    cfg.n_heads = n_heads;
    cfg.d_ff = d_ff;
    cfg.vocab_size = vocab_size;
    cfg.enc_layers = cfg.dec_layers = layers;
    cfg.dropout = dropout;
    cfg.label_smoothing = 0.1f;
    return cfg;
}

#endif
