/* json_keys.c: duplicate keys in a parsed JSON tree (json_keys.h says why). */
#include "json_keys.h"

#include <stdio.h>
#include <string.h>

#include "err.h"

/* The path of a child: parent "." key for an object member, parent "[i]" for an array element. */
static void child_path(char *out, size_t len, const char *parent, const cJSON *child, int index) {
    if (child->string) snprintf(out, len, "%s%s%s", parent, parent[0] ? "." : "", child->string);
    else snprintf(out, len, "%s[%d]", parent, index);
}

static bool dup_under(const cJSON *item, const char *path, char *where, size_t where_len) {
    if (cJSON_IsObject(item)) {
        for (const cJSON *a = item->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && strcmp(a->string, b->string) == 0) {
                    child_path(where, where_len, path, a, 0);
                    return true;
                }
    }
    if (!cJSON_IsObject(item) && !cJSON_IsArray(item)) return false;
    int i = 0;
    for (const cJSON *c = item->child; c; c = c->next, i++) {
        char sub[512];
        child_path(sub, sizeof sub, path, c, i);
        if (dup_under(c, sub, where, where_len)) return true;
    }
    return false;
}

bool json_duplicate_key(const cJSON *item, char *where, size_t where_len) {
    if (where_len) where[0] = '\0';
    return item && dup_under(item, "", where, where_len);
}

int json_refuse_duplicate_keys(const cJSON *item, const char *what, char *err, size_t err_len) {
    char dup[512];
    if (!json_duplicate_key(item, dup, sizeof dup)) return 0;
    tp_error_set(err, err_len, "%s%skey '%s' appears twice; refusing to guess which value is meant", what,
                 what[0] ? ": " : "", dup);
    return -1;
}
