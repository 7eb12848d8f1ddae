/* comm_impl.h: what a backend of comm.h provides. Private to src/tp.
 *
 * comm.h's functions are thin dispatchers (comm.c) through the table of
 * operations a communicator carries in its first member, so the shared-memory
 * and NCCL backends live side by side and the model never knows which one it
 * talks to. A backend's own struct must begin with `Comm base;` and set
 * base.ops before handing the communicator out; every entry is required.
 * Backends check every argument themselves (dtype, op, peer, root) because a
 * bad call poisons their communicator.
 */
#ifndef TPTRAIN_COMM_IMPL_H
#define TPTRAIN_COMM_IMPL_H

#include "tp/comm.h"

typedef struct CommOps {
    const char *name;  // "shm", "nccl": for messages
    int (*allreduce)(Comm *c, void *buf, size_t n_elems, CommDtype dt, CommOp op);
    int (*reduce_scatter)(Comm *c, const void *in, void *out, size_t n_elems, CommDtype dt);
    int (*allgather)(Comm *c, const void *in, void *out, size_t n_elems, CommDtype dt);
    int (*broadcast)(Comm *c, void *buf, size_t n_bytes, int root);
    int (*barrier)(Comm *c);
    int (*send)(Comm *c, const void *buf, size_t n_bytes, int peer);
    int (*recv)(Comm *c, void *buf, size_t n_bytes, int peer);
    int (*set_device_copy)(Comm *c, const CommDeviceCopy *hooks);
    int (*rank)(const Comm *c);
    int (*size)(const Comm *c);
    const char *(*error)(const Comm *c);
    CommStats (*stats)(const Comm *c);
    void (*reset_stats)(Comm *c);
    void (*free)(Comm *c);  // releases the backend's struct itself
} CommOps;

/* The common header of every backend's communicator. */
struct Comm {
    const CommOps *ops;
    CommTimer timer;  // comm_set_timer's brackets (zero: none)
};

#endif
