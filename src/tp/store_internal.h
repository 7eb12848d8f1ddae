/* store_internal.h: what the store's server (store_server.c) and client
 * (store_client.c) share: the wire format and its bounds. Private to the
 * store; nothing else includes it.
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
 */
#ifndef TPTRAIN_STORE_INTERNAL_H
#define TPTRAIN_STORE_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include "clock.h"

enum { OP_AUTH = 1, OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_ADD = 5 };
enum { ST_OK = 0, ST_MISSING = 1, ST_BAD = 2 };

#define HDR_BYTES 16
#define STORE_KEY_MAX 1024
#define STORE_VAL_MAX ((uint64_t)64 << 20)
#define STORE_TOKEN_MAX 256

static inline void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Milliseconds until deadline for poll(): -1 = no deadline, rounded up so
 * a wake-up never comes early and spins. */
static inline int ms_until(double deadline) {
    if (isinf(deadline)) return -1;
    double ms = ceil((deadline - tp_now_s()) * 1000.0);
    if (ms <= 0) return 0;
    if (ms > 1e9) return 1000000000;
    return (int)ms;
}

#endif
