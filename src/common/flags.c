/* flags.c: exact flag names and the nearest-flag sentence (see flags.h).
 * The distance is Damerau-Levenshtein restricted to adjacent swaps, so a
 * swapped pair of letters (stpes) costs one edit, as a user counts it. */
#include "flags.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A suggestion must be at most this many edits away, and fewer than the
 * typed name's letters: beyond that it is a guess, not a typo. */
#define FLAG_MAX_EDITS 3
#define FLAG_NAME_MAX 64

static size_t min3(size_t a, size_t b, size_t c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }

/* Edit distance with adjacent transpositions, names cut at FLAG_NAME_MAX. */
static size_t edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > FLAG_NAME_MAX) n = FLAG_NAME_MAX;
    if (m > FLAG_NAME_MAX) m = FLAG_NAME_MAX;
    size_t d[FLAG_NAME_MAX + 1][FLAG_NAME_MAX + 1];
    for (size_t i = 0; i <= n; i++) d[i][0] = i;
    for (size_t j = 0; j <= m; j++) d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            const size_t cost = a[i - 1] != b[j - 1];
            d[i][j] = min3(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[n][m];
}

const char *flag_nearest(const char *name, const char *const *known, int n_known) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    const size_t len = strlen(name);
    for (int i = 0; i < n_known; i++) {
        size_t d = edit_distance(name, known[i]);
        /* a typed prefix of a known flag (--max-step) is a near miss too */
        if (len >= 2 && strncmp(known[i], name, len) == 0 && d > 1) d = 1;
        if (d < best_d) best_d = d, best = known[i];
    }
    if (!best || best_d > FLAG_MAX_EDITS || best_d >= len) return NULL;
    return best;
}

void flag_unknown(const char *prog, const char *arg, const char *const *known, int n_known) {
    const char *eq = strchr(arg, '=');
    const int shown = eq ? (int)(eq - arg) : (int)strlen(arg);
    char name[FLAG_NAME_MAX + 1];
    const char *bare = arg;
    while (*bare == '-') bare++;
    int n = eq ? (int)(eq - bare) : (int)strlen(bare);
    if (n < 0) n = 0;
    if (n > FLAG_NAME_MAX) n = FLAG_NAME_MAX;
    memcpy(name, bare, (size_t)n);
    name[n] = '\0';
    const char *near = flag_nearest(name, known, n_known);
    if (near) fprintf(stderr, "%s: unknown flag %.*s; did you mean --%s?\n", prog, shown, arg, near);
    else fprintf(stderr, "%s: unknown flag %.*s; see %s --help\n", prog, shown, arg, prog);
}

int flags_check_exact(const char *prog, int argc, char *const *argv, const struct option *opts) {
    int n_known = 0;
    while (opts[n_known].name) n_known++;
    const char **known = malloc((size_t)(n_known > 0 ? n_known : 1) * sizeof *known);
    if (!known) return -1;
    for (int k = 0; k < n_known; k++) known[k] = opts[k].name;
    int rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) break;
        if (a[0] != '-' || strcmp(a, "-") == 0) continue;  // an operand
        const char *name = a + (a[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        const size_t n = eq ? (size_t)(eq - name) : strlen(name);
        const struct option *o = NULL;
        for (int k = 0; k < n_known && a[1] == '-'; k++)
            if (strlen(opts[k].name) == n && strncmp(opts[k].name, name, n) == 0) o = &opts[k];
        if (!o) {
            flag_unknown(prog, a, known, n_known);
            rc = -1;
        } else if (o->has_arg == no_argument && eq) {
            fprintf(stderr, "%s: --%s takes no value, got '%s'\n", prog, o->name, a);
            rc = -1;
        } else if (o->has_arg == required_argument && !eq) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --%s needs a value\n", prog, o->name);
                rc = -1;
            }
            i++;  // the value, whatever it looks like
        }
    }
    free(known);
    return rc;
}
