/* comm.c: comm.h dispatched to the backend a communicator was made by
 * (comm_shm_create, comm_nccl_create); see comm_impl.h. */
#include "tp/comm_impl.h"

int comm_rank(const Comm *c) { return c->ops->rank(c); }
int comm_size(const Comm *c) { return c->ops->size(c); }

int comm_allreduce(Comm *c, float *buf, size_t n_elems, CommOp op) {
    return c->ops->allreduce(c, buf, n_elems, op);
}

int comm_reduce_scatter(Comm *c, const float *in, float *out, size_t n_elems) {
    return c->ops->reduce_scatter(c, in, out, n_elems);
}

int comm_allgather(Comm *c, const float *in, float *out, size_t n_elems) {
    return c->ops->allgather(c, in, out, n_elems);
}

int comm_broadcast(Comm *c, void *buf, size_t n_bytes, int root) { return c->ops->broadcast(c, buf, n_bytes, root); }
int comm_barrier(Comm *c) { return c->ops->barrier(c); }

const char *comm_error(const Comm *c) { return c->ops->error(c); }
CommStats comm_stats(const Comm *c) { return c->ops->stats(c); }
void comm_reset_stats(Comm *c) { c->ops->reset_stats(c); }

void comm_free(Comm *c) {
    if (c) c->ops->free(c);
}
