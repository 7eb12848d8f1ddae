/* run.h: a training run of train_mt, as the steps main calls in order:
 * set up (device, ranks, data, model, optimizer, resume), train (the step
 * loop with its logging, evaluation, checkpoints and stops), finish (the
 * last checkpoint, the best, the average), report (time, collectives,
 * stages, profile, memory), outputs (--dump-batches, --export), close.
 *
 * Run holds what those steps share; every rank runs every step (the
 * collectives inside them pair up), rank 0 (`lead`) prints and writes.
 */
#ifndef TPTRAIN_APP_RUN_H
#define TPTRAIN_APP_RUN_H

#include <stdbool.h>
#include <stdio.h>

#include "app/args.h"
#include "app/persist.h"
#include "app/report.h"
#include "app/source.h"
#include "app/startup.h"
#include "data/batch_dump.h"
#include "train/checkpoint.h"
#include "train/grad_sync.h"
#include "train/horizon.h"
#include "train/step.h"
#include "transformer/model.h"
#include "transformer/optim.h"

typedef struct {
    TrainArgs *a;
    Backend *be;
    Runtime rt;
    ModelStage stages[MAX_PP];
    char pp_layout[CKPT_MAX_LAYOUT];  // what checkpoints record of the stages
    const Mesh *mesh;
    bool lead;  // rank 0: prints, writes metrics and saves
    int pp;
    Source src;
    Model m;      // this rank's stage (its tp shard)
    Model stack;  // with stages: the whole stack's tp shard, on the first stage's ranks of dp rank 0
    Model whole;  // the whole model on rank 0, which decodes for dev BLEU (whole_held)
    bool stack_here, decode_here;
    bool whole_is_m;  // the training model is whole (tp 1, pp 1): it decodes and exports itself
    bool whole_held;  // r->whole was made (decode_here, and the training model is not whole)
    Model *evm;  // the model evaluate() runs (NULL on ranks that do not evaluate)
    GradSync *gsync;
    AdamW opt;
    Trainer trainer;
    FILE *metrics;  // --metrics, on rank 0
    int first_step, total;
    /* the loop's state */
    bool tty;  // rank 0 on a terminal: a progress line updated in place
    RunClock clock;
    Horizon hz;  // --max-minutes: the schedule's time horizon and the stop (rank 0's clock)
    double t_window, pad_slots, all_slots;  // the log window's start, padded and total batch slots
    long tok_window;
    double *mem_last;  // the memory figures last reported
    int saved_step;
    CkptWriter *writer;  // --save-mode async: the background writer (NULL: sync, or no --save)
    Best best;
    double top;  // the best single evaluation's dev BLEU (lowest loss for a --task run), for --average-last
    int top_step, early_stop, stop_sig;
    BatchDump *dump;
    Startup *boot;  // the start-up phases, closed and reported at the first step
} Run;

/* Everything before the first step, its phases marked on boot; a refusal
 * printed, its exit status returned (nonzero: main returns it at once). */
int run_setup(Run *r, TrainArgs *a, Startup *boot);
/* The steps; 1 when a step's loss is not finite (main returns it at once). */
int run_train(Run *r);
/* The last checkpoint, the best checkpoint's line, --average-last. 0 or 1. */
int run_finish(Run *r);
/* The closing lines and the memory table (collective). */
void run_report(Run *r);
/* --dump-batches and --export. 0 or 1. */
int run_outputs(Run *r);
/* Frees the run; the exit status from rc and a stop on a signal. */
int run_close(Run *r, int rc);

#endif
