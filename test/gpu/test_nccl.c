/* test_nccl.c: the NCCL backend of comm.h on real GPUs.
 *
 * Ranks are forked processes, one GPU each (rank % device count), meeting
 * through a store server in this process; the parent never touches CUDA
 * (a CUDA context does not survive fork), even the device count comes from
 * a child. Scenarios:
 *  - a world of 1, then of N when N >= 2 GPUs are present: allreduce SUM and
 *    MAX (exact integer-valued data), bitwise determinism and agreement
 *    across ranks on random data, allgather, reduce_scatter, broadcast of an
 *    odd byte count, barrier, stats, splits (by parity; and one rank in no
 *    group), an argument error that poisons the communicator; bf16
 *    allreduce / reduce_scatter / allgather (exact integer-valued data);
 *    send / recv to oneself (messages kept in order, zero bytes) and, with
 *    N ranks, around a ring; pageable and pinned host buffers refused
 *    before NCCL sees them;
 *  - N >= 2: a peer that never makes the call: the caller fails within the
 *    timeout with a message, and stays failed;
 *  - a group whose peer never joins, and a rank whose rank 0 never publishes
 *    the id: creation fails within the timeout, naming the group.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "bf16.h"
#include "check.h"
#include "clock.h"
#include "cuda/cuda_common.h"
#include "tp/comm_nccl.h"
#include "tp/store.h"

#define TOKEN "0123456789abcdef0123456789abcdef"
#define MAX_RANKS 8
#define COMM_TIMEOUT_S 60.0   // healthy groups: generous (first NCCL init on a node takes seconds)
#define SHORT_TIMEOUT_S 5.0   // the failure scenarios
#define SLACK_S 15.0          // allowed past a timeout: abort, scheduling, loaded machines
#define RUN_LIMIT_S 300.0     // a scenario that takes longer is a hang: its ranks are killed


static int g_port;
static int g_n_dev;

static uint64_t g_rng;
static float urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / (double)(1ULL << 23)) - 1.0);
}

static uint64_t fnv1a(const void *p, size_t n_bytes) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n_bytes; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

static StoreClient *store_or_die(void) {
    char err[512] = "";
    StoreClient *s = store_connect("127.0.0.1", g_port, TOKEN, 30.0, err, sizeof err);
    if (!s) {
        fprintf(stderr, "store_connect: %s\n", err);
        _exit(2);
    }
    return s;
}

/* ---- process plumbing ---- */

typedef int (*RankFn)(int rank, int size, const char *job);

/* Forks `size` ranks running fn; each child's exit status is its number of
 * failed checks (0 = pass). Ranks still running after RUN_LIMIT_S are
 * killed and count as failures. */
static void run_ranks(const char *what, int size, RankFn fn, const char *job) {
    pid_t pid[MAX_RANKS];
    fflush(NULL);
    for (int r = 0; r < size; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            perror("fork");
            exit(2);
        }
        if (pid[r] == 0) {
            g_check_failures = g_check_count = 0;
            int failed = fn(r, size, job);
            fflush(NULL);
            _exit(failed ? 1 : 0);
        }
    }
    const double t0 = tp_now_s();
    int left = size, status[MAX_RANKS], done[MAX_RANKS] = {0};
    while (left > 0) {
        for (int r = 0; r < size; r++) {
            if (done[r]) continue;
            pid_t w = waitpid(pid[r], &status[r], WNOHANG);
            if (w == pid[r]) {
                done[r] = 1;
                left--;
            }
        }
        if (left > 0 && tp_now_s() - t0 > RUN_LIMIT_S) {
            for (int r = 0; r < size; r++)
                if (!done[r]) kill(pid[r], SIGKILL);
            for (int r = 0; r < size; r++)
                if (!done[r]) {
                    waitpid(pid[r], &status[r], 0);
                    CHECK(0, "%s: rank %d still running after %g s (hang)", what, r, RUN_LIMIT_S);
                    done[r] = 2;
                }
            break;
        }
        if (left > 0) usleep(20000);
    }
    for (int r = 0; r < size; r++) {
        if (done[r] == 2) continue;
        if (WIFEXITED(status[r]))
            CHECK(WEXITSTATUS(status[r]) == 0, "%s: rank %d failed (exit %d)", what, r, WEXITSTATUS(status[r]));
        else
            CHECK(0, "%s: rank %d died of signal %d", what, r, WTERMSIG(status[r]));
    }
    printf("%s: %d rank(s) done in %.1f s\n", what, size, tp_now_s() - t0);
}

/* The device count, asked in a child so this process stays CUDA-free. */
static int probe_devices(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
}

/* ---- the collectives on one rank ---- */

static float *dev_alloc(size_t n_bytes) {
    float *d = NULL;
    CUDA_CHECK(cudaMalloc((void **)&d, n_bytes ? n_bytes : 1));
    return d;
}

static void check_collectives(Comm *c, int rank, int size) {
    char what[64];
    const size_t n = ((size_t)1 << 20) + 3;  // not a multiple of anything NCCL chunks by
    float *h = malloc(n * sizeof *h), *d = dev_alloc(n * sizeof(float));

    // SUM of small multiples of 1/4: exact in any order.
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 13) + 0.25f * (float)rank;
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(comm_allreduce(c, d, n, COMM_SUM) == 0, "allreduce sum: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != (float)size * (float)(i % 13) + 0.25f * (float)(size * (size - 1) / 2);
    CHECK(bad == 0, "allreduce sum: %zu of %zu elements wrong", bad, n);

    // MAX
    for (size_t i = 0; i < n; i++) h[i] = (float)((i * 7 + (size_t)rank * 5) % 23) - (float)rank;
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(comm_allreduce(c, d, n, COMM_MAX) == 0, "allreduce max: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = -1e30f;
        for (int q = 0; q < size; q++) {
            float v = (float)((i * 7 + (size_t)q * 5) % 23) - (float)q;
            if (v > want) want = v;
        }
        bad += h[i] != want;
    }
    CHECK(bad == 0, "allreduce max: %zu of %zu elements wrong", bad, n);

    // Random data: the same call twice gives the same bits, and every rank the same bits.
    float *r1 = malloc(n * sizeof *r1), *r2 = malloc(n * sizeof *r2);
    g_rng = 0x243f6a8885a308d3ULL ^ (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < n; i++) h[i] = urand();
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(comm_allreduce(c, d, n, COMM_SUM) == 0, "allreduce random #1: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(r1, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(comm_allreduce(c, d, n, COMM_SUM) == 0, "allreduce random #2: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(r2, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(memcmp(r1, r2, n * sizeof(float)) == 0, "allreduce is deterministic from call to call");
    uint64_t mine = fnv1a(r1, n * sizeof(float)), theirs = mine;
    float *d_hash = dev_alloc(sizeof mine);
    CUDA_CHECK(cudaMemcpy(d_hash, &mine, sizeof mine, cudaMemcpyHostToDevice));
    CHECK(comm_broadcast(c, d_hash, sizeof mine, 0) == 0, "broadcast hash: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(&theirs, d_hash, sizeof theirs, cudaMemcpyDeviceToHost));
    CHECK(theirs == mine, "rank %d's allreduce result has the bits of rank 0's", rank);
    free(r1);
    free(r2);

    // allgather: rank q's block lands at q * m.
    const size_t m = 1001;
    float *d_in = dev_alloc(size * m * sizeof(float)), *d_out = dev_alloc(size * m * sizeof(float));
    for (size_t i = 0; i < m; i++) h[i] = (float)(rank * 10000) + (float)i;
    CUDA_CHECK(cudaMemcpy(d_in, h, m * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(comm_allgather(c, d_in, d_out, m) == 0, "allgather: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d_out, size * m * sizeof(float), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < m; i++) bad += h[(size_t)q * m + i] != (float)(q * 10000) + (float)i;
    CHECK(bad == 0, "allgather: %zu wrong", bad);

    // reduce_scatter: out[i] = sum_q (q + 1) * (rank * m + i).
    for (size_t j = 0; j < size * m; j++) h[j] = (float)(rank + 1) * (float)j;
    CUDA_CHECK(cudaMemcpy(d_in, h, size * m * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(comm_reduce_scatter(c, d_in, d_out, m) == 0, "reduce_scatter: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d_out, m * sizeof(float), cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < m; i++)
        bad += h[i] != (float)((size_t)rank * m + i) * (float)(size * (size + 1) / 2);
    CHECK(bad == 0, "reduce_scatter: %zu wrong", bad);

    // broadcast an odd number of bytes from the last rank.
    const size_t nb = 12345;
    unsigned char *hb = malloc(nb);
    for (size_t i = 0; i < nb; i++) hb[i] = rank == size - 1 ? (unsigned char)(i * 31 + 7) : 0;
    float *d_bytes = dev_alloc(nb);
    CUDA_CHECK(cudaMemcpy(d_bytes, hb, nb, cudaMemcpyHostToDevice));
    CHECK(comm_broadcast(c, d_bytes, nb, size - 1) == 0, "broadcast: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(hb, d_bytes, nb, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_bytes));
    bad = 0;
    for (size_t i = 0; i < nb; i++) bad += hb[i] != (unsigned char)(i * 31 + 7);
    CHECK(bad == 0, "broadcast: %zu of %zu bytes wrong", bad, nb);
    free(hb);

    CHECK(comm_barrier(c) == 0, "barrier: %s", comm_error(c));

    CommStats s = comm_stats(c);
    snprintf(what, sizeof what, "stats of rank %d", rank);
    CHECK(s.allreduce == 4 && s.reduce_scatter == 1 && s.allgather == 1 && s.broadcast == 2 && s.barrier == 1,
          "%s: %ld allreduce, %ld reduce_scatter, %ld allgather, %ld broadcast, %ld barrier", what, s.allreduce,
          s.reduce_scatter, s.allgather, s.broadcast, s.barrier);
    CHECK(s.allreduce_bytes == 4.0 * (double)n * sizeof(float), "%s: allreduce bytes %g", what, s.allreduce_bytes);
    CHECK(s.seconds > 0.0, "%s: time inside collectives is counted", what);
    comm_reset_stats(c);
    CHECK(comm_stats(c).allreduce == 0, "reset clears the stats");

    free(h);
    CUDA_CHECK(cudaFree(d));
    CUDA_CHECK(cudaFree(d_hash));
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_out));
}

/* bf16 collectives on small integers (exact in bf16 whatever the order), then
 * send / recv: to oneself, and around a ring (even ranks send first, since
 * an NCCL send waits for its receive). */
static void check_dtype_p2p(Comm *c, int rank, int size) {
    const size_t m = 3001;
    uint16_t *h = malloc((size_t)size * m * sizeof *h);
    uint16_t *d_in = (uint16_t *)dev_alloc((size_t)size * m * 2), *d_out = (uint16_t *)dev_alloc((size_t)size * m * 2);
    for (size_t i = 0; i < m; i++) h[i] = tp_f32_to_bf16((float)(i % 7) + (float)rank);
    CUDA_CHECK(cudaMemcpy(d_in, h, m * 2, cudaMemcpyHostToDevice));
    CHECK(comm_allreduce_t(c, d_in, m, COMM_BF16, COMM_SUM) == 0, "bf16 allreduce: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d_in, m * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < m; i++)
        bad += h[i] != tp_f32_to_bf16((float)size * (float)(i % 7) + (float)(size * (size - 1) / 2));
    CHECK(bad == 0, "bf16 allreduce sum: %zu of %zu wrong", bad, m);

    // Any partial sum over ranks stays below 256: exact in bf16 in whatever order NCCL adds.
    for (size_t j = 0; j < (size_t)size * m; j++) h[j] = tp_f32_to_bf16((float)(j % 5) * (float)(rank + 1));
    CUDA_CHECK(cudaMemcpy(d_in, h, (size_t)size * m * 2, cudaMemcpyHostToDevice));
    CHECK(comm_reduce_scatter_t(c, d_in, d_out, m, COMM_BF16) == 0, "bf16 reduce_scatter: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d_out, m * 2, cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < m; i++)
        bad += h[i] != tp_f32_to_bf16((float)(((size_t)rank * m + i) % 5) * (float)(size * (size + 1) / 2));
    CHECK(bad == 0, "bf16 reduce_scatter: %zu wrong", bad);

    for (size_t i = 0; i < m; i++) h[i] = (uint16_t)(rank * 1000 + (int)(i % 1000));  // any bits: copied as they are
    CUDA_CHECK(cudaMemcpy(d_in, h, m * 2, cudaMemcpyHostToDevice));
    CHECK(comm_allgather_t(c, d_in, d_out, m, COMM_BF16) == 0, "bf16 allgather: %s", comm_error(c));
    CUDA_CHECK(cudaMemcpy(h, d_out, (size_t)size * m * 2, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int q = 0; q < size; q++)
        for (size_t i = 0; i < m; i++) bad += h[(size_t)q * m + i] != (uint16_t)(q * 1000 + (int)(i % 1000));
    CHECK(bad == 0, "bf16 allgather: %zu wrong", bad);

    // Messages to oneself arrive in order, zero bytes included.
    const size_t sizes[3] = {0, 1000, ((size_t)3 << 20) + 1};
    unsigned char *hb = malloc(sizes[2]);
    unsigned char *d_msg[3], *d_got = (unsigned char *)dev_alloc(sizes[2]);
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < sizes[k]; i++) hb[i] = (unsigned char)(i * 7 + (size_t)k);
        d_msg[k] = (unsigned char *)dev_alloc(sizes[k]);
        if (sizes[k]) CUDA_CHECK(cudaMemcpy(d_msg[k], hb, sizes[k], cudaMemcpyHostToDevice));
        CHECK(comm_send(c, d_msg[k], sizes[k], rank) == 0, "send #%d to itself: %s", k, comm_error(c));
    }
    for (int k = 0; k < 3; k++) {
        CHECK(comm_recv(c, d_got, sizes[k], rank) == 0, "recv #%d from itself: %s", k, comm_error(c));
        if (sizes[k]) CUDA_CHECK(cudaMemcpy(hb, d_got, sizes[k], cudaMemcpyDeviceToHost));
        bad = 0;
        for (size_t i = 0; i < sizes[k]; i++) bad += hb[i] != (unsigned char)(i * 7 + (size_t)k);
        CHECK(bad == 0, "message #%d to itself: %zu of %zu bytes wrong", k, bad, sizes[k]);
    }
    // Around the ring: the largest message to rank + 1, from rank - 1.
    if (size >= 2) {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        for (size_t i = 0; i < sizes[2]; i++) hb[i] = (unsigned char)(i * 13 + (size_t)rank);
        CUDA_CHECK(cudaMemcpy(d_msg[2], hb, sizes[2], cudaMemcpyHostToDevice));
        int ok = rank % 2 == 0
                     ? comm_send(c, d_msg[2], sizes[2], next) == 0 && comm_recv(c, d_got, sizes[2], prev) == 0
                     : comm_recv(c, d_got, sizes[2], prev) == 0 && comm_send(c, d_msg[2], sizes[2], next) == 0;
        CHECK(ok, "ring send/recv: %s", comm_error(c));
        CUDA_CHECK(cudaMemcpy(hb, d_got, sizes[2], cudaMemcpyDeviceToHost));
        bad = 0;
        for (size_t i = 0; i < sizes[2]; i++) bad += hb[i] != (unsigned char)(i * 13 + (size_t)prev);
        CHECK(bad == 0, "ring message from %d: %zu bytes wrong", prev, bad);
    }
    CommStats s = comm_stats(c);
    const long n_p2p = 3 + (size >= 2);
    CHECK(s.allreduce == 1 && s.reduce_scatter == 1 && s.allgather == 1 && s.send == n_p2p && s.recv == n_p2p,
          "stats: %ld allreduce, %ld reduce_scatter, %ld allgather, %ld send, %ld recv", s.allreduce, s.reduce_scatter,
          s.allgather, s.send, s.recv);
    CHECK(s.allreduce_bytes == 2.0 * (double)m, "bf16 allreduce bytes: %g", s.allreduce_bytes);
    const CommDeviceCopy hooks = {0};
    CHECK(comm_set_device_copy(c, &hooks) == -1 && strstr(comm_error(c), "NCCL"), "staging hooks refused: %s",
          comm_error(c));
    CHECK(comm_barrier(c) == 0, "a refused staging leaves the communicator working: %s", comm_error(c));
    comm_reset_stats(c);
    for (int k = 0; k < 3; k++) CUDA_CHECK(cudaFree(d_msg[k]));
    CUDA_CHECK(cudaFree(d_got));
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_out));
    free(hb);
    free(h);
}

static void check_splits(Comm *world, int rank, int size) {
    char err[512] = "";
    // By parity: ranks 0, 2, 4... and 1, 3, 5...
    Comm *half = NULL;
    CHECK(comm_nccl_split(world, "half", rank % 2, rank, &half, err, sizeof err) == 0 && half, "split: %s", err);
    if (half) {
        const int want_size = (size - rank % 2 + 1) / 2;
        CHECK(comm_size(half) == want_size && comm_rank(half) == rank / 2, "split by parity: rank %d of %d",
              comm_rank(half), comm_size(half));
        float v = (float)rank, *d = dev_alloc(sizeof v);
        CUDA_CHECK(cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice));
        CHECK(comm_allreduce(half, d, 1, COMM_SUM) == 0, "allreduce on the split: %s", comm_error(half));
        CUDA_CHECK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
        float want = 0.0f;
        for (int q = rank % 2; q < size; q += 2) want += (float)q;
        CHECK(v == want, "allreduce on the split: %g, want %g", v, want);
        CUDA_CHECK(cudaFree(d));
        printf("rank %d: world took %.1f MiB, the split %.1f MiB of device memory\n", rank,
               comm_nccl_device_bytes(world) / 1048576.0, comm_nccl_device_bytes(half) / 1048576.0);
        comm_free(half);
    }
    // Rank 0 in no group; the others together.
    Comm *rest = NULL;
    int rc = comm_nccl_split(world, "rest", rank == 0 ? -1 : 0, rank, &rest, err, sizeof err);
    CHECK(rc == 0, "split with a rank in no group: %s", err);
    if (rank == 0) {
        CHECK(rest == NULL, "color < 0 gives no communicator");
    } else {
        CHECK(rest && comm_size(rest) == size - 1 && comm_rank(rest) == rank - 1, "the others form a group of %d",
              size - 1);
        if (rest) {
            CHECK(comm_barrier(rest) == 0, "barrier on the rest: %s", comm_error(rest));
            comm_free(rest);
        }
    }
    CHECK(comm_barrier(world) == 0, "the world still works after the splits: %s", comm_error(world));
}

/* NCCL never receives a host pointer: a pageable and a pinned host buffer
 * are each refused in one sentence before any NCCL call (on a split of
 * their own: the refusal poisons it), the buffer left as it was. */
static void check_host_pointers(Comm *world, int rank) {
    float *pinned = NULL;
    CUDA_CHECK(cudaMallocHost((void **)&pinned, 4 * sizeof(float)));
    float pageable[4];
    float *const bufs[2] = {pageable, pinned};
    for (int k = 0; k < 2; k++) {
        char err[512] = "";
        Comm *h = NULL;
        CHECK(comm_nccl_split(world, k ? "pinned" : "pageable", 0, rank, &h, err, sizeof err) == 0 && h,
              "split for the host-pointer check: %s", err);
        if (!h) continue;
        for (int i = 0; i < 4; i++) bufs[k][i] = (float)(i + 1);
        const int rc = comm_allreduce(h, bufs[k], 4, COMM_SUM);
        CHECK(rc == -1 && strstr(comm_error(h), "host pointer") && strstr(comm_error(h), "allreduce #1"),
              "%s host buffer: refused naming it: %s", k ? "a pinned" : "a pageable", comm_error(h));
        CHECK(bufs[k][0] == 1.0f && bufs[k][3] == 4.0f, "a refused host buffer is left as it was");
        CHECK(comm_barrier(h) == -1, "the refusal poisons the communicator");
        comm_free(h);
    }
    CUDA_CHECK(cudaFreeHost(pinned));
    CHECK(comm_barrier(world) == 0, "the world still works after the refusals: %s", comm_error(world));
}

/* Rank 0 calls an allreduce that the others never make: it must fail within
 * the timeout, and stay failed. The others wait (through the store) until
 * rank 0 has its verdict, so the timeout path is what fires. */
static void check_idle_peer(StoreClient *st, const char *job, int rank, int size, int device, cudaStream_t stream) {
    char err[512] = "", key[256];
    Comm *c = comm_nccl_create(st, job, "idle", rank, size, device, SHORT_TIMEOUT_S, stream, err, sizeof err);
    CHECK(c != NULL, "create idle: %s", err);
    if (!c) return;
    snprintf(key, sizeof key, "%s/test/idle-verdict", job);
    if (rank == 0) {
        float *d = dev_alloc(sizeof(float) * 256);
        const double t0 = tp_now_s();
        int rc = comm_allreduce(c, d, 256, COMM_SUM);
        const double dt = tp_now_s() - t0;
        const char *msg = comm_error(c);
        CHECK(rc == -1, "an allreduce nobody else makes fails");
        CHECK(dt < SHORT_TIMEOUT_S + SLACK_S, "and fails in %.1f s, within the timeout of %g s", dt, SHORT_TIMEOUT_S);
        CHECK(strstr(msg, "idle") && strstr(msg, "allreduce #1") && strstr(msg, "within"),
              "the message names the group, the call and the timeout: %s", msg);
        printf("idle peer: failed after %.1f s: %s\n", dt, msg);
        char first[512];
        snprintf(first, sizeof first, "%s", msg);
        CHECK(comm_barrier(c) == -1 && strcmp(comm_error(c), first) == 0,
              "a failed communicator fails at once and keeps the first message");
        store_set(st, key, "done", 4);
        CUDA_CHECK(cudaFree(d));
    } else {
        size_t n_bytes = 0;
        void *v = store_get(st, key, &n_bytes, SHORT_TIMEOUT_S + 2 * SLACK_S);
        CHECK(v != NULL, "rank 0 reported its verdict on the idle group");
        free(v);
    }
    const double t0 = tp_now_s();
    comm_free(c);  // the others' finalize cannot complete with rank 0 aborted: bounded by the timeout
    CHECK(tp_now_s() - t0 < SHORT_TIMEOUT_S + SLACK_S, "freeing a broken group takes %.1f s", tp_now_s() - t0);
}

static int rank_main(int rank, int size, const char *job) {
    const int device = rank % g_n_dev;
    CUDA_CHECK(cudaSetDevice(device));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));  // blocking: ordered after the test's cudaMemcpy calls
    StoreClient *st = store_or_die();
    char err[512] = "";
    Comm *c = comm_nccl_create(st, job, "world", rank, size, device, COMM_TIMEOUT_S, stream, err, sizeof err);
    CHECK(c != NULL, "create world of %d: %s", size, err);
    if (c) {
        CHECK(comm_is_nccl(c) && comm_rank(c) == rank && comm_size(c) == size, "rank %d of %d", comm_rank(c),
              comm_size(c));
        CHECK(comm_stats(c).barrier == 0, "creation's own barrier is not in the stats");
        check_collectives(c, rank, size);
        check_dtype_p2p(c, rank, size);
        check_splits(c, rank, size);
        check_host_pointers(c, rank);
        if (size >= 2) check_idle_peer(st, job, rank, size, device, stream);
        // An argument error poisons the communicator (the ranks are out of step after it).
        CHECK(comm_broadcast(c, NULL, 4, size) == -1 && strstr(comm_error(c), "root"), "bad root: %s",
              comm_error(c));
        CHECK(comm_barrier(c) == -1, "a poisoned communicator fails every later call");
        comm_free(c);
    }
    store_close(st);
    CUDA_CHECK(cudaStreamDestroy(stream));
    printf("rank %d of %d: %d checks, %d failed\n", rank, size, g_check_count, g_check_failures);
    return g_check_failures;
}

/* One process, groups that can never form. */
static int lonely_main(int rank, int size, const char *job) {
    (void)rank;
    (void)size;
    CUDA_CHECK(cudaSetDevice(0));
    StoreClient *st = store_or_die();
    char err[512] = "";
    // A group of 2 whose rank 1 never comes.
    double t0 = tp_now_s();
    Comm *c = comm_nccl_create(st, job, "ghost", 0, 2, 0, SHORT_TIMEOUT_S, 0, err, sizeof err);
    double dt = tp_now_s() - t0;
    CHECK(c == NULL, "a group whose peer never joins is not created");
    CHECK(dt < SHORT_TIMEOUT_S + SLACK_S, "and fails in %.1f s (timeout %g s)", dt, SHORT_TIMEOUT_S);
    CHECK(strstr(err, "ghost") && strstr(err, "did not form within"), "message: %s", err);
    printf("peer never joins: failed after %.1f s: %s\n", dt, err);
    if (c) comm_free(c);
    // Rank 1 of a group whose rank 0 never publishes the id.
    t0 = tp_now_s();
    c = comm_nccl_create(st, job, "orphan", 1, 2, 0, SHORT_TIMEOUT_S, 0, err, sizeof err);
    dt = tp_now_s() - t0;
    CHECK(c == NULL, "a rank without rank 0 is not created");
    CHECK(dt < SHORT_TIMEOUT_S + SLACK_S, "and fails in %.1f s", dt);
    CHECK(strstr(err, "orphan") && strstr(err, "NCCL id"), "message: %s", err);
    printf("rank 0 never publishes: failed after %.1f s: %s\n", dt, err);
    if (c) comm_free(c);
    // Bad arguments are refused before any NCCL call.
    CHECK(comm_nccl_create(st, job, "bad", 2, 2, 0, SHORT_TIMEOUT_S, 0, err, sizeof err) == NULL &&
              strstr(err, "invalid"),
          "rank 2 of 2 is refused: %s", err);
    CHECK(comm_nccl_create(NULL, job, "nostore", 0, 2, 0, SHORT_TIMEOUT_S, 0, err, sizeof err) == NULL &&
              strstr(err, "store"),
          "a group without a store is refused: %s", err);
    store_close(st);
    return g_check_failures;
}

int main(void) {
    g_n_dev = probe_devices();
    if (g_n_dev < 1) {
        fprintf(stderr, "test_nccl: no CUDA device: this test needs a GPU (label gpu)\n");
        return 1;
    }
    // One node: NCCL's bootstrap may use loopback (unless the caller chose an interface).
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    char err[512] = "";
    StoreServer *server = store_server_start("127.0.0.1", 0, TOKEN, &g_port, err, sizeof err);
    if (!server) {
        fprintf(stderr, "test_nccl: store server: %s\n", err);
        return 1;
    }
    char job[64];
    snprintf(job, sizeof job, "nccltest%ld", (long)getpid());
    char job1[96], jobl[96], jobn[96];
    snprintf(job1, sizeof job1, "%s-w1", job);
    snprintf(jobl, sizeof jobl, "%s-lonely", job);
    snprintf(jobn, sizeof jobn, "%s-wn", job);

    run_ranks("world of 1", 1, rank_main, job1);
    run_ranks("groups that never form", 1, lonely_main, jobl);
    const int n = g_n_dev < MAX_RANKS ? g_n_dev : MAX_RANKS;
    if (n >= 2) {
        char what[64];
        snprintf(what, sizeof what, "world of %d", n);
        run_ranks(what, n, rank_main, jobn);
    } else {
        printf("one GPU: the multi-rank scenarios need two or more and are skipped\n");
    }
    store_server_stop(server);
    return check_report("test_nccl");
}
