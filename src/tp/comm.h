/* comm.h: collectives on a group of ranks, backend-neutral.
 *
 * The model and the trainer only see this interface; comm_shm.c implements
 * it over shared memory on one host (CPU ranks, or several ranks sharing a
 * GPU staged through host memory), comm_nccl.c on NCCL (buffers are then
 * device pointers: see comm_nccl.h). comm.c dispatches to the backend that
 * created the communicator (comm_impl.h).
 *
 * Every collective is blocking and must be called by every rank of the
 * group in the same order with the same counts. Results are bitwise
 * identical on every rank of the group, so replicated tensors stay
 * identical, and the same from run to run (shm: the reduction order is
 * fixed, rank 0, 1, ... n-1; NCCL: fixed by the topology and the NCCL
 * version, so the last bits may differ from shm).
 *
 * A peer that dies or stops calling makes the others fail after the
 * group's timeout with an error naming the peer, never hang: collectives
 * return -1 and leave one sentence in comm_error(); callers stop the run.
 */
#ifndef TPTRAIN_COMM_H
#define TPTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct Comm Comm;
typedef enum { COMM_SUM = 0, COMM_MAX = 1 } CommOp;

/* Instrumentation: counts of calls and bytes per collective kind. */
typedef struct {
    long allreduce, reduce_scatter, allgather, broadcast, barrier;
    double allreduce_bytes;
    double seconds;           // wall time spent inside collectives
} CommStats;

int comm_rank(const Comm *c);
int comm_size(const Comm *c);

/* In place: buf (n_elems) becomes the element-wise op over the group. */
int comm_allreduce(Comm *c, float *buf, size_t n_elems, CommOp op);
/* in (size * n_elems) -> out (n_elems): out = sum over ranks of chunk `rank` of in. */
int comm_reduce_scatter(Comm *c, const float *in, float *out, size_t n_elems);
/* in (n_elems) -> out (size * n_elems): rank r's in lands at out + r * n_elems. */
int comm_allgather(Comm *c, const float *in, float *out, size_t n_elems);
/* n_bytes from root to every rank (any data type). */
int comm_broadcast(Comm *c, void *buf, size_t n_bytes, int root);
int comm_barrier(Comm *c);

const char *comm_error(const Comm *c);
CommStats comm_stats(const Comm *c);
void comm_reset_stats(Comm *c);
void comm_free(Comm *c);

#endif
