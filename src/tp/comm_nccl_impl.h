/* comm_nccl_impl.h: the NCCL communicator's private parts, shared by
 * comm_nccl.c (set-up, collectives, teardown) and comm_nccl_p2p.c (send /
 * recv). Private to src/tp; like comm_nccl.c it sees CUDA and NCCL.
 */
#ifndef TPTRAIN_COMM_NCCL_IMPL_H
#define TPTRAIN_COMM_NCCL_IMPL_H

#include <cuda_runtime.h>
#include <nccl.h>

#include "tp/comm_impl.h"

typedef enum { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_BARRIER, K_SEND, K_RECV, K_COUNT } Kind;

/* A message this rank sent to itself: a device copy until it receives it. */
typedef struct SelfMsg {
    struct SelfMsg *next;
    size_t n_bytes;
    void *dev;  // (n_bytes) device memory, NULL when empty
} SelfMsg;

typedef struct {
    Comm base;             // first: comm.c dispatches through base.ops
    char group[128];
    int rank, size, device;
    double timeout_s;
    cudaStream_t stream;   // not owned
    ncclComm_t nccl;       // NULL once aborted or destroyed
    float *barrier_buf;    // (1) device: the barrier is a one-element allreduce
    size_t device_bytes;   // what NCCL took (cudaMemGetInfo around creation)
    int failed;            // poisoned: every later call fails at once
    long calls[K_COUNT];   // calls per kind since creation: "#n" in messages
    char err[512];
    CommStats stats;
    SelfMsg *self_head, *self_tail;
} NcclComm;

extern const char *const NCCL_KIND_NAME[];

/* comm_nccl.c */
/* Records the first failure, aborts the communicator and poisons it; -1. */
int nccl_fail(NcclComm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Starts a call (fails at once when poisoned) and counts it. */
int nccl_begin(NcclComm *c, Kind kind, long *counter, double *t0);
int nccl_end(NcclComm *c, double t0, int rc);
/* An argument error: poisons without an NCCL call; -1. */
int nccl_bad_call(NcclComm *c, double t0, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Refuses (poisons, -1) a buffer that is not device memory of c's device; 0 when it is. */
int nccl_check_device_buffer(NcclComm *c, double t0, Kind kind, const char *which, const void *buf);
/* Polls the call that `queued` reports on to its end, an error or the timeout. */
int nccl_finish(NcclComm *c, Kind kind, ncclResult_t queued, double t0);

/* comm_nccl_p2p.c */
int nccl_send(Comm *comm, const void *buf, size_t n_bytes, int peer);
int nccl_recv(Comm *comm, void *buf, size_t n_bytes, int peer);
int nccl_set_device_copy(Comm *comm, const CommDeviceCopy *hooks);
void nccl_free_self_msgs(NcclComm *c);

#endif
