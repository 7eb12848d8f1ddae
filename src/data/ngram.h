/* ngram.h: what BLEU (token n-grams) and chrF (character n-grams) share:
 * the clipped match count of two sorted n-gram arrays. Each metric keeps its
 * own n-gram type and order; this walks them through that order, so the
 * counting is written once. */
#ifndef TPTRAIN_NGRAM_H
#define TPTRAIN_NGRAM_H

#include <stddef.h>

/* Sum over distinct hypothesis n-grams of min(hyp count, ref count): h (nh)
 * and r (nr) are arrays of elements of elem_size bytes, both sorted by cmp
 * (qsort's comparator, equal n-grams comparing 0). */
long ngram_clipped_matches(const void *h, int nh, const void *r, int nr, size_t elem_size,
                           int (*cmp)(const void *, const void *));

#endif
