/* textlines.h: a text file's lines for the metric tests' file mode
 * (test_bleu and test_chrf HYP REF score two files line by line for their
 * Python oracles). Header-only: each test is one translation unit. */
#ifndef TPTRAIN_TEST_TEXTLINES_H
#define TPTRAIN_TEST_TEXTLINES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef struct {
    char **line;
    int n;
} Lines;

static inline int read_lines(const char *path, Lines *out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    out->line = NULL;
    out->n = 0;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&buf, &cap, f)) >= 0) {
        if (got > 0 && buf[got - 1] == '\n') buf[--got] = '\0';
        if (got > 0 && buf[got - 1] == '\r') buf[--got] = '\0';
        out->line = realloc(out->line, (size_t)(out->n + 1) * sizeof(char *));
        out->line[out->n++] = strdup(buf);
    }
    free(buf);
    fclose(f);
    return 0;
}

/* The hypothesis and reference files of a metric test's file mode, line
 * for line; tool names the test in the error of a length mismatch. */
static inline int read_pair(const char *tool, const char *hyp_path, const char *ref_path, Lines *h, Lines *r) {
    if (read_lines(hyp_path, h) || read_lines(ref_path, r)) return -1;
    if (h->n != r->n) {
        fprintf(stderr, "%s: %s has %d lines, %s %d\n", tool, hyp_path, h->n, ref_path, r->n);
        return -1;
    }
    return 0;
}

/* A metric test's file mode for the Python oracle: every pair's figures
 * (line, which also adds the pair to the corpus in ctx), then the corpus's
 * (done). 0, or 2 when the files do not read as pairs. */
static inline int score_pairs(const char *tool, const char *hyp_path, const char *ref_path, void *ctx,
                              void (*line)(void *ctx, const char *hyp, const char *ref), void (*done)(void *ctx)) {
    Lines h, r;
    if (read_pair(tool, hyp_path, ref_path, &h, &r)) return 2;
    for (int i = 0; i < h.n; i++) {
        line(ctx, h.line[i], r.line[i]);
        free(h.line[i]);
        free(r.line[i]);
    }
    done(ctx);
    free(h.line);
    free(r.line);
    return 0;
}

#endif
