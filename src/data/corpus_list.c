/* corpus_list.c: --data's list of corpora (see corpus_list.h). */
#include "data/corpus_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "parse.h"

/* One item "DIR[:COPIES]" of length len into slot k. */
static int parse_item(const char *item, size_t len, CorpusList *out, int k, char *err, size_t err_len) {
    size_t dir_len = len;
    int copies = 1;
    const char *colon = NULL;
    for (size_t i = len; i-- > 0;)
        if (item[i] == ':') {
            colon = item + i;
            break;
        }
    const size_t digits = colon ? (size_t)(item + len - colon - 1) : 0;
    if (digits > 0 && strspn(colon + 1, "0123456789") >= digits) {
        char num[32] = {0}, why[128];
        long v = -1;
        if (digits < sizeof num) parse_int("copies", memcpy(num, colon + 1, digits), 1, DATASET_MAX_COPIES, &v, why,
                                           sizeof why);
        if (v < 1) {
            tp_error_set(err, err_len, "--data item %d (%.*s): the copies after ':' must be 1 to %d", k + 1, (int)len,
                         item, DATASET_MAX_COPIES);
            return -1;
        }
        copies = (int)v;
        dir_len = (size_t)(colon - item);
    }
    if (dir_len == 0) {
        tp_error_set(err, err_len, "--data item %d is an empty folder name", k + 1);
        return -1;
    }
    if (dir_len >= sizeof out->dir[k]) {
        tp_error_set(err, err_len, "--data item %d: the folder name is longer than %zu characters", k + 1,
                     sizeof out->dir[k] - 1);
        return -1;
    }
    memcpy(out->dir[k], item, dir_len);
    out->dir[k][dir_len] = '\0';
    out->copies[k] = copies;
    for (int j = 0; j < k; j++)
        if (strcmp(out->dir[j], out->dir[k]) == 0) {
            tp_error_set(err, err_len, "--data names %s twice (give it copies instead: %s:2)", out->dir[k],
                         out->dir[k]);
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
        if (parse_item(p, len, out, out->n, err, err_len) != 0) return -1;
        out->n++;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}
