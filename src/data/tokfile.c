/* tokfile.c: the token file's reader and writer (see tokfile.h).
 *
 * Readers map the file read-only and check every structural invariant
 * before handing out pointers: the header crc covers the 36 header bytes
 * before it; the body crc covers every byte after the header (offset and
 * line tables, tokens), so a damaged body is found when the file is
 * opened, not trusted because its key still matches; on top of the
 * checksum, every token id is checked against the vocabulary the caller
 * names. The writer streams: offsets from the pairs' lengths, then each
 * part's tokens copied in order, the body checksum computed on the way and
 * the header written last.
 */
#include "data/tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h" /* crc32c */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian and mapped as is: a big-endian host needs byte swapping here"
#endif

#define TOK_VERSION 2u
#define TOK_HEADER_BYTES 40
#define TOK_PAIRS_AT 12
#define TOK_KEY_AT 24
#define TOK_BODY_CRC_AT 28
#define TOK_HEADER_CRC_AT 36
static const char TOK_MAGIC[8] = {'T', 'P', 'T', 'O', 'K', 0, 0, 1};

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ---- reading ------------------------------------------------------------------ */

static int token_file_map(TokenFile *tf, const char *path, int vocab_size, bool check_body, char *err, size_t err_len) {
    memset(tf, 0, sizeof *tf);
    uint64_t file_bytes = 0;
    char why[PATH_MAX + 128];
    int fd = tp_open_regular(path, &file_bytes, why, sizeof why);
    if (fd < 0) {
        tp_error_set(err, err_len, "token file %s", why);
        return -1;
    }
    if (file_bytes < TOK_HEADER_BYTES) {
        tp_error_set(err, err_len, "token file %s is truncated: %llu bytes, shorter than its %d-byte header", path,
                     (unsigned long long)file_bytes, TOK_HEADER_BYTES);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        tp_error_set(err, err_len, "cannot map token file %s: %s", path, strerror(errno));
        return -1;
    }
    const uint8_t *b = map;
#define TOK_FAIL(...)                                   \
    do {                                                \
        tp_error_set(err, err_len, __VA_ARGS__);        \
        munmap(map, (size_t)file_bytes);                \
        return -1;                                      \
    } while (0)
    if (memcmp(b, TOK_MAGIC, 8) != 0) TOK_FAIL("%s is not a token file (bad magic)", path);
    const uint32_t version = get_u32(b + 8);
    if (version != TOK_VERSION)
        TOK_FAIL("token file %s has format version %u, this build reads version %u", path, version, TOK_VERSION);
    if (get_u32(b + TOK_HEADER_CRC_AT) != crc32c(0, b, TOK_HEADER_CRC_AT))
        TOK_FAIL("token file %s has a damaged header (checksum mismatch)", path);
    const uint64_t n_pairs = get_u32(b + TOK_PAIRS_AT);
    const uint64_t n_tokens = get_u64(b + 16);
    if (n_pairs > (uint64_t)INT_MAX)
        TOK_FAIL("token file %s claims %llu pairs, too many", path, (unsigned long long)n_pairs);
    const uint64_t table_bytes = TOK_HEADER_BYTES + 16 * (n_pairs + 1) + 4 * n_pairs;
    if (n_tokens > file_bytes / 4 || table_bytes + 4 * n_tokens != file_bytes)
        TOK_FAIL("token file %s is %llu bytes but its header (%llu pairs, %llu tokens) implies %s%llu", path,
                 (unsigned long long)file_bytes, (unsigned long long)n_pairs, (unsigned long long)n_tokens,
                 n_tokens > file_bytes / 4 ? "more than " : "",
                 (unsigned long long)(n_tokens > file_bytes / 4 ? file_bytes : table_bytes + 4 * n_tokens));
    const uint32_t body_crc = check_body ? crc32c(0, b + TOK_HEADER_BYTES, (size_t)file_bytes - TOK_HEADER_BYTES) : 0;
    if (check_body && body_crc != get_u32(b + TOK_BODY_CRC_AT))
        TOK_FAIL("token file %s has a damaged body (checksum %08x, the header says %08x)", path, body_crc,
                 get_u32(b + TOK_BODY_CRC_AT));
    const uint64_t *en_off = (const uint64_t *)(b + TOK_HEADER_BYTES);
    const uint64_t *ja_off = en_off + n_pairs + 1;
    const uint32_t *line = (const uint32_t *)(ja_off + n_pairs + 1);
    const int32_t *tokens = (const int32_t *)(line + n_pairs);
    if (en_off[0] != 0 || ja_off[0] != en_off[n_pairs] || ja_off[n_pairs] != n_tokens)
        TOK_FAIL("token file %s has inconsistent offsets (en %llu..%llu, ja %llu..%llu, %llu tokens)", path,
                 (unsigned long long)en_off[0], (unsigned long long)en_off[n_pairs],
                 (unsigned long long)ja_off[0], (unsigned long long)ja_off[n_pairs],
                 (unsigned long long)n_tokens);
    for (uint64_t i = 0; i < n_pairs; i++) {
        if (en_off[i + 1] < en_off[i] || ja_off[i + 1] < ja_off[i])
            TOK_FAIL("token file %s: offsets of pair %llu are not monotone", path, (unsigned long long)i);
        if (line[i] == 0 || (i > 0 && line[i] <= line[i - 1]))
            TOK_FAIL("token file %s: source line numbers are not increasing at pair %llu", path,
                     (unsigned long long)i);
    }
    /* one unsigned comparison a token (negative ids wrap above any size); the loop vectorizes */
    uint32_t outside = 0;
    for (uint64_t i = 0; check_body && i < n_tokens; i++) outside |= (uint32_t)tokens[i] >= (uint32_t)vocab_size;
    for (uint64_t i = 0; outside && i < n_tokens; i++) {
        if (tokens[i] < 0)
            TOK_FAIL("token file %s: token %llu has negative id %d", path, (unsigned long long)i, tokens[i]);
        if (tokens[i] >= vocab_size)
            TOK_FAIL("token file %s: token %llu has id %d, outside the vocabulary of %d pieces", path,
                     (unsigned long long)i, tokens[i], vocab_size);
    }
#undef TOK_FAIL
    *tf = (TokenFile){.n_pairs = (int)n_pairs, .en_off = en_off, .ja_off = ja_off, .line = line, .tokens = tokens,
                      .n_tokens = n_tokens, .key = get_u32(b + TOK_KEY_AT), .map = map,
                      .map_bytes = (size_t)file_bytes};
    return 0;
}

void token_file_close(TokenFile *tf) {
    if (tf->map) munmap(tf->map, tf->map_bytes);
    memset(tf, 0, sizeof *tf);
}

int token_file_open(TokenFile *tf, const char *path, int vocab_size, char *err, size_t err_len) {
    return token_file_map(tf, path, vocab_size, true, err, err_len);
}

int token_file_open_checked(TokenFile *tf, const char *path, int vocab_size, char *err, size_t err_len) {
    return token_file_map(tf, path, vocab_size, false, err, err_len);
}

int token_file_header(const char *path, uint32_t *key, uint32_t *n_pairs, char *err, size_t err_len) {
    uint8_t hdr[TOK_HEADER_BYTES];
    char why[PATH_MAX + 128];
    const int fd = tp_open_regular(path, NULL, why, sizeof why);  // never waits on a named pipe
    const ssize_t got = fd >= 0 ? pread(fd, hdr, sizeof hdr, 0) : -1;
    if (fd >= 0) close(fd);
    if (fd < 0) {
        tp_error_set(err, err_len, "token file %s", why);
        return -1;
    }
    if (got != (ssize_t)sizeof hdr || memcmp(hdr, TOK_MAGIC, 8) != 0 || get_u32(hdr + 8) != TOK_VERSION ||
        get_u32(hdr + TOK_HEADER_CRC_AT) != crc32c(0, hdr, TOK_HEADER_CRC_AT)) {
        tp_error_set(err, err_len, "%s has no valid token file header", path);
        return -1;
    }
    *key = get_u32(hdr + TOK_KEY_AT);
    *n_pairs = get_u32(hdr + TOK_PAIRS_AT);
    return 0;
}

/* ---- writing ------------------------------------------------------------------ */

#define COPY_BYTES (4u << 20)

/* Writes n bytes and adds them to the body checksum. */
static int body_write(AtomicFile *af, uint32_t *crc, const void *p, size_t n, char *err, size_t err_len) {
    *crc = crc32c(*crc, p, n);
    return atomic_file_write(af, p, n, err, err_len);
}

/* The running offsets of one side, starting at `base`, n + 1 of them. */
static int write_offsets(AtomicFile *af, uint32_t *crc, const uint32_t *len, long n, uint64_t base, uint64_t *buf,
                         size_t cap, char *err, size_t err_len) {
    uint64_t at = base;
    size_t k = 0;
    for (long i = 0; i <= n; i++) {
        buf[k++] = at;
        if (i < n) at += len[i];
        if (k == cap || i == n) {
            if (body_write(af, crc, buf, k * sizeof *buf, err, err_len) != 0) return -1;
            k = 0;
        }
    }
    return 0;
}

/* Appends the file at path, whose size must be want bytes. */
static int copy_part(AtomicFile *af, uint32_t *crc, const char *path, uint64_t want, void *buf, char *err,
                     size_t err_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tp_error_set(err, err_len, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    uint64_t done = 0;
    for (;;) {
        ssize_t got = read(fd, buf, COPY_BYTES);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            tp_error_set(err, err_len, "cannot read %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (got == 0) break;
        done += (uint64_t)got;
        if (body_write(af, crc, buf, (size_t)got, err, err_len) != 0) {
            close(fd);
            return -1;
        }
    }
    close(fd);
    if (done != want) {
        tp_error_set(err, err_len, "%s holds %llu bytes of tokens, %llu expected", path, (unsigned long long)done,
                     (unsigned long long)want);
        return -1;
    }
    return 0;
}

int token_file_assemble(const char *path, uint32_t key, const TokenPieces *p, char *err, size_t err_len) {
    const long n = p->n_pairs;
    if (n < 0 || n > INT_MAX) {
        tp_error_set(err, err_len, "%s: %ld pairs do not fit a token file", path, n);
        return -1;
    }
    uint64_t n_en = 0, n_ja = 0;
    for (long i = 0; i < n; i++) n_en += p->en_len[i], n_ja += p->ja_len[i];
    /* every part's byte count, from the lengths of the pairs it holds, is checked as it is copied */
    AtomicFile af;
    if (atomic_file_open(&af, path, true, err, err_len) != 0) return -1;
    uint8_t hdr[TOK_HEADER_BYTES];
    memset(hdr, 0, sizeof hdr);
    void *buf = TP_MALLOC(COPY_BYTES);
    uint32_t crc = 0;
    int rc = -1;
    if (atomic_file_write(&af, hdr, sizeof hdr, err, err_len) != 0 ||
        write_offsets(&af, &crc, p->en_len, n, 0, buf, COPY_BYTES / 8, err, err_len) != 0 ||
        write_offsets(&af, &crc, p->ja_len, n, n_en, buf, COPY_BYTES / 8, err, err_len) != 0 ||
        body_write(&af, &crc, p->line, (size_t)n * sizeof *p->line, err, err_len) != 0)
        goto done;
    for (int side = 0; side < 2; side++)
        for (int k = 0; k < p->n_parts; k++) {
            struct stat st;
            const char *part = side == 0 ? p->en_path[k] : p->ja_path[k];
            if (stat(part, &st) != 0) {
                tp_error_set(err, err_len, "cannot read %s: %s", part, strerror(errno));
                goto done;
            }
            if (copy_part(&af, &crc, part, (uint64_t)st.st_size, buf, err, err_len) != 0) goto done;
        }
    memcpy(hdr, TOK_MAGIC, 8);
    put_u32(hdr + 8, TOK_VERSION);
    put_u32(hdr + 12, (uint32_t)n);
    put_u64(hdr + 16, n_en + n_ja);
    put_u32(hdr + TOK_KEY_AT, key);
    put_u32(hdr + TOK_BODY_CRC_AT, crc);
    put_u32(hdr + TOK_HEADER_CRC_AT, crc32c(0, hdr, TOK_HEADER_CRC_AT));
    if (pwrite(af.fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) {
        tp_error_set(err, err_len, "%s: writing its header failed (%s)", path, strerror(errno));
        goto done;
    }
    rc = atomic_file_commit(&af, err, err_len);
done:
    if (rc != 0) atomic_file_abort(&af);  // nothing left when a write or the commit failed already
    free(buf);
    return rc;
}
