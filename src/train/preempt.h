/* preempt.h: a signal asks the job to save and stop, at a step boundary.
 *
 * Clusters preempt with a signal some seconds before the kill (SLURM's
 * --signal=USR1@90, a spot machine's SIGTERM, Ctrl-C). The handler only
 * records the first signal's number; the training loop asks, after every
 * step, whether any rank got one (preempt_agree: one small allreduce over
 * the host control group, so every rank stops after the same step whichever
 * rank the signal reached), then saves one checkpoint (crash-safe as every
 * save) and exits with TP_EXIT_SAVED_ON_SIGNAL (common/err.h), which tprun
 * passes through.
 * Further signals while the job saves are recorded and change nothing: the
 * save completes (a SIGKILL, or tprun's second signal, leaves the previous
 * checkpoint as the newest complete one, as any crash does).
 */
#ifndef TPTRAIN_PREEMPT_H
#define TPTRAIN_PREEMPT_H

#include "tp/comm.h"

/* Handlers for SIGTERM, SIGINT and SIGUSR1 that record the first one. */
void preempt_install(void);

/* The signal this process received (0: none). */
int preempt_signal(void);

/* Collective over ctrl (NULL or a group of one: local only): the largest
 * signal number any rank received, 0 when none did. -1 when the collective
 * failed (comm_error(ctrl) says why). */
int preempt_agree(Comm *ctrl);

/* "SIGTERM", "SIGINT", "SIGUSR1" or "signal N" (static storage). */
const char *preempt_signal_name(int sig);

#endif
