/* store.c: the job's TCP key-value store (server in tprun, client in
 * workers and in the tprun agents of other nodes).
 *
 * Why this shape: rendezvous traffic is small and rare, so the server is a
 * single background thread running poll() over the listening socket, a
 * wake-up pipe and every connection, with non-blocking sockets and one
 * request in flight per connection. A GET for a missing key parks the
 * connection on the server until a SET/ADD creates the key or the client's
 * deadline passes (the poll timeout is the nearest deadline), so a waiting
 * client costs nothing on the network and nothing in CPU. Clients are
 * plain blocking request/reply with every wait bounded by poll().
 *
 * Wire format (all integers little-endian), one request then one reply:
 *   request: u8 op, u8[3] zero, u32 key_len, u64 val_len, key, value
 *   reply:   u8 status, u8[3] zero, u32 zero, u64 val_len, value
 *   op  AUTH  key = token, no value. Right token: reply OK. Anything else
 *             (wrong token, another op first, an oversized header): the
 *             server closes the connection without a word.
 *       SET   key, value -> OK
 *       GET   key, value = u64 timeout in ms (~0 = forever) -> OK + value,
 *             or MISSING when the key did not appear in time
 *       CHECK key -> OK + one byte (1 = exists, 0 = not)
 *       ADD   key, value = i64 delta -> OK + i64 new value. Counters are
 *             stored as decimal text, so a GET of a counter reads "3".
 *   status OK 0, MISSING 1, BAD 2 (value = one sentence: why).
 * Keys are 1..1024 bytes, values up to 64 MiB, tokens 1..256 bytes. An
 * unauthenticated connection may only send a small AUTH header, so nobody
 * without the token can make the server allocate or wait.
 *
 * Unauthenticated connections are also bounded in time and number, so idle
 * sockets opened by anyone who can reach the port cannot fill the server's
 * descriptor table (accept() then fails with EMFILE and a naive loop spins
 * while real clients wait in the backlog): one that has not authenticated
 * within STORE_AUTH_WINDOW_S is dropped; at most STORE_MAX_UNAUTHED are
 * held, and at the cap the oldest one (if at least STORE_EVICT_AGE_S old)
 * is dropped for each newcomer, so a real client, whose AUTH follows its
 * connect at once, gets in. A dropped connection receives a BAD reply ("not
 * authenticated in time") before the close, and store_connect starts over on
 * it until its own timeout; a wrong token is still closed without a word.
 * When accept() runs out of descriptors the server stops accepting for
 * STORE_ACCEPT_PAUSE_S rather than spin. Authenticated connections are
 * never dropped for any of this.
 *
 * A client is one socket: use one StoreClient per thread. After any I/O
 * error or timeout mid-reply the stream is out of step, so the client
 * closes it and every later call fails with that reason.
 */
#define _GNU_SOURCE
#include "tp/store.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"

enum { OP_AUTH = 1, OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_ADD = 5 };
enum { ST_OK = 0, ST_MISSING = 1, ST_BAD = 2 };

#define HDR_BYTES 16
#define STORE_KEY_MAX 1024
#define STORE_VAL_MAX ((uint64_t)64 << 20)
#define STORE_TOKEN_MAX 256
#define STORE_AUTH_WINDOW_S 1.0   // an unauthenticated connection lives this long at most
#define STORE_MAX_UNAUTHED 64      // unauthenticated connections held at once (well below any fd limit)
#define STORE_EVICT_AGE_S 0.1      // at the cap, the oldest is dropped for a newcomer once this old
#define STORE_ACCEPT_PAUSE_S 0.1   // accept() out of descriptors: stop accepting this long
#define STORE_DROP_MSG "not authenticated in time; connect again"
#define STORE_IO_TIMEOUT_S 120.0  // bound on a reply that needs no waiting (SET, CHECK, ADD)
#define STORE_GET_SLACK_S 30.0    // the server answers a GET at its deadline; allow this on top
#define N_BUCKETS 1024

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Milliseconds until deadline for poll(): -1 = no deadline, rounded up so
 * a wake-up never comes early and spins. */
static int ms_until(double deadline) {
    if (isinf(deadline)) return -1;
    double ms = ceil((deadline - tp_now_s()) * 1000.0);
    if (ms <= 0) return 0;
    if (ms > 1e9) return 1000000000;
    return (int)ms;
}

/* ======================================================================== */
/* server                                                                   */
/* ======================================================================== */

typedef struct Entry {
    struct Entry *next;
    char *key;  // NUL-terminated, key_len bytes
    size_t key_len;
    unsigned char *val;  // val_len bytes (+1 NUL for counters' parsing)
    size_t val_len;
} Entry;

typedef struct {
    int fd;  // -1 = closed, removed after the poll round
    int authed;
    double accepted_at;  // auth deadline = accepted_at + STORE_AUTH_WINDOW_S
    // request being read
    unsigned char hdr[HDR_BYTES];
    size_t hdr_got;
    int op;
    uint32_t key_len;
    uint64_t val_len;
    unsigned char *body;  // key_len + val_len bytes
    size_t body_got;
    // reply being written
    unsigned char *out;
    size_t out_len, out_sent;
    // parked GET
    int waiting;
    char *wait_key;
    size_t wait_key_len;
    double wait_deadline;  // INFINITY = forever
} Conn;

struct StoreServer {
    int listen_fd;
    int wake[2];
    pthread_t thread;
    unsigned char token[STORE_TOKEN_MAX];  // zero-padded
    size_t token_len;
    Conn *conns;
    size_t n_conns, cap_conns;
    double accept_resume;  // accept() ran out of descriptors: not before this time
    Entry *buckets[N_BUCKETS];
};

static size_t key_hash(const char *key, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
    return (size_t)(h % N_BUCKETS);
}

static Entry *table_find(StoreServer *s, const char *key, size_t n) {
    for (Entry *e = s->buckets[key_hash(key, n)]; e; e = e->next)
        if (e->key_len == n && memcmp(e->key, key, n) == 0) return e;
    return NULL;
}

/* Takes ownership of val (malloc'ed, val_len + 1 bytes). */
static Entry *table_put(StoreServer *s, const char *key, size_t n, unsigned char *val, size_t val_len) {
    Entry *e = table_find(s, key, n);
    if (!e) {
        e = TP_CALLOC(1, sizeof *e);
        e->key = TP_MALLOC(n + 1);
        memcpy(e->key, key, n);
        e->key[n] = 0;
        e->key_len = n;
        size_t b = key_hash(key, n);
        e->next = s->buckets[b];
        s->buckets[b] = e;
    }
    free(e->val);
    e->val = val;
    e->val_len = val_len;
    return e;
}

/* Token comparison in constant time: both sides padded to the maximum,
 * every byte compared, lengths folded into the same accumulator. */
static int token_matches(const StoreServer *s, const unsigned char *tok, size_t n) {
    unsigned char pad[STORE_TOKEN_MAX];
    memset(pad, 0, sizeof pad);
    if (n > STORE_TOKEN_MAX) return 0;
    memcpy(pad, tok, n);
    volatile unsigned diff = (unsigned)(n ^ s->token_len);
    for (size_t i = 0; i < STORE_TOKEN_MAX; i++) diff |= (unsigned)(pad[i] ^ s->token[i]);
    return diff == 0;
}

static void conn_close(Conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->body);
    free(c->out);
    free(c->wait_key);
    c->body = c->out = NULL;
    c->wait_key = NULL;
    c->waiting = 0;
}

/* Tries to send the pending reply; closes the connection on error. */
static void conn_flush(Conn *c) {
    while (c->fd >= 0 && c->out && c->out_sent < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_sent += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            conn_close(c);
            return;
        }
    }
    if (c->out && c->out_sent == c->out_len) {
        free(c->out);
        c->out = NULL;
        c->out_len = c->out_sent = 0;
    }
}

static void conn_reply(Conn *c, int status, const void *val, size_t n) {
    free(c->out);
    c->out = TP_MALLOC(HDR_BYTES + n);
    memset(c->out, 0, HDR_BYTES);
    c->out[0] = (unsigned char)status;
    put_u64(c->out + 8, (uint64_t)n);
    if (n) memcpy(c->out + HDR_BYTES, val, n);
    c->out_len = HDR_BYTES + n;
    c->out_sent = 0;
    conn_flush(c);
}

static void conn_reply_msg(Conn *c, const char *msg) { conn_reply(c, ST_BAD, msg, strlen(msg)); }

/* A key was created or changed: answer every GET parked on it. */
static void wake_waiters(StoreServer *s, const Entry *e) {
    for (size_t i = 0; i < s->n_conns; i++) {
        Conn *w = &s->conns[i];
        if (w->fd < 0 || !w->waiting || w->wait_key_len != e->key_len) continue;
        if (memcmp(w->wait_key, e->key, e->key_len) != 0) continue;
        w->waiting = 0;
        free(w->wait_key);
        w->wait_key = NULL;
        conn_reply(w, ST_OK, e->val, e->val_len);
    }
}

/* Parses a counter's decimal text. 0 or -1 when it is not an integer. */
static int parse_counter(const Entry *e, long long *v) {
    if (e->val_len == 0 || e->val_len > 24) return -1;
    char buf[32];
    memcpy(buf, e->val, e->val_len);
    buf[e->val_len] = 0;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (errno || end != buf + e->val_len) return -1;
    *v = x;
    return 0;
}

static void handle_request(StoreServer *s, Conn *c) {
    const char *key = (const char *)c->body;
    size_t kn = c->key_len;
    const unsigned char *val = c->body + kn;
    size_t vn = (size_t)c->val_len;

    if (!c->authed) {  // the header was already checked to be a small AUTH
        if (!token_matches(s, c->body, kn)) {
            conn_close(c);
            return;
        }
        c->authed = 1;
        conn_reply(c, ST_OK, NULL, 0);
        return;
    }
    switch (c->op) {
    case OP_AUTH:
        conn_reply(c, ST_OK, NULL, 0);
        return;
    case OP_SET: {
        unsigned char *copy = TP_MALLOC(vn + 1);
        if (vn) memcpy(copy, val, vn);
        copy[vn] = 0;
        Entry *e = table_put(s, key, kn, copy, vn);
        conn_reply(c, ST_OK, NULL, 0);
        wake_waiters(s, e);
        return;
    }
    case OP_GET: {
        if (vn != 8) {
            conn_reply_msg(c, "a GET request carries an 8-byte timeout");
            return;
        }
        Entry *e = table_find(s, key, kn);
        if (e) {
            conn_reply(c, ST_OK, e->val, e->val_len);
            return;
        }
        uint64_t ms = get_u64(val);
        if (ms == 0) {
            conn_reply(c, ST_MISSING, NULL, 0);
            return;
        }
        c->waiting = 1;
        c->wait_key = TP_MALLOC(kn);
        memcpy(c->wait_key, key, kn);
        c->wait_key_len = kn;
        c->wait_deadline = ms == UINT64_MAX ? INFINITY : tp_now_s() + 1e-3 * (double)ms;
        return;
    }
    case OP_CHECK: {
        unsigned char yes = table_find(s, key, kn) != NULL;
        conn_reply(c, ST_OK, &yes, 1);
        return;
    }
    case OP_ADD: {
        if (vn != 8) {
            conn_reply_msg(c, "an ADD request carries an 8-byte delta");
            return;
        }
        long long delta = (long long)get_u64(val), cur = 0, next;
        Entry *e = table_find(s, key, kn);
        if (e && parse_counter(e, &cur) != 0) {
            conn_reply_msg(c, "the key holds a value that is not an integer counter");
            return;
        }
        if (__builtin_add_overflow(cur, delta, &next)) {
            conn_reply_msg(c, "the counter would overflow");
            return;
        }
        char text[32];
        int n = snprintf(text, sizeof text, "%lld", next);
        unsigned char *copy = TP_MALLOC((size_t)n + 1);
        memcpy(copy, text, (size_t)n + 1);
        e = table_put(s, key, kn, copy, (size_t)n);
        unsigned char out[8];
        put_u64(out, (uint64_t)next);
        conn_reply(c, ST_OK, out, 8);
        wake_waiters(s, e);
        return;
    }
    default:
        conn_reply_msg(c, "unknown request");
        return;
    }
}

/* Reads what is available; handles a request once complete. A connection
 * with a reply pending or a parked GET reads nothing more until done. */
static void conn_read(StoreServer *s, Conn *c) {
    while (c->fd >= 0 && !c->out && !c->waiting) {
        if (c->hdr_got < HDR_BYTES) {
            ssize_t r = recv(c->fd, c->hdr + c->hdr_got, HDR_BYTES - c->hdr_got, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {
                conn_close(c);
                return;
            }
            c->hdr_got += (size_t)r;
            if (c->hdr_got < HDR_BYTES) continue;
            c->op = c->hdr[0];
            c->key_len = get_u32(c->hdr + 4);
            c->val_len = get_u64(c->hdr + 8);
            int ok = c->key_len >= 1 && c->key_len <= STORE_KEY_MAX && c->val_len <= STORE_VAL_MAX;
            if (!c->authed)  // before the token, only a small AUTH is acceptable
                ok = c->op == OP_AUTH && c->key_len <= STORE_TOKEN_MAX && c->val_len == 0;
            if (!ok) {
                conn_close(c);
                return;
            }
            c->body = TP_MALLOC(c->key_len + (size_t)c->val_len + 1);
            c->body_got = 0;
        }
        size_t need = c->key_len + (size_t)c->val_len;
        if (c->body_got < need) {
            ssize_t r = recv(c->fd, c->body + c->body_got, need - c->body_got, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {
                conn_close(c);
                return;
            }
            c->body_got += (size_t)r;
            if (c->body_got < need) continue;
        }
        handle_request(s, c);
        free(c->body);
        c->body = NULL;
        c->hdr_got = 0;
        c->body_got = 0;
    }
}

/* Drops a connection that has not authenticated: one best-effort BAD reply
 * (a real client that was merely slow then knows to connect again), then
 * the close. Never blocks: the reply is small and the socket buffer empty. */
static void conn_drop_unauthed(Conn *c) {
    unsigned char msg[HDR_BYTES + sizeof STORE_DROP_MSG - 1];
    memset(msg, 0, HDR_BYTES);
    msg[0] = ST_BAD;
    put_u64(msg + 8, sizeof STORE_DROP_MSG - 1);
    memcpy(msg + HDR_BYTES, STORE_DROP_MSG, sizeof STORE_DROP_MSG - 1);
    ssize_t w = send(c->fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    conn_close(c);
}

/* Unauthenticated open connections; *oldest receives the longest-waiting one. */
static size_t count_unauthed(StoreServer *s, Conn **oldest) {
    size_t n = 0;
    *oldest = NULL;
    for (size_t i = 0; i < s->n_conns; i++) {
        Conn *c = &s->conns[i];
        if (c->fd < 0 || c->authed) continue;
        n++;
        if (!*oldest || c->accepted_at < (*oldest)->accepted_at) *oldest = c;
    }
    return n;
}

/* Makes room for one more unauthenticated connection by dropping the
 * oldest, if it has had STORE_EVICT_AGE_S to authenticate. 1 when room was made. */
static int evict_oldest(StoreServer *s, double t) {
    Conn *oldest;
    count_unauthed(s, &oldest);
    if (!oldest || t - oldest->accepted_at < STORE_EVICT_AGE_S) return 0;
    conn_drop_unauthed(oldest);
    return 1;
}

/* Takes every waiting connection. Past the cap, the oldest unauthenticated
 * one makes room for each newcomer; when none is old enough to drop, the
 * rest stay in the kernel's backlog until the next round. */
static void accept_all(StoreServer *s) {
    for (;;) {
        double t = tp_now_s();
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (evict_oldest(s, t)) continue;  // a descriptor is free again
                s->accept_resume = t + STORE_ACCEPT_PAUSE_S;  // no spinning on a full table
            }
            return;  // EAGAIN: nobody else is waiting
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (s->n_conns == s->cap_conns) {
            size_t cap = s->cap_conns ? 2 * s->cap_conns : 16;
            Conn *nc = realloc(s->conns, cap * sizeof *nc);
            TP_CHECK(nc != NULL, "out of memory growing the store's connection table");
            s->conns = nc;
            s->cap_conns = cap;
        }
        Conn *c = &s->conns[s->n_conns++];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->accepted_at = t;
        Conn *oldest;
        if (count_unauthed(s, &oldest) > STORE_MAX_UNAUTHED && !evict_oldest(s, t)) return;
    }
}

static void *server_main(void *arg) {
    StoreServer *s = arg;
    struct pollfd *pfds = NULL;
    size_t cap_pfds = 0;
    for (;;) {
        size_t n = s->n_conns;
        if (n + 2 > cap_pfds) {
            cap_pfds = 2 * (n + 2);
            free(pfds);
            pfds = TP_MALLOC(cap_pfds * sizeof *pfds);
        }
        double deadline = INFINITY;
        for (size_t i = 0; i < n; i++) {
            Conn *c = &s->conns[i];
            short ev = c->out ? POLLOUT : c->waiting ? POLLRDHUP : POLLIN;
            pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
            double auth_deadline = c->accepted_at + STORE_AUTH_WINDOW_S;
            if (!c->authed && auth_deadline < deadline) deadline = auth_deadline;
            if (c->waiting && c->wait_deadline < deadline) deadline = c->wait_deadline;
        }
        /* Listen only when a newcomer could be taken: not while accept() is
         * out of descriptors, nor at the cap before the oldest may be dropped. */
        int listening = 1;
        double t_round = tp_now_s();
        Conn *oldest;
        if (t_round < s->accept_resume) {
            listening = 0;
            if (s->accept_resume < deadline) deadline = s->accept_resume;
        } else if (count_unauthed(s, &oldest) >= STORE_MAX_UNAUTHED &&
                   t_round - oldest->accepted_at < STORE_EVICT_AGE_S) {
            listening = 0;
            if (oldest->accepted_at + STORE_EVICT_AGE_S < deadline) deadline = oldest->accepted_at + STORE_EVICT_AGE_S;
        }
        pfds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pfds[1] = (struct pollfd){.fd = listening ? s->listen_fd : -1, .events = POLLIN};
        int rc = poll(pfds, n + 2, ms_until(deadline));
        if (rc < 0 && errno != EINTR) break;
        if (rc > 0 && (pfds[0].revents & POLLIN)) break;  // store_server_stop
        for (size_t i = 0; rc > 0 && i < n; i++) {
            Conn *c = &s->conns[i];
            short re = pfds[i + 2].revents;
            if (!re || c->fd < 0) continue;
            if (c->waiting) {  // the peer went away while parked
                if (re & (POLLRDHUP | POLLHUP | POLLERR)) conn_close(c);
                continue;
            }
            if (re & POLLOUT) conn_flush(c);
            if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR))) conn_read(s, c);
            if (c->fd >= 0 && !c->out) conn_read(s, c);  // reply sent: a queued request may wait
        }
        double t = tp_now_s();
        for (size_t i = 0; i < n; i++) {
            Conn *c = &s->conns[i];
            if (c->fd < 0) continue;
            if (!c->authed && t >= c->accepted_at + STORE_AUTH_WINDOW_S) {
                conn_drop_unauthed(c);
            } else if (c->waiting && t >= c->wait_deadline) {
                c->waiting = 0;
                free(c->wait_key);
                c->wait_key = NULL;
                conn_reply(c, ST_MISSING, NULL, 0);
                if (c->fd >= 0 && !c->out) conn_read(s, c);
            }
        }
        if (rc > 0 && (pfds[1].revents & POLLIN)) accept_all(s);
        size_t k = 0;  // drop closed connections, keep order
        for (size_t i = 0; i < s->n_conns; i++)
            if (s->conns[i].fd >= 0) s->conns[k++] = s->conns[i];
        s->n_conns = k;
    }
    free(pfds);
    return NULL;
}

StoreServer *store_server_start(const char *addr, int port, const char *token, int *bound_port, char *err,
                                size_t err_len) {
    if (!token || !token[0] || strlen(token) > STORE_TOKEN_MAX) {
        tp_error_set(err, err_len, "the store needs a job token of 1 to %d bytes", STORE_TOKEN_MAX);
        return NULL;
    }
    if (port < 0 || port > 65535) {
        tp_error_set(err, err_len, "store port %d is out of range 0..65535", port);
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    int gai = getaddrinfo(addr && addr[0] ? addr : NULL, port_s, &hints, &res);
    if (gai != 0) {
        tp_error_set(err, err_len, "cannot resolve store address %s: %s", addr ? addr : "(any)", gai_strerror(gai));
        return NULL;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 256) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        tp_error_set(err, err_len, "cannot listen on %s:%d for the store: %s", addr ? addr : "(any)", port,
                     strerror(saved));
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int real_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (bound_port) *bound_port = real_port;

    StoreServer *s = TP_CALLOC(1, sizeof *s);
    s->listen_fd = fd;
    s->token_len = strlen(token);
    memcpy(s->token, token, s->token_len);
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        tp_error_set(err, err_len, "cannot create the store's wake-up pipe: %s", strerror(errno));
        close(fd);
        free(s);
        return NULL;
    }
    // The server thread takes no signals: they belong to the main thread.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        tp_error_set(err, err_len, "cannot start the store thread: %s", strerror(prc));
        close(fd);
        close(s->wake[0]);
        close(s->wake[1]);
        free(s);
        return NULL;
    }
    return s;
}

void store_server_stop(StoreServer *s) {
    if (!s) return;
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->n_conns; i++) conn_close(&s->conns[i]);
    free(s->conns);
    for (size_t b2 = 0; b2 < N_BUCKETS; b2++) {
        Entry *e = s->buckets[b2];
        while (e) {
            Entry *next = e->next;
            free(e->key);
            free(e->val);
            free(e);
            e = next;
        }
    }
    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}

/* ======================================================================== */
/* client                                                                   */
/* ======================================================================== */

struct StoreClient {
    int fd;  // -1 once broken
    char host[256];
    int port;
    char err[512];
};

const char *store_error(const StoreClient *c) { return c ? c->err : "no store client"; }

static void client_fail(StoreClient *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void client_fail(StoreClient *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

/* Waits until fd is ready for `events` or the deadline passes: 0 when the
 * caller should retry, -1 with errno (ETIMEDOUT at the deadline). */
static int wait_ready(int fd, short events, double deadline) {
    struct pollfd pfd = {.fd = fd, .events = events};
    int ms = ms_until(deadline);
    if (ms == 0) {
        errno = ETIMEDOUT;
        return -1;
    }
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -1;
    return 0;
}

/* Sends all bytes before deadline. 0, or -1 with errno (ETIMEDOUT on time). */
static int send_all(int fd, const void *buf, size_t n, double deadline) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_ready(fd, POLLOUT, deadline) == 0) continue;
        return -1;
    }
    return 0;
}

/* Receives exactly n bytes before deadline. 0; -1 with errno (ETIMEDOUT on
 * time, ECONNRESET when the peer closed). */
static int recv_all(int fd, void *buf, size_t n, double deadline) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (errno == EINTR) continue;
        if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_ready(fd, POLLIN, deadline) == 0) continue;
        return -1;
    }
    return 0;
}

static void client_break(StoreClient *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* One request/reply. On success returns 0 with *status and a malloc'ed,
 * NUL-terminated reply value (*reply may be NULL when not wanted). */
static int client_call(StoreClient *c, int op, const char *key, const void *val, size_t val_len,
                       double reply_timeout_s, int *status, unsigned char **reply, size_t *reply_len) {
    static const char *op_names[] = {"", "AUTH", "SET", "GET", "CHECK", "ADD"};
    if (c->fd < 0) {
        if (!c->err[0]) client_fail(c, "the store connection is closed");
        return -1;
    }
    size_t kn = strlen(key);
    unsigned char head[HDR_BYTES + STORE_KEY_MAX];
    memset(head, 0, HDR_BYTES);
    head[0] = (unsigned char)op;
    put_u32(head + 4, (uint32_t)kn);
    put_u64(head + 8, (uint64_t)val_len);
    memcpy(head + HDR_BYTES, key, kn);
    double t0 = tp_now_s();
    double deadline = t0 + STORE_IO_TIMEOUT_S;
    if (send_all(c->fd, head, HDR_BYTES + kn, deadline) != 0 ||
        (val_len && send_all(c->fd, val, val_len, deadline) != 0)) {
        client_fail(c, "store %s of key '%.200s' failed sending to %s:%d: %s", op_names[op], key, c->host, c->port,
                    strerror(errno));
        client_break(c);
        return -1;
    }
    double reply_deadline = isinf(reply_timeout_s) ? INFINITY : tp_now_s() + reply_timeout_s;
    unsigned char rh[HDR_BYTES];
    if (recv_all(c->fd, rh, HDR_BYTES, reply_deadline) != 0) {
        int e = errno;
        client_fail(c, "store %s of key '%.200s' got no reply from %s:%d: %s", op_names[op], key, c->host, c->port,
                    e == ECONNRESET ? "the store closed the connection" : strerror(e));
        client_break(c);
        return -1;
    }
    uint64_t n = get_u64(rh + 8);
    if (n > STORE_VAL_MAX) {
        client_fail(c, "store %s of key '%.200s' got a malformed reply from %s:%d", op_names[op], key, c->host,
                    c->port);
        client_break(c);
        return -1;
    }
    unsigned char *buf = malloc((size_t)n + 1);
    if (!buf) {
        client_fail(c, "out of memory receiving %llu bytes from the store", (unsigned long long)n);
        client_break(c);
        return -1;
    }
    if (recv_all(c->fd, buf, (size_t)n, tp_now_s() + STORE_IO_TIMEOUT_S) != 0) {
        client_fail(c, "store %s of key '%.200s' lost the reply from %s:%d: %s", op_names[op], key, c->host, c->port,
                    strerror(errno));
        free(buf);
        client_break(c);
        return -1;
    }
    buf[n] = 0;
    *status = rh[0];
    if (rh[0] == ST_BAD) {
        client_fail(c, "store refused %s of key '%.200s': %s", op_names[op], key, (char *)buf);
        free(buf);
        return -1;
    }
    if (reply) {
        *reply = buf;
        if (reply_len) *reply_len = (size_t)n;
    } else {
        free(buf);
    }
    return 0;
}

static int check_key(StoreClient *c, const char *key) {
    if (!c) return -1;
    if (!key || !key[0] || strlen(key) > STORE_KEY_MAX) {
        client_fail(c, "store keys must be 1 to %d bytes (got %zu)", STORE_KEY_MAX, key ? strlen(key) : (size_t)0);
        return -1;
    }
    return 0;
}

static int sleep_s(double s) {
    if (s <= 0) return 0;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return 0;
}

/* One connection attempt to any address of host:port, bounded by deadline.
 * Returns a connected non-blocking socket or -1 with errno. */
static int try_connect(const char *host, int port, double deadline) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0) {
        errno = EHOSTUNREACH;
        return -2;  // name does not resolve
    }
    int fd = -1, saved = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int prc;
            do {
                int ms = ms_until(deadline);
                prc = poll(&pfd, 1, ms < 0 || ms > 5000 ? 5000 : ms);
            } while (prc < 0 && errno == EINTR);
            int soerr = ETIMEDOUT;
            socklen_t sl = sizeof soerr;
            if (prc > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            rc = soerr == 0 ? 0 : -1;
            errno = soerr;
        }
        if (rc != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) errno = saved;
    return fd;
}

/* Connects to host:port, retrying with back-off until deadline. The socket,
 * or -1 with err. */
static int connect_until(const char *host, int port, double deadline, double timeout_s, char *err, size_t err_len) {
    double pause = 0.02;
    for (;;) {
        int fd = try_connect(host, port, deadline);
        if (fd >= 0) return fd;
        if (fd == -2) {
            tp_error_set(err, err_len, "cannot resolve the store host '%s'", host);
            return -1;
        }
        double left = deadline - tp_now_s();
        if (left <= 0) {
            tp_error_set(err, err_len, "cannot reach the store at %s:%d within %.1f s: %s", host, port,
                         timeout_s > 0 ? timeout_s : 0.0, strerror(errno));
            return -1;
        }
        sleep_s(pause < left ? pause : left);
        if (pause < 0.5) pause *= 2;
    }
}

StoreClient *store_connect(const char *host, int port, const char *token, double timeout_s, char *err,
                           size_t err_len) {
    if (!host || !host[0] || port <= 0 || port > 65535) {
        tp_error_set(err, err_len, "the store address '%s:%d' is not valid", host ? host : "", port);
        return NULL;
    }
    if (!token || !token[0] || strlen(token) > STORE_TOKEN_MAX) {
        tp_error_set(err, err_len, "a job token of 1 to %d bytes is needed to join the store (TPRUN_TOKEN)",
                     STORE_TOKEN_MAX);
        return NULL;
    }
    double deadline = tp_now_s() + (timeout_s > 0 ? timeout_s : 0);
    double pause = 0.02;
    for (;;) {
        int fd = connect_until(host, port, deadline, timeout_s, err, err_len);
        if (fd < 0) return NULL;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        StoreClient *c = TP_CALLOC(1, sizeof *c);
        c->fd = fd;
        c->port = port;
        snprintf(c->host, sizeof c->host, "%s", host);
        int status = -1;
        // The key of AUTH is the token: client_call takes a NUL-terminated key.
        if (client_call(c, OP_AUTH, token, NULL, 0, STORE_IO_TIMEOUT_S, &status, NULL, NULL) == 0 && status == ST_OK)
            return c;
        store_close(c);
        /* A BAD reply to AUTH: the server dropped this connection before
         * reading the token (busy with unauthenticated connections, or this
         * process stalled past the window). A wrong token gets no reply. */
        double left = deadline - tp_now_s();
        if (status != ST_BAD) {
            tp_error_set(err, err_len, "the store at %s:%d refused this connection (wrong or missing job token?)",
                         host, port);
            return NULL;
        }
        if (left <= 0) {
            tp_error_set(err, err_len, "the store at %s:%d dropped this connection before it authenticated, again "
                         "and again for %.1f s (flooded with unauthenticated connections?)", host, port,
                         timeout_s > 0 ? timeout_s : 0.0);
            return NULL;
        }
        sleep_s(pause < left ? pause : left);
        if (pause < 0.5) pause *= 2;
    }
}

void store_close(StoreClient *c) {
    if (!c) return;
    client_break(c);
    free(c);
}

int store_set(StoreClient *c, const char *key, const void *val, size_t n_bytes) {
    if (check_key(c, key) != 0) return -1;
    if ((uint64_t)n_bytes > STORE_VAL_MAX || (n_bytes && !val)) {
        client_fail(c, "store value for key '%.200s' is %zu bytes; the limit is 64 MiB", key, n_bytes);
        return -1;
    }
    int status;
    if (client_call(c, OP_SET, key, val, n_bytes, STORE_IO_TIMEOUT_S, &status, NULL, NULL) != 0) return -1;
    return 0;
}

void *store_get(StoreClient *c, const char *key, size_t *n_bytes, double timeout_s) {
    if (check_key(c, key) != 0) return NULL;
    unsigned char tb[8];
    uint64_t ms = timeout_s < 0 || timeout_s > 1e12 ? UINT64_MAX : (uint64_t)ceil(timeout_s * 1000.0);
    put_u64(tb, ms);
    double reply_timeout = ms == UINT64_MAX ? INFINITY : timeout_s + STORE_GET_SLACK_S;
    int status;
    unsigned char *val = NULL;
    size_t n = 0;
    if (client_call(c, OP_GET, key, tb, 8, reply_timeout, &status, &val, &n) != 0) return NULL;
    if (status != ST_OK) {
        free(val);
        client_fail(c, "timed out after %.1f s waiting for store key '%.200s'", timeout_s, key);
        return NULL;
    }
    if (n_bytes) *n_bytes = n;
    return val;
}

int store_check(StoreClient *c, const char *key) {
    if (check_key(c, key) != 0) return -1;
    int status;
    unsigned char *val = NULL;
    size_t n = 0;
    if (client_call(c, OP_CHECK, key, NULL, 0, STORE_IO_TIMEOUT_S, &status, &val, &n) != 0) return -1;
    int yes = n == 1 && val[0] == 1;
    free(val);
    return yes;
}

int store_add(StoreClient *c, const char *key, long delta, long *out) {
    if (check_key(c, key) != 0) return -1;
    unsigned char db[8];
    put_u64(db, (uint64_t)(int64_t)delta);
    int status;
    unsigned char *val = NULL;
    size_t n = 0;
    if (client_call(c, OP_ADD, key, db, 8, STORE_IO_TIMEOUT_S, &status, &val, &n) != 0) return -1;
    if (n != 8) {
        free(val);
        client_fail(c, "store ADD of key '%.200s' got a malformed reply", key);
        return -1;
    }
    if (out) *out = (long)(int64_t)get_u64(val);
    free(val);
    return 0;
}

/* The k-th arrival (counting from 1) belongs to generation (k-1)/n; the
 * n-th of a generation sets "<key>/done/<gen>", which the others wait on.
 * So one key serves any number of successive barriers of the same n. */
int store_barrier(StoreClient *c, const char *key, int n, double timeout_s) {
    if (check_key(c, key) != 0) return -1;
    if (n < 1) {
        client_fail(c, "barrier '%.200s' needs at least 1 participant (got %d)", key, n);
        return -1;
    }
    char done[STORE_KEY_MAX + 64];
    if (strlen(key) + 32 > STORE_KEY_MAX) {
        client_fail(c, "barrier key '%.200s...' is too long", key);
        return -1;
    }
    long k = 0;
    if (store_add(c, key, 1, &k) != 0) return -1;
    long gen = (k - 1) / n;
    snprintf(done, sizeof done, "%s/done/%ld", key, gen);
    if (k % n == 0) return store_set(c, done, "1", 1);
    void *v = store_get(c, done, NULL, timeout_s);
    if (v) {
        free(v);
        return 0;
    }
    long now_k = k;
    if (c->fd >= 0 && store_add(c, key, 0, &now_k) == 0) {  // a plain timeout: say how many arrived
        long arrived = now_k - gen * n;
        client_fail(c, "barrier '%.200s' timed out after %.1f s: %ld of %d participants arrived", key, timeout_s,
                    arrived > n ? (long)n : arrived, n);
    }
    return -1;
}
