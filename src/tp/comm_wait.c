/* comm_wait.c: see comm_wait.h. Collectives of the tensor-parallel layers
 * are short, so the first looks spin; a wait that lasts yields the core,
 * then sleeps between looks, so a stuck peer costs no CPU while the
 * deadline runs. */
#define _GNU_SOURCE
#include "tp/comm_wait.h"

#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "clock.h"
#include "err.h"

#define SPIN_POLLS 256     // polls before yielding
#define YIELD_POLLS 4096   // polls before sleeping
#define SLEEP_S 50e-6      // between later polls

void comm_wait_backoff(unsigned poll_no) {
    if (poll_no < SPIN_POLLS) return;
    if (poll_no < YIELD_POLLS) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, (long)(SLEEP_S * 1e9)};
    nanosleep(&ts, NULL);
}

static double now_of(const CommWaiter *w) { return w->now ? w->now(w->ctx) : tp_now_s(); }

int comm_wait(const CommWaiter *w, double deadline, double timeout_s, const char *what, char *err, size_t err_len) {
    char why[256];
    for (unsigned i = 0;; i++) {
        why[0] = 0;
        const CommWorkState s = w->poll(w->ctx, why, sizeof why);
        if (s == COMM_WORK_DONE) return 0;
        if (s == COMM_WORK_FAILED) {
            w->abort(w->ctx);
            tp_error_set(err, err_len, "%s failed: %s; the communicator was aborted", what, why[0] ? why : "an error");
            return -1;
        }
        if (now_of(w) >= deadline) {
            w->abort(w->ctx);
            tp_error_set(err, err_len,
                         "%s did not complete within %g s (--comm-timeout: a peer did not make the same call, exited "
                         "or hangs); the communicator was aborted",
                         what, timeout_s);
            return -2;
        }
        if (w->backoff) w->backoff(w->ctx, i);
        else comm_wait_backoff(i);
    }
}
