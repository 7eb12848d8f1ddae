/* text_lines.c: see text_lines.h. One buffer per reader (4 MiB, doubled
 * when a single line is longer); a line is cut in place. */
#include "data/text_lines.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h" /* crc32c */

#define LINE_READER_BUF (4u << 20)

int line_reader_open(LineReader *r, const char *path, uint64_t at, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    if (snprintf(r->path, sizeof r->path, "%s", path) >= (int)sizeof r->path) {
        tp_error_set(err, err_len, "path too long: %s", path);
        return -1;
    }
    r->fd = tp_open_regular(path, &r->size, err, err_len);  // a named pipe is refused, never waited on
    if (r->fd < 0) {
        line_reader_close(r);
        return -1;
    }
    if (at > r->size || (at > 0 && lseek(r->fd, (off_t)at, SEEK_SET) != (off_t)at)) {
        tp_error_set(err, err_len, "cannot seek %s to byte %llu", path, (unsigned long long)at);
        line_reader_close(r);
        return -1;
    }
    posix_fadvise(r->fd, (off_t)at, 0, POSIX_FADV_SEQUENTIAL);
    r->buf_at = at;
    r->hashing = at == 0;
    r->crc = crc32c(0, &r->size, sizeof r->size);
    r->cap = LINE_READER_BUF;
    r->buf = TP_MALLOC(r->cap + 1);
    return 0;
}

/* Reads more bytes after buf[end), moving the unread ones to the front
 * (growing the buffer when they fill it). 0, or -1 + err. */
static int refill(LineReader *r, char *err, size_t err_len) {
    if (r->beg > 0) {
        memmove(r->buf, r->buf + r->beg, r->end - r->beg);
        r->buf_at += r->beg;
        r->end -= r->beg;
        r->beg = 0;
    }
    if (r->end == r->cap) {
        r->cap *= 2;
        char *p = realloc(r->buf, r->cap + 1);
        TP_CHECK(p != NULL, "out of memory: a line of %s is longer than %zu bytes", r->path, r->cap / 2);
        r->buf = p;
    }
    ssize_t got;
    do got = read(r->fd, r->buf + r->end, r->cap - r->end);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
        tp_error_set(err, err_len, "cannot read %s: %s", r->path, strerror(errno));
        return -1;
    }
    if (r->hashing) r->crc = crc32c(r->crc, r->buf + r->end, (size_t)got);
    r->end += (size_t)got;
    r->n_read += (uint64_t)got;
    if (got == 0) {
        r->eof = true;
        if (r->hashing && r->n_read != r->size) {
            tp_error_set(err, err_len, "%s changed while it was read (%llu bytes when opened, %llu read)", r->path,
                         (unsigned long long)r->size, (unsigned long long)r->n_read);
            return -1;
        }
    }
    return 0;
}

int line_reader_next(LineReader *r, char **line, size_t *len, char *err, size_t err_len) {
    for (;;) {
        char *p = r->buf + r->beg;
        const size_t avail = r->end - r->beg;
        char *nl = avail ? memchr(p, '\n', avail) : NULL;
        if (nl || (r->eof && avail > 0)) {
            char *stop = nl ? nl : r->buf + r->end;
            r->beg = nl ? (size_t)(nl - r->buf) + 1 : r->end;
            if (stop > p && stop[-1] == '\r') {
                stop--;
                r->n_crlf++;
            }
            *stop = '\0';
            *line = p;
            *len = (size_t)(stop - p);
            return 1;
        }
        if (r->eof) return 0;
        if (refill(r, err, err_len) != 0) return -1;
    }
}

uint64_t line_reader_tell(const LineReader *r) { return r->buf_at + r->beg; }

uint32_t line_reader_crc(const LineReader *r) { return r->crc; }

void line_reader_close(LineReader *r) {
    if (r->fd >= 0) close(r->fd);
    free(r->buf);
    r->buf = NULL;
    r->fd = -1;
}

const char *utf8_invalid(const uint8_t *s, size_t n, size_t *bad_at) {
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        *bad_at = i;
        if (c < 0x80) {
            if (c == 0) return "NUL byte";
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min_cp;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2, cp = c & 0x1Fu, min_cp = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0Fu, min_cp = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4, cp = c & 0x07u, min_cp = 0x10000;
        } else if (c == 0xC0 || c == 0xC1) {
            return "overlong encoding";
        } else if (c < 0xC0) {
            return "continuation byte without a lead byte";
        } else if (c <= 0xF7) {
            return "code point above U+10FFFF";
        } else {
            return "byte that never occurs in UTF-8";
        }
        for (size_t k = 1; k < len; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return "truncated sequence";
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if (cp < min_cp) return "overlong encoding";
        if (cp >= 0xD800 && cp <= 0xDFFF) return "UTF-16 surrogate";
        if (cp > 0x10FFFF) return "code point above U+10FFFF";
        i += len;
    }
    return NULL;
}
