/* comm_shm_p2p.c: comm_send / comm_recv over shared memory.
 *
 * Every ordered pair (src, dst) of a group has its own ring of ring_bytes in
 * the segment, written only by src and read only by dst, so a pair needs no
 * lock and pairs never wait on each other. A message is a byte stream in
 * the ring: its size (8 bytes), the payload, padding to 8 bytes; the sender
 * moves `head` as it writes, the receiver `tail` as it reads, so a message
 * of any size streams through the bounded ring piece by piece, and messages
 * of a pair arrive in the order they were sent. The receiver checks the
 * size against its own: a mismatch is an error, not a silent truncation.
 * A small message completes before the receiver calls comm_recv (the ring
 * buffers it); a larger one waits for the receiver to drain the ring.
 *
 * A waiting side spins briefly, then sleeps on the pair's futex word, which
 * the other side bumps after every move; like the barrier, it wakes every
 * 50 ms to check that the peer's pid is alive and to enforce the group's
 * timeout (counted from the last progress), and fails naming the peer.
 * A message to oneself is a heap copy queued in the communicator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "tp/comm_shm_impl.h"

#define RING_BUDGET_BYTES ((size_t)16 << 20)  // all rings of a group, as far as RING_MIN_BYTES allows
#define RING_MIN_BYTES ((size_t)16 << 10)
#define RING_MAX_BYTES ((size_t)1 << 20)
#define MSG_HEADER_BYTES 8

/* 1 MiB per pair up to 4 ranks, less for larger groups (a power of two). */
size_t shm_ring_bytes(int size) {
    if (size < 2) return 0;
    const size_t pairs = (size_t)size * (size_t)(size - 1);
    size_t r = RING_MAX_BYTES;
    while (r > RING_MIN_BYTES && r * pairs > RING_BUDGET_BYTES) r /= 2;
    return r;
}

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

static size_t pair_index(const ShmComm *c, int src, int dst) {
    return (size_t)src * (size_t)(c->size - 1) + (size_t)(dst < src ? dst : dst - 1);
}

/* ---- waiting on a ring ---- */

typedef enum { WANT_DATA, WANT_SPACE } Want;

static uint64_t available(const ShmComm *c, const PairWord *pw, Want want) {
    const uint64_t used = atomic_load(&pw->head) - atomic_load(&pw->tail);
    return want == WANT_DATA ? used : c->ring_bytes - used;
}

/* Publishes a move of head or tail and wakes the other side if it sleeps. */
static void publish(PairWord *pw, _Atomic uint64_t *pos, uint64_t value) {
    atomic_store(pos, value);
    atomic_fetch_add(&pw->wake, 1);
    if (atomic_load(&pw->n_sleepers) > 0) shm_futex_wake_all(&pw->wake);
}

/* Waits until the ring of pw holds at least one byte of data (receiver) or
 * of free space (sender); returns how many, or 0 after failing c. */
static uint64_t wait_ring(ShmComm *c, PairWord *pw, Want want, int peer, long call_no) {
    uint64_t n;
    for (int i = 0; i < SPIN_ITERS; i++) {
        if ((n = available(c, pw, want)) > 0) return n;
        shm_cpu_relax();
    }
    const double t0 = tp_now_s();
    double next_check = t0 + CHECK_PERIOD_S;
    for (;;) {
        const uint32_t w = atomic_load(&pw->wake);
        if ((n = available(c, pw, want)) > 0) return n;
        const double t = tp_now_s();
        if (t >= next_check) {
            next_check = t + CHECK_PERIOD_S;
            const pid_t pid = atomic_load(&c->words[peer].pid);
            if (shm_peer_gone(pid)) {
                if (want == WANT_DATA)
                    shm_fail(c, "comm %s: rank %d (pid %d) exited during recv #%ld from it", c->group, peer, (int)pid,
                             call_no);
                else
                    shm_fail(c, "comm %s: rank %d (pid %d) exited during send #%ld to it", c->group, peer, (int)pid,
                             call_no);
                return 0;
            }
            if (t - t0 >= c->timeout_s) {
                if (want == WANT_DATA)
                    shm_fail(c, "comm %s: rank %d did not send within %g s (recv #%ld from it)", c->group, peer,
                             c->timeout_s, call_no);
                else
                    shm_fail(c, "comm %s: rank %d did not receive within %g s (send #%ld to it)", c->group, peer,
                             c->timeout_s, call_no);
                return 0;
            }
        }
        atomic_fetch_add(&pw->n_sleepers, 1);
        if (available(c, pw, want) == 0) shm_futex_wait(&pw->wake, w, CHECK_PERIOD_S);
        atomic_fetch_sub(&pw->n_sleepers, 1);
    }
}

/* ---- messages to oneself ---- */

static int self_send(ShmComm *c, const void *buf, size_t n_bytes) {
    SelfMsg *m = TP_MALLOC(sizeof *m + n_bytes);
    m->next = NULL;
    m->n_bytes = n_bytes;
    shm_copy_in(c, m->data, buf, n_bytes);
    if (c->self_tail) c->self_tail->next = m;
    else c->self_head = m;
    c->self_tail = m;
    return 0;
}

static int self_recv(ShmComm *c, void *buf, size_t n_bytes, long call_no) {
    SelfMsg *m = c->self_head;
    if (!m)
        return shm_fail(c, "comm %s: recv #%ld from rank %d (itself), which has sent it nothing", c->group, call_no,
                        c->rank);
    if (m->n_bytes != n_bytes)
        return shm_fail(c, "comm %s: recv #%ld expects %zu bytes from rank %d (itself), which sent %zu", c->group,
                        call_no, n_bytes, c->rank, m->n_bytes);
    shm_copy_out(c, buf, m->data, n_bytes);
    c->self_head = m->next;
    if (!c->self_head) c->self_tail = NULL;
    free(m);
    return 0;
}

void shm_free_self_msgs(ShmComm *c) {
    while (c->self_head) {
        SelfMsg *next = c->self_head->next;
        free(c->self_head);
        c->self_head = next;
    }
    c->self_tail = NULL;
}

/* ---- send / recv ---- */

static int check_peer(ShmComm *c, const char *what, int peer, const void *buf, size_t n_bytes) {
    if (peer < 0 || peer >= c->size)
        return shm_fail(c, "comm %s: %s rank %d, outside the group of %d", c->group, what, peer, c->size);
    if (!buf && n_bytes > 0) return shm_fail(c, "comm %s: %s rank %d of %zu bytes with a NULL buffer", c->group, what,
                                             peer, n_bytes);
    return 0;
}

int shm_send(Comm *comm, const void *buf, size_t n_bytes, int peer) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_SEND, &c->stats.send, &t0) != 0) return -1;
    c->stats.send_bytes += (double)n_bytes;
    if (check_peer(c, "send to", peer, buf, n_bytes) != 0) return shm_end(c, t0, -1);
    if (peer == c->rank) return shm_end(c, t0, self_send(c, buf, n_bytes));
    const long call_no = c->calls[K_SEND];
    const size_t R = c->ring_bytes;
    const size_t k_pair = pair_index(c, c->rank, peer);
    PairWord *pw = &c->pairs[k_pair];
    unsigned char *ring = c->rings + k_pair * R;  // (R)
    uint64_t head = atomic_load(&pw->head);       // only this rank moves it
    // Free space and head are multiples of 8, so the size never wraps.
    if (wait_ring(c, pw, WANT_SPACE, peer, call_no) == 0) return shm_end(c, t0, -1);
    const uint64_t size_word = n_bytes;
    memcpy(ring + head % R, &size_word, MSG_HEADER_BYTES);
    publish(pw, &pw->head, head += MSG_HEADER_BYTES);
    for (size_t k = 0; k < n_bytes;) {
        const uint64_t space = wait_ring(c, pw, WANT_SPACE, peer, call_no);
        if (space == 0) return shm_end(c, t0, -1);
        const size_t left = n_bytes - k, at = (size_t)(head % R);
        size_t piece = left;
        if (piece > space) piece = (size_t)space;
        if (piece > R - at) piece = R - at;
        shm_copy_in(c, ring + at, (const char *)buf + k, piece);
        k += piece;
        // Pieces before the last are multiples of 8 (space and R - at are); the last one is padded.
        publish(pw, &pw->head, head += round8(piece));
    }
    return shm_end(c, t0, 0);
}

int shm_recv(Comm *comm, void *buf, size_t n_bytes, int peer) {
    ShmComm *c = (ShmComm *)comm;
    double t0;
    if (shm_begin(c, K_RECV, &c->stats.recv, &t0) != 0) return -1;
    c->stats.recv_bytes += (double)n_bytes;
    if (check_peer(c, "recv from", peer, buf, n_bytes) != 0) return shm_end(c, t0, -1);
    const long call_no = c->calls[K_RECV];
    if (peer == c->rank) return shm_end(c, t0, self_recv(c, buf, n_bytes, call_no));
    const size_t R = c->ring_bytes;
    const size_t k_pair = pair_index(c, peer, c->rank);
    PairWord *pw = &c->pairs[k_pair];
    const unsigned char *ring = c->rings + k_pair * R;  // (R)
    uint64_t tail = atomic_load(&pw->tail);             // only this rank moves it
    if (wait_ring(c, pw, WANT_DATA, peer, call_no) == 0) return shm_end(c, t0, -1);
    uint64_t size_word;
    memcpy(&size_word, ring + tail % R, MSG_HEADER_BYTES);
    publish(pw, &pw->tail, tail += MSG_HEADER_BYTES);
    if (size_word != n_bytes)
        return shm_end(c, t0,
                       shm_fail(c, "comm %s: recv #%ld expects %zu bytes from rank %d, which sent %llu", c->group,
                                call_no, n_bytes, peer, (unsigned long long)size_word));
    for (size_t k = 0; k < n_bytes;) {
        const uint64_t data = wait_ring(c, pw, WANT_DATA, peer, call_no);
        if (data == 0) return shm_end(c, t0, -1);
        const size_t left = n_bytes - k, at = (size_t)(tail % R);
        size_t piece = left;
        if (piece > data) piece = (size_t)data;
        if (piece > R - at) piece = R - at;
        shm_copy_out(c, (char *)buf + k, ring + at, piece);
        k += piece;
        publish(pw, &pw->tail, tail += round8(piece));
    }
    return shm_end(c, t0, 0);
}
