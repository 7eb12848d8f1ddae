/* flags.c: the flag table's parsing (see flags.h); --help and the echo
 * are in flags_show.c. Parsing is two passes: the names first (an unknown
 * flag or a missing value is refused before any value is read, so a typo
 * is named even after a bad number), then the values in order. The
 * nearest-flag distance is Damerau-Levenshtein restricted to adjacent
 * swaps, so a swapped pair of letters (stpes) costs one edit, as a user
 * counts it. */
#include "flags.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "parse.h"

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

/* ---- the table ------------------------------------------------------------ */

const Flag *flags_find(const FlagTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->flags[i].name, name) == 0) return &t->flags[i];
    return NULL;
}

/* The typed name of word a ("--name" or "--name=v") without dashes and
 * value, '-' turned to '_' under FLAGS_UNDERSCORE. */
static void typed_name(const FlagTable *t, const char *a, char *name, size_t len) {
    const char *bare = a + 2;
    const char *eq = strchr(bare, '=');
    size_t n = eq ? (size_t)(eq - bare) : strlen(bare);
    if (n >= len) n = len - 1;
    memcpy(name, bare, n);
    name[n] = '\0';
    if (t->options & FLAGS_UNDERSCORE)
        for (char *p = name; *p; p++)
            if (*p == '-') *p = '_';
}

/* The entry's index, FLAGS_MAX for the built-in --help, -1 when unknown. */
static int lookup(const FlagTable *t, const char *name) {
    if (strcmp(name, "help") == 0) return FLAGS_MAX;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->flags[i].name, name) == 0) return i;
    return -1;
}

static void unknown(const FlagTable *t, const char *a, const char *name) {
    const char *known[FLAGS_MAX + 1];
    int n = 0;
    for (int i = 0; i < t->n && n < FLAGS_MAX; i++) known[n++] = t->flags[i].name;
    known[n++] = "help";
    if (t->options & FLAGS_UNDERSCORE) {  // shown as normalised: --nproc_per_nod
        char shown[FLAG_NAME_MAX + 3];
        snprintf(shown, sizeof shown, "--%s", name);
        flag_unknown(t->prog, shown, known, n);
    } else {
        flag_unknown(t->prog, a, known, n);
    }
}

/* What word i of argv is: an operand, the end of the flags, or a flag. */
enum { W_OPERAND, W_END, W_DASHDASH, W_HELP, W_FLAG, W_BAD };
static int word_kind(const FlagTable *t, const char *a) {
    if (strcmp(a, "--") == 0) return W_DASHDASH;
    if ((t->options & FLAGS_DASH_H) && strcmp(a, "-h") == 0) return W_HELP;
    if (a[0] != '-' || strcmp(a, "-") == 0) return (t->options & FLAGS_STOP) ? W_END : W_OPERAND;
    if (a[1] != '-') return (t->options & FLAGS_STOP) ? W_END : W_BAD;  // every flag here is long
    return W_FLAG;
}

int flags_check(const FlagTable *t, int argc, char *const *argv) {
    if (t->n > FLAGS_MAX) {
        fprintf(stderr, "%s: the flag table holds %d entries, more than FLAGS_MAX %d\n", t->prog, t->n, FLAGS_MAX);
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int w = word_kind(t, a);
        if (w == W_DASHDASH || w == W_END) break;
        if (w == W_OPERAND || w == W_HELP) continue;
        char name[FLAG_NAME_MAX + 1];
        if (w == W_BAD) {
            unknown(t, a, a + 1);
            return -1;
        }
        typed_name(t, a, name, sizeof name);
        const int k = lookup(t, name);
        if (k < 0) {
            unknown(t, a, name);
            return -1;
        }
        const bool has_value = strchr(a, '=') != NULL;
        const bool takes_value = k < FLAGS_MAX && t->flags[k].kind != FLAG_SWITCH;
        if (!takes_value && has_value) {
            fprintf(stderr, "%s: --%s takes no value, got '%s'\n", t->prog, name, a);
            return -1;
        }
        if (takes_value && !has_value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --%s needs a value\n", t->prog, name);
                return -1;
            }
            i++;  // the value, whatever it looks like
        }
    }
    return 0;
}

/* Choice i of f ("a|b|c") into buf; -1 past the last. */
static int choice_at(const Flag *f, int i, char *buf, size_t len) {
    const char *p = f->choices;
    for (int k = 0; k < i && p; k++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    if (!p) return -1;
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (n >= len) n = len - 1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 0;
}

/* "--name must be a, b or c, got 's'" */
static void choice_refusal(const Flag *f, const char *s, char *err, size_t err_len) {
    char list[512] = "", c[64];
    int n = 0;
    while (choice_at(f, n, c, sizeof c) == 0) n++;
    for (int i = 0; i < n; i++) {
        choice_at(f, i, c, sizeof c);
        const size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", c);
    }
    tp_error_set(err, err_len, "--%s must be %s, got '%s'", f->name, list, s);
}

/* The number a value stands for (its range checked), before it is stored. */
static int value_number(const Flag *f, const char *s, double *num, char *err, size_t err_len) {
    char what[FLAG_NAME_MAX + 3];
    snprintf(what, sizeof what, "--%s", f->name);
    *num = 1.0;
    if (f->kind == FLAG_STRING && s[0] == '\0') {  // no path, name or address is empty ('' would mean '.' or '/')
        tp_error_set(err, err_len, "%s expects %s, got ''", what, f->metavar ? f->metavar : "a value");
        return -1;
    }
    if (f->kind == FLAG_INT) {
        long v;
        if (parse_int(what, s, (long)f->lo, (long)f->hi, &v, err, err_len)) return -1;
        *num = (double)v;
    } else if (f->kind == FLAG_REAL) {
        if (parse_double_in(what, s, f->lo, f->hi, f->open, num, err, err_len)) return -1;
    } else if (f->kind == FLAG_CHOICE) {
        char c[64];
        int i = 0;
        while (choice_at(f, i, c, sizeof c) == 0 && strcmp(c, s) != 0) i++;
        if (choice_at(f, i, c, sizeof c) != 0) {
            choice_refusal(f, s, err, err_len);
            return -1;
        }
        *num = f->values ? f->values[i] : i;
    }
    return 0;
}

/* One flag's value, parsed and stored. 0, or -1 with err. */
static int flag_store(const Flag *f, const char *s, void *args, char *err, size_t err_len) {
    double num;
    if (value_number(f, s, &num, err, err_len)) return -1;
    if (f->set) return f->set(args, f, s, num, err, err_len);
    char *at = (char *)args + f->offset;
    switch (f->field) {
    case FIELD_INT: *(int *)at = (int)num; break;
    case FIELD_U64: *(unsigned long long *)at = (unsigned long long)num; break;
    case FIELD_FLOAT: *(float *)at = (float)num; break;
    case FIELD_DOUBLE: *(double *)at = num; break;
    case FIELD_BOOL: *(bool *)at = num != 0.0; break;
    case FIELD_STR: *(const char **)at = s; break;
    case FIELD_NONE: break;
    }
    return 0;
}

int flags_defaults(const FlagTable *t, void *args) {
    char err[512];
    for (int i = 0; i < t->n; i++) {
        const Flag *f = &t->flags[i];
        if (f->dflt && flag_store(f, f->dflt, args, err, sizeof err)) {
            fprintf(stderr, "%s: the default of --%s: %s\n", t->prog, f->name, err);
            return -1;
        }
    }
    return 0;
}

int flags_parse(const FlagTable *t, int argc, char **argv, void *args, FlagsParsed *p) {
    FlagsParsed local;
    if (!p) p = &local;
    memset(p, 0, sizeof *p);
    if (flags_check(t, argc, argv)) return -1;
    p->operands = TP_CALLOC((size_t)argc + 1, sizeof *p->operands);
    char err[512];
    int rc = 0, i = 1;
    for (; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        const int w = word_kind(t, a);
        if (w == W_DASHDASH) {
            i++;
            break;
        }
        if (w == W_END) break;
        if (w == W_OPERAND) {
            p->operands[p->n_operands++] = argv[i];
            continue;
        }
        char name[FLAG_NAME_MAX + 1];
        if (w == W_FLAG) typed_name(t, a, name, sizeof name);
        const int k = w == W_HELP ? FLAGS_MAX : lookup(t, name);  // known: flags_check passed
        if (k == FLAGS_MAX) {  // the caller prints flags_help, with its defaults
            p->help = true;
            rc = 1;
            break;
        }
        const Flag *f = &t->flags[k];
        const char *eq = strchr(a, '=');
        const char *v = f->kind == FLAG_SWITCH ? "" : eq ? eq + 1 : argv[++i];
        if (flag_store(f, v, args, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", t->prog, err);
            rc = -1;
        }
        p->given[k] = i;
    }
    for (; i < argc && rc == 0; i++) p->operands[p->n_operands++] = argv[i];  // after "--" or the first operand
    if (p == &local) flags_parsed_free(p);
    return rc;
}

void flags_parsed_free(FlagsParsed *p) {
    free(p->operands);
    p->operands = NULL;
    p->n_operands = 0;
}

bool flags_given(const FlagTable *t, const FlagsParsed *p, const char *name) {
    const Flag *f = flags_find(t, name);
    return f && p->given[f - t->flags] > 0;
}

const char *flags_last_given(const FlagTable *t, const FlagsParsed *p, const char *const *names) {
    const char *last = NULL;
    int at = 0;
    for (int k = 0; names[k]; k++) {
        const Flag *f = flags_find(t, names[k]);
        if (f && p->given[f - t->flags] > at) at = p->given[f - t->flags], last = f->name;
    }
    return last;
}
