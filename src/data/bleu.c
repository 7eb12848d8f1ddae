/* bleu.c: corpus BLEU-4 from clipped n-gram counts.
 *
 * Each sentence pair is counted exactly (no hashing): the tokens of both
 * sides are interned to small integers by sorting, the n-grams of each side
 * are sorted, and a merge of the two sorted lists gives the clipped matches.
 * That is O(L log L) per sentence of L tokens, so a 50k-line corpus costs
 * well under a second.
 */
#include "data/bleu.h"
#include "data/ngram.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "err.h"

enum { BLEU_N = 4 };

typedef struct {
    const char *p;
    int len;
    int side;   // 0 hypothesis, 1 reference
    int pos;    // position within its side
} Tok;

typedef struct {
    int32_t id[BLEU_N];  // unused tail = -1
} Gram;

/* The byte length of the whitespace character at s, or 0 when s holds
 * something else (whitespace as Python's str.split() sees it). */
static int space_len(const char *s) {
    uint32_t cp;
    const int len = text_utf8_next((const unsigned char *)s, &cp);
    return text_is_space(cp) ? len : 0;
}

/* The tokens of s into out (NULL: only counted). */
static int split(const char *s, int side, Tok *out) {
    int n = 0, sp;
    while (*s) {
        while (*s && (sp = space_len(s)) > 0) s += sp;
        if (!*s) break;
        const char *b = s;
        while (*s && space_len(s) == 0) s += text_utf8_next((const unsigned char *)s, &(uint32_t){0});
        if (out) out[n] = (Tok){.p = b, .len = (int)(s - b), .side = side, .pos = n};
        n++;
    }
    return n;
}

static int count_tokens(const char *s) { return split(s, 0, NULL); }

static int cmp_tok(const void *x, const void *y) {
    const Tok *a = x, *b = y;
    int m = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->p, b->p, (size_t)m);
    if (c) return c;
    return (a->len > b->len) - (a->len < b->len);
}

static int cmp_gram(const void *x, const void *y) {
    const Gram *a = x, *b = y;
    for (int k = 0; k < BLEU_N; k++)
        if (a->id[k] != b->id[k]) return (a->id[k] > b->id[k]) - (a->id[k] < b->id[k]);
    return 0;
}

/* The n-grams of ids (len tokens), sorted. Returns their number. */
static int grams(const int32_t *ids, int len, int n, Gram *out) {
    int m = len - n + 1;
    if (m <= 0) return 0;
    for (int i = 0; i < m; i++) {
        for (int k = 0; k < BLEU_N; k++) out[i].id[k] = k < n ? ids[i + k] : -1;
    }
    qsort(out, (size_t)m, sizeof *out, cmp_gram);
    return m;
}

void bleu_init(BleuStats *s) { memset(s, 0, sizeof *s); }

void bleu_add(BleuStats *s, const char *hyp, const char *ref) {
    const int nh = count_tokens(hyp), nr = count_tokens(ref), n = nh + nr;
    s->hyp_len += nh;
    s->ref_len += nr;
    if (n == 0) return;

    Tok *tok = TP_MALLOC((size_t)n * sizeof *tok);
    int32_t *ids = TP_MALLOC((size_t)n * sizeof *ids);  // hypothesis ids, then reference ids
    Gram *gh = TP_MALLOC((size_t)(nh > 0 ? nh : 1) * sizeof *gh);
    Gram *gr = TP_MALLOC((size_t)(nr > 0 ? nr : 1) * sizeof *gr);
    split(hyp, 0, tok);
    split(ref, 1, tok + nh);

    /* Intern: equal strings get equal ids. */
    qsort(tok, (size_t)n, sizeof *tok, cmp_tok);
    int32_t id = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && cmp_tok(&tok[i - 1], &tok[i]) != 0) id++;
        ids[tok[i].side == 0 ? tok[i].pos : nh + tok[i].pos] = id;
    }

    for (int k = 1; k <= BLEU_N; k++) {
        int mh = grams(ids, nh, k, gh);
        int mr = grams(ids + nh, nr, k, gr);
        s->total[k - 1] += mh;
        s->match[k - 1] += ngram_clipped_matches(gh, mh, gr, mr, sizeof *gh, cmp_gram);
    }
    free(tok);
    free(ids);
    free(gh);
    free(gr);
}

double bleu_score(const BleuStats *s, double *bp, double prec[4]) {
    const long c = s->hyp_len, r = s->ref_len;
    double brevity;
    if (c == 0) brevity = r > 0 ? 0.0 : 1.0;
    else brevity = c >= r ? 1.0 : exp(1.0 - (double)r / (double)c);
    if (bp) *bp = brevity;

    double log_sum = 0.0;
    bool zero = (c == 0);
    for (int k = 0; k < BLEU_N; k++) {
        double p = s->total[k] > 0 ? (double)s->match[k] / (double)s->total[k] : 0.0;
        if (prec) prec[k] = p;
        if (p == 0.0) zero = true;
        else log_sum += log(p);
    }
    if (zero) return 0.0;
    return brevity * exp(log_sum / BLEU_N) * 100.0;
}
