/* comm_shm_coll.c: the shared-memory collectives (see comm_shm_impl.h).
 *
 * A collective runs in chunks of at most one slot (SLOT_BYTES): each rank
 * copies its chunk into its slot, a barrier publishes it, and every element
 * is reduced over ranks 0, 1, ..., n-1 in that order, whoever computes it,
 * so results are deterministic and bitwise equal on all ranks. bf16
 * elements are widened to fp32, reduced in that order in fp32 and rounded
 * to bf16 once. Large chunks are reduced one portion per rank and copied
 * back (2 barriers, O(n) traffic per rank); small ones are reduced whole by
 * every rank (1 barrier). Consecutive data exchanges alternate between the
 * two slot sets, so a slot is rewritten only after a barrier that every
 * reader of its previous contents has passed: no barrier is needed at the
 * end.
 *
 * The caller's buffers are only reached through shm_copy_in / shm_copy_out
 * / shm_result_at (comm_shm.c), so the same code serves host buffers and
 * staged device buffers.
 */
#include <string.h>

#include "bf16.h"
#include "tp/comm_shm_impl.h"

#define BF16_TILE 1024  // fp32 accumulators on the stack per pass of a bf16 reduction

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* acc[i] = acc[i] op x[i]; MAX keeps NaN (a NaN anywhere makes the result NaN). */
static void reduce_f32(float *acc, const float *x, size_t n_elems, CommOp op) {
    if (op == COMM_SUM) {
        for (size_t i = 0; i < n_elems; i++) acc[i] += x[i];
    } else {
        for (size_t i = 0; i < n_elems; i++)
            if (x[i] > acc[i] || x[i] != x[i]) acc[i] = x[i];
    }
}

static void reduce_bf16(float *acc, const uint16_t *x, size_t n_elems, CommOp op) {
    if (op == COMM_SUM) {
        for (size_t i = 0; i < n_elems; i++) acc[i] += tp_bf16_to_f32(x[i]);
    } else {
        for (size_t i = 0; i < n_elems; i++) {
            const float v = tp_bf16_to_f32(x[i]);
            if (v > acc[i] || v != v) acc[i] = v;
        }
    }
}

/* dst (count elements) = slot 0 op slot 1 op ... op slot n-1, each read from
 * element `at` of the slots of parity p, in rank order. */
static void reduce_slots(const ShmComm *c, uint64_t p, size_t at, size_t count, CommDtype dt, CommOp op,
                         void *dst) {
    if (count == 0) return;
    if (dt == COMM_F32) {
        float *out = dst;  // (count)
        memcpy(out, (const float *)shm_slot(c, p, 0) + at, count * sizeof(float));
        for (int q = 1; q < c->size; q++) reduce_f32(out, (const float *)shm_slot(c, p, q) + at, count, op);
        return;
    }
    uint16_t *out = dst;  // (count)
    float acc[BF16_TILE];
    for (size_t t = 0; t < count; t += BF16_TILE) {
        const size_t k = min_size(BF16_TILE, count - t);
        const uint16_t *x0 = (const uint16_t *)shm_slot(c, p, 0) + at + t;
        for (size_t i = 0; i < k; i++) acc[i] = tp_bf16_to_f32(x0[i]);
        for (int q = 1; q < c->size; q++) reduce_bf16(acc, (const uint16_t *)shm_slot(c, p, q) + at + t, k, op);
        for (size_t i = 0; i < k; i++) out[t + i] = tp_f32_to_bf16(acc[i]);
    }
}

/* The element size of dt, or 0 after poisoning c for an unknown one. */
static size_t elem_bytes(ShmComm *c, CommDtype dt, const char *what) {
    const size_t es = comm_dtype_bytes(dt);
    if (es == 0) shm_fail(c, "comm %s: %s of unknown dtype %d", c->group, what, (int)dt);
    return es;
}

int shm_allreduce(Comm *comm, void *buf, size_t n_elems, CommDtype dt, CommOp op) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_ALLREDUCE, &c->stats.allreduce, &t0) != 0) return -1;
    const size_t es = elem_bytes(c, dt, "allreduce");
    if (es == 0) return shm_end(c, t0, -1);
    c->stats.allreduce_bytes += (double)n_elems * (double)es;
    if (op != COMM_SUM && op != COMM_MAX)
        return shm_end(c, t0, shm_fail(c, "comm %s: unknown reduction %d", c->group, (int)op));
    if (n_elems == 0) return shm_end(c, t0, 0);
    if (!buf) return shm_end(c, t0, shm_fail(c, "comm %s: allreduce of %zu elements from NULL", c->group, n_elems));
    if (c->size == 1) return shm_end(c, t0, 0);
    const long call_no = c->calls[K_ALLREDUCE];
    const int n = c->size, r = c->rank;
    const size_t chunk = SLOT_BYTES / es;
    for (size_t off = 0; off < n_elems; off += chunk) {
        const size_t m = min_size(chunk, n_elems - off);
        const uint64_t p = c->n_uses++ & 1;
        char *user = (char *)buf + off * es;  // (m) elements
        shm_copy_in(c, shm_slot(c, p, r), user, m * es);
        if (shm_sync_all(c, K_ALLREDUCE, call_no) != 0) return shm_end(c, t0, -1);
        char *out = shm_result_at(c, user);  // (m) elements
        if (m * es <= DIRECT_MAX_BYTES) {
            reduce_slots(c, p, 0, m, dt, op, out);
        } else {
            // This rank reduces its portion [lo, hi) and publishes it in its own slot.
            const size_t lo = m * (size_t)r / (size_t)n, hi = m * (size_t)(r + 1) / (size_t)n;
            reduce_slots(c, p, lo, hi - lo, dt, op, out + lo * es);
            memcpy(shm_slot(c, p, r) + lo * es, out + lo * es, (hi - lo) * es);
            if (shm_sync_all(c, K_ALLREDUCE, call_no) != 0) return shm_end(c, t0, -1);
            for (int q = 0; q < n; q++) {
                if (q == r) continue;
                const size_t qlo = m * (size_t)q / (size_t)n, qhi = m * (size_t)(q + 1) / (size_t)n;
                memcpy(out + qlo * es, shm_slot(c, p, q) + qlo * es, (qhi - qlo) * es);
            }
        }
        shm_result_done(c, user, m * es);
    }
    return shm_end(c, t0, 0);
}

int shm_reduce_scatter(Comm *comm, const void *in, void *out, size_t n_elems, CommDtype dt) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_REDUCE_SCATTER, &c->stats.reduce_scatter, &t0) != 0) return -1;
    const size_t es = elem_bytes(c, dt, "reduce_scatter");
    if (es == 0) return shm_end(c, t0, -1);
    if (n_elems == 0) return shm_end(c, t0, 0);
    if (!in || !out) return shm_end(c, t0, shm_fail(c, "comm %s: reduce_scatter with a NULL buffer", c->group));
    if (c->size == 1) {
        return shm_end(c, t0, shm_copy_user(c, out, in, n_elems * es));
    }
    const long call_no = c->calls[K_REDUCE_SCATTER];
    const int n = c->size, r = c->rank;
    const size_t per_rank = SLOT_BYTES / es / (size_t)n;  // each slot holds one piece for every rank
    for (size_t off = 0; off < n_elems; off += per_rank) {
        const size_t m = min_size(per_rank, n_elems - off);
        const uint64_t p = c->n_uses++ & 1;
        unsigned char *mine = shm_slot(c, p, r);  // (n, m) elements
        for (int q = 0; q < n; q++)
            shm_copy_in(c, mine + (size_t)q * m * es, (const char *)in + ((size_t)q * n_elems + off) * es, m * es);
        if (shm_sync_all(c, K_REDUCE_SCATTER, call_no) != 0) return shm_end(c, t0, -1);
        char *user = (char *)out + off * es;  // (m) elements
        reduce_slots(c, p, (size_t)r * m, m, dt, COMM_SUM, shm_result_at(c, user));
        shm_result_done(c, user, m * es);
    }
    return shm_end(c, t0, 0);
}

int shm_allgather(Comm *comm, const void *in, void *out, size_t n_elems, CommDtype dt) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_ALLGATHER, &c->stats.allgather, &t0) != 0) return -1;
    const size_t es = elem_bytes(c, dt, "allgather");
    if (es == 0) return shm_end(c, t0, -1);
    if (n_elems == 0) return shm_end(c, t0, 0);
    if (!in || !out) return shm_end(c, t0, shm_fail(c, "comm %s: allgather with a NULL buffer", c->group));
    if (c->size == 1) {
        return shm_end(c, t0, shm_copy_user(c, out, in, n_elems * es));
    }
    const long call_no = c->calls[K_ALLGATHER];
    const int n = c->size, r = c->rank;
    const size_t chunk = SLOT_BYTES / es;
    for (size_t off = 0; off < n_elems; off += chunk) {
        const size_t m = min_size(chunk, n_elems - off);
        const uint64_t p = c->n_uses++ & 1;
        shm_copy_in(c, shm_slot(c, p, r), (const char *)in + off * es, m * es);
        if (shm_sync_all(c, K_ALLGATHER, call_no) != 0) return shm_end(c, t0, -1);
        for (int q = 0; q < n; q++)
            shm_copy_out(c, (char *)out + ((size_t)q * n_elems + off) * es, shm_slot(c, p, q), m * es);
    }
    return shm_end(c, t0, 0);
}

int shm_broadcast(Comm *comm, void *buf, size_t n_bytes, int root) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_BROADCAST, &c->stats.broadcast, &t0) != 0) return -1;
    if (root < 0 || root >= c->size)
        return shm_end(c, t0,
                       shm_fail(c, "comm %s: broadcast root %d is outside the group of %d", c->group, root, c->size));
    if (n_bytes == 0) return shm_end(c, t0, 0);
    if (!buf) return shm_end(c, t0, shm_fail(c, "comm %s: broadcast of %zu bytes from NULL", c->group, n_bytes));
    if (c->size == 1) return shm_end(c, t0, 0);
    const long call_no = c->calls[K_BROADCAST];
    // Only the root writes: the whole slot set of one parity is its staging area.
    const size_t chunk_bytes = (size_t)c->size * SLOT_BYTES;
    for (size_t off = 0; off < n_bytes; off += chunk_bytes) {
        const size_t m = min_size(chunk_bytes, n_bytes - off);
        const uint64_t p = c->n_uses++ & 1;
        unsigned char *area = shm_slot(c, p, 0);  // (chunk_bytes)
        if (c->rank == root) shm_copy_in(c, area, (char *)buf + off, m);
        if (shm_sync_all(c, K_BROADCAST, call_no) != 0) return shm_end(c, t0, -1);
        if (c->rank != root) shm_copy_out(c, (char *)buf + off, area, m);
    }
    return shm_end(c, t0, 0);
}

int shm_barrier(Comm *comm) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_BARRIER, &c->stats.barrier, &t0) != 0) return -1;
    if (c->size == 1) return shm_end(c, t0, 0);
    return shm_end(c, t0, shm_sync_all(c, K_BARRIER, c->calls[K_BARRIER]));
}
