/* proc.c: is a pid's maker gone (see proc.h). It errs on the side of "may
 * be alive": whatever cannot be read or judged is left to its maker. */
#define _GNU_SOURCE
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int proc_state(int pid, char *state, uint64_t *start_ticks) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        errno = EIO;
        return -1;
    }
    buf[n] = 0;
    const char *p = strrchr(buf, ')');  // the command name may hold spaces and parentheses
    unsigned long long start = 0;
    if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                     state, &start) != 2) {
        errno = EIO;
        return -1;
    }
    *start_ticks = start;
    return 0;
}

uint64_t proc_pid_ns(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/pid", pid);
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static int64_t ns_of(struct timespec t) { return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec; }

/* Whether a process that started start_ticks after boot started after the
 * wall-clock moment at_ns (by more than the slack). */
static int started_after(uint64_t start_ticks, int64_t at_ns) {
    const long hz = sysconf(_SC_CLK_TCK);
    struct timespec real, boot;
    if (hz <= 0 || clock_gettime(CLOCK_REALTIME, &real) != 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0) return 0;
    const int64_t at_since_boot = ns_of(boot) - (ns_of(real) - at_ns);  // the moment on the start time's clock
    const int64_t start_ns = (int64_t)(start_ticks / (uint64_t)hz) * 1000000000LL +
                             (int64_t)(start_ticks % (uint64_t)hz) * (1000000000LL / hz);
    return start_ns > at_since_boot + PROC_START_SLACK_NS;
}

int proc_gone(int pid, uint64_t start_ticks, int64_t alive_at_ns) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0) return errno == ESRCH;  // EPERM: someone else's live process
    char state;
    uint64_t start;
    if (proc_state(pid, &state, &start) != 0) return errno == ENOENT;  // exited just now
    if (state == 'Z' || state == 'X') return 1;  // exited, not yet reaped
    if (start_ticks && start != start_ticks) return 1;  // the pid now belongs to a later process
    if (alive_at_ns && started_after(start, alive_at_ns)) return 1;
    return 0;
}
