/* threads.h: how a node's cores are shared out among the workers tprun
 * starts (like torchrun, so that they do not each start a thread per
 * core): cores / workers threads each, at least one. */
#ifndef TPTRAIN_TP_THREADS_H
#define TPTRAIN_TP_THREADS_H

#include <unistd.h>

static inline long tp_threads_per_worker(long workers) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return workers > 0 && cores > workers ? cores / workers : 1;
}

#endif
