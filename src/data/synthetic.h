/* synthetic.h: toy sequence tasks (copy, reverse) that need no corpus.
 * They prove the model and optimizer learn before any real data is read,
 * and give tests a task whose loss must fall fast. Batches are a pure
 * function of (seed, index), like everything else that is random here. */
#ifndef TPTRAIN_SYNTHETIC_H
#define TPTRAIN_SYNTHETIC_H

#include <stdint.h>
#include "data/batch.h"

typedef enum { SYNTH_COPY = 0, SYNTH_REVERSE = 1 } SynthTask;


/* B sequences of lengths in [min_len, max_len], tokens drawn from the ids
 * above the special ones (4 .. V-1); target = source (copy) or reversed.
 * max_len + 1 must not exceed tok.max_len. */
void synth_batch(OwnedBatch *out, SynthTask task, TokenSpec tok, int B, int min_len, int max_len, uint64_t seed,
                 uint64_t index);
int synth_task_parse(const char *s, SynthTask *task);
/* The task's name as --task takes it ("copy", "reverse"). */
const char *synth_task_name(SynthTask task);

#endif
