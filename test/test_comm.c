/* test_comm.c: the shared-memory collectives in fp32, with real processes.
 *
 * Each scenario forks N ranks (comm_ranks.h); each child computes the
 * expected result itself, reducing in rank order exactly as the contract
 * says, and compares bit for bit; the parent checks that ranks agree and
 * that nothing is left in /dev/shm. Fault scenarios kill or stall one rank
 * and time how fast the others give up. bf16 is in test_comm_dtype.c,
 * send / recv in test_comm_p2p.c, staged device buffers in
 * test_comm_staged.c.
 */
#define _GNU_SOURCE
#include "check.h"
#include "comm_ranks.h"
#include "tp/mesh.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>

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

/* The world group of a fault scenario after one allreduce of x[7] that
 * every rank joins; NULL when it did not form (reported). */
static Comm *world_after_allreduce(int rank, int n, const FaultArg *fa, float *x) {
    Comm *c = create_or_report("world", rank, n, fa->timeout_s);
    if (c) CHECK(comm_allreduce(c, x, 7, COMM_SUM) == 0, "first allreduce: %s", comm_error(c));
    return c;
}

static void rank_dead_peer(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    float x[7] = {0};
    Comm *c = world_after_allreduce(rank, n, fa, x);
    if (!c) return;
    if (rank == n - 1) _exit(0);
    double t0 = tp_now_s();
    int rc = comm_allreduce(c, x, 7, COMM_SUM);
    double dt = tp_now_s() - t0;
    CHECK(rc == -1, "allreduce with a dead peer succeeded");
    CHECK(dt < 2.0, "took %.2f s to notice the dead peer (timeout %g s)", dt, fa->timeout_s);
    emit(fd, "error = %s", comm_error(c));
    // Poisoned: fails at once, keeps the first sentence.
    char first[512];
    snprintf(first, sizeof first, "%s", comm_error(c));
    t0 = tp_now_s();
    CHECK(comm_barrier(c) == -1 && comm_allreduce(c, x, 7, COMM_SUM) == -1, "poisoned comm still works");
    CHECK(tp_now_s() - t0 < 0.01, "poisoned call took %.3f s", tp_now_s() - t0);
    CHECK(strcmp(first, comm_error(c)) == 0, "error changed to %s", comm_error(c));
    comm_free(c);
}

/* ---- scenario: a peer stays alive but never calls ---- */

static void rank_idle_peer(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    float x[7] = {0};
    Comm *c = world_after_allreduce(rank, n, fa, x);
    if (!c) return;
    if (idle_peer_left(rank, n, c, fa)) return;
    double t0 = tp_now_s();
    int rc = comm_allreduce(c, x, 7, COMM_SUM);
    double dt = tp_now_s() - t0;
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
    double t0 = tp_now_s();
    Comm *c = comm_shm_create(g_job, "partial", rank, n, fa->timeout_s, err, sizeof err);
    double dt = tp_now_s() - t0;
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
    double t0 = tp_now_s();
    for (int i = 0; i < iters; i++) CHECK(comm_allreduce(c, buf, n_elems, COMM_SUM) == 0, "%s", comm_error(c));
    CHECK(comm_barrier(c) == 0, "%s", comm_error(c));
    double per_call = (tp_now_s() - t0) / iters;
    if (rank == 0) emit(fd, "ms = %.3f", per_call * 1e3);
    // Small messages: latency of one barrier-like exchange.
    t0 = tp_now_s();
    for (int i = 0; i < 200; i++) CHECK(comm_allreduce(c, buf, 1, COMM_SUM) == 0, "%s", comm_error(c));
    if (rank == 0) emit(fd, "small_us = %.1f", (tp_now_s() - t0) / 200 * 1e6);
    free(buf);
    comm_free(c);
}

/* ---- parent ---- */

int main(int argc, char **argv) {
    init_job("t");
    g_shared_counter = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_shared_counter == MAP_FAILED) return 2;
    const int bench_only = argc > 1 && strcmp(argv[1], "--bench") == 0;
    Run *run = malloc(sizeof *run);
    char what[64];

    if (!bench_only) {
        for (int n = 1; n <= 4; n++) {
            atomic_store(g_shared_counter, 0);
            snprintf(what, sizeof what, "collectives n=%d", n);
            double t0 = tp_now_s();
            run_ranks(what, n, rank_collectives, NULL, run);
            check_all_ok(what, run);
            printf("%s: %.2f s\n", what, tp_now_s() - t0);
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
