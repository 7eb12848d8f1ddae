/* test_comm.c: the shared-memory collectives, with real processes.
 *
 * Each scenario forks N ranks from this process. Every input value is a
 * cheap function of (rank, index, tag), so each child computes the expected
 * result itself, reducing in rank order exactly as the contract says, and
 * compares bit for bit. Children report through their exit code (their
 * CHECK failures) and a pipe of "key value" lines; the parent checks that
 * ranks reporting the same key (a result checksum, an error sentence)
 * agree, and that nothing is left in /dev/shm. Fault scenarios kill or
 * stall one rank and time how fast the others give up.
 */
#define _GNU_SOURCE
#include "check.h"
#include "err.h"
#include "tp/comm_shm.h"
#include "tp/mesh.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_ELEMS ((size_t)1 << 20)  // SLOT_ELEMS of comm_shm.c: the big sizes straddle chunk boundaries
#define MAX_RANKS 8
#define OUT_BYTES 16384

static char g_job[64];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- running ranks ---- */

typedef void (*RankFn)(int rank, int n, int out_fd, void *arg);

typedef struct {
    int n;
    pid_t pid[MAX_RANKS];
    int status[MAX_RANKS];
    char out[MAX_RANKS][OUT_BYTES];
} Run;

static void run_ranks(const char *what, int n, RankFn fn, void *arg, Run *run) {
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

static int exited_ok(const Run *run, int r) { return WIFEXITED(run->status[r]) && WEXITSTATUS(run->status[r]) == 0; }

static void check_all_ok(const char *what, const Run *run) {
    for (int r = 0; r < run->n; r++)
        CHECK(exited_ok(run, r), "%s: rank %d ended with status 0x%x", what, r, run->status[r]);
}

/* Value of line `key` in a rank's output, or NULL. */
static const char *find_value(const Run *run, int r, const char *key, char *val, size_t val_len) {
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

static void emit(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(int fd, const char *fmt, ...) {
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

static uint64_t checksum(const void *p, size_t n_bytes) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n_bytes; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ULL;
    return h;
}

/* ---- data ---- */

/* Input value of (rank, index, tag): fractional, of varied magnitude, so
 * sums round and the reduction order shows in the bits. */
static float val(int rank, size_t i, int tag) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(rank + 1) * 40503u ^ (uint32_t)tag * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)((int32_t)(h >> 8) - (1 << 23)) * 1.0e-5f * (float)(rank + 1);
}

static float *alloc_floats(size_t n_elems) { return malloc((n_elems ? n_elems : 1) * sizeof(float)); }

/* The contract's result: members[0] op members[1] op ... in group order. */
static void expected_reduce(float *out, size_t n_elems, const int *members, int n, int tag, CommOp op) {
    for (size_t i = 0; i < n_elems; i++) {
        float acc = val(members[0], i, tag);
        for (int q = 1; q < n; q++) {
            float x = val(members[q], i, tag);
            acc = op == COMM_SUM ? acc + x : (x > acc ? x : acc);
        }
        out[i] = acc;
    }
}

static Comm *create_or_report(const char *group, int rank, int n, double timeout_s) {
    char err[512] = "";
    Comm *c = comm_shm_create(g_job, group, rank, n, timeout_s, err, sizeof err);
    CHECK(c != NULL, "rank %d: create %s: %s", rank, group, err);
    return c;
}

/* Allreduce of n_elems on comm c whose members (world ranks) are given;
 * checks bits against the direct computation and emits a checksum. */
static void check_allreduce(Comm *c, int fd, const char *label, const int *members, int world_rank, size_t n_elems,
                            int tag, CommOp op) {
    const int n = comm_size(c);
    float *buf = alloc_floats(n_elems), *want = alloc_floats(n_elems);
    for (size_t i = 0; i < n_elems; i++) buf[i] = val(world_rank, i, tag);
    int rc = comm_allreduce(c, buf, n_elems, op);
    CHECK(rc == 0, "%s allreduce %zu: %s", label, n_elems, comm_error(c));
    expected_reduce(want, n_elems, members, n, tag, op);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n_elems; i++) {
        int differs = memcmp(&buf[i], &want[i], sizeof(float)) != 0;
        if (differs && bad++ == 0) first = i;
    }
    CHECK(bad == 0, "%s allreduce %s of %zu: %zu elements differ (first [%zu]: got %.9g want %.9g)", label,
          op == COMM_SUM ? "sum" : "max", n_elems, bad, first, bad ? buf[first] : 0.0, bad ? want[first] : 0.0);
    emit(fd, "%s allreduce %s %zu tag %d = %016llx", label, op == COMM_SUM ? "sum" : "max", n_elems, tag,
         (unsigned long long)checksum(buf, n_elems * sizeof(float)));
    free(buf);
    free(want);
}

/* ---- scenario: every collective on "world" ---- */

static _Atomic int *g_shared_counter;  // MAP_SHARED, for the barrier check

static void rank_collectives(int rank, int n, int fd, void *arg) {
    (void)arg;
    Comm *c = create_or_report("world", rank, n, 20.0);
    if (!c) return;
    CHECK(comm_rank(c) == rank && comm_size(c) == n, "rank/size %d/%d", comm_rank(c), comm_size(c));
    int members[MAX_RANKS];
    for (int q = 0; q < n; q++) members[q] = q;

    const size_t sizes[] = {0, 1, 7, 16384, 16385, 100003, 3 * CHUNK_ELEMS + 5};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    long n_allreduce = 0;
    double ar_bytes = 0;
    for (int s = 0; s < n_sizes; s++) {
        for (int op = 0; op < 2; op++) {
            check_allreduce(c, fd, "world", members, rank, sizes[s], 10 * s + op, (CommOp)op);
            n_allreduce++;
            ar_bytes += (double)sizes[s] * sizeof(float);
        }
    }

    // MAX propagates NaN from any rank; SUM carries infinities.
    {
        float x[4] = {1.0f, 2.0f, (float)rank, -1.0f};
        if (rank == n - 1) x[1] = NAN;
        CHECK(comm_allreduce(c, x, 4, COMM_MAX) == 0, "nan max: %s", comm_error(c));
        CHECK(isnan(x[1]) && x[2] == (float)(n - 1) && x[0] == 1.0f, "nan max: %g %g %g", x[0], x[1], x[2]);
        float y[2] = {rank == 0 ? INFINITY : 1.0f, 2.0f};
        CHECK(comm_allreduce(c, y, 2, COMM_SUM) == 0, "inf sum: %s", comm_error(c));
        CHECK(isinf(y[0]) && y[1] == 2.0f * (float)n, "inf sum: %g %g", y[0], y[1]);
        n_allreduce += 2;
        ar_bytes += 6 * sizeof(float);
    }

    // reduce_scatter: in (n * m) -> out (m), out[i] = sum over q of q's in[rank * m + i].
    const size_t rs_sizes[] = {0, 1, 7, 100003, CHUNK_ELEMS + 5};
    for (int s = 0; s < 5; s++) {
        size_t m = rs_sizes[s];
        float *in = alloc_floats((size_t)n * m), *out = alloc_floats(m);
        for (size_t i = 0; i < (size_t)n * m; i++) in[i] = val(rank, i, 100 + s);
        CHECK(comm_reduce_scatter(c, in, out, m) == 0, "reduce_scatter %zu: %s", m, comm_error(c));
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            float acc = val(0, (size_t)rank * m + i, 100 + s);
            for (int q = 1; q < n; q++) acc += val(q, (size_t)rank * m + i, 100 + s);
            bad += memcmp(&acc, &out[i], sizeof acc) != 0;
        }
        CHECK(bad == 0, "reduce_scatter %zu: %zu elements differ", m, bad);
        free(in);
        free(out);
    }

    // allgather: rank q's in lands at out + q * m.
    const size_t ag_sizes[] = {0, 1, 7, CHUNK_ELEMS + 5};
    for (int s = 0; s < 4; s++) {
        size_t m = ag_sizes[s];
        float *in = alloc_floats(m), *out = alloc_floats((size_t)n * m);
        for (size_t i = 0; i < m; i++) in[i] = val(rank, i, 200 + s);
        CHECK(comm_allgather(c, in, out, m) == 0, "allgather %zu: %s", m, comm_error(c));
        size_t bad = 0;
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < m; i++) {
                float want = val(q, i, 200 + s);
                bad += memcmp(&want, &out[(size_t)q * m + i], sizeof want) != 0;
            }
        CHECK(bad == 0, "allgather %zu: %zu elements differ", m, bad);
        emit(fd, "allgather %zu = %016llx", m, (unsigned long long)checksum(out, (size_t)n * m * sizeof(float)));
        free(in);
        free(out);
    }

    // broadcast from the last rank (non-zero when n > 1), odd byte counts.
    const size_t bc_sizes[] = {0, 1, 13, (size_t)n * CHUNK_ELEMS * sizeof(float) * 2 + 3};
    const int root = n - 1;
    for (int s = 0; s < 4; s++) {
        size_t nb = bc_sizes[s];
        unsigned char *b = malloc(nb ? nb : 1);
        for (size_t i = 0; i < nb; i++) b[i] = rank == root ? (unsigned char)(i * 7 + s) : 0xAA;
        CHECK(comm_broadcast(c, b, nb, root) == 0, "broadcast %zu: %s", nb, comm_error(c));
        size_t bad = 0;
        for (size_t i = 0; i < nb; i++) bad += b[i] != (unsigned char)(i * 7 + s);
        CHECK(bad == 0, "broadcast %zu from %d: %zu bytes differ", nb, root, bad);
        free(b);
    }

    // barrier: nobody leaves round k before everyone has entered it.
    for (int k = 1; k <= 20; k++) {
        atomic_fetch_add(g_shared_counter, 1);
        CHECK(comm_barrier(c) == 0, "barrier %d: %s", k, comm_error(c));
        int seen = atomic_load(g_shared_counter);
        CHECK(seen >= n * k, "barrier %d: counter %d < %d", k, seen, n * k);
        CHECK(comm_barrier(c) == 0, "barrier %d: %s", k, comm_error(c));  // no one starts k+1 early
    }

    CommStats st = comm_stats(c);
    CHECK(st.allreduce == n_allreduce && st.reduce_scatter == 5 && st.allgather == 4 && st.broadcast == 4 &&
              st.barrier == 40,
          "stats %ld %ld %ld %ld %ld", st.allreduce, st.reduce_scatter, st.allgather, st.broadcast, st.barrier);
    CHECK(st.allreduce_bytes == ar_bytes, "allreduce bytes %.0f want %.0f", st.allreduce_bytes, ar_bytes);
    CHECK(st.seconds > 0 || n == 1, "seconds %g", st.seconds);
    comm_reset_stats(c);
    st = comm_stats(c);
    CHECK(st.allreduce == 0 && st.barrier == 0 && st.allreduce_bytes == 0 && st.seconds == 0, "reset stats");

    // A bad root is refused and poisons the comm (the group is out of step).
    if (n == 1) {
        CHECK(comm_broadcast(c, NULL, 0, 1) == -1, "root 1 of 1 accepted");
        CHECK(strstr(comm_error(c), "root 1") != NULL, "error: %s", comm_error(c));
        CHECK(comm_barrier(c) == -1, "poisoned comm still works");
    }
    comm_free(c);
}

/* ---- scenario: tp and dp groups of a tp=2 x dp=2 mesh, used interleaved ---- */

static void rank_groups(int rank, int n, int fd, void *arg) {
    (void)arg;
    char err[256];
    Mesh m;
    CHECK(mesh_init(&m, n, rank, 2, 2, 1, err, sizeof err) == 0, "%s", err);
    int world_members[4] = {0, 1, 2, 3}, tp_members[2], dp_members[2];
    mesh_tp_group(&m, tp_members);
    mesh_dp_group(&m, dp_members);
    char tp_name[32], dp_name[32];
    snprintf(tp_name, sizeof tp_name, "tp%d", m.dp_rank + m.dp * m.pp_rank);
    snprintf(dp_name, sizeof dp_name, "dp%d", m.tp_rank + m.tp * m.pp_rank);
    Comm *world = create_or_report("world", rank, n, 20.0);
    Comm *tp = create_or_report(tp_name, m.tp_rank, m.tp, 20.0);
    Comm *dp = create_or_report(dp_name, m.dp_rank, m.dp, 20.0);
    if (!world || !tp || !dp) return;
    const size_t sizes[] = {1, 1000, 16385, CHUNK_ELEMS + 5};
    for (int it = 0; it < 4; it++) {
        size_t sz = sizes[it];
        check_allreduce(tp, fd, tp_name, tp_members, rank, sz, 300 + it, COMM_SUM);
        check_allreduce(dp, fd, dp_name, dp_members, rank, sz + 1, 400 + it, COMM_SUM);
        check_allreduce(world, fd, "world", world_members, rank, sz + 2, 500 + it, COMM_MAX);
        check_allreduce(dp, fd, dp_name, dp_members, rank, sz, 600 + it, COMM_MAX);
        check_allreduce(tp, fd, tp_name, tp_members, rank, sz + 3, 700 + it, COMM_SUM);
    }
    // Broadcast within tp from tp rank 1 and allgather within dp, interleaved.
    int32_t token[3] = {m.tp_rank == 1 ? 1000 + rank : -1, 7, m.tp_rank == 1 ? rank : -1};
    CHECK(comm_broadcast(tp, token, sizeof token, 1) == 0, "tp broadcast: %s", comm_error(tp));
    CHECK(token[0] == 1000 + tp_members[1] && token[2] == tp_members[1], "tp broadcast got %d %d", token[0],
          token[2]);
    float mine = (float)rank, all[2];
    CHECK(comm_allgather(dp, &mine, all, 1) == 0, "dp allgather: %s", comm_error(dp));
    CHECK(all[0] == (float)dp_members[0] && all[1] == (float)dp_members[1], "dp allgather got %g %g", all[0],
          all[1]);
    CHECK(comm_barrier(world) == 0, "world barrier: %s", comm_error(world));
    comm_free(dp);
    comm_free(tp);
    comm_free(world);
}

/* ---- scenario: a peer dies before a collective ---- */

typedef struct {
    double timeout_s;
} FaultArg;

static void rank_dead_peer(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    Comm *c = create_or_report("world", rank, n, fa->timeout_s);
    if (!c) return;
    float x[7] = {0};
    CHECK(comm_allreduce(c, x, 7, COMM_SUM) == 0, "first allreduce: %s", comm_error(c));
    if (rank == n - 1) _exit(0);
    double t0 = now_s();
    int rc = comm_allreduce(c, x, 7, COMM_SUM);
    double dt = now_s() - t0;
    CHECK(rc == -1, "allreduce with a dead peer succeeded");
    CHECK(dt < 2.0, "took %.2f s to notice the dead peer (timeout %g s)", dt, fa->timeout_s);
    emit(fd, "error = %s", comm_error(c));
    // Poisoned: fails at once, keeps the first sentence.
    char first[512];
    snprintf(first, sizeof first, "%s", comm_error(c));
    t0 = now_s();
    CHECK(comm_barrier(c) == -1 && comm_allreduce(c, x, 7, COMM_SUM) == -1, "poisoned comm still works");
    CHECK(now_s() - t0 < 0.01, "poisoned call took %.3f s", now_s() - t0);
    CHECK(strcmp(first, comm_error(c)) == 0, "error changed to %s", comm_error(c));
    comm_free(c);
}

/* ---- scenario: a peer stays alive but never calls ---- */

static void rank_idle_peer(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    Comm *c = create_or_report("world", rank, n, fa->timeout_s);
    if (!c) return;
    float x[7] = {0};
    CHECK(comm_allreduce(c, x, 7, COMM_SUM) == 0, "first allreduce: %s", comm_error(c));
    if (rank == n - 1) {
        struct timespec ts = {(time_t)(fa->timeout_s * 3 + 1), 0};
        nanosleep(&ts, NULL);  // outlive the others' timeout, then leave quietly
        comm_free(c);
        return;
    }
    double t0 = now_s();
    int rc = comm_allreduce(c, x, 7, COMM_SUM);
    double dt = now_s() - t0;
    CHECK(rc == -1, "allreduce with an idle peer succeeded");
    CHECK(dt >= fa->timeout_s * 0.95 && dt < fa->timeout_s + 1.5, "gave up after %.2f s (timeout %g s)", dt,
          fa->timeout_s);
    emit(fd, "error = %s", comm_error(c));
    comm_free(c);
}

/* ---- scenario: a rank never joins; a joiner without a creator ---- */

static void rank_missing_member(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    if (rank == n - 1) {
        struct timespec ts = {(time_t)(fa->timeout_s * 2 + 1), 0};
        nanosleep(&ts, NULL);
        return;
    }
    char err[512] = "";
    double t0 = now_s();
    Comm *c = comm_shm_create(g_job, "partial", rank, n, fa->timeout_s, err, sizeof err);
    double dt = now_s() - t0;
    CHECK(c == NULL, "group formed without rank %d", n - 1);
    CHECK(dt < fa->timeout_s + 1.5, "gave up after %.2f s", dt);
    emit(fd, "error = %s", err);
    comm_free(c);
}

static void rank_no_creator(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    if (rank == 0) return;  // never creates
    char err[512] = "";
    Comm *c = comm_shm_create(g_job, "orphan", rank, n, fa->timeout_s, err, sizeof err);
    CHECK(c == NULL, "joined a group without rank 0");
    emit(fd, "error = %s", err);
    comm_free(c);
}

/* ---- scenario: stale segments, long names, re-created groups ---- */

static void rank_rejoin(int rank, int n, int fd, void *arg) {
    (void)fd;
    const char *group = arg;
    int members[MAX_RANKS];
    for (int q = 0; q < n; q++) members[q] = q;
    if (rank == 0) {  // let the others find the stale segment first
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int k = 0; k < 15; k++) {
        Comm *c = create_or_report(group, rank, n, 10.0);
        if (!c) return;
        float x[3] = {(float)rank, (float)k, 1.0f};
        CHECK(comm_allreduce(c, x, 3, COMM_SUM) == 0, "round %d: %s", k, comm_error(c));
        CHECK(x[0] == (float)(n * (n - 1) / 2) && x[1] == (float)(n * k) && x[2] == (float)n, "round %d", k);
        if (k == 0) check_allreduce(c, fd, "rejoin", members, rank, 33, 800, COMM_SUM);
        comm_free(c);
    }
}

/* ---- timing ---- */

static void rank_bench(int rank, int n, int fd, void *arg) {
    const size_t n_elems = *(const size_t *)arg;
    Comm *c = create_or_report("bench", rank, n, 30.0);
    if (!c) return;
    float *buf = alloc_floats(n_elems);
    for (size_t i = 0; i < n_elems; i++) buf[i] = val(rank, i, 900) * 1e-3f;
    for (int i = 0; i < 3; i++) comm_allreduce(c, buf, n_elems, COMM_SUM);  // touch the pages
    const int iters = 20;
    CHECK(comm_barrier(c) == 0, "%s", comm_error(c));
    double t0 = now_s();
    for (int i = 0; i < iters; i++) CHECK(comm_allreduce(c, buf, n_elems, COMM_SUM) == 0, "%s", comm_error(c));
    CHECK(comm_barrier(c) == 0, "%s", comm_error(c));
    double per_call = (now_s() - t0) / iters;
    if (rank == 0) emit(fd, "ms = %.3f", per_call * 1e3);
    // Small messages: latency of one barrier-like exchange.
    t0 = now_s();
    for (int i = 0; i < 200; i++) CHECK(comm_allreduce(c, buf, 1, COMM_SUM) == 0, "%s", comm_error(c));
    if (rank == 0) emit(fd, "small_us = %.1f", (now_s() - t0) / 200 * 1e6);
    free(buf);
    comm_free(c);
}

/* ---- parent ---- */

static int shm_leftovers(void) {
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

static void expect_error(const Run *run, int r, const char *what, const char *want) {
    char val_buf[600];
    const char *got = find_value(run, r, "error", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, want) == 0, "%s: rank %d error \"%s\" want \"%s\"", what, r, got ? got : "(none)",
          want);
}

int main(int argc, char **argv) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(g_job, sizeof g_job, "t%dx%lx", (int)getpid(),
             (unsigned long)(ts.tv_nsec ^ (ts.tv_sec << 8)) & 0xffffffUL);
    g_shared_counter = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_shared_counter == MAP_FAILED) return 2;
    const int bench_only = argc > 1 && strcmp(argv[1], "--bench") == 0;
    Run *run = malloc(sizeof *run);
    char what[64];

    if (!bench_only) {
        for (int n = 1; n <= 4; n++) {
            atomic_store(g_shared_counter, 0);
            snprintf(what, sizeof what, "collectives n=%d", n);
            double t0 = now_s();
            run_ranks(what, n, rank_collectives, NULL, run);
            check_all_ok(what, run);
            printf("%s: %.2f s\n", what, now_s() - t0);
        }

        run_ranks("tp/dp groups", 4, rank_groups, NULL, run);
        check_all_ok("tp/dp groups", run);

        FaultArg slow = {20.0};
        run_ranks("dead peer", 3, rank_dead_peer, &slow, run);
        for (int r = 0; r < 2; r++) {
            CHECK(exited_ok(run, r), "dead peer: rank %d status 0x%x", r, run->status[r]);
            char want[256];
            snprintf(want, sizeof want, "comm world: rank 2 (pid %d) exited during allreduce", (int)run->pid[2]);
            expect_error(run, r, "dead peer", want);
        }

        FaultArg quick = {1.0};
        run_ranks("idle peer", 3, rank_idle_peer, &quick, run);
        check_all_ok("idle peer", run);
        for (int r = 0; r < 2; r++)
            expect_error(run, r, "idle peer", "comm world: rank 2 did not reach allreduce #2 within 1 s");

        FaultArg half = {0.5};
        run_ranks("missing member", 3, rank_missing_member, &half, run);
        check_all_ok("missing member", run);
        for (int r = 0; r < 2; r++)
            expect_error(run, r, "missing member", "comm partial: rank 2 did not join within 0.5 s");

        run_ranks("no creator", 2, rank_no_creator, &half, run);
        check_all_ok("no creator", run);
        char want[256];
        snprintf(want, sizeof want,
                 "comm orphan: rank 1 could not join within 0.5 s: rank 0 did not create the shared memory "
                 "/tpt-%s-orphan",
                 g_job);
        expect_error(run, 1, "no creator", want);

        // A stale segment of this name (garbage, wrong size) must be replaced, never joined.
        char path[160];
        snprintf(path, sizeof path, "/dev/shm/tpt-%s-stale", g_job);
        int fd = open(path, O_CREAT | O_RDWR, 0600);
        CHECK(fd >= 0, "cannot make %s", path);
        if (fd >= 0) {
            CHECK(write(fd, "garbage", 7) == 7, "write %s", path);
            close(fd);
        }
        run_ranks("stale segment", 3, rank_rejoin, "stale", run);
        check_all_ok("stale segment", run);

        // A name too long and odd for /dev/shm is shortened and hashed.
        char long_name[256];
        memset(long_name, 'g', 200);
        memcpy(long_name + 50, "/ with spaces /", 15);
        long_name[200] = 0;
        run_ranks("long name", 2, rank_rejoin, long_name, run);
        check_all_ok("long name", run);

        CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    }

    // Timing: 1M floats among 2 and 4 ranks (milliseconds expected, even on 2 cores).
    size_t n_elems = (size_t)1 << 20;
    for (int n = 2; n <= 4; n += 2) {
        snprintf(what, sizeof what, "bench n=%d", n);
        run_ranks(what, n, rank_bench, &n_elems, run);
        check_all_ok(what, run);
        char ms[64] = "", us[64] = "";
        find_value(run, 0, "ms", ms, sizeof ms);
        find_value(run, 0, "small_us", us, sizeof us);
        printf("allreduce of 1M floats among %d ranks: %s ms per call; 1 float: %s us\n", n, ms, us);
        CHECK(ms[0] && atof(ms) < 500.0, "allreduce of 1M floats took %s ms", ms);
    }
    CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    free(run);
    return check_report("test_comm");
}
