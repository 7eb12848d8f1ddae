/* comm.h: collectives and point-to-point messages on a group of ranks,
 * backend-neutral.
 *
 * The model and the trainer only see this interface; comm_shm.c implements
 * it over shared memory on one host (CPU ranks, or several ranks sharing a
 * GPU, staged through host memory: see comm_set_device_copy), comm_nccl.c on
 * NCCL (buffers are then device pointers: see comm_nccl.h). comm.c
 * dispatches to the backend that created the communicator (comm_impl.h).
 *
 * Every collective is blocking and must be called by every rank of the
 * group in the same order with the same counts and dtype. Results are
 * bitwise identical on every rank of the group, so replicated tensors stay
 * identical, and the same from run to run (shm: the reduction order is
 * fixed, rank 0, 1, ... n-1; NCCL: fixed by the topology and the NCCL
 * version, so the last bits may differ from shm).
 *
 * Data types: COMM_F32 (float) and COMM_BF16 (bfloat16 kept as its raw
 * uint16_t bits, see common/bf16.h). On shm a bf16 reduction converts every
 * input to fp32, accumulates in fp32 in the fixed rank order and rounds to
 * bf16 (nearest, ties to even) once at the end, so the result is bitwise
 * identical on every rank. NCCL reduces bf16 its own way (ncclBfloat16).
 * The float-only functions are the COMM_F32 case of the typed ones.
 *
 * Point-to-point: comm_send / comm_recv move bytes from one rank to another;
 * messages between a (sender, receiver) pair are matched in the order they
 * were sent, and their sizes must agree (shm checks it, NCCL cannot). A call
 * blocks until its buffer may be reused; a send may return before the
 * receiver has called comm_recv (shm buffers a little, per pair) but callers
 * must not rely on that: order the calls so that they would also complete
 * if every send waited for its receive (e.g. even ranks send first, odd
 * ranks receive first), as NCCL needs. A rank may send to itself: the
 * message waits in the communicator until it receives it.
 *
 * A peer that dies or stops calling makes the others fail after the
 * group's timeout with an error naming the peer (shm; NCCL names the group
 * and the call), never hang: calls return -1 and leave one sentence in
 * comm_error(); the communicator is then poisoned (every later call fails
 * at once) and callers stop the run. A call with bad arguments (unknown
 * dtype or op, a peer outside the group) fails the same way.
 */
#ifndef TPTRAIN_COMM_H
#define TPTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct Comm Comm;
typedef enum { COMM_SUM = 0, COMM_MAX = 1 } CommOp;
typedef enum { COMM_F32 = 0, COMM_BF16 = 1 } CommDtype;

/* Instrumentation: counts of calls and bytes per kind. */
typedef struct {
    long allreduce, reduce_scatter, allgather, broadcast, barrier;
    long send, recv;
    double allreduce_bytes;   // n_elems * the dtype's size, summed
    double send_bytes, recv_bytes;
    double seconds;           // wall time spent inside collectives and send/recv
} CommStats;

/* Bytes of one element of dt; 0 for an unknown dtype. */
size_t comm_dtype_bytes(CommDtype dt);

int comm_rank(const Comm *c);
int comm_size(const Comm *c);

/* In place: buf (n_elems of dt) becomes the element-wise op over the group. */
int comm_allreduce_t(Comm *c, void *buf, size_t n_elems, CommDtype dt, CommOp op);
/* in (size * n_elems) -> out (n_elems): out = sum over ranks of chunk `rank` of in. */
int comm_reduce_scatter_t(Comm *c, const void *in, void *out, size_t n_elems, CommDtype dt);
/* in (n_elems) -> out (size * n_elems): rank r's in lands at out + r * n_elems. */
int comm_allgather_t(Comm *c, const void *in, void *out, size_t n_elems, CommDtype dt);

/* The same for fp32 (COMM_F32). */
int comm_allreduce(Comm *c, float *buf, size_t n_elems, CommOp op);
int comm_reduce_scatter(Comm *c, const float *in, float *out, size_t n_elems);
int comm_allgather(Comm *c, const float *in, float *out, size_t n_elems);

/* n_bytes from root to every rank (any data type). */
int comm_broadcast(Comm *c, void *buf, size_t n_bytes, int root);
int comm_barrier(Comm *c);

/* n_bytes to / from group rank `peer` (see the top comment). */
int comm_send(Comm *c, const void *buf, size_t n_bytes, int peer);
int comm_recv(Comm *c, void *buf, size_t n_bytes, int peer);

/* Device buffers on a host backend (shm). When set, every buffer passed to
 * the communicator is a device pointer that the backend never dereferences:
 * it copies through a host staging buffer it owns (at most 4 MiB, made on
 * first use) with these hooks, piece by piece. to_host / to_device copy
 * n_bytes and return once the copy is complete (the caller's backend orders
 * them after its queued work). host_alloc / host_free (both or neither)
 * make and release the staging buffer, e.g. as pinned memory; NULL = malloc.
 * Staging is per rank: ranks of one group may differ. */
typedef struct {
    void *ctx;
    void (*to_host)(void *ctx, void *dst_host, const void *src_dev, size_t n_bytes);
    void (*to_device)(void *ctx, void *dst_dev, const void *src_host, size_t n_bytes);
    void *(*host_alloc)(void *ctx, size_t n_bytes);  // optional
    void (*host_free)(void *ctx, void *p);            // optional
} CommDeviceCopy;

/* hooks NULL = host buffers again. The hooks are copied. 0, or -1 with one
 * sentence in comm_error() (NCCL takes device buffers itself and refuses;
 * missing copy hooks). A refusal does not poison the communicator. */
int comm_set_device_copy(Comm *c, const CommDeviceCopy *hooks);

const char *comm_error(const Comm *c);
/* A collective that failed (rc != 0) ends the process with the
 * communicator's reason (TP_CHECK): for control collectives that have no
 * way to go on. */
void comm_ok(int rc, const Comm *c);
/* Brackets around every collective and point-to-point call of c (a
 * profiler's: train_mt --profile counts the time between them as
 * communication). begin/end run on the calling thread; NULL functions: none. */
typedef struct {
    void (*begin)(void *ctx);
    void (*end)(void *ctx);
    void *ctx;
} CommTimer;
void comm_set_timer(Comm *c, CommTimer t);
CommStats comm_stats(const Comm *c);
void comm_reset_stats(Comm *c);
void comm_free(Comm *c);

#endif
