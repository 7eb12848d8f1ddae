/* ckpt_average.h: checkpoint averaging (ckpt average, train_mt --average-last). */
#ifndef TPTRAIN_CKPT_AVERAGE_H
#define TPTRAIN_CKPT_AVERAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "train/checkpoint.h"

/* Writes `out`, a complete checkpoint directory whose weights are the mean
 * of the n checkpoint directories in[] (sum in double in the order given,
 * divided by n, rounded once to fp32), loaded from whatever layouts they were
 * saved with. All inputs must be the same model (config, corpus or task,
 * tokenizer): otherwise refused with one sentence. Optimizer state, step,
 * data cursor and tokenizer are the newest input's. An existing out is
 * refused unless replace. 0 or -1 + err. */
int ckpt_average(const char *const *in, int n, const char *out, bool replace, char *err, size_t err_len);

#endif
