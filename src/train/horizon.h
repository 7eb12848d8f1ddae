/* horizon.h: --max-minutes as the end of the learning-rate schedule.
 *
 * A run bounded by time has no last step to aim a cosine at: its horizon
 * is the time budget. After every step rank 0 reads its clock (training
 * time from the first step, set-up left out, plus what the checkpoint it
 * resumed had spent) and broadcasts it over the host control group, so
 * every rank takes the same stop and the same learning rate (a tp rank on
 * another lr would train other weights). A step's lr is taken at the time
 * that step is expected to end (the last step's length added), so the
 * step that passes the budget, the run's last, trains at the floor. The
 * warm-up stays in steps; the decay's time span starts where it ends.
 *
 * TPTRAIN_FAKE_STEP_SECONDS=S (for tests only) makes rank 0's clock
 * advance by exactly S seconds a step, so a test's schedule and stop are
 * exact; the other ranks' clocks are never read.
 */
#ifndef TPTRAIN_HORIZON_H
#define TPTRAIN_HORIZON_H

#include <stdbool.h>
#include "tp/comm.h"
#include "train/checkpoint.h"

typedef struct {
    double budget_s;      // 60 x --max-minutes (0: no horizon)
    int warmup;           // the schedule's warm-up steps
    double train_s;       // training seconds by the end of the last step (rank 0's, on every rank)
    double step_s;        // the last step's seconds
    double warmup_end_s;  // train_s when the warm-up ended (< 0: not yet)
    double base_s;        // train_s carried from the checkpoint this run resumed
    double t0, fake_s;    // the clock at the first step (horizon_begin); TPTRAIN_FAKE_STEP_SECONDS (0: real)
    int steps;            // steps this run has taken
} Horizon;

/* Before the first step (first_step: the step a resume goes on from);
 * carried: the checkpoint's state (NULL, or has_clock 0: nothing spent
 * before this run). max_minutes 0: no horizon, and nothing else here does
 * anything. */
void horizon_start(Horizon *h, double max_minutes, int warmup, int first_step, const TrainState *carried);

/* When the first step begins: training time counts from here. */
void horizon_begin(Horizon *h);

/* After step `step`, collective over ctrl (NULL or a group of one: local):
 * rank 0's clock for every rank. 1 when the budget is spent (the run ends
 * with this step), 0 to go on, -1 when the collective failed. */
int horizon_tick(Horizon *h, Comm *ctrl, bool lead, int step);

/* The time fraction for lr_at_frac of the next step: how much of the
 * decay's span (warm-up end to budget) will have passed when it ends, in
 * [0, 1]; -1 with no horizon or during the warm-up. */
double horizon_frac(const Horizon *h);

/* The clock into a checkpoint's state (has_clock only with a horizon). */
void horizon_save(const Horizon *h, TrainState *st);

#endif
