/* threads.h: how a node's cores are shared out among the workers tprun
 * starts (like torchrun, so that they do not each start a thread per
 * core): cores / workers threads each, at least one. */
#ifndef TPTRAIN_TP_THREADS_H
#define TPTRAIN_TP_THREADS_H

#include <stdlib.h>
#include <unistd.h>

static inline long tp_threads_per_worker(long workers) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return workers > 0 && cores > workers ? cores / workers : 1;
}

/* This process's threads: OMP_NUM_THREADS (tprun sets it to cores /
 * workers; its leading digits) when positive, else
 * every core. */
static inline long tp_threads_here(void) {
    const char *s = getenv("OMP_NUM_THREADS");
    const long t = s && *s ? atol(s) : 0;
    if (t > 0) return t;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? cores : 1;
}

#endif
