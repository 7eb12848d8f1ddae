/* comm_nccl.h: the NCCL backend of comm.h (one GPU per rank, any number of
 * nodes).
 *
 * Every buffer passed to a collective or to comm_send / comm_recv on a
 * communicator made here is a DEVICE pointer on the communicator's device:
 * each is checked (cudaPointerGetAttributes), and a host pointer or another
 * device's memory is refused in one sentence before NCCL sees it (the
 * communicator is then poisoned, like after any argument error).
 * Calls are queued on the communicator's stream, after whatever the caller
 * queued there before, and return once the stream has drained, so they are
 * blocking as comm.h says (and the host waits for the stream's earlier work
 * too). COMM_BF16 is ncclBfloat16. Send / recv are ncclSend / ncclRecv
 * (blocking: a send waits for its receive); a message to oneself is kept as
 * a device copy until received. comm_set_device_copy is refused.
 *
 * This header is free of CUDA headers (the stream is a cudaStream_t passed
 * as void *), so runtime.c can include it; only comm_nccl.c includes CUDA.
 *
 * Communicators are non-blocking NCCL communicators: creation and every
 * collective are polled (ncclCommGetAsyncError, cudaStreamQuery) against
 * the group's timeout. On an NCCL or CUDA error, or when the timeout passes
 * (a peer never joined, exited, or did not make the same call), the
 * communicator is aborted (ncclCommAbort), the call returns -1 with one
 * sentence naming the group, this rank and the operation in comm_error(),
 * and every later call fails at once. NCCL cannot say which peer is
 * missing, unlike comm_shm: the sentence names the rank that waited.
 *
 * Results are identical on every rank and from run to run for a fixed
 * topology, NCCL version and environment (NCCL_ALGO, NCCL_PROTO), but the
 * reduction order is NCCL's, not shm's rank order. COMM_MAX on NaN inputs
 * follows NCCL (not specified). NCCL refuses two ranks on one device: use
 * comm_shm there.
 */
#ifndef TPTRAIN_COMM_NCCL_H
#define TPTRAIN_COMM_NCCL_H

#include <stddef.h>

#include "tp/comm.h"
#include "tp/store.h"

/* A communicator of `size` ranks on `device` (made current here). Group rank
 * 0 makes the NCCL unique id and publishes it in the store under
 * "<job_id>/nccl/<group>/id"; the others wait for it there (store may be
 * NULL when size is 1). timeout_s bounds the whole creation and, later,
 * every collective. stream: the cudaStream_t where calls run (the caller
 * keeps ownership; NULL = the legacy default stream). Ends with a first
 * barrier, so a returned communicator has met all its peers. NULL + one
 * sentence in err. */
Comm *comm_nccl_create(StoreClient *store, const char *job_id, const char *group, int rank, int size, int device,
                       double timeout_s, void *stream, char *err, size_t err_len);

/* Collective over every rank of parent (ncclCommSplit): ranks passing the
 * same color >= 0 form one new communicator, ordered by key (ties by parent
 * rank); color < 0 joins none and gets *out = NULL. The child inherits the
 * parent's device, stream and timeout; group names it in messages. This is
 * how the tp and dp groups come from the world communicator without another
 * rendezvous. 0, or -1 + err (the parent is then unusable). */
int comm_nccl_split(Comm *parent, const char *group, int color, int key, Comm **out, char *err, size_t err_len);

/* Whether c was made by this backend (its buffers are device pointers). */
int comm_is_nccl(const Comm *c);

/* Device memory NCCL took for this communicator: cudaMemGetInfo before and
 * after creation and its first barrier (device-wide, so other processes on
 * the same GPU blur it). NCCL may allocate more on the first use of another
 * algorithm or protocol; NCCL_RUNTIME_CONNECT=0 connects everything at
 * creation and makes this figure complete. */
size_t comm_nccl_device_bytes(const Comm *c);

#endif
