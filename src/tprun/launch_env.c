/* launch_env.c: SLURM hostlists and the visible GPU count (see launch_env.h). */
#define _GNU_SOURCE
#include "tprun/launch_env.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* ---- hostlists ------------------------------------------------------------- */

/* One piece of a host item: a literal, or a bracket's numbers. */
typedef struct {
    const char *lit;  // not NUL-terminated
    size_t lit_len;
    unsigned long *num;  // [n_num] (a bracket)
    int n_num, width;    // width: digits of each range's lower bound, per number
    int *widths;
} Piece;

typedef struct {
    char **hosts;
    int n, cap;
    char *err;
    size_t err_len;
} Out;

static int push_host(Out *o, const char *h) {
    if (o->n >= NODELIST_MAX_HOSTS) {
        tp_error_set(o->err, o->err_len, "expands to more than %d hosts", NODELIST_MAX_HOSTS);
        return -1;
    }
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 8;
        o->hosts = TP_REALLOC(o->hosts, (size_t)o->cap * sizeof *o->hosts);
    }
    o->hosts[o->n++] = strdup(h);
    return 0;
}

/* Every host of pieces[k..] after the prefix buf[0..len). */
static int expand(Out *o, const Piece *p, int n_pieces, int k, char *buf, size_t len) {
    if (k == n_pieces) {
        buf[len] = 0;
        return push_host(o, buf);
    }
    if (!p[k].num) {
        if (len + p[k].lit_len >= HOSTNAME_MAX) goto long_name;
        memcpy(buf + len, p[k].lit, p[k].lit_len);
        return expand(o, p, n_pieces, k + 1, buf, len + p[k].lit_len);
    }
    for (int i = 0; i < p[k].n_num; i++) {
        int w = snprintf(buf + len, HOSTNAME_MAX - len, "%0*lu", p[k].widths[i], p[k].num[i]);
        if (w < 0 || len + (size_t)w >= HOSTNAME_MAX) goto long_name;
        if (expand(o, p, n_pieces, k + 1, buf, len + (size_t)w)) return -1;
    }
    return 0;
long_name:
    tp_error_set(o->err, o->err_len, "a host name longer than %d characters", HOSTNAME_MAX - 1);
    return -1;
}

static int parse_number(const char *s, size_t n, unsigned long *v) {
    if (n == 0 || n > 9) return -1;
    *v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        *v = *v * 10 + (unsigned long)(s[i] - '0');
    }
    return 0;
}

/* The numbers of a bracket's text s[0..n) ("01-04,7") into p. */
static int parse_bracket(const char *s, size_t n, Piece *p, char *err, size_t err_len) {
    size_t i = 0;
    long total = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && s[j] != ',') j++;
        const char *dash = memchr(s + i, '-', j - i);
        unsigned long lo, hi;
        const size_t lo_len = dash ? (size_t)(dash - (s + i)) : j - i;
        if (parse_number(s + i, lo_len, &lo) || (dash && parse_number(dash + 1, (size_t)(s + j - dash - 1), &hi))) {
            tp_error_set(err, err_len, "'[%.*s]': '%.*s' is not a number or a range lo-hi", (int)n, s, (int)(j - i),
                         s + i);
            return -1;
        }
        if (!dash) hi = lo;
        if (hi < lo) {
            tp_error_set(err, err_len, "'[%.*s]': the range %.*s runs backwards", (int)n, s, (int)(j - i), s + i);
            return -1;
        }
        total += (long)(hi - lo + 1);
        if (total > NODELIST_MAX_HOSTS) {
            tp_error_set(err, err_len, "'[%.*s]' expands to more than %d hosts", (int)n, s, NODELIST_MAX_HOSTS);
            return -1;
        }
        p->num = TP_REALLOC(p->num, (size_t)total * sizeof *p->num);
        p->widths = TP_REALLOC(p->widths, (size_t)total * sizeof *p->widths);
        for (unsigned long v = lo; v <= hi; v++) {
            p->num[p->n_num] = v;
            p->widths[p->n_num++] = (int)lo_len;
        }
        i = j + 1;
    }
    return 0;
}

static int valid_host_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_'; }

/* One comma-free item ("gpu[01-04]", "b7") into o. */
static int expand_item(Out *o, const char *s, size_t n) {
    Piece p[32];
    int np = 0, rc = -1;
    memset(p, 0, sizeof p);
    if (n == 0) {
        tp_error_set(o->err, o->err_len, "an empty host name (two commas, or a comma at an end)");
        return -1;
    }
    for (size_t i = 0; i < n;) {
        if (np == (int)(sizeof p / sizeof *p)) {
            tp_error_set(o->err, o->err_len, "'%.*s' has too many pieces", (int)n, s);
            goto done;
        }
        if (s[i] == '[') {
            const char *close = memchr(s + i, ']', n - i);
            if (!close) {
                tp_error_set(o->err, o->err_len, "'%.*s': '[' without ']'", (int)n, s);
                goto done;
            }
            if (parse_bracket(s + i + 1, (size_t)(close - s - i - 1), &p[np++], o->err, o->err_len)) goto done;
            i = (size_t)(close - s) + 1;
            continue;
        }
        size_t j = i;
        while (j < n && s[j] != '[') {
            if (!valid_host_char(s[j])) {
                tp_error_set(o->err, o->err_len, "'%.*s': '%c' cannot appear in a host name", (int)n, s, s[j]);
                goto done;
            }
            j++;
        }
        p[np++] = (Piece){.lit = s + i, .lit_len = j - i};
        i = j;
    }
    char buf[HOSTNAME_MAX];
    rc = expand(o, p, np, 0, buf, 0);
done:
    for (int k = 0; k < np; k++) {
        free(p[k].num);
        free(p[k].widths);
    }
    return rc;
}

int nodelist_expand(const char *list, char ***hosts, char *err, size_t err_len) {
    *hosts = NULL;
    char why[256] = "";
    Out o = {.err = why, .err_len = sizeof why};
    if (!list || !*list) {
        tp_error_set(err, err_len, "the node list is empty");
        return -1;
    }
    const size_t n = strlen(list);
    size_t start = 0;
    int depth = 0;
    for (size_t i = 0; i <= n; i++) {
        const char c = list[i];
        if (c == '[' && depth++ > 0) snprintf(why, sizeof why, "'[' inside a bracket");
        if (c == ']' && depth-- == 0) snprintf(why, sizeof why, "']' without '['");
        if (why[0]) break;
        if ((c == ',' && depth == 0) || c == 0) {
            if (c == 0 && depth > 0) {
                snprintf(why, sizeof why, "'[' without ']'");
                break;
            }
            if (expand_item(&o, list + start, i - start)) break;
            start = i + 1;
        }
    }
    if (why[0]) {
        tp_error_set(err, err_len, "node list '%s': %s", list, why);
        nodelist_free(o.hosts, o.n);
        return -1;
    }
    *hosts = o.hosts;
    return o.n;
}

void nodelist_free(char **hosts, int n) {
    for (int i = 0; i < n; i++) free(hosts[i]);
    free(hosts);
}

/* ---- GPUs -------------------------------------------------------------------- */

int visible_gpu_count(const char *cvd, int n_smi) {
    if (!cvd) return n_smi;
    int n = 0;
    const char *p = cvd;
    while (*p) {
        const size_t len = strcspn(p, ",");
        char e[128];
        snprintf(e, sizeof e, "%.*s", (int)(len < sizeof e ? len : sizeof e - 1), p);
        char *end = NULL;
        const long idx = strtol(e, &end, 10);
        const int is_index = end != e && *end == 0 && idx >= 0;
        const int is_uuid = strncmp(e, "GPU-", 4) == 0 || strncmp(e, "MIG-", 4) == 0;
        if (!(is_index ? idx < n_smi : is_uuid)) break;  // CUDA stops at the first entry it cannot use
        n++;
        p += len;
        if (*p == ',') p++;
    }
    return n;
}

int nvidia_smi_gpu_count(void) {
    FILE *f = popen("nvidia-smi -L 2>/dev/null", "r");
    if (!f) return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "GPU ", 4) == 0) n++;
    const int status = pclose(f);
    return status == 0 ? n : 0;
}
