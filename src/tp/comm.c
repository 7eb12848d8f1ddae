/* comm.c: comm.h dispatched to the backend a communicator was made by
 * (comm_shm_create, comm_nccl_create); see comm_impl.h. The fp32 functions
 * are the COMM_F32 case of the typed ones. */
#include "tp/comm_impl.h"

#include "err.h"

size_t comm_dtype_bytes(CommDtype dt) {
    switch (dt) {
    case COMM_F32: return 4;
    case COMM_BF16: return 2;
    }
    return 0;
}

/* The caller's brackets (comm_set_timer) around an implementation's call. */
#define TIMED(c, call)                                   \
    do {                                                 \
        if ((c)->timer.begin) (c)->timer.begin((c)->timer.ctx); \
        int rc_ = (call);                                \
        if ((c)->timer.end) (c)->timer.end((c)->timer.ctx);     \
        return rc_;                                      \
    } while (0)

void comm_set_timer(Comm *c, CommTimer t) {
    if (c) c->timer = t;
}

int comm_rank(const Comm *c) { return c->ops->rank(c); }
int comm_size(const Comm *c) { return c->ops->size(c); }

int comm_allreduce_t(Comm *c, void *buf, size_t n_elems, CommDtype dt, CommOp op) {
    TIMED(c, c->ops->allreduce(c, buf, n_elems, dt, op));
}

int comm_reduce_scatter_t(Comm *c, const void *in, void *out, size_t n_elems, CommDtype dt) {
    TIMED(c, c->ops->reduce_scatter(c, in, out, n_elems, dt));
}

int comm_allgather_t(Comm *c, const void *in, void *out, size_t n_elems, CommDtype dt) {
    TIMED(c, c->ops->allgather(c, in, out, n_elems, dt));
}

int comm_allreduce(Comm *c, float *buf, size_t n_elems, CommOp op) {
    return comm_allreduce_t(c, buf, n_elems, COMM_F32, op);
}

int comm_reduce_scatter(Comm *c, const float *in, float *out, size_t n_elems) {
    return comm_reduce_scatter_t(c, in, out, n_elems, COMM_F32);
}

int comm_allgather(Comm *c, const float *in, float *out, size_t n_elems) {
    return comm_allgather_t(c, in, out, n_elems, COMM_F32);
}

int comm_broadcast(Comm *c, void *buf, size_t n_bytes, int root) { TIMED(c, c->ops->broadcast(c, buf, n_bytes, root)); }
int comm_barrier(Comm *c) { return c->ops->barrier(c); }

int comm_send(Comm *c, const void *buf, size_t n_bytes, int peer) { TIMED(c, c->ops->send(c, buf, n_bytes, peer)); }
int comm_recv(Comm *c, void *buf, size_t n_bytes, int peer) { TIMED(c, c->ops->recv(c, buf, n_bytes, peer)); }

int comm_set_device_copy(Comm *c, const CommDeviceCopy *hooks) { return c->ops->set_device_copy(c, hooks); }

const char *comm_error(const Comm *c) { return c->ops->error(c); }
void comm_ok(int rc, const Comm *c) { TP_CHECK(rc == 0, "%s", comm_error(c)); }
CommStats comm_stats(const Comm *c) { return c->ops->stats(c); }
void comm_reset_stats(Comm *c) { c->ops->reset_stats(c); }

void comm_free(Comm *c) {
    if (c) c->ops->free(c);
}
