/* dataset.h: token pairs -> padded batches for one data-parallel rank.
 *
 * Like fairseq's max_tokens: pairs are bucketed by length and packed into
 * batches whose padded size (sequences x longest side, bos/eos included)
 * stays within a token budget. Every epoch has its own order, a pure
 * function of (seed, epoch): pairs are shuffled, stably sorted by length,
 * cut into global batches (budget x dp_size), and the batch order shuffled.
 * Global batch g is dealt to the dp ranks by striding its length-sorted
 * pairs (pair j goes to rank j % dp_size), so every pair is seen exactly
 * once per epoch, by one rank, and all ranks take the same number of steps.
 * A global batch always holds at least dp_size pairs.
 *
 * The cursor (seed, epoch, position) is all the state there is: saving it
 * and restoring it resumes at the same batch. With per-epoch token files
 * (subword sampling) the plan is also a function of that epoch's files,
 * themselves a pure function of (seed, epoch): still nothing else to save.
 *
 * Length buckets (dataset_set_length_bucket, `--length-bucket N`): each
 * batch's source and target lengths are padded up to a multiple of N
 * (capped at max_len), so few distinct shapes recur and a GPU can reuse its
 * plans. The budget holds for the padded shapes. N = 1 is the plain cut.
 */
#ifndef TPTRAIN_DATASET_H
#define TPTRAIN_DATASET_H

#include <stdbool.h>
#include <stdint.h>
#include "data/corpus.h"
#include "data/synthetic.h"

typedef enum { DIR_EN_JA = 0, DIR_JA_EN = 1 } Direction;

typedef struct {
    uint64_t seed;
    int64_t epoch;     // 0-based
    int64_t position;  // index of the next global batch within the epoch
} DataCursor;

#define DATASET_MAX_CORPORA 16  // token files one dataset mixes
#define DATASET_MAX_COPIES 100   // times a corpus is taken an epoch

typedef struct {
    const TokenFile *tf;  // the first corpus (the only one, but for dataset_init_mix)
    int n_tf;
    const TokenFile *tfs[DATASET_MAX_CORPORA];
    int copies[DATASET_MAX_CORPORA];
    int32_t first[DATASET_MAX_CORPORA + 1];  // corpus k's pairs are ids first[k] .. first[k+1] - 1
    Direction dir;
    int max_len;          // a side longer than max_len - 1 pieces is skipped
    int batch_tokens;     // per-rank budget of padded tokens
    int dp_rank, dp_size;
    int pad_id, bos_id, eos_id;
    int length_bucket;    // padded lengths are multiples of this (or max_len); 1: none
    /* filled by dataset_init */
    int n_usable;         // pairs within max_len
    long n_too_long;      // pairs skipped for length
    int32_t *usable;      // (n_usable) pair indices, length-sorted (eval order)
    uint32_t *usable_key; // (n_usable) their sort keys: longest side (eos/bos included) - 1 << 16 | source pieces
    /* current epoch's plan */
    int64_t plan_epoch;   // epoch the plan below belongs to (-1: none)
    int n_batches;        // global batches in the epoch
    int32_t *order;       // (n_usable) pair indices, batches contiguous
    int32_t *batch_start; // (n_batches + 1) into order, in batch order
    DataCursor cursor;
    /* per-epoch token files (subword sampling, data/resample.h); NULL: tfs every epoch */
    const TokenFile *const *(*epoch_files)(void *ctx, int64_t epoch);
    void *epoch_ctx;
} Dataset;

/* 0 or -1 + err (e.g. nothing usable, dp_rank out of range, budget too
 * small for the longest usable pair). */
int dataset_init(Dataset *ds, const TokenFile *tf, Direction dir, int max_len, int batch_tokens, int dp_rank,
                 int dp_size, uint64_t seed, int pad_id, int bos_id, int eos_id, char *err, size_t err_len);
/* Several corpora as one: pair ids run through the token files in order,
 * and corpus k's usable pairs are taken copies[k] times an epoch (NULL:
 * once each), each copy a pair of its own in the shuffle and the cut, as
 * fairseq's and Marian's up-sampling of a smaller corpus. dataset_init is
 * the case of one file taken once. */
int dataset_init_mix(Dataset *ds, const TokenFile *const *tfs, const int *copies, int n_tf, Direction dir,
                     int max_len, int batch_tokens, int dp_rank, int dp_size, uint64_t seed, int pad_id, int bos_id,
                     int eos_id, char *err, size_t err_len);
void dataset_free(Dataset *ds);
/* Pads every batch's lengths up to multiples of n (at most max_len) from
 * now on; call right after dataset_init. 0, or -1 + err (n < 1, or the
 * longest usable pair padded to a multiple of n exceeds batch_tokens). */
int dataset_set_length_bucket(Dataset *ds, int n, char *err, size_t err_len);

/* The longest side (in pieces) a batch of ds takes: within max_len - 1
 * and, padded with its bos/eos to the length bucket, within the budget. */
int dataset_max_pieces(const Dataset *ds);
/* From now on epoch e's batches come from files(ctx, e) (n_tf token files
 * with ds's pairs, each side at most dataset_max_pieces long: subword
 * samples): the usable pairs stay those of dataset_init, their lengths and
 * so the epoch's plan are the epoch's files'. The plan of the cursor's
 * epoch is rebuilt. */
void dataset_set_epoch_files(Dataset *ds, const TokenFile *const *(*files)(void *ctx, int64_t epoch), void *ctx);

/* This rank's share of the next global batch; advances the cursor (into the
 * next epoch when one ends). src = pieces + eos, tgt_in = bos + pieces,
 * tgt_out = pieces + eos, all right-padded with pad_id. *global_tokens (if
 * non-NULL) receives the target tokens (incl. eos) of the whole global
 * batch, the divisor of the data-parallel mean loss. */
void dataset_next(Dataset *ds, OwnedBatch *out, long *global_tokens);
/* With gradient accumulation: a dataset made with dp_size = dp x n_micro
 * shares (dp_rank < dp) gives rank dp_rank the shares dp_rank + i dp,
 * i < n_micro, of the next global batch (budget x dp x n_micro) as out[i].
 * dataset_next is the case n_micro = 1. */
void dataset_next_micro(Dataset *ds, int n_micro, OwnedBatch *out, long *global_tokens);

/* Every usable pair once, in a fixed length-sorted order, for evaluation:
 * batch i of n (not shuffled, not split across ranks). Returns the number of
 * batches; dataset_eval_batch fills batch i. `index` (n_seqs) receives the
 * pair indices of the batch's rows. */
int dataset_eval_batches(Dataset *ds);
void dataset_eval_batch(Dataset *ds, int i, OwnedBatch *out, int32_t *index);

DataCursor dataset_cursor(const Dataset *ds);
/* 0, or -1 + err when the cursor's seed differs from the dataset's. */
int dataset_seek(Dataset *ds, DataCursor c, char *err, size_t err_len);

int direction_parse(const char *s, Direction *d);

#endif
