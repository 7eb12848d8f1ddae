/* mt.h: a translation model as users handle it: the network plus its
 * tokenizer, in one directory (config.json, model.safetensors, spm.model).
 * Shared by train_mt (saving, dev BLEU) and translate_mt. */
#ifndef TPTRAIN_MT_H
#define TPTRAIN_MT_H

#include <stddef.h>
#include "data/spm.h"
#include "transformer/decode.h"
#include "transformer/model.h"

typedef struct {
    Model model;
    Spm *spm;
} MtModel;

/* Loads an export (DIR/config.json, DIR/model.safetensors, DIR/spm.model)
 * or a checkpoint of any layout (DIR/manifest.json, or a folder of
 * checkpoints: its latest) and checks model and tokenizer agree
 * (vocabulary size, special ids). 0 or -1 + err. */
int mt_load(MtModel *mt, const char *dir, char *err, size_t err_len);
/* The same on backend be (NULL: the model's own CPU backend); be then
 * outlives mt (mt_free does not destroy it). */
int mt_load_on(MtModel *mt, Backend *be, const char *dir, char *err, size_t err_len);
void mt_free(MtModel *mt);

/* Exports the model and copies the tokenizer next to it. 0 or -1 + err. */
int mt_save(const Model *m, const char *spm_model_path, const char *dir, char *err, size_t err_len);

/* Translates n sources given as piece ids (no eos; at most max_len - 1 of
 * them: longer ones are cut there). Sentences are sorted by length and
 * decoded in batches of at most batch_size; out holds them in input order.
 * beam 0 = greedy. */
void mt_translate_ids(Model *m, const int32_t *const *src, const int *len, int n, int beam, float lenpen,
                      int batch_size, Hypotheses *out);

/* Log-probability of each target given its source (pieces, no bos/eos), in
 * batches of batch_size pairs; scores (n). */
void mt_score_ids(Model *m, const int32_t *const *src, const int *src_len, const int32_t *const *tgt,
                  const int *tgt_len, int n, int batch_size, double *scores);

/* Encodes a line with the tokenizer into a malloc'ed id array; *n receives
 * the count. NULL when the tokenizer fails. */
int32_t *mt_encode_line(const Spm *spm, const char *line, int *n);

#endif
