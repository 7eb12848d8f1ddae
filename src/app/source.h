/* source.h: where a run's batches come from: a corpus folder (prepared
 * and cached by data/corpus.h, batched by data/dataset.h) or a synthetic
 * copy/reverse task; and how many steps the run takes over it.
 *
 * The plan (--plan, --layout auto) reads the same token files to learn the
 * batch shapes a layout would see, so the struct is open to it.
 */
#ifndef TPTRAIN_APP_SOURCE_H
#define TPTRAIN_APP_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "app/args.h"
#include "app/startup.h"
#include "data/batch.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/resample.h"
#include "data/spm.h"
#include "tp/runtime.h"

/* Where batches come from: the corpus, or a synthetic task. */
typedef struct {
    const TrainArgs *args;
    const ModelConfig *cfg;
    const Mesh *mesh;
    /* corpus */
    Spm *spm;
    char spm_path[4096];
    int n_train;                                // corpora of the training set (--data's list)
    TokenFile train_tf[DATASET_MAX_CORPORA];    // their training splits, the first corpus's first
    int train_copies[DATASET_MAX_CORPORA];      // times each is taken an epoch
    TokenFile dev_tf;                           // the first corpus's dev split
    Dataset train, dev;
    bool sampling;                              // --spm-alpha > 0: train's epochs come from resample
    Resampler resample;
    /* synthetic */
    uint64_t synth_index;
} Source;

/* Rank 0 prepares the corpus cache (tokenizer, token files); the others
 * wait for it and then map the same files. Sets cfg's vocabulary, token
 * ids and text form from the tokenizer and the corpus; its phases are
 * marked on boot (NULL: not timed). 0, or -1 with err (source_close is
 * still called). */
int source_open(Source *src, const TrainArgs *a, ModelConfig *cfg, const Runtime *rt, Startup *boot, char *err,
                size_t err_len);
void source_close(Source *src);

/* A dataset over the training corpora for share dp_rank of `shares`
 * (source_open's, and the planner's per rank). 0, or -1 + why. */
int source_train_dataset(const Source *src, Dataset *ds, int dp_rank, int shares, int batch_tokens, char *why,
                         size_t why_len);

/* This rank's micro-batches b[0..M) of the next global batch (share
 * dp_rank + i dp of dp x M); *global_tokens = target tokens of the whole
 * global batch (the divisor of the mean loss). */
void source_next(Source *src, OwnedBatch *b, long *global_tokens);

/* Steps of the run: --max-steps (or the preset's), or --epochs passes over
 * n_batches global batches, counted in 64 bits and bounded so the step
 * counter never wraps. A run too long for it is refused (exit 2). */
int run_steps(const TrainArgs *a, int n_batches);

#endif
