/* clock.h: the one monotonic wall clock for timings (seconds), and a process's age. */
#ifndef TPTRAIN_CLOCK_H
#define TPTRAIN_CLOCK_H

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline double tp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds since this process started (the kernel's start time in
 * /proc/self/stat against /proc/uptime: 10 ms resolution), so that a
 * launch-to-first-step time counts the loading before main; -1 where
 * /proc cannot say. */
static inline double tp_process_age_s(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1.0;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');  // the command name may hold spaces; fields follow its ')'
    unsigned long long start = 0;
    int field = 2;
    for (; p && *p && field < 22; p++)
        if (*p == ' ') field++;
    if (!p || sscanf(p, "%llu", &start) != 1) return -1.0;
    double up = -1.0;
    f = fopen("/proc/uptime", "r");
    if (!f) return -1.0;
    if (fscanf(f, "%lf", &up) != 1) up = -1.0;
    fclose(f);
    const long hz = sysconf(_SC_CLK_TCK);
    return up < 0 || hz <= 0 ? -1.0 : up - (double)start / (double)hz;
}

#endif
