/* comm_nccl_p2p.c: comm_send / comm_recv on NCCL (ncclSend / ncclRecv of
 * bytes, polled like the collectives: see comm_nccl.c).
 *
 * A message to oneself is a device copy queued in the communicator: NCCL
 * would need the send and the receive in one group call, which a blocking
 * comm_send cannot give it. Zero-byte messages make no NCCL call (both
 * sides know the size).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "tp/comm_nccl_impl.h"

static int check_peer(NcclComm *c, double t0, const char *what, int peer, const void *buf, size_t n_bytes) {
    if (peer < 0 || peer >= c->size)
        return nccl_bad_call(c, t0, "comm %s (nccl): %s rank %d, outside the group of %d", c->group, what, peer,
                             c->size);
    if (!buf && n_bytes > 0)
        return nccl_bad_call(c, t0, "comm %s (nccl): %s rank %d of %zu bytes with a NULL buffer", c->group, what, peer,
                             n_bytes);
    return 0;
}

/* A device-to-device copy on the communicator's stream, waited for. */
static int copy_on_stream(NcclComm *c, Kind kind, void *dst, const void *src, size_t n_bytes, double t0) {
    cudaError_t e = cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess)
        return nccl_end(c, t0,
                        nccl_fail(c, "comm %s (nccl): %s #%ld to itself failed on device %d: %s", c->group,
                                  NCCL_KIND_NAME[kind], c->calls[kind], c->device, cudaGetErrorString(e)));
    return nccl_finish(c, kind, ncclSuccess, t0);
}

static int self_send(NcclComm *c, const void *buf, size_t n_bytes, double t0) {
    SelfMsg *m = TP_CALLOC(1, sizeof *m);
    m->n_bytes = n_bytes;
    if (c->self_tail)
        c->self_tail->next = m;
    else
        c->self_head = m;
    c->self_tail = m;
    if (n_bytes == 0) return nccl_end(c, t0, 0);
    cudaError_t e = cudaMalloc(&m->dev, n_bytes);
    if (e != cudaSuccess) {
        m->dev = NULL;
        return nccl_end(c, t0,
                        nccl_fail(c, "comm %s (nccl): send #%ld to itself cannot hold %zu bytes on device %d (%s)",
                                  c->group, c->calls[K_SEND], n_bytes, c->device, cudaGetErrorString(e)));
    }
    return copy_on_stream(c, K_SEND, m->dev, buf, n_bytes, t0);
}

static int self_recv(NcclComm *c, void *buf, size_t n_bytes, double t0) {
    SelfMsg *m = c->self_head;
    if (!m)
        return nccl_bad_call(c, t0, "comm %s (nccl): recv #%ld from rank %d (itself), which has sent it nothing",
                             c->group, c->calls[K_RECV], c->rank);
    if (m->n_bytes != n_bytes)
        return nccl_bad_call(c, t0, "comm %s (nccl): recv #%ld expects %zu bytes from rank %d (itself), which sent %zu",
                             c->group, c->calls[K_RECV], n_bytes, c->rank, m->n_bytes);
    c->self_head = m->next;
    if (!c->self_head) c->self_tail = NULL;
    int rc = n_bytes ? copy_on_stream(c, K_RECV, buf, m->dev, n_bytes, t0) : nccl_end(c, t0, 0);
    if (m->dev) cudaFree(m->dev);
    free(m);
    return rc;
}

void nccl_free_self_msgs(NcclComm *c) {
    while (c->self_head) {
        SelfMsg *next = c->self_head->next;
        if (c->self_head->dev) cudaFree(c->self_head->dev);
        free(c->self_head);
        c->self_head = next;
    }
    c->self_tail = NULL;
}

int nccl_send(Comm *comm, const void *buf, size_t n_bytes, int peer) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_SEND, &c->stats.send, &t0) != 0) return -1;
    c->stats.send_bytes += (double)n_bytes;
    if (check_peer(c, t0, "send to", peer, buf, n_bytes) != 0) return -1;
    if (n_bytes && nccl_check_device_buffer(c, t0, K_SEND, "message", buf)) return -1;
    if (peer == c->rank) return self_send(c, buf, n_bytes, t0);
    if (n_bytes == 0) return nccl_end(c, t0, 0);  // both sides know: nothing to move
    ncclResult_t q = ncclSend(buf, n_bytes, ncclUint8, peer, c->nccl, c->stream);
    return nccl_finish(c, K_SEND, q, t0);
}

int nccl_recv(Comm *comm, void *buf, size_t n_bytes, int peer) {
    NcclComm *c = (NcclComm *)comm;
    double t0;
    if (nccl_begin(c, K_RECV, &c->stats.recv, &t0) != 0) return -1;
    c->stats.recv_bytes += (double)n_bytes;
    if (check_peer(c, t0, "recv from", peer, buf, n_bytes) != 0) return -1;
    if (n_bytes && nccl_check_device_buffer(c, t0, K_RECV, "message", buf)) return -1;
    if (peer == c->rank) return self_recv(c, buf, n_bytes, t0);
    if (n_bytes == 0) return nccl_end(c, t0, 0);
    ncclResult_t q = ncclRecv(buf, n_bytes, ncclUint8, peer, c->nccl, c->stream);
    return nccl_finish(c, K_RECV, q, t0);
}

/* NCCL takes device buffers itself: staging hooks are for host backends. */
int nccl_set_device_copy(Comm *comm, const CommDeviceCopy *hooks) {
    NcclComm *c = (NcclComm *)comm;
    if (!hooks) return 0;
    if (!c->failed)
        snprintf(c->err, sizeof c->err,
                 "comm %s (nccl): device-copy hooks are for shared-memory groups; NCCL takes device buffers directly",
                 c->group);
    return -1;
}
