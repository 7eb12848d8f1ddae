/* store_client.c: the job's TCP key-value store, its client side (in the
 * workers and in the tprun agents of other nodes: store_connect and the
 * calls of store.h). Clients are plain blocking request/reply with every
 * wait bounded by poll().
 *
 * A client is one socket: use one StoreClient per thread. After any I/O
 * error or timeout mid-reply the stream is out of step, so the client
 * closes it and every later call fails with that reason.
 *
 * Calls: store_internal.h (the wire format), POSIX sockets, common/.
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
#include "tp/store_internal.h"

#define STORE_IO_TIMEOUT_S 120.0  // bound on a reply that needs no waiting (SET, CHECK, ADD)
#define STORE_GET_SLACK_S 30.0    // the server answers a GET at its deadline; allow this on top

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
