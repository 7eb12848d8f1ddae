/* ckpt_pieces.h: ZeRO optimizer shards in checkpoints (checkpoint.c's
 * helper). Under ZeRO a dp rank holds the AdamW moments of pieces of the
 * flat parameter buffer (optim.h's OptRange), cut through tensors, and it
 * saves them as they lie: for every (range, tensor) overlap, one 1-D F32
 * entry per moment named `exp_avg.NAME@START` / `exp_avg_sq.NAME@START`,
 * with the list [[NAME, START, END], ...] (elements of the tensor's
 * tp-local shard, flattened) in the file's metadata under "pieces". A
 * loader of any layout rebuilds each tensor's tp-local moments from the
 * pieces of every dp file, checking that they cover it exactly once. */
#ifndef TPTRAIN_CKPT_PIECES_H
#define TPTRAIN_CKPT_PIECES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "safetensors.h"
#include "transformer/optim.h"
#include "transformer/params.h"

/* The pieces of the ranges r[0..n) as (tensor index, start, end) in the
 * tensor's local elements, ascending; *count of them. Caller frees. */
typedef struct {
    int tensor;
    size_t start, end;
} OptPiece;
OptPiece *opt_pieces(const ParamTable *tab, const OptRange *r, int n, int *count);

/* Adds the pieces of opt's state (host views m, v of opt->n_elems) to w,
 * with the "pieces" metadata; the names live in *names until the file is
 * written (caller frees). */
void opt_pieces_add(StWriter *w, const ParamTable *tab, const AdamW *opt, const float *m, const float *v,
                    char **names);

/* The state elements (both moments) the file of dp rank d holds under
 * `zero` with bucket_elems: for the manifest's size check. */
uint64_t opt_pieces_file_elems(const ParamTable *tab, int zero, size_t bucket_elems, int dp, int d, bool staged);

/* Into loc (p's local elements), the moment `kind` ("exp_avg" or
 * "exp_avg_sq") of tensor p from the pieces of the dp files f[0..dp)
 * (paths for messages). 0, or -1 + err when a piece is malformed or the
 * pieces do not cover the tensor exactly once. */
int opt_pieces_read(const StFile *f, char (*paths)[4096], int dp, const ParamInfo *p, const char *kind, float *loc,
                    char *err, size_t err_len);

#endif
