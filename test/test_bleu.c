/* test_bleu.c: corpus BLEU-4 against hand-computed fixtures, and the clipped
 * n-gram counts against a brute-force count on random sentences.
 *
 *   test_bleu            the fixtures
 *   test_bleu HYP REF    for test_bleu.sh (sacreBLEU's definition in Python):
 *                        one line per sentence pair, "<m1> .. <m4> <t1> ..
 *                        <t4> <hyp_len> <ref_len>" (clipped matches, n-grams),
 *                        then "corpus <BLEU>" (%.17g) from the summed counts */
#include "check.h"
#include "textlines.h"
#include "data/bleu.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Scores are sums of a few logs and one exp: exact to ~1e-13 relative. */
#define BLEU_TOL 1e-9

static void check_stats(const BleuStats *s, const long match[4], const long total[4], long c, long r,
                        const char *what) {
    for (int k = 0; k < 4; k++) {
        CHECK(s->match[k] == match[k], "%s: match[%d] = %ld, want %ld", what, k, s->match[k], match[k]);
        CHECK(s->total[k] == total[k], "%s: total[%d] = %ld, want %ld", what, k, s->total[k], total[k]);
    }
    CHECK(s->hyp_len == c && s->ref_len == r, "%s: lengths %ld/%ld, want %ld/%ld", what, s->hyp_len, s->ref_len, c, r);
}

static double sentence_bleu(const char *hyp, const char *ref) {
    BleuStats s;
    bleu_init(&s);
    bleu_add(&s, hyp, ref);
    return bleu_score(&s, NULL, NULL);
}

static void check_fixtures(void) {
    BleuStats s;
    double bp, prec[4];

    /* Identical corpus. */
    bleu_init(&s);
    bleu_add(&s, "the cat sat on the mat", "the cat sat on the mat");
    bleu_add(&s, "a quick brown fox jumps", "a quick brown fox jumps");
    CHECK_CLOSE(bleu_score(&s, &bp, prec), 100.0, 0, BLEU_TOL, "identical corpus");
    CHECK(bp == 1.0 && prec[0] == 1.0 && prec[3] == 1.0, "identical corpus: bp %g p1 %g p4 %g", bp, prec[0], prec[3]);

    /* Whitespace of every kind separates tokens; runs of it count once. */
    CHECK_CLOSE(sentence_bleu("  the\tcat  sat\ton the mat\r\n", "the cat sat on the mat"), 100.0, 0, BLEU_TOL,
                "whitespace");

    /* Whitespace is what Python's str.split() splits on, as sacreBLEU
     * splits: U+3000 (E3 80 80), U+00A0 (C2 A0), U+2009 (E2 80 89), vertical
     * tab, form feed; a byte that is not UTF-8 (FF) belongs to its token. */
    bleu_init(&s);
    bleu_add(&s, "\xE3\x80\x80the\xC2\xA0" "cat\vsat\fon\xE2\x80\x89the mat\xFF", "the cat sat on the mat\xFF");
    check_stats(&s, (long[]){6, 5, 4, 3}, (long[]){6, 5, 4, 3}, 6, 6, "Unicode whitespace");
    bleu_init(&s);
    bleu_add(&s, "\xE3\x81\xAF\xE3\x80\x80\xE3\x81\xAE", "\xE3\x81\xAF \xE3\x81\xAE");  // は　の / は の
    check_stats(&s, (long[]){2, 1, 0, 0}, (long[]){2, 1, 0, 0}, 2, 2, "ideographic space");

    /* No token in common. */
    bleu_init(&s);
    bleu_add(&s, "a b c d", "e f g h");
    check_stats(&s, (long[]){0, 0, 0, 0}, (long[]){4, 3, 2, 1}, 4, 4, "disjoint");
    CHECK(bleu_score(&s, NULL, NULL) == 0.0, "disjoint: not 0");

    /* Strict prefix: c = 6, r = 9, all precisions 1,
     * BLEU = 100 * exp(1 - 9/6) = 100 * exp(-0.5) = 60.653065971263345. */
    bleu_init(&s);
    bleu_add(&s, "the quick brown fox jumps over", "the quick brown fox jumps over the lazy dog");
    check_stats(&s, (long[]){6, 5, 4, 3}, (long[]){6, 5, 4, 3}, 6, 9, "prefix");
    CHECK_CLOSE(bleu_score(&s, &bp, prec), 60.653065971263345, 0, BLEU_TOL, "prefix");
    CHECK_CLOSE(bp, 0.60653065971263345, 0, 1e-12, "prefix bp");
    CHECK(prec[0] == 1.0 && prec[1] == 1.0 && prec[2] == 1.0 && prec[3] == 1.0, "prefix precisions not 1");

    /* Partial matches. hyp "the the the cat sat on", ref "the cat sat on the mat":
     *   1-grams: the x3 (ref has 2 -> 2), cat 1, sat 1, on 1          -> 5/6
     *   2-grams: "the the" x2 (0), "the cat", "cat sat", "sat on"     -> 3/5
     *   3-grams: "the the the" (0), "the the cat" (0), "the cat sat",
     *            "cat sat on"                                         -> 2/4
     *   4-grams: "the the the cat" (0), "the the cat sat" (0),
     *            "the cat sat on"                                     -> 1/3
     *   c = r = 6, BP = 1; BLEU = 100 * (5/6 * 3/5 * 2/4 * 1/3)^(1/4)
     *   = 100 * (1/12)^(1/4) = 53.7284965911771. */
    bleu_init(&s);
    bleu_add(&s, "the the the cat sat on", "the cat sat on the mat");
    check_stats(&s, (long[]){5, 3, 2, 1}, (long[]){6, 5, 4, 3}, 6, 6, "partial");
    CHECK_CLOSE(bleu_score(&s, &bp, prec), 53.7284965911771, 0, BLEU_TOL, "partial");
    CHECK(bp == 1.0, "partial: bp %g", bp);
    CHECK_CLOSE(prec[1], 0.6, 0, 1e-15, "partial p2");

    /* hyp "the the the cat sat", ref "the cat sat on the mat":
     *   1-grams 2 + 1 + 1 = 4/5; 2-grams "the cat", "cat sat" = 2/4;
     *   3-grams "the cat sat" = 1/3; 4-grams 0/2 -> BLEU 0. */
    bleu_init(&s);
    bleu_add(&s, "the the the cat sat", "the cat sat on the mat");
    check_stats(&s, (long[]){4, 2, 1, 0}, (long[]){5, 4, 3, 2}, 5, 6, "no 4-gram");
    CHECK(bleu_score(&s, &bp, prec) == 0.0, "no 4-gram: not 0");
    CHECK_CLOSE(prec[0], 0.8, 0, 1e-15, "no 4-gram p1");
    CHECK_CLOSE(bp, exp(1.0 - 6.0 / 5.0), 0, 1e-15, "no 4-gram bp");

    /* Clipping: "the" occurs once in the reference, so 1 of 4 unigrams counts. */
    bleu_init(&s);
    bleu_add(&s, "the the the the", "the cat");
    check_stats(&s, (long[]){1, 0, 0, 0}, (long[]){4, 3, 2, 1}, 4, 2, "clipping");
    CHECK(bleu_score(&s, &bp, prec) == 0.0, "clipping: not 0");
    CHECK(prec[0] == 0.25 && prec[1] == 0.0 && bp == 1.0, "clipping: p1 %g p2 %g bp %g", prec[0], prec[1], bp);

    /* Tokens that are prefixes of each other stay distinct.
     * hyp "ab abc ab abc", ref "abc ab abc ab": 1-grams 4/4;
     * 2-grams hyp {ab abc: 2, abc ab: 1}, ref {abc ab: 2, ab abc: 1} -> 2/3;
     * 3-grams "ab abc ab", "abc ab abc" both in ref -> 2/2; 4-gram 0/1. */
    bleu_init(&s);
    bleu_add(&s, "ab abc ab abc", "abc ab abc ab");
    check_stats(&s, (long[]){4, 2, 2, 0}, (long[]){4, 3, 2, 1}, 4, 4, "prefix tokens");

    /* Longer hypothesis: BP 1. hyp adds "today": 6/7, 5/6, 4/5, 3/4,
     * BLEU = 100 * (3/7)^(1/4) = 80.91067115702212. */
    bleu_init(&s);
    bleu_add(&s, "the cat sat on the mat today", "the cat sat on the mat");
    CHECK_CLOSE(bleu_score(&s, &bp, prec), 80.91067115702212, 0, BLEU_TOL, "longer hypothesis");
    CHECK(bp == 1.0, "longer hypothesis: bp %g", bp);

    /* Empty hypothesis (and an empty corpus) score 0. */
    bleu_init(&s);
    bleu_add(&s, "", "the cat");
    check_stats(&s, (long[]){0, 0, 0, 0}, (long[]){0, 0, 0, 0}, 0, 2, "empty hypothesis");
    CHECK(bleu_score(&s, &bp, prec) == 0.0 && bp == 0.0, "empty hypothesis: bp %g", bp);
    bleu_init(&s);
    CHECK(bleu_score(&s, NULL, NULL) == 0.0, "empty corpus");
    bleu_add(&s, " \t ", "");
    CHECK(bleu_score(&s, NULL, NULL) == 0.0 && s.hyp_len == 0 && s.ref_len == 0, "blank lines");
}

/* Corpus BLEU sums the statistics; it is not the mean of sentence BLEUs.
 *   sentence 1 (partial above): 5/6 3/5 2/4 1/3, c 6, r 6;
 *   sentence 2 "a b c d e" vs "a b c d e f g": 5/5 4/4 3/3 2/2, c 5, r 7.
 *   sums: 10/11 7/9 5/7 3/5, c 11, r 13; product = 1050/3465 = 10/33;
 *   BLEU = 100 * exp(1 - 13/11) * (10/33)^(1/4) = 61.859852760686344,
 *   while the sentence mean is (53.728... + 67.032...) / 2 = 60.380. */
static void check_corpus(void) {
    BleuStats s;
    bleu_init(&s);
    bleu_add(&s, "the the the cat sat on", "the cat sat on the mat");
    bleu_add(&s, "a b c d e", "a b c d e f g");
    check_stats(&s, (long[]){10, 7, 5, 3}, (long[]){11, 9, 7, 5}, 11, 13, "corpus");
    double corpus = bleu_score(&s, NULL, NULL);
    CHECK_CLOSE(corpus, 61.859852760686344, 0, BLEU_TOL, "corpus");
    double s2 = sentence_bleu("a b c d e", "a b c d e f g");
    CHECK_CLOSE(s2, 67.03200460356393, 0, BLEU_TOL, "sentence 2");
    double mean = 0.5 * (sentence_bleu("the the the cat sat on", "the cat sat on the mat") + s2);
    CHECK(fabs(corpus - mean) > 1.0, "corpus %g equals the sentence mean %g", corpus, mean);
}

/* Brute force: for each n-gram position of hyp, count it once at its first
 * occurrence, with its counts in hyp and ref. */
static long brute_matches(const int *h, int nh, const int *r, int nr, int n) {
    long m = 0;
    for (int i = 0; i + n <= nh; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++) first = memcmp(h + j, h + i, (size_t)n * sizeof(int)) != 0;
        if (!first) continue;
        long ch = 0, cr = 0;
        for (int j = 0; j + n <= nh; j++) ch += memcmp(h + j, h + i, (size_t)n * sizeof(int)) == 0;
        for (int j = 0; j + n <= nr; j++) cr += memcmp(r + j, h + i, (size_t)n * sizeof(int)) == 0;
        m += ch < cr ? ch : cr;
    }
    return m;
}

static void check_random(void) {
    static const char *words[] = {"a", "b", "ab", "ba", "c", "の", "は", "です"};
    uint64_t x = 88172645463325252ull;
    BleuStats s;
    bleu_init(&s);
    long want_match[4] = {0}, want_total[4] = {0}, want_c = 0, want_r = 0;
    for (int sent = 0; sent < 300; sent++) {
        int h[40], r[40], nh, nr;
        char hs[512], rs[512];
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        nh = (int)(x % 25);
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        nr = 1 + (int)(x % 25);
        size_t ph = 0, pr = 0;
        hs[0] = rs[0] = 0;
        for (int i = 0; i < nh; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            h[i] = (int)(x % 8);
            ph += (size_t)snprintf(hs + ph, sizeof hs - ph, "%s%s", i ? " " : "", words[h[i]]);
        }
        for (int i = 0; i < nr; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            r[i] = (int)(x % 8);
            pr += (size_t)snprintf(rs + pr, sizeof rs - pr, "%s%s", i ? "  " : "\t", words[r[i]]);
        }
        bleu_add(&s, hs, rs);
        for (int n = 1; n <= 4; n++) {
            want_match[n - 1] += brute_matches(h, nh, r, nr, n);
            want_total[n - 1] += nh >= n ? nh - n + 1 : 0;
        }
        want_c += nh;
        want_r += nr;
    }
    check_stats(&s, want_match, want_total, want_c, want_r, "random corpus");
    /* Score from the stats by the formula, independently. */
    double lp = 0;
    for (int k = 0; k < 4; k++) lp += log((double)want_match[k] / (double)want_total[k]);
    double bp = want_c >= want_r ? 1.0 : exp(1.0 - (double)want_r / (double)want_c);
    CHECK_CLOSE(bleu_score(&s, NULL, NULL), 100.0 * bp * exp(lp / 4), 0, BLEU_TOL, "random corpus score");
}

/* File mode: a pair's counts, added to the corpus too. */
static void score_line(void *corpus, const char *hyp, const char *ref) {
    BleuStats one;
    bleu_init(&one);
    bleu_add(&one, hyp, ref);
    bleu_add(corpus, hyp, ref);
    printf("%ld %ld %ld %ld %ld %ld %ld %ld %ld %ld\n", one.match[0], one.match[1], one.match[2], one.match[3],
           one.total[0], one.total[1], one.total[2], one.total[3], one.hyp_len, one.ref_len);
}

static void score_corpus(void *corpus) { printf("corpus %.17g\n", bleu_score(corpus, NULL, NULL)); }

static int score_files(const char *hyp_path, const char *ref_path) {
    BleuStats corpus;
    bleu_init(&corpus);
    return score_pairs("test_bleu", hyp_path, ref_path, &corpus, score_line, score_corpus);
}

static void check_all(void) {
    check_fixtures();
    check_corpus();
    check_random();
}

int main(int argc, char **argv) { return metric_test_main(argc, argv, "test_bleu", score_files, check_all); }
