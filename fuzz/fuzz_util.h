/* fuzz_util.h: what every fuzz target shares. The readers under test take a
 * path (they are the project's file readers: open, stat, read or map), so
 * each input is written to a file in a private temporary folder first. An
 * invariant that fails calls fuzz_fail(), which aborts: libFuzzer then keeps
 * the input as a crash. */
#ifndef TPTRAIN_FUZZ_UTIL_H
#define TPTRAIN_FUZZ_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The private folder, created once per process (removed by the OS's tmp
 * cleaning; fuzz.sh runs each target with TMPDIR inside its build folder). */
static const char *fuzz_dir(void) {
    static char dir[512];
    if (!dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/tptrain-fuzz.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

/* dir/name holding exactly data[0..size). The path is static storage. */
static const char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
    static char path[640];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            perror(path);
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
    return path;
}

#define fuzz_fail(...)                                              \
    do {                                                            \
        fprintf(stderr, "fuzz invariant failed: " __VA_ARGS__);    \
        fprintf(stderr, "\n");                                      \
        abort();                                                    \
    } while (0)

#endif
