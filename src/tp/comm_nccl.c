/* comm_nccl.c: comm.h on NCCL, one communicator per group.
 *
 * NCCL collectives only queue work on a stream, and a missing peer makes
 * them wait forever. comm.h promises blocking calls that fail, never hang,
 * so every communicator here is non-blocking (ncclConfig_t.blocking = 0):
 * creation, splits and collectives return at once, and comm_wait (the loop
 * a CPU test drives with a stand-in communicator, tp/comm_wait.h) polls
 * ncclCommGetAsyncError and cudaStreamQuery until the work is done, an error
 * shows up, or the group's timeout (--comm-timeout) passes; then the
 * communicator is aborted (ncclCommAbort also stops kernels waiting on a
 * peer) and poisoned, and the one sentence in comm_error() names the group,
 * this rank (global and group rank, device), the operation and its number.
 *
 * The world communicator is created from a unique id exchanged through the
 * job's store; the tp and dp groups are split from it (comm_nccl_split), so
 * only one rendezvous goes through the store.
 *
 * Send and recv (comm_nccl_p2p.c) are ncclSend / ncclRecv, polled the
 * same way; the communicator's struct is in comm_nccl_impl.h.
 */
#define _GNU_SOURCE
#include "tp/comm_nccl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "err.h"
#include "tp/comm_nccl_impl.h"
#include "tp/comm_wait.h"

static const CommOps *nccl_ops(void);

const char *const NCCL_KIND_NAME[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                      "barrier",   "send",           "recv"};

/* ---- small helpers ---- */

/* Device memory in use on the current device now (0 when unknown). */
static size_t used_bytes(void) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return total_b - free_b;
}

static void abort_nccl(NcclComm *c) {
    if (c->nccl) ncclCommAbort(c->nccl);
    c->nccl = NULL;
}

/* Records the first failure, aborts the communicator and poisons it. */
int nccl_fail(NcclComm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    abort_nccl(c);
    c->failed = 1;
    return -1;
}

/* NCCL's detail for the last error on comm, as " (detail)" or "". */
static void nccl_detail(ncclComm_t comm, char *out, size_t out_len) {
    const char *d = comm ? ncclGetLastError(comm) : NULL;
    if (d && *d) snprintf(out, out_len, " (%s)", d);
    else if (out_len) out[0] = 0;
}

/* Waits while NCCL reports work in progress on comm (creation, split,
 * finalize). Returns NCCL's final state, or ncclInProgress at the deadline. */
static ncclResult_t wait_state(ncclComm_t comm, double deadline) {
    for (unsigned i = 0;; i++) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress) return state;
        if (tp_now_s() >= deadline) return ncclInProgress;
        comm_wait_backoff(i);
    }
}

/* ---- collectives ---- */

int nccl_begin(NcclComm *c, Kind kind, long *counter, double *t0) {
    if (c->failed) return -1;  // comm_error() still holds the first failure
    (*counter)++;
    c->calls[kind]++;
    *t0 = tp_now_s();
    return 0;
}

int nccl_end(NcclComm *c, double t0, int rc) {
    c->stats.seconds += tp_now_s() - t0;
    return rc;
}

/* An argument error: no NCCL call was made, but the ranks are now out of
 * step, so the communicator is poisoned as after any failure. */
int nccl_bad_call(NcclComm *c, double t0, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->failed = 1;
    return nccl_end(c, t0, -1);
}

/* "comm GROUP (nccl): rank R (group rank r of n, device d): KIND #N": who
 * waited for what, the start of every failure sentence of a call. */
static void call_what(const NcclComm *c, Kind kind, char *out, size_t out_len) {
    char who[96];
    if (tp_log_rank() >= 0)
        snprintf(who, sizeof who, "rank %d (group rank %d of %d, device %d)", tp_log_rank(), c->rank, c->size,
                 c->device);
    else
        snprintf(who, sizeof who, "group rank %d of %d (device %d)", c->rank, c->size, c->device);
    snprintf(out, out_len, "comm %s (nccl): %s: %s #%ld", c->group, who, NCCL_KIND_NAME[kind], c->calls[kind]);
}

/* One look at the queued call: NCCL's asynchronous error, then the stream. */
static CommWorkState poll_call(void *ctx, char *why, size_t why_len) {
    NcclComm *c = ctx;
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(c->nccl, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
        char detail[256];
        nccl_detail(c->nccl, detail, sizeof detail);
        snprintf(why, why_len, "%s%s", ncclGetErrorString(state), detail);
        return COMM_WORK_FAILED;
    }
    if (state == ncclInProgress) return COMM_WORK_PENDING;
    cudaError_t e = cudaStreamQuery(c->stream);
    if (e == cudaSuccess) return COMM_WORK_DONE;
    if (e == cudaErrorNotReady) return COMM_WORK_PENDING;
    snprintf(why, why_len, "%s on device %d", cudaGetErrorString(e), c->device);
    return COMM_WORK_FAILED;
}

static void abort_call(void *ctx) { abort_nccl((NcclComm *)ctx); }

/* Completes the collective that `queued` reports on: comm_wait polls NCCL
 * and the stream until both are done, or aborts the communicator on an
 * error or at the timeout (--comm-timeout), naming this rank. */
int nccl_finish(NcclComm *c, Kind kind, ncclResult_t queued, double t0) {
    char what[256], detail[256];
    call_what(c, kind, what, sizeof what);
    if (queued != ncclSuccess && queued != ncclInProgress) {
        nccl_detail(c->nccl, detail, sizeof detail);
        return nccl_end(c, t0, nccl_fail(c, "%s could not start: %s%s; the communicator was aborted", what,
                                         ncclGetErrorString(queued), detail));
    }
    const CommWaiter w = {.ctx = c, .poll = poll_call, .abort = abort_call};
    if (comm_wait(&w, t0 + c->timeout_s, c->timeout_s, what, c->err, sizeof c->err) == 0) return nccl_end(c, t0, 0);
    c->failed = 1;  // aborted by comm_wait; comm_error() holds its sentence
    return nccl_end(c, t0, -1);
}

/* NCCL must never receive a host pointer (its kernels would fault, or
 * read stale memory, far from the mistake): every buffer is asked about
 * (cudaPointerGetAttributes, about a microsecond) and one that is not
 * device or managed memory of this communicator's device is refused in one
 * sentence, before any NCCL call. 0, or -1 with the communicator poisoned. */
int nccl_check_device_buffer(NcclComm *c, double t0, Kind kind, const char *which, const void *buf) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, buf);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: an unknown pointer
        a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == c->device)) return 0;
    if (a.type == cudaMemoryTypeDevice)
        return nccl_bad_call(c, t0, "comm %s (nccl): %s #%ld got %s buffer %p on device %d, not on this group's "
                             "device %d", c->group, NCCL_KIND_NAME[kind], c->calls[kind], which, buf, a.device,
                             c->device);
    return nccl_bad_call(c, t0, "comm %s (nccl): %s #%ld got a host pointer as its %s buffer (%p): NCCL takes device "
                         "memory only (host data goes to the device first, or through the host control group)",
                         c->group, NCCL_KIND_NAME[kind], c->calls[kind], which, buf);
}

/* NCCL's type for dt; 0, or -1 for an unknown dtype. */
static int nccl_type(CommDtype dt, ncclDataType_t *out) {
    switch (dt) {
    case COMM_F32: *out = ncclFloat32; return 0;
    case COMM_BF16: *out = ncclBfloat16; return 0;
    }
    return -1;
}

static int nccl_allreduce(Comm *comm, void *buf, size_t n_elems, CommDtype dt, CommOp op) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_ALLREDUCE, &c->stats.allreduce, &t0) != 0) return -1;
    ncclDataType_t type;
    if (nccl_type(dt, &type) != 0)
        return nccl_bad_call(c, t0, "comm %s (nccl): allreduce of unknown dtype %d", c->group, (int)dt);
    c->stats.allreduce_bytes += (double)n_elems * (double)comm_dtype_bytes(dt);
    if (op != COMM_SUM && op != COMM_MAX)
        return nccl_bad_call(c, t0, "comm %s (nccl): unknown reduction %d", c->group, (int)op);
    if (n_elems == 0) return nccl_end(c, t0, 0);
    if (!buf) return nccl_bad_call(c, t0, "comm %s (nccl): allreduce of %zu elements from NULL", c->group, n_elems);
    if (nccl_check_device_buffer(c, t0, K_ALLREDUCE, "in-place", buf)) return -1;
    ncclResult_t q = ncclAllReduce(buf, buf, n_elems, type, op == COMM_SUM ? ncclSum : ncclMax, c->nccl, c->stream);
    return nccl_finish(c, K_ALLREDUCE, q, t0);
}

static int nccl_reduce_scatter(Comm *comm, const void *in, void *out, size_t n_elems, CommDtype dt) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_REDUCE_SCATTER, &c->stats.reduce_scatter, &t0) != 0) return -1;
    ncclDataType_t type;
    if (nccl_type(dt, &type) != 0)
        return nccl_bad_call(c, t0, "comm %s (nccl): reduce_scatter of unknown dtype %d", c->group, (int)dt);
    if (n_elems == 0) return nccl_end(c, t0, 0);
    if (!in || !out) return nccl_bad_call(c, t0, "comm %s (nccl): reduce_scatter with a NULL buffer", c->group);
    if (nccl_check_device_buffer(c, t0, K_REDUCE_SCATTER, "input", in) ||
        nccl_check_device_buffer(c, t0, K_REDUCE_SCATTER, "output", out))
        return -1;
    ncclResult_t q = ncclReduceScatter(in, out, n_elems, type, ncclSum, c->nccl, c->stream);
    return nccl_finish(c, K_REDUCE_SCATTER, q, t0);
}

static int nccl_allgather(Comm *comm, const void *in, void *out, size_t n_elems, CommDtype dt) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_ALLGATHER, &c->stats.allgather, &t0) != 0) return -1;
    ncclDataType_t type;
    if (nccl_type(dt, &type) != 0)
        return nccl_bad_call(c, t0, "comm %s (nccl): allgather of unknown dtype %d", c->group, (int)dt);
    if (n_elems == 0) return nccl_end(c, t0, 0);
    if (!in || !out) return nccl_bad_call(c, t0, "comm %s (nccl): allgather with a NULL buffer", c->group);
    if (nccl_check_device_buffer(c, t0, K_ALLGATHER, "input", in) ||
        nccl_check_device_buffer(c, t0, K_ALLGATHER, "output", out))
        return -1;
    ncclResult_t q = ncclAllGather(in, out, n_elems, type, c->nccl, c->stream);
    return nccl_finish(c, K_ALLGATHER, q, t0);
}

static int nccl_broadcast(Comm *comm, void *buf, size_t n_bytes, int root) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_BROADCAST, &c->stats.broadcast, &t0) != 0) return -1;
    if (root < 0 || root >= c->size)
        return nccl_bad_call(c, t0, "comm %s (nccl): broadcast root %d is outside the group of %d", c->group, root,
                             c->size);
    if (n_bytes == 0) return nccl_end(c, t0, 0);
    if (!buf) return nccl_bad_call(c, t0, "comm %s (nccl): broadcast of %zu bytes from NULL", c->group, n_bytes);
    if (nccl_check_device_buffer(c, t0, K_BROADCAST, "in-place", buf)) return -1;
    ncclResult_t q = ncclBroadcast(buf, buf, n_bytes, ncclUint8, root, c->nccl, c->stream);
    return nccl_finish(c, K_BROADCAST, q, t0);
}

/* No rank's allreduce can complete before every rank has joined it. */
static int nccl_barrier(Comm *comm) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_BARRIER, &c->stats.barrier, &t0) != 0) return -1;
    ncclResult_t q = ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclFloat32, ncclSum, c->nccl, c->stream);
    return nccl_finish(c, K_BARRIER, q, t0);
}

/* ---- accessors and teardown ---- */

static int nccl_rank(const Comm *c) { return ((const NcclComm *)c)->rank; }
static int nccl_size(const Comm *c) { return ((const NcclComm *)c)->size; }
static const char *nccl_error(const Comm *c) { return ((const NcclComm *)c)->err; }
static CommStats nccl_stats(const Comm *c) { return ((const NcclComm *)c)->stats; }
static void nccl_reset_stats(Comm *c) { memset(&((NcclComm *)c)->stats, 0, sizeof(CommStats)); }

/* A healthy communicator is finalized (flushes, waits for the group to be
 * quiescent) within the timeout, then destroyed; a failed one, or one whose
 * finalize does not complete, is aborted. */
static void nccl_free(Comm *comm) {
    NcclComm *c = (NcclComm *)comm;
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(c->device);
    if (c->nccl) {
        int clean = 0;
        if (!c->failed) {
            ncclResult_t r = ncclCommFinalize(c->nccl);
            if (r == ncclSuccess || r == ncclInProgress)
                clean = wait_state(c->nccl, tp_now_s() + c->timeout_s) == ncclSuccess;
        }
        if (clean) ncclCommDestroy(c->nccl);
        else ncclCommAbort(c->nccl);
        c->nccl = NULL;
    }
    if (c->barrier_buf) cudaFree(c->barrier_buf);
    nccl_free_self_msgs(c);
    if (prev >= 0) cudaSetDevice(prev);
    free(c);
}

static const CommOps *nccl_ops(void) {
    static const CommOps ops = {
        .name = "nccl",
        .allreduce = nccl_allreduce,
        .reduce_scatter = nccl_reduce_scatter,
        .allgather = nccl_allgather,
        .broadcast = nccl_broadcast,
        .barrier = nccl_barrier,
        .send = nccl_send,
        .recv = nccl_recv,
        .set_device_copy = nccl_set_device_copy,
        .rank = nccl_rank,
        .size = nccl_size,
        .error = nccl_error,
        .stats = nccl_stats,
        .reset_stats = nccl_reset_stats,
        .free = nccl_free,
    };
    return &ops;
}

int comm_is_nccl(const Comm *c) { return c && c->ops == nccl_ops(); }

size_t comm_nccl_device_bytes(const Comm *c) {
    return comm_is_nccl(c) ? ((const NcclComm *)c)->device_bytes : 0;
}

/* ---- creation ---- */

static NcclComm *new_comm(const char *group, int device, double timeout_s, cudaStream_t stream) {
    NcclComm *c = TP_CALLOC(1, sizeof *c);
    c->base.ops = nccl_ops();
    snprintf(c->group, sizeof c->group, "%s", group);
    c->device = device;
    c->timeout_s = timeout_s;
    c->stream = stream;
    return c;
}

/* Once NCCL has made the communicator: the barrier buffer, a first barrier
 * (every member has met the others), the memory figure, fresh stats. */
static int finish_setup(NcclComm *c, size_t used_before) {
    cudaError_t e = cudaMalloc((void **)&c->barrier_buf, sizeof(float));
    if (e == cudaSuccess) e = cudaMemsetAsync(c->barrier_buf, 0, sizeof(float), c->stream);  // ordered before the barrier
    if (e != cudaSuccess)
        return nccl_fail(c, "comm %s (nccl): cannot allocate its barrier buffer on device %d (%s)", c->group, c->device,
                         cudaGetErrorString(e));
    if (nccl_barrier(&c->base) != 0) return -1;
    const size_t used_after = used_bytes();
    c->device_bytes = used_after > used_before ? used_after - used_before : 0;
    memset(&c->stats, 0, sizeof c->stats);
    memset(c->calls, 0, sizeof c->calls);
    return 0;
}

static Comm *create_fail(NcclComm *c, char *err, size_t err_len) {
    tp_error_set(err, err_len, "%s", c->err);
    abort_nccl(c);
    if (c->barrier_buf) cudaFree(c->barrier_buf);
    free(c);
    return NULL;
}

Comm *comm_nccl_create(StoreClient *store, const char *job_id, const char *group, int rank, int size, int device,
                       double timeout_s, void *stream, char *err, size_t err_len) {
    if (!job_id || !*job_id || !group || !*group) {
        tp_error_set(err, err_len, "comm (nccl): the job id and the group name must not be empty");
        return NULL;
    }
    if (size < 1 || rank < 0 || rank >= size) {
        tp_error_set(err, err_len, "comm %s (nccl): rank %d of a group of %d is invalid", group, rank, size);
        return NULL;
    }
    if (!(timeout_s > 0)) {
        tp_error_set(err, err_len, "comm %s (nccl): the timeout (%g s) must be positive", group, timeout_s);
        return NULL;
    }
    if (size > 1 && !store) {
        tp_error_set(err, err_len, "comm %s (nccl): a group of %d needs the job's store to share the NCCL id", group,
                     size);
        return NULL;
    }
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        tp_error_set(err, err_len, "comm %s (nccl): rank %d cannot use device %d (%s)", group, rank, device,
                     cudaGetErrorString(e));
        return NULL;
    }
    const double deadline = tp_now_s() + timeout_s;
    NcclComm *c = new_comm(group, device, timeout_s, (cudaStream_t)stream);
    c->rank = rank;
    c->size = size;

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    char key[512];
    snprintf(key, sizeof key, "%s/nccl/%s/id", job_id, group);
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            nccl_fail(c, "comm %s (nccl): cannot make the NCCL id: %s", group, ncclGetErrorString(r));
            return create_fail(c, err, err_len);
        }
        if (size > 1 && store_set(store, key, &id, sizeof id) != 0) {
            nccl_fail(c, "comm %s (nccl): cannot publish the NCCL id in the store (%s)", group, store_error(store));
            return create_fail(c, err, err_len);
        }
    } else {
        size_t n_bytes = 0;
        void *v = store_get(store, key, &n_bytes, timeout_s);
        if (!v) {
            nccl_fail(c, "comm %s (nccl): rank %d did not get the NCCL id from rank 0 within %g s (%s)", group, rank,
                      timeout_s, store_error(store));
            return create_fail(c, err, err_len);
        }
        if (n_bytes != sizeof id) {
            free(v);
            nccl_fail(c, "comm %s (nccl): the NCCL id in the store has %zu bytes, expected %zu", group, n_bytes,
                      sizeof id);
            return create_fail(c, err, err_len);
        }
        memcpy(&id, v, sizeof id);
        free(v);
    }

    const size_t used_before = used_bytes();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = c->group;
    ncclResult_t r = ncclCommInitRankConfig(&c->nccl, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        char detail[256];
        nccl_detail(c->nccl, detail, sizeof detail);
        nccl_fail(c, "comm %s (nccl): rank %d of %d could not start NCCL initialisation: %s%s", group, rank, size,
                  ncclGetErrorString(r), detail);
        return create_fail(c, err, err_len);
    }
    ncclResult_t state = wait_state(c->nccl, deadline);
    if (state == ncclInProgress) {
        nccl_fail(c,
                  "comm %s (nccl): rank %d of %d: the group did not form within %g s (a peer did not join, exited or "
                  "hangs); the communicator was aborted",
                  group, rank, size, timeout_s);
        return create_fail(c, err, err_len);
    }
    if (state != ncclSuccess) {
        char detail[256];
        nccl_detail(c->nccl, detail, sizeof detail);
        nccl_fail(c, "comm %s (nccl): rank %d of %d: NCCL initialisation failed: %s%s", group, rank, size,
                  ncclGetErrorString(state), detail);
        return create_fail(c, err, err_len);
    }
    if (finish_setup(c, used_before) != 0) return create_fail(c, err, err_len);
    return &c->base;
}

int comm_nccl_split(Comm *parent, const char *group, int color, int key, Comm **out, char *err, size_t err_len) {
    *out = NULL;
    if (!comm_is_nccl(parent)) {
        tp_error_set(err, err_len, "comm_nccl_split: the parent communicator is not an NCCL one");
        return -1;
    }
    NcclComm *p = (NcclComm *)parent;
    if (!group || !*group) {
        tp_error_set(err, err_len, "comm %s (nccl): a split needs a group name", p->group);
        return -1;
    }
    if (p->failed) {
        tp_error_set(err, err_len, "comm %s (nccl): cannot split %s from a failed communicator: %s", p->group, group,
                     p->err);
        return -1;
    }
    cudaError_t e = cudaSetDevice(p->device);
    if (e != cudaSuccess) {
        tp_error_set(err, err_len, "comm %s (nccl): cannot use device %d to split %s (%s)", p->group, p->device, group,
                     cudaGetErrorString(e));
        return -1;
    }
    const double deadline = tp_now_s() + p->timeout_s;
    NcclComm *c = new_comm(group, p->device, p->timeout_s, p->stream);
    const size_t used_before = used_bytes();
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = c->group;
    ncclResult_t r = ncclCommSplit(p->nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c->nccl, &config);
    ncclResult_t state = r;
    if (r == ncclSuccess || r == ncclInProgress) {
        // The split runs on the parent (an exchange of colors) and then builds the child.
        state = wait_state(p->nccl, deadline);
        if (state == ncclSuccess && c->nccl) state = wait_state(c->nccl, deadline);
    }
    if (state != ncclSuccess) {
        char detail[256];
        nccl_detail(c->nccl ? c->nccl : p->nccl, detail, sizeof detail);
        if (state == ncclInProgress)
            snprintf(c->err, sizeof c->err,
                     "comm %s (nccl): splitting %s from it did not complete within %g s (a peer did not make the "
                     "same call, exited or hangs); both were aborted",
                     p->group, group, p->timeout_s);
        else
            snprintf(c->err, sizeof c->err, "comm %s (nccl): splitting %s from it failed: %s%s; both were aborted",
                     p->group, group, ncclGetErrorString(state), detail);
        nccl_fail(p, "%s", c->err);
        create_fail(c, err, err_len);
        return -1;
    }
    if (!c->nccl) {  // color < 0: in no new group
        free(c);
        return 0;
    }
    if (ncclCommCount(c->nccl, &c->size) != ncclSuccess || ncclCommUserRank(c->nccl, &c->rank) != ncclSuccess) {
        nccl_fail(c, "comm %s (nccl): cannot read its rank and size after the split", group);
        create_fail(c, err, err_len);
        return -1;
    }
    if (finish_setup(c, used_before) != 0) {
        create_fail(c, err, err_len);
        return -1;
    }
    *out = &c->base;
    return 0;
}
