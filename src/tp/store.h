/* store.h: the TCP key-value store that tprun hosts and the workers use to
 * rendezvous (exchange addresses, shared-memory names, NCCL ids, and the
 * job's failure flag).
 *
 * Every connection must present the job token (TPRUN_TOKEN in the
 * workers' environment) in its first message; a connection without it, or
 * with another token, is refused and closed. One that has not sent it
 * within a second is dropped, and only a bounded number of unauthenticated
 * connections is held at once, so idle sockets cannot starve the job (see
 * store.c). Values are byte strings.
 */
#ifndef TPTRAIN_STORE_H
#define TPTRAIN_STORE_H

#include <stddef.h>

/* ---- server (in tprun) ---- */
typedef struct StoreServer StoreServer;
/* Listens on addr:port (port 0 = any free port; *bound_port receives it).
 * Serves from a background thread. NULL + err on failure. */
StoreServer *store_server_start(const char *addr, int port, const char *token, int *bound_port, char *err,
                                size_t err_len);
void store_server_stop(StoreServer *s);

/* ---- client (in workers, and in tprun agents of other nodes) ---- */
typedef struct StoreClient StoreClient;
/* Connects (retrying until timeout_s) and authenticates. NULL + err. */
StoreClient *store_connect(const char *host, int port, const char *token, double timeout_s, char *err,
                           size_t err_len);
void store_close(StoreClient *c);
int store_set(StoreClient *c, const char *key, const void *val, size_t n_bytes);
/* Waits until key exists (up to timeout_s), then returns a malloc'ed copy
 * (NUL-terminated for convenience) and its size; NULL on timeout/error. */
void *store_get(StoreClient *c, const char *key, size_t *n_bytes, double timeout_s);
/* Non-blocking: 1 when key exists, 0 when not, -1 on error. */
int store_check(StoreClient *c, const char *key);
/* Atomic add on an integer counter key (created at 0); returns the new value
 * via *out. 0 or -1. */
int store_add(StoreClient *c, const char *key, long delta, long *out);
/* Barrier over n participants named by key: every caller adds 1, then waits
 * until the count reaches n. 0, or -1 on timeout. */
int store_barrier(StoreClient *c, const char *key, int n, double timeout_s);
const char *store_error(const StoreClient *c);

#endif
