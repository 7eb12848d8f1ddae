/* store_server.c: the job's TCP key-value store, its server side (run by
 * tprun: store_server_start / store_server_stop of store.h).
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
 * Calls: store_internal.h (the wire format), POSIX sockets and threads, common/.
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "tp/store_internal.h"

#define STORE_AUTH_WINDOW_S 1.0   // an unauthenticated connection lives this long at most
#define STORE_MAX_UNAUTHED 64      // unauthenticated connections held at once (well below any fd limit)
#define STORE_EVICT_AGE_S 0.1      // at the cap, the oldest is dropped for a newcomer once this old
#define STORE_ACCEPT_PAUSE_S 0.1   // accept() out of descriptors: stop accepting this long
#define STORE_DROP_MSG "not authenticated in time; connect again"
#define N_BUCKETS 1024

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

/* One recv into buf[*got .. want) of c: 1 when those bytes are all there,
 * 0 when more are to come (read again), -1 when there is nothing to read
 * now or the connection closed (conn_close). */
static int conn_recv(Conn *c, unsigned char *buf, size_t want, size_t *got) {
    ssize_t r = recv(c->fd, buf + *got, want - *got, 0);
    if (r < 0 && errno == EINTR) return 0;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    if (r <= 0) {
        conn_close(c);
        return -1;
    }
    *got += (size_t)r;
    return *got == want;
}

/* Reads what is available; handles a request once complete. A connection
 * with a reply pending or a parked GET reads nothing more until done. */
static void conn_read(StoreServer *s, Conn *c) {
    while (c->fd >= 0 && !c->out && !c->waiting) {
        if (c->hdr_got < HDR_BYTES) {
            const int whole = conn_recv(c, c->hdr, HDR_BYTES, &c->hdr_got);
            if (whole < 0) return;
            if (!whole) continue;
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
            const int whole = conn_recv(c, c->body, need, &c->body_got);
            if (whole < 0) return;
            if (!whole) continue;
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
