/* resample.h: subword regularization over token files: each epoch, every
 * training pair's two sides re-segmented by spm_sample_ids (Kudo 2018;
 * fairseq's --sentencepiece-enable-sampling, Marian's
 * --sentencepiece-alphas), into token files held in memory that the
 * dataset batches that epoch (dataset_set_epoch_files).
 *
 * An epoch's samples are a pure function of (the token files, the
 * tokenizer, alpha, nbest, seed, epoch): side s of pair i of corpus k is
 * drawn from SplitMix64 seeded by (seed, epoch, k, i, s), never from a
 * stream a thread or a rank shares. So any thread count gives the same
 * bytes, every data-parallel rank builds the same epoch for its share, and
 * a resume at (epoch, position) replays the samples a straight run drew.
 * The text is the token file's: its best ids spell the normalized
 * sentence (spm.h), so no text file is read again.
 *
 * A sample longer than max_pieces (the longest side a batch takes) keeps
 * its best segmentation: the usable pairs and their count stay those of
 * the token files, so epochs differ in lengths only. A corpus taken
 * several times an epoch has one sample per pair per epoch.
 *
 * Epoch e is built on `workers` threads when it is asked for, and e + 1 is
 * then built in the background while e trains; two epochs are held at
 * once (the one asked for and the next).
 */
#ifndef TPTRAIN_RESAMPLE_H
#define TPTRAIN_RESAMPLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "data/spm.h"
#include "data/tokfile.h"

#define RESAMPLE_MAX_CORPORA 16

typedef struct {
    int64_t epoch;  // -1: empty
    TokenFile tf[RESAMPLE_MAX_CORPORA];
    const TokenFile *tfp[RESAMPLE_MAX_CORPORA];
    double seconds;  // to build it
} ResampleEpoch;

typedef struct {
    const Spm *spm;
    float alpha;
    int nbest;
    uint64_t seed;
    int max_pieces;
    int workers;
    int n_tf;
    const TokenFile *base[RESAMPLE_MAX_CORPORA];
    ResampleEpoch slot[2];
    int cur;             // the slot handed out last
    pthread_t bg;        // builds slot[1 - cur] while it runs
    bool bg_running;
    int bg_rc;
    char err[512];
} Resampler;

/* 0, or -1 + err (alpha <= 0, nbest neither -1 nor >= 2, too many files). */
int resampler_init(Resampler *r, const Spm *spm, const TokenFile *const *tfs, int n_tf, float alpha, int nbest,
                   uint64_t seed, int max_pieces, int workers, char *err, size_t err_len);
/* The token files of epoch `epoch` (n_tf of them, in order), valid until
 * another epoch is asked for; starts building epoch + 1 in the background.
 * Exits with a message on a failure (the tokenizer refusing ids it made). */
const TokenFile *const *resampler_epoch(Resampler *r, int64_t epoch);
/* resampler_epoch as a dataset's per-epoch callback (ctx: the Resampler). */
const TokenFile *const *resampler_epoch_files(void *ctx, int64_t epoch);
void resampler_free(Resampler *r);

/* The seed of one side's sample (exposed for the tests). */
uint64_t resample_seed(uint64_t seed, int64_t epoch, int corpus, int64_t pair, int side);

#endif
