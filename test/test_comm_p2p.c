/* test_comm_p2p.c: comm_send / comm_recv over shared memory, forked ranks.
 *
 * Messages carry bytes that are a function of (sender, message, index), so
 * a receiver knows what it must get. Scenarios, for 1 to 4 ranks: messages
 * to oneself; a ring (even ranks send first, odd ranks receive first: the
 * order that also works when a send waits for its receive) with sizes from
 * 0 bytes to past the pair ring (1 MiB) and the staging buffer (4 MiB);
 * ping-pong; a burst of messages whose order must hold; the stats. Then the
 * failures: a size mismatch, a peer outside the group, a peer that dies
 * while another waits on it in recv and in send (error naming it, within
 * 2 s), and a live peer that never calls (error after the timeout).
 */
#define _GNU_SOURCE
#include "check.h"
#include "comm_ranks.h"

#define RING_PAST_BYTES (((size_t)1 << 20) + 3)  // past the largest pair ring
#define STAGE_PAST_BYTES (((size_t)5 << 20) + 7)  // past the 4 MiB slot and staging buffer

static unsigned char byte_of(int src, int msg, size_t i) {
    return (unsigned char)((i * 131u) ^ (unsigned)(src * 29 + msg * 7) ^ (i >> 9));
}

static unsigned char *make_msg(int src, int msg, size_t n_bytes) {
    unsigned char *b = malloc(n_bytes ? n_bytes : 1);
    for (size_t i = 0; i < n_bytes; i++) b[i] = byte_of(src, msg, i);
    return b;
}

/* Bytes of b that are not message `msg` of src. */
static size_t count_wrong(const unsigned char *b, int src, int msg, size_t n_bytes) {
    size_t bad = 0;
    for (size_t i = 0; i < n_bytes; i++) bad += b[i] != byte_of(src, msg, i);
    return bad;
}

static int send_msg(Comm *c, int me, int msg, size_t n_bytes, int peer) {
    unsigned char *b = make_msg(me, msg, n_bytes);
    int rc = comm_send(c, b, n_bytes, peer);
    CHECK(rc == 0, "rank %d: send #%d (%zu bytes) to %d: %s", me, msg, n_bytes, peer, comm_error(c));
    free(b);
    return rc;
}

static int recv_msg(Comm *c, int me, int msg, size_t n_bytes, int peer) {
    unsigned char *b = malloc(n_bytes ? n_bytes : 1);
    memset(b, 0xEE, n_bytes ? n_bytes : 1);
    int rc = comm_recv(c, b, n_bytes, peer);
    CHECK(rc == 0, "rank %d: recv #%d (%zu bytes) from %d: %s", me, msg, n_bytes, peer, comm_error(c));
    if (rc == 0) {
        size_t bad = count_wrong(b, peer, msg, n_bytes);
        CHECK(bad == 0, "rank %d: message #%d from %d: %zu of %zu bytes wrong", me, msg, peer, bad, n_bytes);
    }
    free(b);
    return rc;
}

/* ---- scenario: everything that should work ---- */

static void rank_p2p(int rank, int n, int fd, void *arg) {
    (void)arg;
    Comm *c = create_or_report("p2p", rank, n, 20.0);
    if (!c) return;
    long sends = 0, recvs = 0;
    double sent = 0, received = 0;
#define SEND(msg, nb, peer) (sends++, sent += (double)(nb), send_msg(c, rank, (msg), (nb), (peer)))
#define RECV(msg, nb, peer) (recvs++, received += (double)(nb), recv_msg(c, rank, (msg), (nb), (peer)))

    // To oneself: kept in order until received, whatever the size.
    const size_t self_sizes[] = {0, 5, RING_PAST_BYTES};
    for (int k = 0; k < 3; k++) SEND(k, self_sizes[k], rank);
    for (int k = 0; k < 3; k++) RECV(k, self_sizes[k], rank);

    // Ring: to rank + 1, from rank - 1.
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const size_t ring_sizes[] = {0, 1, 13, 4096, RING_PAST_BYTES, STAGE_PAST_BYTES};
    for (int s = 0; s < 6; s++) {
        const int msg = 10 + s;
        if (rank % 2 == 0) {
            SEND(msg, ring_sizes[s], next);
            RECV(msg, ring_sizes[s], prev);
        } else {
            RECV(msg, ring_sizes[s], prev);
            SEND(msg, ring_sizes[s], next);
        }
    }

    // Ping-pong between the first and the last rank: a counter goes back and forth.
    if (n >= 2 && (rank == 0 || rank == n - 1)) {
        const int other = rank == 0 ? n - 1 : 0, rounds = 200;
        int32_t counter = 0;
        const double t0 = tp_now_s();
        for (int k = 0; k < rounds; k++) {
            if (rank == 0) {
                counter++;
                CHECK(comm_send(c, &counter, sizeof counter, other) == 0, "ping: %s", comm_error(c));
                CHECK(comm_recv(c, &counter, sizeof counter, other) == 0, "pong: %s", comm_error(c));
            } else {
                CHECK(comm_recv(c, &counter, sizeof counter, other) == 0, "ping: %s", comm_error(c));
                counter++;
                CHECK(comm_send(c, &counter, sizeof counter, other) == 0, "pong: %s", comm_error(c));
            }
        }
        sends += rounds;
        recvs += rounds;
        sent += rounds * 4.0;
        received += rounds * 4.0;
        if (rank == 0) {
            CHECK(counter == 2 * rounds, "ping-pong counter %d, want %d", counter, 2 * rounds);
            emit(fd, "pingpong_us = %.1f", (tp_now_s() - t0) / rounds * 1e6);
        }
    }

    // A burst from rank 0 to every other rank: 40 messages of varied sizes
    // (zero bytes among them, some past the ring) arrive in order.
    const int burst = 40;
    for (int k = 0; k < burst; k++) {
        const size_t nb = k % 7 == 0 ? 0 : (k % 13 == 5 ? RING_PAST_BYTES : (size_t)k * 977);
        if (rank == 0) {
            for (int q = 1; q < n; q++) SEND(100 + k, nb, q);
        } else {
            RECV(100 + k, nb, 0);
        }
    }

    CHECK(comm_barrier(c) == 0, "barrier after send/recv: %s", comm_error(c));
    CommStats st = comm_stats(c);
    CHECK(st.send == sends && st.recv == recvs, "stats: %ld sends, %ld recvs; want %ld, %ld", st.send, st.recv, sends,
          recvs);
    CHECK(st.send_bytes == sent && st.recv_bytes == received, "stats: %.0f bytes sent, %.0f received; want %.0f, %.0f",
          st.send_bytes, st.recv_bytes, sent, received);
    comm_reset_stats(c);
    CHECK(comm_stats(c).send == 0 && comm_stats(c).recv_bytes == 0, "reset clears send/recv");

    // A peer outside the group is refused by name, and poisons (local: no peer waits on it).
    char x = 0;
    CHECK(comm_send(c, &x, 1, n) == -1 && strstr(comm_error(c), "outside the group"), "peer %d: %s", n, comm_error(c));
    CHECK(comm_recv(c, &x, 1, 0) == -1, "a poisoned group still receives");
    comm_free(c);
#undef SEND
#undef RECV
}

/* ---- scenario: the receiver expects another size ---- */

static void rank_mismatch(int rank, int n, int fd, void *arg) {
    (void)n;
    (void)arg;
    Comm *c = create_or_report("mismatch", rank, 2, 20.0);
    if (!c) return;
    char buf[64] = {0};
    if (rank == 0) {
        CHECK(comm_send(c, buf, 40, 1) == 0, "send: %s", comm_error(c));  // fits the ring: completes
        CHECK(comm_send(c, buf, 0, 0) == 0, "self send: %s", comm_error(c));
        CHECK(comm_recv(c, buf, 8, 0) == -1, "a self message of 0 bytes received as 8");
        emit(fd, "self = %s", comm_error(c));
    } else {
        CHECK(comm_recv(c, buf, 48, 0) == -1, "a message of 40 bytes received as 48");
        emit(fd, "other = %s", comm_error(c));
    }
    comm_free(c);
}

/* ---- scenario: a peer dies while another waits in recv or send ---- */

static void rank_dead_peer(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    Comm *c = create_or_report("p2pdead", rank, n, fa->timeout_s);
    if (!c) return;
    CHECK(comm_barrier(c) == 0, "barrier: %s", comm_error(c));
    if (rank == n - 1) _exit(0);
    const size_t big = ((size_t)3 << 20) + 1;  // larger than the ring: the sender must wait for the reader
    unsigned char *b = calloc(1, big);
    double t0 = tp_now_s();
    int rc = rank == 0 ? comm_recv(c, b, 16, n - 1) : comm_send(c, b, big, n - 1);
    double dt = tp_now_s() - t0;
    CHECK(rc == -1, "rank %d: %s with a dead peer succeeded", rank, rank == 0 ? "recv" : "send");
    CHECK(dt < 2.0, "took %.2f s to notice the dead peer (timeout %g s)", dt, fa->timeout_s);
    emit(fd, "error%d = %s", rank, comm_error(c));
    CHECK(comm_send(c, b, 1, 0) == -1, "a poisoned group still sends");
    free(b);
    comm_free(c);
}

/* ---- scenario: a live peer never calls ---- */

static void rank_idle_peer(int rank, int n, int fd, void *arg) {
    const FaultArg *fa = arg;
    Comm *c = create_or_report("p2pidle", rank, n, fa->timeout_s);
    if (!c) return;
    if (idle_peer_left(rank, n, c, fa)) return;
    const size_t big = ((size_t)3 << 20) + 1;
    unsigned char *b = calloc(1, big);
    double t0 = tp_now_s();
    int rc = rank == 0 ? comm_recv(c, b, 16, n - 1) : comm_send(c, b, big, n - 1);
    double dt = tp_now_s() - t0;
    CHECK(rc == -1, "rank %d: waiting on an idle peer succeeded", rank);
    CHECK(dt >= fa->timeout_s * 0.95 && dt < fa->timeout_s + 1.5, "gave up after %.2f s (timeout %g s)", dt,
          fa->timeout_s);
    emit(fd, "error%d = %s", rank, comm_error(c));
    free(b);
    comm_free(c);
}

int main(void) {
    init_job("tp");
    Run *run = malloc(sizeof *run);
    char what[64], val_buf[600], want[256];
    for (int n = 1; n <= 4; n++) {
        snprintf(what, sizeof what, "send/recv n=%d", n);
        const double t0 = tp_now_s();
        run_ranks(what, n, rank_p2p, NULL, run);
        check_all_ok(what, run);
        char us[64] = "";
        if (find_value(run, 0, "pingpong_us", us, sizeof us))
            printf("%s: %.2f s; ping-pong round trip %s us\n", what, tp_now_s() - t0, us);
        else
            printf("%s: %.2f s\n", what, tp_now_s() - t0);
    }

    run_ranks("size mismatch", 2, rank_mismatch, NULL, run);
    check_all_ok("size mismatch", run);
    const char *got = find_value(run, 1, "other", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, "comm mismatch: recv #1 expects 48 bytes from rank 0, which sent 40") == 0,
          "mismatch error: %s", got ? got : "(none)");
    got = find_value(run, 0, "self", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, "comm mismatch: recv #1 expects 8 bytes from rank 0 (itself), which sent 0") == 0,
          "self mismatch error: %s", got ? got : "(none)");

    FaultArg slow = {20.0};
    run_ranks("dead peer", 3, rank_dead_peer, &slow, run);
    for (int r = 0; r < 2; r++) CHECK(exited_ok(run, r), "dead peer: rank %d status 0x%x", r, run->status[r]);
    snprintf(want, sizeof want, "comm p2pdead: rank 2 (pid %d) exited during recv #1 from it", (int)run->pid[2]);
    got = find_value(run, 0, "error0", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, want) == 0, "dead peer in recv: \"%s\" want \"%s\"", got ? got : "(none)", want);
    snprintf(want, sizeof want, "comm p2pdead: rank 2 (pid %d) exited during send #1 to it", (int)run->pid[2]);
    got = find_value(run, 1, "error1", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, want) == 0, "dead peer in send: \"%s\" want \"%s\"", got ? got : "(none)", want);

    FaultArg quick = {1.0};
    run_ranks("idle peer", 3, rank_idle_peer, &quick, run);
    check_all_ok("idle peer", run);
    got = find_value(run, 0, "error0", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, "comm p2pidle: rank 2 did not send within 1 s (recv #1 from it)") == 0,
          "idle peer in recv: %s", got ? got : "(none)");
    got = find_value(run, 1, "error1", val_buf, sizeof val_buf);
    CHECK(got && strcmp(got, "comm p2pidle: rank 2 did not receive within 1 s (send #1 to it)") == 0,
          "idle peer in send: %s", got ? got : "(none)");

    CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    free(run);
    return check_report("test_comm_p2p");
}
