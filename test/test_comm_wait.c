/* test_comm_wait.c: the wait loop of the NCCL communicator (comm_wait),
 * driven on the CPU by a stand-in communicator: work that finishes after
 * some looks (no abort), work that fails (aborted once, the reason and the
 * rank in the sentence), and work that pends for ever, as when a peer has
 * stopped (aborted once at --comm-timeout on a fake clock, the sentence
 * naming the rank and the timeout), plus a real clock: a stuck wait ends
 * within the timeout and a little more, not never.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "clock.h"
#include "tp/comm_wait.h"

#define REAL_TIMEOUT_S 0.2
#define REAL_SLACK_S 0.5  // scheduling on a loaded machine: the wait ends this soon after the deadline

typedef struct {
    int polls, aborts;
    int done_at;   // the look at which the work is done (-1: never)
    int fail_at;   // the look at which it fails (-1: never)
    double clock;  // fake seconds; every look costs tick
    double tick;
    int polls_after_abort;
} Fake;

static CommWorkState fake_poll(void *ctx, char *why, size_t why_len) {
    Fake *f = ctx;
    if (f->aborts) f->polls_after_abort++;
    const int i = f->polls++;
    f->clock += f->tick;
    if (i == f->fail_at) {
        snprintf(why, why_len, "unhandled system error (remote process exited)");
        return COMM_WORK_FAILED;
    }
    return i == f->done_at ? COMM_WORK_DONE : COMM_WORK_PENDING;
}
static void fake_abort(void *ctx) { ((Fake *)ctx)->aborts++; }
static double fake_now(void *ctx) { return ((Fake *)ctx)->clock; }
static void fake_backoff(void *ctx, unsigned poll_no) { (void)ctx, (void)poll_no; }

static CommWaiter waiter(Fake *f) {
    return (CommWaiter){.ctx = f, .poll = fake_poll, .abort = fake_abort, .now = fake_now, .backoff = fake_backoff};
}

static const char *WHAT = "comm dp (nccl): rank 3 (group rank 1 of 2, device 1): allreduce #12";

int main(void) {
    char err[512];
    /* finishes at the 5th look: no abort, no message */
    Fake f = {.done_at = 4, .fail_at = -1, .tick = 1.0};
    CommWaiter w = waiter(&f);
    CHECK(comm_wait(&w, 100.0, 100.0, WHAT, err, sizeof err) == 0, "%s", err);
    CHECK(f.polls == 5 && f.aborts == 0, "%s", err);

    /* fails at the 3rd look: aborted once, the reason and the rank in one sentence */
    f = (Fake){.done_at = -1, .fail_at = 2, .tick = 1.0};
    w = waiter(&f);
    err[0] = 0;
    CHECK(comm_wait(&w, 100.0, 100.0, WHAT, err, sizeof err) == -1, "%s", err);
    CHECK(f.aborts == 1 && f.polls == 3 && f.polls_after_abort == 0, "%s", err);
    CHECK(strcmp(err, "comm dp (nccl): rank 3 (group rank 1 of 2, device 1): allreduce #12 failed: unhandled system "
                      "error (remote process exited); the communicator was aborted") == 0, "%s", err);

    /* a stopped peer: pends for ever; with a 30 s timeout and 1 s per look, aborted at the deadline */
    f = (Fake){.done_at = -1, .fail_at = -1, .tick = 1.0};
    w = waiter(&f);
    CHECK(comm_wait(&w, 30.0, 30.0, WHAT, err, sizeof err) == -2, "%s", err);
    CHECK(f.aborts == 1 && f.polls == 30 && f.polls_after_abort == 0, "%s", err);
    CHECK(strstr(err, "rank 3 (group rank 1 of 2, device 1): allreduce #12 did not complete within 30 s (--comm-timeout") == err + strlen("comm dp (nccl): "), "%s", err);
    CHECK(strstr(err, "the communicator was aborted") != NULL, "%s", err);

    /* work done at the very look the deadline passes counts as done */
    f = (Fake){.done_at = 29, .fail_at = -1, .tick = 1.0};
    w = waiter(&f);
    CHECK(comm_wait(&w, 30.0, 30.0, WHAT, err, sizeof err) == 0 && f.aborts == 0, "%s", err);

    /* the real clock and the default backoff: a stuck wait ends near its deadline */
    f = (Fake){.done_at = -1, .fail_at = -1};
    w = (CommWaiter){.ctx = &f, .poll = fake_poll, .abort = fake_abort};
    const double t0 = tp_now_s();
    CHECK(comm_wait(&w, t0 + REAL_TIMEOUT_S, REAL_TIMEOUT_S, WHAT, err, sizeof err) == -2, "%s", err);
    const double took = tp_now_s() - t0;
    CHECK(took >= REAL_TIMEOUT_S && took < REAL_TIMEOUT_S + REAL_SLACK_S, "%s", err);
    CHECK(f.aborts == 1, "%s", err);
    printf("test_comm_wait: a stuck wait of %.2f s timeout ended after %.3f s and %d looks\n", REAL_TIMEOUT_S,
           took, f.polls);
    return check_report("test_comm_wait");
}
