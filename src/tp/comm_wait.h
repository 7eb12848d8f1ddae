/* comm_wait.h: waiting for queued communication to finish, fail, or pass
 * its deadline, and then stopping it.
 *
 * NCCL in non-blocking mode returns at once from every call; the caller
 * looks until the work is done. A peer that stopped or is gone makes the
 * work pend for ever, so the wait has a deadline (--comm-timeout) after
 * which the work is aborted (ncclCommAbort also stops kernels waiting on a
 * peer) and the job ends with one sentence naming the rank. The loop is
 * written against this small table rather than NCCL itself, so that it is
 * the same code a CPU test drives with a stand-in communicator (a fake that
 * pends, fails or finishes on cue, and a fake clock), and free of CUDA and
 * NCCL headers.
 */
#ifndef TPTRAIN_COMM_WAIT_H
#define TPTRAIN_COMM_WAIT_H

#include <stddef.h>

typedef enum { COMM_WORK_DONE = 0, COMM_WORK_PENDING = 1, COMM_WORK_FAILED = 2 } CommWorkState;

typedef struct {
    void *ctx;
    /* One look at the work: done, still pending, or failed (then why, one phrase). */
    CommWorkState (*poll)(void *ctx, char *why, size_t why_len);
    /* Stops the work and its communicator for good (called at most once). */
    void (*abort)(void *ctx);
    /* Seconds on a monotonic clock; NULL: tp_now_s. */
    double (*now)(void *ctx);
    /* Between looks (poll_no counts from 0); NULL: spin, then yield, then sleep 50 us. */
    void (*backoff)(void *ctx, unsigned poll_no);
} CommWaiter;

/* Polls w until the work is done (0), fails (-1) or deadline passes (-2);
 * on -1 and -2 the work is aborted and err holds one sentence beginning
 * with what (e.g. "comm dp (nccl): rank 3 (group rank 1 of 2, device 1):
 * allreduce #12"), saying what happened, and ending "the communicator was
 * aborted". timeout_s is the figure the sentence gives. */
int comm_wait(const CommWaiter *w, double deadline, double timeout_s, const char *what, char *err, size_t err_len);

/* The default backoff: SPIN polls spinning, then yields, then 50 us sleeps. */
void comm_wait_backoff(unsigned poll_no);

#endif
