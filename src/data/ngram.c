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

/* What Python's str.isspace calls whitespace (sacreBLEU removes it with
 * ''.join(line.split())): bidirectional classes WS, B, S and category Zs. */
int text_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* One character from s (s[0] != 0): its code point in *cp, the bytes it
 * took as the result. Well-formed UTF-8 per Unicode's table 3-7 (no
 * overlong forms, no surrogates, nothing past U+10FFFF); any other byte is
 * one character U+DC00 + byte, as Python's surrogateescape decodes it
 * (never a code point of valid text, so it matches only the same byte). */
int text_utf8_next(const unsigned char *s, uint32_t *cp) {
    const unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int need;
    uint32_t v;
    unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1, v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2, v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3, v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *cp = 0xDC00u + c;
        return 1;
    }
    for (int k = 1; k <= need; k++) {
        const unsigned b = s[k];  // the terminating NUL is no continuation byte: reads stop there
        if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xBFu)) {
            *cp = 0xDC00u + c;
            return 1;
        }
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need + 1;
}
