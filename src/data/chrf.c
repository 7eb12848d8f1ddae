/* chrf.c: corpus chrF from clipped character n-gram counts.
 *
 * Each side is decoded from UTF-8 into code points with whitespace dropped;
 * an n-gram of up to 6 code points (21 bits each) packs into two 64-bit
 * words, the n-grams of each side are sorted, and a merge of the two sorted
 * lists gives the clipped matches: exact counts, O(L log L) per sentence of
 * L characters. */
#include "data/chrf.h"
#include "data/ngram.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "err.h"

typedef struct {
    uint64_t hi, lo;  // code points 1-3 and 4-6 of the n-gram, 21 bits each
} Gram;

/* The characters of s without whitespace into out (room for strlen(s)). */
static int chars(const char *s, uint32_t *out) {
    const unsigned char *p = (const unsigned char *)s;
    int n = 0;
    while (*p) {
        uint32_t cp;
        p += text_utf8_next(p, &cp);
        if (!text_is_space(cp)) out[n++] = cp;
    }
    return n;
}

static int cmp_gram(const void *x, const void *y) {
    const Gram *a = x, *b = y;
    if (a->hi != b->hi) return a->hi < b->hi ? -1 : 1;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return 0;
}

/* The n-grams of c (len characters), sorted. Returns their number. */
static int grams(const uint32_t *c, int len, int n, Gram *out) {
    const int m = len - n + 1;
    if (m <= 0) return 0;
    for (int i = 0; i < m; i++) {
        uint64_t w[2] = {0, 0};
        for (int k = 0; k < n; k++) w[k / 3] = (w[k / 3] << 21) | c[i + k];
        out[i] = (Gram){.hi = w[0], .lo = w[1]};
    }
    qsort(out, (size_t)m, sizeof *out, cmp_gram);
    return m;
}

void chrf_init(ChrfStats *s) { memset(s, 0, sizeof *s); }

void chrf_add(ChrfStats *s, const char *hyp, const char *ref) {
    const size_t bh = strlen(hyp), br = strlen(ref);
    TP_CHECK(bh < (size_t)1 << 30 && br < (size_t)1 << 30, "chrF: a sentence of %zu bytes is too long",
             bh > br ? bh : br);
    uint32_t *ch = TP_MALLOC((bh + br + 1) * sizeof *ch);
    const int nh = chars(hyp, ch), nr = chars(ref, ch + nh);
    Gram *gh = TP_MALLOC((size_t)(nh > 0 ? nh : 1) * sizeof *gh);
    Gram *gr = TP_MALLOC((size_t)(nr > 0 ? nr : 1) * sizeof *gr);
    for (int n = 1; n <= CHRF_ORDER; n++) {
        const int mh = grams(ch, nh, n, gh), mr = grams(ch + nh, nr, n, gr);
        s->hyp[n - 1] += mh;
        s->ref[n - 1] += mr;
        s->match[n - 1] += ngram_clipped_matches(gh, mh, gr, mr, sizeof *gh, cmp_gram);
    }
    free(ch);
    free(gh);
    free(gr);
}

double chrf_score(const ChrfStats *s, double *prec, double *rec) {
    double p = 0.0, r = 0.0;
    int orders = 0;  // the orders at which both sides have n-grams
    for (int k = 0; k < CHRF_ORDER; k++) {
        if (s->hyp[k] > 0 && s->ref[k] > 0) {
            p += (double)s->match[k] / (double)s->hyp[k];
            r += (double)s->match[k] / (double)s->ref[k];
            orders++;
        }
    }
    if (orders > 0) p /= orders, r /= orders;
    if (prec) *prec = p;
    if (rec) *rec = r;
    if (p + r == 0.0) return 0.0;
    const double b2 = (double)CHRF_BETA * CHRF_BETA;
    return 100.0 * (1.0 + b2) * p * r / (b2 * p + r);
}
