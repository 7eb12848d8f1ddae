/* ngram.c: see ngram.h. One merge walk over the two sorted arrays. */
#include "ngram.h"

long ngram_clipped_matches(const void *h, int nh, const void *r, int nr, size_t elem_size,
                           int (*cmp)(const void *, const void *)) {
    const char *hb = h, *rb = r;
    long match = 0;
    int i = 0, j = 0;
    while (i < nh && j < nr) {
        const int c = cmp(hb + (size_t)i * elem_size, rb + (size_t)j * elem_size);
        if (c < 0) {
            i++;
        } else if (c > 0) {
            j++;
        } else {
            const void *g = hb + (size_t)i * elem_size;
            int ci = 0, cj = 0;
            while (i < nh && cmp(hb + (size_t)i * elem_size, g) == 0) i++, ci++;
            while (j < nr && cmp(rb + (size_t)j * elem_size, g) == 0) j++, cj++;
            match += ci < cj ? ci : cj;
        }
    }
    return match;
}
