/* bleu.h: corpus BLEU-4 (Papineni et al. 2002) over whitespace tokens
 * (what Python's str.split() returns: sacreBLEU with tokenize="none").
 *
 * Clipped n-gram precisions for n = 1..4 summed over the corpus, geometric
 * mean, brevity penalty exp(1 - r/c) when the hypothesis length c is below
 * the reference length r (BP = 1 otherwise; BLEU = 0 when c = 0 or any
 * precision is 0). One reference per sentence. The texts are compared as
 * given (the corpus is already tokenized): no further tokenization. */
#ifndef TPTRAIN_BLEU_H
#define TPTRAIN_BLEU_H

typedef struct {
    long match[4], total[4];   // clipped matches and hypothesis n-grams
    long hyp_len, ref_len;
} BleuStats;

void bleu_init(BleuStats *s);
/* Adds one sentence pair (NUL-terminated, whitespace-separated tokens). */
void bleu_add(BleuStats *s, const char *hyp, const char *ref);
/* BLEU in [0, 100]; *bp (if non-NULL) receives the brevity penalty and
 * prec[4] (if non-NULL) the n-gram precisions in [0, 1]. */
double bleu_score(const BleuStats *s, double *bp, double prec[4]);

#endif
