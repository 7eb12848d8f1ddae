/* config.h: the model's hyper-parameters, presets, validation and JSON form.
 *
 * One struct describes the encoder-decoder; the same struct is written to
 * config.json by the exporter and read back by every loader, so a model file
 * never needs its shapes guessed.
 */
#ifndef TPTRAIN_CONFIG_H
#define TPTRAIN_CONFIG_H

#include <stddef.h>
#include "data/batch.h"
#include "data/textnorm.h"
#include "kernels/ops.h"

/* Upper bounds of the dimensions (the flags of train_mt accept the same):
 * every product the model forms from two of them (vocab x d_model, d_ff x
 * d_model, ...) fits in 64-bit sizes, and each one fits in an int with room
 * for padding to a multiple of tp. */
#define CONFIG_MAX_D_MODEL 65536
#define CONFIG_MAX_HEADS 1024
#define CONFIG_MAX_D_FF (1 << 20)
#define CONFIG_MAX_VOCAB (1 << 24)
#define CONFIG_MAX_LEN (1 << 16)

typedef struct {
    int d_model;        // C
    int n_heads;        // H, divides d_model
    int d_ff;           // F
    int enc_layers;     // >= 1
    int dec_layers;     // >= 1
    int vocab_size;     // V (shared source/target vocabulary)
    int max_len;        // longest sequence (positions) the model accepts
    float dropout;      // on embeddings and every sub-block output
    float attn_dropout; // on the attention probabilities (after the softmax); "attention_dropout" in the JSON
    float act_dropout;  // on the FFN's hidden activations (after the activation); "activation_dropout"
                        // (both optional in the JSON: absent, as in files written before them, is 0)
    float label_smoothing;
    Activation act;     // FFN activation
    float ln_eps;       // LayerNorm epsilon
    int pad_id, bos_id, eos_id, unk_id; // special token ids
    TextNorm text;      // how the training text was normalized: not the network's shape (config_diff skips it);
                        // "text" in the JSON, optional (absent: textnorm_assumed)
} ModelConfig;

/* Fills cfg from a preset name ("tiny", "small", "base", "big").
 * Returns 0, or -1 with a sentence in err for an unknown name. */
int config_preset(const char *name, ModelConfig *cfg, char *err, size_t err_len);

/* Returns 0 when cfg describes a buildable model, else -1 and one sentence
 * naming the offending field in err. */
int config_validate(const ModelConfig *cfg, char *err, size_t err_len);

/* JSON text (caller frees) / parse with validation (-1 + err naming the field). */
char *config_to_json(const ModelConfig *cfg);
int config_from_json(const char *text, ModelConfig *cfg, char *err, size_t err_len);

/* The vocabulary, longest sequence and special ids batches for cfg keep to. */
TokenSpec config_tokens(const ModelConfig *cfg);

/* NULL when a and b describe the same model, else one sentence naming the
 * first field that differs and whose value is which (written to buf):
 * "the checkpoint has d_model 128, this run 256" for names "the
 * checkpoint" and "this run". */
const char *config_diff(const ModelConfig *a, const char *a_name, const ModelConfig *b, const char *b_name, char *buf,
                        size_t buf_len);

const char *activation_name(Activation act);
int activation_parse(const char *s, Activation *act);

#endif
