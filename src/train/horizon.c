/* horizon.c: see horizon.h. Two doubles a step through one broadcast;
 * every other figure is derived from them identically on every rank. */
#include "train/horizon.h"

#include <stdlib.h>
#include <string.h>
#include "clock.h"

void horizon_start(Horizon *h, double max_minutes, int warmup, int first_step, const TrainState *carried) {
    memset(h, 0, sizeof *h);
    h->budget_s = max_minutes > 0.0 ? 60.0 * max_minutes : 0.0;
    h->warmup = warmup;
    h->warmup_end_s = -1.0;
    if (h->budget_s <= 0.0) return;
    const bool have = carried && carried->has_clock;
    h->base_s = h->train_s = have ? carried->train_s : 0.0;
    h->step_s = have ? carried->step_s : 0.0;
    /* The ramp ends before step `warmup` (lr_at: the peak there). A resume
     * past it without a record (saved without --max-minutes) starts the
     * decay's span here. */
    if (have && carried->warmup_end_s >= 0.0) h->warmup_end_s = carried->warmup_end_s;
    else if (first_step >= warmup) h->warmup_end_s = h->base_s;
    const char *fake = getenv("TPTRAIN_FAKE_STEP_SECONDS");
    h->fake_s = fake ? strtod(fake, NULL) : 0.0;
    if (!(h->fake_s > 0.0)) h->fake_s = 0.0;
}

void horizon_begin(Horizon *h) { h->t0 = tp_now_s(); }

int horizon_tick(Horizon *h, Comm *ctrl, bool lead, int step) {
    if (h->budget_s <= 0.0) return 0;
    h->steps++;
    double now[2] = {0.0, 0.0};  // rank 0's training seconds and this step's length
    if (lead) {
        now[0] = h->fake_s > 0.0 ? h->base_s + h->steps * h->fake_s : h->base_s + (tp_now_s() - h->t0);
        now[1] = now[0] - h->train_s;
    }
    if (ctrl && comm_size(ctrl) > 1 && comm_broadcast(ctrl, now, sizeof now, 0) != 0) return -1;
    h->train_s = now[0];
    h->step_s = now[1];
    if (h->warmup_end_s < 0.0 && step + 1 >= h->warmup) h->warmup_end_s = h->train_s;
    return h->train_s >= h->budget_s;
}

double horizon_frac(const Horizon *h) {
    if (h->budget_s <= 0.0 || h->warmup_end_s < 0.0) return -1.0;
    const double span = h->budget_s - h->warmup_end_s;
    if (span <= 0.0) return 1.0;  // the warm-up took the whole budget
    const double f = (h->train_s + h->step_s - h->warmup_end_s) / span;
    return f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
}

void horizon_save(const Horizon *h, TrainState *st) {
    st->has_clock = h->budget_s > 0.0;
    st->train_s = h->train_s;
    st->step_s = h->step_s;
    st->warmup_end_s = h->warmup_end_s;
}
