/* batch_dump.h: the training batches of a run, kept and written to one
 * safetensors file, so that another framework (scripts/bench_torch_mt.py)
 * can train on exactly the batches tptrain trained on: the same shapes, the
 * same padding, the same tokens, in the same order.
 *
 * File: tensors "step<N>.<i>.<field>" for step N (1-based, as the run counts
 * them), micro-batch i (0-based) and field src (B, S), src_len (B), tgt_in
 * (B, T), tgt_out (B, T), tgt_len (B), all I32; metadata "format"
 * "tptrain-batches", "format_version" "1", "config" (the model's config.json
 * text), "first_step", "steps" and "micro_batches" as decimal strings. */
#ifndef TPTRAIN_BATCH_DUMP_H
#define TPTRAIN_BATCH_DUMP_H

#include <stddef.h>
#include "data/batch.h"

typedef struct BatchDump BatchDump;

/* A dump of micro_batches batches per step, its steps from first_step on. */
BatchDump *batch_dump_new(int first_step, int micro_batches);
/* Takes the arrays of step's micro-batch i (b is left empty). Steps come in
 * order, micro-batches 0..M-1 each. */
void batch_dump_take(BatchDump *d, int step, int i, OwnedBatch *b);
/* Writes the file atomically; config_json is the model's config.json text.
 * 0, or -1 with err naming the file. */
int batch_dump_write(const BatchDump *d, const char *path, const char *config_json, char *err, size_t err_len);
void batch_dump_free(BatchDump *d);

#endif
