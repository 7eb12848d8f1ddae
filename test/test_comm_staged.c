/* test_comm_staged.c: device buffers on the shared-memory backend, staged
 * through host memory by comm_set_device_copy's hooks, on the CPU.
 *
 * The "device" is an address range mapped PROT_NONE: a communicator that
 * touched a caller's buffer directly would die of SIGSEGV. The fake hooks
 * translate those addresses to backing host memory, count calls and bytes,
 * and check that the host side of every copy is the communicator's staging
 * buffer. Every operation runs twice per rank, staged on device buffers and
 * plain on host buffers with the same inputs (two groups of the same
 * ranks), and the results must be bitwise equal; the hook byte counts must
 * be exactly one crossing per byte in each direction the operation needs.
 * Even ranks give the staging allocator hooks, odd ranks leave it to the
 * communicator (staging is per rank).
 */
#define _GNU_SOURCE
#include "check.h"
#include "comm_ranks.h"

#include <sys/mman.h>

#define DEV_BYTES ((size_t)256 << 20)
#define SLOT_BYTES_T ((size_t)4 << 20)  // SLOT_BYTES of comm_shm_impl.h

typedef struct {
    unsigned char *dev;  // (DEV_BYTES) PROT_NONE: the fake device addresses
    unsigned char *backing;  // (DEV_BYTES) the memory behind them
    size_t used;  // bump allocator over dev
    long to_host_calls, to_device_calls, alloc_calls, free_calls;
    size_t alloc_bytes;  // what host_alloc was asked for
    double to_host_bytes, to_device_bytes;
    void *stage;  // what host_alloc returned (NULL: the communicator's own)
    long bad_dev, bad_host;  // hook calls with a pointer outside the device / not the stage
} FakeDevice;

static unsigned char *translate(FakeDevice *d, const void *p, size_t n_bytes) {
    const uintptr_t a = (uintptr_t)p, lo = (uintptr_t)d->dev;
    if (a < lo || a + n_bytes > lo + DEV_BYTES) {
        d->bad_dev++;
        return NULL;
    }
    return d->backing + (a - lo);
}

static void check_host(FakeDevice *d, const void *p) {
    const uintptr_t a = (uintptr_t)p, lo = (uintptr_t)d->dev;
    if ((a >= lo && a < lo + DEV_BYTES) || (d->stage && p != d->stage)) d->bad_host++;
}

/* One copy between the fake device and the host, checked and counted by direction. */
static void fake_copy(FakeDevice *d, void *dst, const void *src, size_t n_bytes, int to_host) {
    check_host(d, to_host ? dst : src);
    unsigned char *dev = translate(d, to_host ? src : dst, n_bytes);
    if (dev) memcpy(to_host ? dst : dev, to_host ? dev : src, n_bytes);
    if (to_host) d->to_host_calls++, d->to_host_bytes += (double)n_bytes;
    else d->to_device_calls++, d->to_device_bytes += (double)n_bytes;
}

static void fake_to_host(void *ctx, void *dst_host, const void *src_dev, size_t n_bytes) {
    fake_copy(ctx, dst_host, src_dev, n_bytes, 1);
}

static void fake_to_device(void *ctx, void *dst_dev, const void *src_host, size_t n_bytes) {
    fake_copy(ctx, dst_dev, src_host, n_bytes, 0);
}

static void *fake_alloc(void *ctx, size_t n_bytes) {
    FakeDevice *d = ctx;
    d->alloc_calls++;
    d->alloc_bytes += n_bytes;
    d->stage = malloc(n_bytes);
    return d->stage;
}

static void fake_free(void *ctx, void *p) {
    FakeDevice *d = ctx;
    d->free_calls++;
    CHECK(p == d->stage, "host_free got %p, not the stage %p", p, d->stage);
    free(p);
}

/* A device buffer holding n_bytes of host (NULL: uninitialised). */
static void *dev_put(FakeDevice *d, const void *host, size_t n_bytes) {
    const size_t at = d->used;
    d->used += (n_bytes + 63) & ~(size_t)63;
    if (d->used > DEV_BYTES) {
        fprintf(stderr, "fake device full\n");
        _exit(3);
    }
    if (host && n_bytes) memcpy(d->backing + at, host, n_bytes);
    return d->dev + at;
}

static const void *dev_view(FakeDevice *d, const void *dev) {
    return d->backing + ((const unsigned char *)dev - d->dev);
}

/* ---- comparing one operation, staged vs plain ---- */

typedef struct {
    FakeDevice *d;
    double h0, d0;  // byte counters before the operation
} Mark;

static Mark mark(FakeDevice *d) { return (Mark){d, d->to_host_bytes, d->to_device_bytes}; }

static void check_bytes(const Mark *m, const char *what, double want_to_host, double want_to_device) {
    const double h = m->d->to_host_bytes - m->h0, dv = m->d->to_device_bytes - m->d0;
    CHECK(h == want_to_host && dv == want_to_device, "%s: %.0f bytes to host, %.0f to device; want %.0f, %.0f", what, h,
          dv, want_to_host, want_to_device);
}

static void check_same(const char *what, const void *staged, const void *plain, size_t n_bytes) {
    CHECK(n_bytes == 0 || memcmp(staged, plain, n_bytes) == 0, "%s: staged result differs from the plain one", what);
}

/* Inputs: val() as floats, or their bf16 bits. */
static void *inputs(int rank, size_t n_elems, int tag, CommDtype dt) {
    const size_t es = comm_dtype_bytes(dt);
    unsigned char *b = malloc(n_elems * es + 1);
    for (size_t i = 0; i < n_elems; i++) {
        float v = val(rank, i, tag);
        if (dt == COMM_F32) {
            memcpy(b + i * 4, &v, 4);
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            const uint16_t h = (uint16_t)(u >> 16);  // any bits will do: both paths get the same
            memcpy(b + i * 2, &h, 2);
        }
    }
    return b;
}

static void op_allreduce(Comm *cs, Comm *cp, FakeDevice *d, int rank, size_t n_elems, CommDtype dt, CommOp op,
                         int tag) {
    const int n = comm_size(cs);
    const size_t nb = n_elems * comm_dtype_bytes(dt);
    char what[96];
    snprintf(what, sizeof what, "allreduce %s %s of %zu", dt == COMM_F32 ? "f32" : "bf16", op ? "max" : "sum", n_elems);
    void *host = inputs(rank, n_elems, tag, dt), *dev = dev_put(d, host, nb);
    Mark m = mark(d);
    CHECK(comm_allreduce_t(cs, dev, n_elems, dt, op) == 0, "%s staged: %s", what, comm_error(cs));
    CHECK(comm_allreduce_t(cp, host, n_elems, dt, op) == 0, "%s plain: %s", what, comm_error(cp));
    check_same(what, dev_view(d, dev), host, nb);
    check_bytes(&m, what, n > 1 ? (double)nb : 0, n > 1 ? (double)nb : 0);
    free(host);
}

static void op_reduce_scatter(Comm *cs, Comm *cp, FakeDevice *d, int rank, size_t m_elems, CommDtype dt, int tag) {
    const int n = comm_size(cs);
    const size_t es = comm_dtype_bytes(dt), in_b = (size_t)n * m_elems * es, out_b = m_elems * es;
    char what[96];
    snprintf(what, sizeof what, "reduce_scatter %s of %zu", dt == COMM_F32 ? "f32" : "bf16", m_elems);
    void *in = inputs(rank, (size_t)n * m_elems, tag, dt), *out = malloc(out_b + 1);
    void *din = dev_put(d, in, in_b), *dout = dev_put(d, NULL, out_b);
    Mark mk = mark(d);
    CHECK(comm_reduce_scatter_t(cs, din, dout, m_elems, dt) == 0, "%s staged: %s", what, comm_error(cs));
    CHECK(comm_reduce_scatter_t(cp, in, out, m_elems, dt) == 0, "%s plain: %s", what, comm_error(cp));
    check_same(what, dev_view(d, dout), out, out_b);
    check_bytes(&mk, what, n > 1 ? (double)in_b : (double)out_b, (double)out_b);
    free(in);
    free(out);
}

static void op_allgather(Comm *cs, Comm *cp, FakeDevice *d, int rank, size_t m_elems, CommDtype dt, int tag) {
    const int n = comm_size(cs);
    const size_t es = comm_dtype_bytes(dt), in_b = m_elems * es, out_b = (size_t)n * m_elems * es;
    char what[96];
    snprintf(what, sizeof what, "allgather %s of %zu", dt == COMM_F32 ? "f32" : "bf16", m_elems);
    void *in = inputs(rank, m_elems, tag, dt), *out = malloc(out_b + 1);
    void *din = dev_put(d, in, in_b), *dout = dev_put(d, NULL, out_b);
    Mark mk = mark(d);
    CHECK(comm_allgather_t(cs, din, dout, m_elems, dt) == 0, "%s staged: %s", what, comm_error(cs));
    CHECK(comm_allgather_t(cp, in, out, m_elems, dt) == 0, "%s plain: %s", what, comm_error(cp));
    check_same(what, dev_view(d, dout), out, out_b);
    check_bytes(&mk, what, (double)in_b, (double)out_b);
    free(in);
    free(out);
}

static void op_broadcast(Comm *cs, Comm *cp, FakeDevice *d, int rank, size_t nb, int root) {
    const int n = comm_size(cs);
    unsigned char *host = malloc(nb + 1);
    for (size_t i = 0; i < nb; i++) host[i] = rank == root ? (unsigned char)(i * 7 + 3) : 0xAA;
    void *dev = dev_put(d, host, nb);
    Mark m = mark(d);
    CHECK(comm_broadcast(cs, dev, nb, root) == 0, "broadcast staged: %s", comm_error(cs));
    CHECK(comm_broadcast(cp, host, nb, root) == 0, "broadcast plain: %s", comm_error(cp));
    check_same("broadcast", dev_view(d, dev), host, nb);
    const int moves = n > 1;
    check_bytes(&m, "broadcast", moves && rank == root ? (double)nb : 0, moves && rank != root ? (double)nb : 0);
    free(host);
}

/* Ring through device buffers (even ranks send first), then a message to oneself. */
static void op_send_recv(Comm *cs, Comm *cp, FakeDevice *d, int rank, size_t nb) {
    const int n = comm_size(cs), next = (rank + 1) % n, prev = (rank + n - 1) % n;
    unsigned char *mine = malloc(nb + 1), *theirs = malloc(nb + 1);
    for (size_t i = 0; i < nb; i++) mine[i] = (unsigned char)(i * 13 + (size_t)rank);
    void *dsend = dev_put(d, mine, nb), *drecv = dev_put(d, NULL, nb);
    Mark m = mark(d);
    for (int pass = 0; pass < 2; pass++) {  // staged, then plain
        Comm *c = pass == 0 ? cs : cp;
        void *sb = pass == 0 ? dsend : mine, *rb = pass == 0 ? drecv : theirs;
        if (rank % 2 == 0) {
            CHECK(comm_send(c, sb, nb, next) == 0, "send: %s", comm_error(c));
            CHECK(comm_recv(c, rb, nb, prev) == 0, "recv: %s", comm_error(c));
        } else {
            CHECK(comm_recv(c, rb, nb, prev) == 0, "recv: %s", comm_error(c));
            CHECK(comm_send(c, sb, nb, next) == 0, "send: %s", comm_error(c));
        }
    }
    check_same("ring send/recv", dev_view(d, drecv), theirs, nb);
    check_bytes(&m, "ring send/recv", (double)nb, (double)nb);
    // To oneself: kept by the communicator, delivered through the hooks.
    m = mark(d);
    CHECK(comm_send(cs, dsend, 100, rank) == 0 && comm_recv(cs, drecv, 100, rank) == 0, "self: %s", comm_error(cs));
    check_same("self send/recv", dev_view(d, drecv), mine, 100);
    check_bytes(&m, "self send/recv", 100, 100);
    free(mine);
    free(theirs);
}

static void rank_staged(int rank, int n, int fd, void *arg) {
    (void)fd;
    (void)arg;
    FakeDevice dev = {0};
    dev.dev = mmap(NULL, DEV_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    dev.backing = mmap(NULL, DEV_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (dev.dev == MAP_FAILED || dev.backing == MAP_FAILED) _exit(3);
    Comm *cs = create_or_report("staged", rank, n, 20.0), *cp = create_or_report("plain", rank, n, 20.0);
    if (!cs || !cp) return;

    // Incomplete hooks are refused without poisoning the group.
    CommDeviceCopy half = {.ctx = &dev, .to_host = fake_to_host};
    CHECK(comm_set_device_copy(cp, &half) == -1 && strstr(comm_error(cp), "to_host and to_device"), "half hooks: %s",
          comm_error(cp));
    CommDeviceCopy odd = {.ctx = &dev, .to_host = fake_to_host, .to_device = fake_to_device, .host_alloc = fake_alloc};
    CHECK(comm_set_device_copy(cp, &odd) == -1 && strstr(comm_error(cp), "host_alloc and host_free"),
          "alloc without free: %s", comm_error(cp));
    CHECK(comm_barrier(cp) == 0, "a refused set-up leaves the group working: %s", comm_error(cp));

    CommDeviceCopy hooks = {.ctx = &dev, .to_host = fake_to_host, .to_device = fake_to_device};
    if (rank % 2 == 0) {
        hooks.host_alloc = fake_alloc;
        hooks.host_free = fake_free;
    }
    CHECK(comm_set_device_copy(cs, &hooks) == 0, "hooks: %s", comm_error(cs));
    // The stage a group makes is comm_shm_stage_bytes(its size), the planner's
    // figure: 4 MiB with peers, nothing for a group of one that only reduces.
    op_allreduce(cs, cp, &dev, rank, 3, COMM_F32, COMM_SUM, 11);
    CHECK(comm_barrier(cs) == 0, "barrier: %s", comm_error(cs));
    if (rank % 2 == 0)
        CHECK(dev.alloc_bytes == comm_shm_stage_bytes(n) && (n > 1) == (comm_shm_stage_bytes(n) == SLOT_BYTES_T),
              "a group of %d staged %zu bytes; comm_shm_stage_bytes says %zu", n, dev.alloc_bytes,
              comm_shm_stage_bytes(n));
    const size_t bf16_chunk = 2 * CHUNK_ELEMS;
    op_allreduce(cs, cp, &dev, rank, 1, COMM_F32, COMM_SUM, 1);
    op_allreduce(cs, cp, &dev, rank, 16385, COMM_F32, COMM_SUM, 2);
    op_allreduce(cs, cp, &dev, rank, 3 * CHUNK_ELEMS + 5, COMM_F32, COMM_SUM, 3);
    op_allreduce(cs, cp, &dev, rank, 100003, COMM_F32, COMM_MAX, 4);
    op_allreduce(cs, cp, &dev, rank, bf16_chunk + 5, COMM_BF16, COMM_SUM, 5);
    op_allreduce(cs, cp, &dev, rank, 0, COMM_BF16, COMM_SUM, 6);
    op_reduce_scatter(cs, cp, &dev, rank, CHUNK_ELEMS + 5, COMM_F32, 7);
    op_reduce_scatter(cs, cp, &dev, rank, 100003, COMM_BF16, 8);
    op_allgather(cs, cp, &dev, rank, CHUNK_ELEMS + 5, COMM_F32, 9);
    op_allgather(cs, cp, &dev, rank, 7, COMM_BF16, 10);
    op_broadcast(cs, cp, &dev, rank, (size_t)n * SLOT_BYTES_T + 3, n - 1);
    op_send_recv(cs, cp, &dev, rank, ((size_t)5 << 20) + 7);
    CHECK(dev.bad_dev == 0, "%ld hook calls with a device pointer outside the device", dev.bad_dev);
    CHECK(dev.bad_host == 0, "%ld hook calls whose host side is not the staging buffer", dev.bad_host);
    if (rank % 2 == 0)
        CHECK(dev.alloc_calls == 1 && dev.free_calls == 0, "the stage was made %ld times (freed %ld)", dev.alloc_calls,
              dev.free_calls);

    // Back to host buffers: the stage is released, host pointers work again.
    CHECK(comm_set_device_copy(cs, NULL) == 0, "unset hooks: %s", comm_error(cs));
    if (rank % 2 == 0) CHECK(dev.free_calls == 1, "the stage is released once (%ld)", dev.free_calls);
    const long calls = dev.to_host_calls + dev.to_device_calls;
    float a[5] = {1, 2, 3, 4, (float)rank}, b[5] = {1, 2, 3, 4, (float)rank};
    CHECK(comm_allreduce(cs, a, 5, COMM_SUM) == 0 && comm_allreduce(cp, b, 5, COMM_SUM) == 0, "host again: %s",
          comm_error(cs));
    check_same("host buffers after unsetting the hooks", a, b, sizeof a);
    CHECK(dev.to_host_calls + dev.to_device_calls == calls, "hooks called after they were unset");
    comm_free(cs);
    comm_free(cp);
    if (rank % 2 == 0) CHECK(dev.free_calls == 1 && dev.alloc_calls == 1, "one stage, made and freed once");
}

int main(void) {
    init_job("ts");
    run_world_sizes("staged", 4, rank_staged, NULL);
    return check_report("test_comm_staged");
}
