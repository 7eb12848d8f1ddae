/* fileio.c: whole-file reads that never block on a FIFO, atomic writes.
 *
 * open(2) of a FIFO for reading blocks until a writer appears, and read(2)
 * of one blocks until data comes: a named pipe left where a manifest or a
 * corpus file should be would hang the program. O_NONBLOCK makes the open
 * return at once; fstat then tells what was opened, and only a regular file
 * is read (with blocking mode restored: regular files never block anyway).
 */
#define _POSIX_C_SOURCE 200809L

#include "fileio.h"
#include "err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a named pipe";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

int tp_open_regular(const char *path, uint64_t *n_bytes, char *err, size_t err_len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        tp_error_set(err, err_len, "%s: cannot open file (%s)", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        tp_error_set(err, err_len, "%s: cannot stat (%s)", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        tp_error_set(err, err_len, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
        close(fd);
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        tp_error_set(err, err_len, "%s: cannot set blocking mode (%s)", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (n_bytes) *n_bytes = (uint64_t)st.st_size;
    return fd;
}

void *read_file_bytes_max(const char *path, size_t max_bytes, size_t *n_bytes, char *err, size_t err_len) {
    uint64_t size = 0;
    int fd = tp_open_regular(path, &size, err, err_len);
    if (fd < 0) return NULL;
    if (size >= SIZE_MAX || (max_bytes > 0 && size > max_bytes)) {
        tp_error_set(err, err_len, "%s: %llu bytes, more than the %zu this file may hold", path,
                     (unsigned long long)size, max_bytes > 0 ? max_bytes : SIZE_MAX - 1);
        close(fd);
        return NULL;
    }
    const size_t n = (size_t)size;
    char *buf = malloc(n + 1);
    if (!buf) {
        tp_error_set(err, err_len, "%s: cannot allocate %zu bytes to read it", path, n + 1);
        close(fd);
        return NULL;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k < 0)
                tp_error_set(err, err_len, "%s: read error after %zu of %zu bytes (%s)", path, got, n,
                             strerror(errno));
            else
                tp_error_set(err, err_len, "%s: file shrank to %zu bytes while being read (expected %zu)", path,
                             got, n);
            free(buf);
            close(fd);
            return NULL;
        }
        got += (size_t)k;
    }
    close(fd);
    buf[n] = '\0';
    if (n_bytes) *n_bytes = n;
    return buf;
}

void *read_file_bytes(const char *path, size_t *n_bytes, char *err, size_t err_len) {
    return read_file_bytes_max(path, 0, n_bytes, err, err_len);
}

char *read_text_file(const char *path, char *err, size_t err_len) { return read_file_bytes(path, NULL, err, err_len); }

int write_file_atomic(const char *path, const void *data, size_t n_bytes, char *err, size_t err_len) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        tp_error_set(err, err_len, "%s: path too long", path);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        tp_error_set(err, err_len, "%s: cannot create (%s)", tmp, strerror(errno));
        return -1;
    }
    const char *p = data;
    size_t left = n_bytes;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            tp_error_set(err, err_len, "%s: write failed (%s)", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        tp_error_set(err, err_len, "%s: cannot finish writing (%s)", path, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        tp_error_set(err, err_len, "%s: cannot finish writing (%s)", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int copy_file_atomic(const char *from, const char *to, char *err, size_t err_len) {
    size_t n = 0;
    void *bytes = read_file_bytes(from, &n, err, err_len);
    if (!bytes) return -1;
    int rc = write_file_atomic(to, bytes, n, err, err_len);
    free(bytes);
    return rc;
}
