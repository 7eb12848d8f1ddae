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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void pathf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    TP_CHECK(k >= 0 && (size_t)k < n, "path too long: %s...", out);
}

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

int write_all_fd(int fd, const void *buf, size_t n_bytes) {
    const char *p = buf;
    while (n_bytes > 0) {
        ssize_t k = write(fd, p, n_bytes);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) {
            errno = EIO;
            return -1;
        }
        p += k;
        n_bytes -= (size_t)k;
    }
    return 0;
}

static char *str_concat(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    char *out = TP_MALLOC(n + k + 1);
    memcpy(out, s, n);
    memcpy(out + n, suffix, k + 1);
    return out;
}

/* Ends f after a failure (err already set): the temporary goes. */
static int atomic_file_fail(AtomicFile *f) {
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp);
    free(f->path);
    free(f->tmp);
    *f = (AtomicFile){.fd = -1};
    return -1;
}

void atomic_file_abort(AtomicFile *f) {
    if (f->path) atomic_file_fail(f);
}

int atomic_file_open(AtomicFile *f, const char *path, bool per_process, char *err, size_t err_len) {
    char suffix[32];
    if (per_process) snprintf(suffix, sizeof suffix, ".tmp.%ld", (long)getpid());
    else snprintf(suffix, sizeof suffix, ".tmp");
    *f = (AtomicFile){.path = str_concat(path, ""), .tmp = str_concat(path, suffix)};
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f->fd < 0) {
        tp_error_set(err, err_len, "%s: cannot create %s (%s)", path, f->tmp, strerror(errno));
        free(f->path);
        free(f->tmp);  // not created here: whatever holds that name stays
        *f = (AtomicFile){.fd = -1};
        return -1;
    }
    return 0;
}

int atomic_file_write(AtomicFile *f, const void *data, size_t n_bytes, char *err, size_t err_len) {
    if (write_all_fd(f->fd, data, n_bytes) == 0) return 0;
    tp_error_set(err, err_len, "%s: writing %s failed (%s)", f->path, f->tmp, strerror(errno));
    return atomic_file_fail(f);
}

int atomic_file_commit(AtomicFile *f, char *err, size_t err_len) {
    if (fsync(f->fd) != 0) {
        tp_error_set(err, err_len, "%s: fsync of %s failed (%s)", f->path, f->tmp, strerror(errno));
        return atomic_file_fail(f);
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        tp_error_set(err, err_len, "%s: closing %s failed (%s)", f->path, f->tmp, strerror(errno));
        return atomic_file_fail(f);
    }
    if (rename(f->tmp, f->path) != 0) {
        tp_error_set(err, err_len, "%s: renaming %s into place failed (%s)", f->path, f->tmp, strerror(errno));
        return atomic_file_fail(f);
    }
    free(f->path);
    free(f->tmp);
    *f = (AtomicFile){.fd = -1};
    return 0;
}

int write_file_atomic(const char *path, const void *data, size_t n_bytes, char *err, size_t err_len) {
    AtomicFile f;
    if (atomic_file_open(&f, path, false, err, err_len) != 0 || atomic_file_write(&f, data, n_bytes, err, err_len) != 0)
        return -1;
    return atomic_file_commit(&f, err, err_len);
}

int copy_file_atomic(const char *from, const char *to, char *err, size_t err_len) {
    size_t n = 0;
    void *bytes = read_file_bytes(from, &n, err, err_len);
    if (!bytes) return -1;
    int rc = write_file_atomic(to, bytes, n, err, err_len);
    free(bytes);
    return rc;
}

int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* The folder that holds path ("." for a bare name), malloc'd. */
static char *parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return str_concat(".", "");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = TP_MALLOC(n + 1);
    memcpy(dir, path, n);
    dir[n] = '\0';
    return dir;
}

int check_writable_path(const char *path, char *err, size_t err_len) {
    char *dir = parent_dir(path);
    struct stat sb;
    int rc = 0;
    if (stat(dir, &sb) != 0) {
        tp_error_set(err, err_len, "%s: its folder %s cannot be used (%s)", path, dir, strerror(errno));
        rc = -1;
    } else if (!S_ISDIR(sb.st_mode)) {
        tp_error_set(err, err_len, "%s: %s is not a folder", path, dir);
        rc = -1;
    } else if (access(dir, W_OK | X_OK) != 0) {
        tp_error_set(err, err_len, "%s: its folder %s is not writable (%s)", path, dir, strerror(errno));
        rc = -1;
    } else if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        tp_error_set(err, err_len, "%s is a folder, not a file", path);
        rc = -1;
    }
    free(dir);
    return rc;
}

int fsync_parent_dir(const char *path) {
    char *dir = parent_dir(path);
    int rc = fsync_path(dir);
    int saved = errno;
    free(dir);
    errno = saved;
    /* some file systems cannot fsync a folder; nothing more can be done there */
    if (rc != 0 && errno == EINVAL) rc = 0;
    return rc;
}

bool paths_same(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    while (na > 1 && a[na - 1] == '/') na--;
    while (nb > 1 && b[nb - 1] == '/') nb--;
    if (na == nb && strncmp(a, b, na) == 0) return true;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
