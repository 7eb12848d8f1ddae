/* batch.h: a batch that owns its id arrays, as the data sources produce it;
 * `view` is the Batch the model reads. */
#ifndef TPTRAIN_BATCH_H
#define TPTRAIN_BATCH_H

#include <stdint.h>
#include "transformer/model.h"

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
void owned_batch_rows(const OwnedBatch *src, int start, int stride, OwnedBatch *out);

#endif
