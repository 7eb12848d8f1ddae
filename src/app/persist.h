/* persist.h: what a run keeps on disk and how it ends early: --resume,
 * checkpoints (--save), --keep-best with --patience, --average-last, and
 * the save on a signal (train/preempt.h).
 *
 * Every function that saves is collective (each rank writes its shard);
 * the Best record is rank 0's, whose figures decide for every rank.
 */
#ifndef TPTRAIN_APP_PERSIST_H
#define TPTRAIN_APP_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "app/args.h"
#include "app/source.h"
#include "train/ckpt_async.h"
#include "train/horizon.h"
#include "transformer/model.h"
#include "transformer/optim.h"

/* Loads the checkpoint --resume names into this layout and moves the data
 * source to where it stood; *first_step receives the next step to run
 * (untouched when --resume auto finds nothing yet) and *clock the
 * checkpoint's --max-minutes clock (has_clock 0: none). 0, or -1 with err. */
int resume(const TrainArgs *a, const Runtime *rt, Model *m, AdamW *opt, Source *src, int total, int *first_step,
           TrainState *clock, char *err, size_t err_len);

/* Writes checkpoint `step` with the schedule's clock hz (collective): at
 * once when w is NULL (--save-mode sync), else snapshotted and written by
 * w in the background (train/ckpt_async.h), best (NULL: none) recorded as
 * DIR/best once the step is published. A failed save ends the run (exit
 * 1). Returns the seconds the run was held up. */
double save(const TrainArgs *a, const Runtime *rt, CkptWriter *w, const Model *m, const AdamW *opt, Source *src,
            const char *pp_layout, const Horizon *hz, int step, const CkptBestRecord *best);

/* Collective: waits until w's write in flight (none when w is NULL) is
 * published, with its line; a failed one ends the run (exit 1) naming the
 * file. Returns the seconds waited. */
double save_wait(const TrainArgs *a, const Runtime *rt, CkptWriter *w);

/* Rank 0's record of the kept figure: the best so far, its step, and the
 * evaluations since (what --patience counts). */
typedef struct {
    bool have;
    double value;
    int step, bad_evals;
} Best;

/* "dev BLEU" or "dev loss": the figure --keep-best keeps. */
const char *keep_label(int keep);

/* On resume: the --save folder's record, so a resumed run never replaces a
 * better best; the evaluations since it count toward --patience. */
void best_restore(const TrainArgs *a, int first_step, bool lead, Best *b);

/* Rank 0, after an evaluation: updates the record; returns 1 when v is the
 * best so far, 2 when --patience has run out (0: neither). */
int best_update(const TrainArgs *a, Best *b, double v, int step);

/* "bleu" or "loss": best.json's name of the figure --keep-best keeps. */
const char *keep_name(int keep);

/* Rank 0: points DIR/best at the step just saved (record false: the
 * background writer does, once the step is published); the line and the
 * metrics record. A failure ends the run. */
void best_publish(const TrainArgs *a, const Best *b, FILE *metrics, bool record);

/* Rank 0: the line and the metrics record of a run ended by --patience. */
void early_stop_report(const TrainArgs *a, const Best *b, int step, int total, FILE *metrics);

/* Rank 0, at the end (after save_wait: it reads published checkpoints): DIR/averaged, the mean of the newest --average-last
 * checkpoints, and its dev figures beside the best single evaluation's
 * (top: the best dev BLEU, or the lowest dev loss for a --task run). 0 or 1. */
int average_report(const TrainArgs *a, Backend *be, Source *src, double top, int top_step, FILE *metrics);

/* After the step every rank agreed to stop at (a signal reached some rank):
 * the checkpoint of that step, durable before it returns (a background
 * write waited for), where it is and how to go on; without --save, a clear
 * word that nothing is saved. Collective. Returns the seconds it blocked. */
double stop_on_signal(const TrainArgs *a, const Runtime *rt, CkptWriter *w, const Model *m, const AdamW *opt,
                      Source *src, const char *pp_layout, const Horizon *hz, int step, int saved_step, int sig,
                      int total);

#endif
