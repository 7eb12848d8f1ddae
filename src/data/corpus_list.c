/* corpus_list.c: --data's list of corpora (see corpus_list.h). */
#include "data/corpus_list.h"

#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "parse.h"

/* Whether path names an existing folder (through any symlink). */
static bool is_folder(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The copies after an item's last ':' (len bytes of digits or not): 0 and
 * *copies set, or -1 + err naming the item. */
static int parse_copies(const char *item, size_t len, const char *num, size_t digits, int k, int *copies,
                        char *err, size_t err_len) {
    char buf[32] = {0}, why[128];
    long v = -1;
    if (digits > 0 && digits < sizeof buf && strspn(num, "0123456789") >= digits)
        parse_int("copies", memcpy(buf, num, digits), 1, DATASET_MAX_COPIES, &v, why, sizeof why);
    if (v < 1) {
        tp_error_set(err, err_len, "--data item %d (%.*s): the copies after ':' must be 1 to %d", k + 1, (int)len,
                     item, DATASET_MAX_COPIES);
        return -1;
    }
    *copies = (int)v;
    return 0;
}

/* One item "DIR[:COPIES]" of length len into slot k. The last ':' starts
 * the copies, unless the whole item names an existing folder. */
static int parse_item(const char *item, size_t len, CorpusList *out, int k, char *err, size_t err_len) {
    if (len >= sizeof out->dir[k]) {
        tp_error_set(err, err_len, "--data item %d: the folder name is longer than %zu characters", k + 1,
                     sizeof out->dir[k] - 1);
        return -1;
    }
    memcpy(out->dir[k], item, len);
    out->dir[k][len] = '\0';
    out->copies[k] = 1;
    const char *colon = strrchr(out->dir[k], ':');
    const size_t digits = colon ? strlen(colon + 1) : 0;
    if (colon && !(strspn(colon + 1, "0123456789") != digits && is_folder(out->dir[k]))) {
        if (parse_copies(item, len, colon + 1, digits, k, &out->copies[k], err, err_len) != 0) return -1;
        out->dir[k][colon - out->dir[k]] = '\0';
    }
    if (out->dir[k][0] == '\0') {
        tp_error_set(err, err_len, "--data item %d is an empty folder name", k + 1);
        return -1;
    }
    return 0;
}

/* A folder named twice, whatever the spelling (C, C/, ./C, a link to C):
 * the same device and inode. A folder that cannot be stat'ed is compared
 * by name (reading it fails later, naming it). 0, or -1 + err. */
static int refuse_twice(const CorpusList *out, int k, char *err, size_t err_len) {
    struct stat a, b;
    const bool a_ok = stat(out->dir[k], &a) == 0;
    for (int j = 0; j < k; j++) {
        const bool same_name = strcmp(out->dir[j], out->dir[k]) == 0;
        if (!same_name && !(a_ok && stat(out->dir[j], &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino))
            continue;
        if (same_name)
            tp_error_set(err, err_len, "--data names %s twice (give it copies instead: %s:2)", out->dir[k],
                         out->dir[k]);
        else
            tp_error_set(err, err_len, "--data names one folder twice: %s and %s are the same folder (give it "
                         "copies instead: %s:2)", out->dir[j], out->dir[k], out->dir[j]);
        return -1;
    }
    return 0;
}

int corpus_list_parse(const char *spec, CorpusList *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (!spec || !spec[0]) {
        tp_error_set(err, err_len, "--data is empty");
        return -1;
    }
    for (const char *p = spec;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (out->n == DATASET_MAX_CORPORA) {
            tp_error_set(err, err_len, "--data names more than %d corpora", DATASET_MAX_CORPORA);
            return -1;
        }
        if (parse_item(p, len, out, out->n, err, err_len) != 0 || refuse_twice(out, out->n, err, err_len) != 0)
            return -1;
        out->n++;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}
