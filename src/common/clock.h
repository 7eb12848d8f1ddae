/* clock.h: the one monotonic wall clock for timings (seconds). */
#ifndef TPTRAIN_CLOCK_H
#define TPTRAIN_CLOCK_H

#include <time.h>

static inline double tp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
