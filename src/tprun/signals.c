/* signals.c: tprun's signals: a tiny handler turns each into two bytes on
 * a self-pipe (g_sig_pipe) that the agent's poll() loop reads; workers get
 * back the dispositions tprun inherited; signal names for the reports.
 *
 * Calls: POSIX signals only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "tprun/tprun_internal.h"

/* ---- signals -------------------------------------------------------------- */

int g_sig_pipe[2] = {-1, -1};  // written by the handler, read by the loop: process-wide by nature

/* Two bytes per signal, written at once (atomic on a pipe): the signal, and
 * 1 when a terminal sent it (the kernel's SI_KERNEL: a key typed; kill(2),
 * as timeout(1) and schedulers use, gives SI_USER). */
static void on_signal(int sig, siginfo_t *info, void *uctx) {
    (void)uctx;
    int saved = errno;
    unsigned char b[2] = {(unsigned char)sig, (unsigned char)(info && info->si_code == SI_KERNEL)};
    ssize_t w = write(g_sig_pipe[1], b, sizeof b);  // full pipe: a wake-up is already pending
    (void)w;
    errno = saved;
}

/* The signals tprun handles (the last, SIGPIPE, it ignores: a closed stdout
 * must not kill the agent); workers get the dispositions tprun inherited. */
static const int k_handled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGPIPE};
#define N_HANDLED (sizeof k_handled / sizeof *k_handled)
static struct sigaction g_inherited[N_HANDLED];

int install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    for (size_t i = 0; i < N_HANDLED; i++) {
        if (k_handled[i] == SIGPIPE) {
            sa.sa_handler = SIG_IGN;
            sa.sa_flags = SA_RESTART;
        }
        if (sigaction(k_handled[i], &sa, &g_inherited[i]) != 0) return -1;
    }
    return 0;
}

/* In a worker between its fork and its exec (async-signal-safe): the
 * dispositions tprun inherited, for the signals it handles. */
void restore_inherited_signals(void) {
    for (size_t i = 0; i < N_HANDLED; i++) {
        struct sigaction sa = g_inherited[i];
        // Inherited ignores stay (nohup's SIGHUP), except SIGCHLD: an
        // ignored SIGCHLD would change how the worker's own waits behave.
        if (sa.sa_handler != SIG_IGN || k_handled[i] == SIGCHLD) sa.sa_handler = SIG_DFL;
        sa.sa_flags &= ~SA_SIGINFO;
        sigaction(k_handled[i], &sa, NULL);
    }
}

const char *signal_name(int sig) {
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal";
    }
}
