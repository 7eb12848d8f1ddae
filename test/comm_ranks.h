/* comm_ranks.h: forked ranks for the communicator tests (test_comm*.c).
 *
 * run_ranks forks N ranks from the test process. Every input value is a
 * cheap function of (rank, index, tag) (val), so each child computes the
 * expected result itself and compares bit for bit. Children report through
 * their exit code (their CHECK failures) and a pipe of "key = value" lines;
 * run_ranks checks that ranks reporting the same key (a result checksum, an
 * error sentence) agree. shm_leftovers counts the job's segments left in
 * /dev/shm. Include after check.h, in one file per test program.
 */
#ifndef TPTRAIN_TEST_COMM_RANKS_H
#define TPTRAIN_TEST_COMM_RANKS_H

#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "tp/comm_shm.h"

#define CHUNK_ELEMS ((size_t)1 << 20)  // SLOT_BYTES of comm_shm_impl.h in floats: big sizes straddle chunks
#define MAX_RANKS 8
#define OUT_BYTES 16384

static char g_job[64];

/* The launcher's environment of rank `rank` of n on one node, in job g_job
 * (tprun's variables), and its removal. */
static inline void rank_env_set(int rank, int n) {
    char v[32];
    snprintf(v, sizeof v, "%d", n);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    setenv("TPRUN_JOB_ID", g_job, 1);
}
static inline void rank_env_clear(void) {
    const char *names[] = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TPRUN_JOB_ID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

/* ---- running ranks ---- */

typedef void (*RankFn)(int rank, int n, int out_fd, void *arg);

typedef struct {
    int n;
    pid_t pid[MAX_RANKS];
    int status[MAX_RANKS];
    char out[MAX_RANKS][OUT_BYTES];
} Run;

static inline void run_ranks(const char *what, int n, RankFn fn, void *arg, Run *run) {
    memset(run, 0, sizeof *run);
    run->n = n;
    int fds[MAX_RANKS][2];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        if (pipe(fds[r]) != 0) {
            perror("pipe");
            exit(2);
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            exit(2);
        }
        if (pid == 0) {
            for (int q = 0; q <= r; q++) close(fds[q][0]);
            alarm(120);  // a hang becomes a failure, not a stuck test
            tp_set_log_rank(r);
            g_check_failures = 0;
            g_check_count = 0;
            fn(r, n, fds[r][1], arg);
            _exit(g_check_failures ? 1 : 0);
        }
        close(fds[r][1]);
        run->pid[r] = pid;
    }
    for (int r = 0; r < n; r++) {
        size_t len = 0;
        ssize_t got;
        while ((got = read(fds[r][0], run->out[r] + len, OUT_BYTES - 1 - len)) > 0) len += (size_t)got;
        run->out[r][len] = 0;
        close(fds[r][0]);
    }
    for (int r = 0; r < n; r++) {
        waitpid(run->pid[r], &run->status[r], 0);
    }
    // Ranks that print the same key must print the same value.
    for (int r = 1; r < n; r++) {
        char *save = NULL, copy[OUT_BYTES];
        snprintf(copy, sizeof copy, "%s", run->out[r]);
        for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char *eq = strstr(line, " = ");
            if (!eq) continue;
            size_t key_len = (size_t)(eq - line) + 3;
            for (int q = 0; q < r; q++) {
                const char *s = run->out[q];
                while (*s) {
                    const char *end = strchr(s, '\n');
                    size_t len = end ? (size_t)(end - s) : strlen(s);
                    if (len >= key_len && strncmp(s, line, key_len) == 0)
                        CHECK(len == strlen(line) && strncmp(s, line, len) == 0,
                              "%s: rank %d says \"%.*s\", rank %d \"%s\"", what, q, (int)len, s, r, line);
                    s = end ? end + 1 : s + len;
                }
            }
        }
    }
}

static inline int exited_ok(const Run *run, int r) {
    return WIFEXITED(run->status[r]) && WEXITSTATUS(run->status[r]) == 0;
}

static inline void check_all_ok(const char *what, const Run *run) {
    for (int r = 0; r < run->n; r++)
        CHECK(exited_ok(run, r), "%s: rank %d ended with status 0x%x", what, r, run->status[r]);
}

/* Value of line `key` in a rank's output, or NULL. */
static inline const char *find_value(const Run *run, int r, const char *key, char *val, size_t val_len) {
    size_t key_len = strlen(key);
    for (const char *s = run->out[r]; *s;) {
        const char *end = strchr(s, '\n');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len > key_len + 3 && strncmp(s, key, key_len) == 0 && strncmp(s + key_len, " = ", 3) == 0) {
            snprintf(val, val_len, "%.*s", (int)(len - key_len - 3), s + key_len + 3);
            return val;
        }
        s = end ? end + 1 : s + len;
    }
    return NULL;
}

static inline void emit(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void emit(int fd, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (write(fd, line, (size_t)n) != n) perror("write");
}

static inline uint64_t checksum(const void *p, size_t n_bytes) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n_bytes; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ULL;
    return h;
}

/* ---- data ---- */

/* Input value of (rank, index, tag): fractional, of varied magnitude, so
 * sums round and the reduction order shows in the bits. */
static inline float val(int rank, size_t i, int tag) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(rank + 1) * 40503u ^ (uint32_t)tag * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)((int32_t)(h >> 8) - (1 << 23)) * 1.0e-5f * (float)(rank + 1);
}

static inline float *alloc_floats(size_t n_elems) { return malloc((n_elems ? n_elems : 1) * sizeof(float)); }

static inline Comm *create_or_report(const char *group, int rank, int n, double timeout_s) {
    char err[512] = "";
    Comm *c = comm_shm_create(g_job, group, rank, n, timeout_s, err, sizeof err);
    CHECK(c != NULL, "rank %d: create %s: %s", rank, group, err);
    return c;
}

/* The fault scenarios' argument: how long a communicator waits for a peer. */
typedef struct {
    double timeout_s;
} FaultArg;

/* The idle peer of a fault scenario is the last rank: it outlives the
 * others' timeout, then leaves quietly (c freed). 1 when this rank is it. */
static inline int idle_peer_left(int rank, int n, Comm *c, const FaultArg *fa) {
    if (rank != n - 1) return 0;
    struct timespec ts = {(time_t)(fa->timeout_s * 3 + 1), 0};
    nanosleep(&ts, NULL);
    comm_free(c);
    return 1;
}

static inline int shm_leftovers(void) {
    char prefix[96];
    snprintf(prefix, sizeof prefix, "tpt-%s", g_job);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            fprintf(stderr, "left in /dev/shm: %s\n", e->d_name);
            count++;
        }
    }
    closedir(d);
    return count;
}

static inline void expect_error(const Run *run, int r, const char *what, const char *want) {
    char val_buf[600];
    const char *got = find_value(run, r, "error", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, want) == 0, "%s: rank %d error \"%s\" want \"%s\"", what, r, got ? got : "(none)", want);
}

/* A job id unique to this test process: segment names never collide with
 * another test running beside it. */
static inline void init_job(const char *prefix) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(g_job, sizeof g_job, "%s%dx%lx", prefix, (int)getpid(),
             (unsigned long)(ts.tv_nsec ^ (ts.tv_sec << 8)) & 0xffffffUL);
}

/* Runs fn on worlds of 1..n_max ranks (checks each: check_all_ok), printing
 * each world's time as "LABEL n=N: S s", then checks that no shared-memory
 * segment is left. */
static inline void run_world_sizes(const char *label, int n_max, RankFn fn, void *arg) {
    Run *run = malloc(sizeof *run);
    char what[64];
    for (int n = 1; n <= n_max; n++) {
        snprintf(what, sizeof what, "%s n=%d", label, n);
        const double t0 = tp_now_s();
        run_ranks(what, n, fn, arg, run);
        check_all_ok(what, run);
        printf("%s: %.2f s\n", what, tp_now_s() - t0);
    }
    CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    free(run);
}

#endif
