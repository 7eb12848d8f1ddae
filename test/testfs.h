/* testfs.h: file helpers shared by the tests that damage files on purpose:
 * whole-file read and write, and a scratch directory removed at the end. */
#ifndef TPTRAIN_TEST_TESTFS_H
#define TPTRAIN_TEST_TESTFS_H
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static inline bool write_bytes(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return false;
    bool ok = (n == 0 || fwrite(buf, 1, n, fp) == n);
    return fclose(fp) == 0 && ok;
}

/* Whole file (caller frees) or NULL. */
static inline uint8_t *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    size_t got = buf ? fread(buf, 1, (size_t)len, fp) : 0;
    fclose(fp);
    if (!buf || got != (size_t)len) {
        free(buf);
        return NULL;
    }
    *n = got;
    return buf;
}

/* A fresh scratch directory /tmp/NAME.XXXXXX into dir (len bytes); false,
 * with the reason on stderr, when it cannot be made. */
static inline bool make_scratch_dir(char *dir, size_t len, const char *name) {
    snprintf(dir, len, "/tmp/%s.XXXXXX", name);
    if (mkdtemp(dir)) return true;
    perror("mkdtemp");
    return false;
}

/* Removes dir and the plain files in it, one level of subdirectories deep. */
static inline void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}
#endif
