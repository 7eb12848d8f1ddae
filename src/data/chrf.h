/* chrf.h: corpus chrF (Popović 2015), character n-gram F-score.
 *
 * The definition of sacreBLEU's default chrF2: whitespace is removed from
 * both sides (every character Python's str.isspace calls whitespace, the
 * ideographic space U+3000 included), the text is cut into characters
 * (Unicode code points of the UTF-8 text, not bytes: a kana or kanji is one
 * character), and for n = 1..6 the hypothesis and reference n-grams and the
 * clipped matches (sum over distinct n-grams of min(hyp count, ref count))
 * are summed over the corpus. Precision P_n = match / hyp n-grams and recall
 * R_n = match / ref n-grams are averaged over the orders n at which both
 * sides have n-grams; chrF = (1 + b^2) P R / (b^2 P + R) with b = 2 (recall
 * weighs twice), 0 when P + R = 0. One reference per sentence; no
 * lowercasing. A byte that is not part of valid UTF-8 counts as one
 * character of its own (as Python's surrogateescape decoding makes it). */
#ifndef TPTRAIN_CHRF_H
#define TPTRAIN_CHRF_H

enum { CHRF_ORDER = 6, CHRF_BETA = 2 };

typedef struct {
    long hyp[CHRF_ORDER], ref[CHRF_ORDER], match[CHRF_ORDER];  // index n - 1
} ChrfStats;

void chrf_init(ChrfStats *s);
/* Adds one sentence pair (NUL-terminated UTF-8). */
void chrf_add(ChrfStats *s, const char *hyp, const char *ref);
/* chrF2 in [0, 100]; *prec and *rec (if non-NULL) receive the averaged
 * character n-gram precision and recall in [0, 1]. */
double chrf_score(const ChrfStats *s, double *prec, double *rec);

#endif
