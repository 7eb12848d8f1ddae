/* preempt.c: see preempt.h. The handler writes one sig_atomic_t and nothing
 * else (async-signal-safe); SA_RESTART keeps blocking reads and writes
 * going, and the loops that poll or wait on a futex already retry on
 * EINTR, so a signal never fails a collective or a file write mid-step. */
#include "train/preempt.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t g_signal;  // the first signal received: process-wide by nature

static void on_signal(int sig) {
    if (!g_signal) g_signal = sig;
}

void preempt_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    const int sigs[] = {SIGTERM, SIGINT, SIGUSR1};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}

int preempt_signal(void) { return g_signal; }

int preempt_agree(Comm *ctrl) {
    float s = (float)g_signal;  // signal numbers are small integers: exact in a float
    if (ctrl && comm_size(ctrl) > 1 && comm_allreduce(ctrl, &s, 1, COMM_MAX) != 0) return -1;
    return (int)s;
}

const char *preempt_signal_name(int sig) {
    static char buf[32];
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: snprintf(buf, sizeof buf, "signal %d", sig); return buf;
    }
}
