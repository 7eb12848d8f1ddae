/* startup.h: where a run's time goes before its first step.
 *
 * Wall-clock phases that follow each other from the process's start (the
 * kernel's start time: exec and loading before main count as "launch") to
 * the first step's start: each mark closes the phase since the last one,
 * so the phases add up to the process's age at the first step and nothing
 * is counted twice. train_mt prints them in one line before its first step
 * and puts them in the first metrics record as "startup_s".
 */
#ifndef TPTRAIN_APP_STARTUP_H
#define TPTRAIN_APP_STARTUP_H

#include <stddef.h>
#include <stdio.h>

#define STARTUP_MAX_PHASES 24

typedef struct {
    double t_last;  // tp_now_s() at the last mark
    int n;
    const char *name[STARTUP_MAX_PHASES];  // static strings, JSON-safe
    double s[STARTUP_MAX_PHASES];
} Startup;

/* At main's start: the phase "launch" is the process's age now (left out
 * where /proc cannot say). */
void startup_begin(Startup *st);
/* The phase since the last mark ends now. NULL st: nothing. */
void startup_mark(Startup *st, const char *name);
double startup_total(const Startup *st);
/* "PROG: start-up 2.91 s: launch 0.02, device 0.80, ..." and a newline. */
void startup_print(const Startup *st, const char *prog, FILE *f);
/* `, "startup_s": {"launch": 0.021, ...}` for a metrics record. */
void startup_json(const Startup *st, char *buf, size_t len);

#endif
