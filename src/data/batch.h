/* batch.h: the batch the model reads, and a batch that owns its id arrays,
 * as the data sources produce it (`view` is its Batch). */
#ifndef TPTRAIN_BATCH_H
#define TPTRAIN_BATCH_H

#include <stdint.h>

/* One batch, right-padded with pad_id. Lengths count real tokens. */
typedef struct {
    int B, S, T;                // sequences, padded source and target lengths
    const int32_t *src;         // (B, S)
    const int32_t *src_len;     // (B)   1 <= src_len[b] <= S
    const int32_t *tgt_in;      // (B, T) bos y_1 .. y_n, then pad
    const int32_t *tgt_out;     // (B, T) y_1 .. y_n eos, then pad
    const int32_t *tgt_len;     // (B)   n + 1 <= T
} Batch;

/* What a batch must keep to for a model: ids in [0, vocab_size), sequences
 * of at most max_len positions, and the special ids (a model config's:
 * config_tokens in transformer/config.h). */
typedef struct {
    int vocab_size, max_len;
    int pad_id, bos_id, eos_id;
} TokenSpec;

typedef struct {
    Batch view;
    int32_t *src, *src_len, *tgt_in, *tgt_out, *tgt_len;
} OwnedBatch;

/* Allocates (B, S) source and (B, T) target arrays, every id pad_id and
 * every length 0, and points view at them. */
void owned_batch_alloc(OwnedBatch *b, int B, int S, int T, int32_t pad_id);
void owned_batch_free(OwnedBatch *b);

/* out = rows start, start + stride, ... of src (a data-parallel rank's share
 * of a global batch; padded lengths kept). */
/* The share of the batch's slots (source and target-input, B x S + B x T)
 * that hold padding: 0 for a batch of equal lengths. */
double batch_pad_fraction(const Batch *b);

void owned_batch_rows(const OwnedBatch *src, int start, int stride, OwnedBatch *out);

#endif
