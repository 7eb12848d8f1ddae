/* ngram.h: what BLEU (token n-grams) and chrF (character n-grams) share:
 * the clipped match count of two sorted n-gram arrays, and how text is
 * read: UTF-8 as Python decodes it, whitespace as Python's str.split()
 * sees it (sacreBLEU splits BLEU's tokens and drops chrF's spaces so). Each metric keeps its
 * own n-gram type and order; this walks them through that order, so the
 * counting is written once. */
#ifndef TPTRAIN_NGRAM_H
#define TPTRAIN_NGRAM_H

#include <stddef.h>
#include <stdint.h>

/* Sum over distinct hypothesis n-grams of min(hyp count, ref count): h (nh)
 * and r (nr) are arrays of elements of elem_size bytes, both sorted by cmp
 * (qsort's comparator, equal n-grams comparing 0). */
long ngram_clipped_matches(const void *h, int nh, const void *r, int nr, size_t elem_size,
                           int (*cmp)(const void *, const void *));

/* What Python's str.isspace calls whitespace: bidirectional classes WS, B,
 * S and category Zs. */
int text_is_space(uint32_t c);
/* One character from s (s[0] != 0): its code point in *cp, the bytes it
 * took as the result; a byte that is not well-formed UTF-8 is one character
 * U+DC00 + byte (Python's surrogateescape). */
int text_utf8_next(const unsigned char *s, uint32_t *cp);

#endif
