/* test_chrf.c: corpus chrF (src/data/chrf.c).
 *
 *   test_chrf                 hand-computed fixtures (counts and scores)
 *   test_chrf HYP REF         for test_chrf.sh: one line per sentence pair,
 *                             "<chrF> <P> <R>" of that pair alone, then
 *                             "corpus <chrF> <P> <R>" from the summed counts
 *                             (%.17g; files read line by line, the newline
 *                             and a CR before it stripped, the bytes as given) */
#include "check.h"
#include "textlines.h"
#include "data/chrf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Scores are a few divisions: exact to ~1e-15 relative. */
#define CHRF_TOL 1e-12

static double sentence_chrf(const char *hyp, const char *ref) {
    ChrfStats s;
    chrf_init(&s);
    chrf_add(&s, hyp, ref);
    return chrf_score(&s, NULL, NULL);
}

static void check_counts(const ChrfStats *s, const long hyp[6], const long ref[6], const long match[6],
                         const char *what) {
    for (int k = 0; k < CHRF_ORDER; k++)
        CHECK(s->hyp[k] == hyp[k] && s->ref[k] == ref[k] && s->match[k] == match[k],
              "%s: order %d: hyp %ld ref %ld match %ld, want %ld %ld %ld", what, k + 1, s->hyp[k], s->ref[k],
              s->match[k], hyp[k], ref[k], match[k]);
}

static void check_fixtures(void) {
    ChrfStats s;
    double p, r;

    /* "abc" vs "abd": 1-grams 2/3 match, 2-grams 1/2, 3-grams 0/1, no 4..6-grams:
     * P = R = (2/3 + 1/2 + 0) / 3 = 7/18, so chrF = P. */
    chrf_init(&s);
    chrf_add(&s, "abc", "abd");
    check_counts(&s, (long[]){3, 2, 1, 0, 0, 0}, (long[]){3, 2, 1, 0, 0, 0}, (long[]){2, 1, 0, 0, 0, 0}, "abc/abd");
    CHECK_CLOSE(chrf_score(&s, &p, &r), 100.0 * 7 / 18, CHRF_TOL, 0, "abc/abd");
    CHECK_CLOSE(p, 7.0 / 18, CHRF_TOL, 0, "abc/abd precision");
    CHECK_CLOSE(r, 7.0 / 18, CHRF_TOL, 0, "abc/abd recall");

    /* Whitespace does not count, and a kana is one character, not 3 bytes:
     * "猫 が" vs "猫が いる" = 猫が vs 猫がいる: 1-grams 2/2 of 4, 2-grams 1/1
     * of 3, 3..4-grams only in the reference. P = 1, R = (2/4 + 1/3) / 2 = 5/12,
     * chrF = 5 P R / (4 P + R) = (25/12) / (4 + 5/12) = 25/53. */
    chrf_init(&s);
    chrf_add(&s, "猫 が", "猫が\u3000いる");
    check_counts(&s, (long[]){2, 1, 0, 0, 0, 0}, (long[]){4, 3, 2, 1, 0, 0}, (long[]){2, 1, 0, 0, 0, 0}, "猫が");
    CHECK_CLOSE(chrf_score(&s, &p, &r), 100.0 * 25 / 53, CHRF_TOL, 0, "猫が vs 猫がいる");
    CHECK(p == 1.0, "猫が: precision %g, want 1", p);
    CHECK_CLOSE(r, 5.0 / 12, CHRF_TOL, 0, "猫が recall");

    /* Clipping: "aaaa" vs "aa": 1-grams min(4, 2) = 2 of 4, 2-grams 1 of 3. */
    chrf_init(&s);
    chrf_add(&s, "aaaa", "aa");
    check_counts(&s, (long[]){4, 3, 2, 1, 0, 0}, (long[]){2, 1, 0, 0, 0, 0}, (long[]){2, 1, 0, 0, 0, 0}, "aaaa/aa");

    /* Identical text, tokenized differently: 100. */
    CHECK_CLOSE(sentence_chrf("今日 は いい 天気 です 。", "今日は いい天気です。"), 100.0, CHRF_TOL, 0, "spacing");
    CHECK_CLOSE(sentence_chrf("the cat sat on the mat", "thecat saton themat"), 100.0, CHRF_TOL, 0, "spacing en");
    /* Nothing in common, an empty hypothesis, both empty, only spaces: 0. */
    CHECK(sentence_chrf("xyz", "abc") == 0.0, "disjoint");
    CHECK(sentence_chrf("", "猫がいる") == 0.0, "empty hypothesis");
    CHECK(sentence_chrf("", "") == 0.0, "both empty");
    CHECK(sentence_chrf(" \t\u3000", "   ") == 0.0, "only whitespace");

    /* Corpus level is the summed counts, not a mean of sentence scores. */
    chrf_init(&s);
    chrf_add(&s, "abc", "abd");
    chrf_add(&s, "", "xyz");
    check_counts(&s, (long[]){3, 2, 1, 0, 0, 0}, (long[]){6, 4, 2, 0, 0, 0}, (long[]){2, 1, 0, 0, 0, 0}, "corpus");
    /* P = 7/18, R = (2/6 + 1/4 + 0) / 3 = 7/36: chrF = 5 P R / (4 P + R). */
    const double P = 7.0 / 18, R = 7.0 / 36;
    CHECK_CLOSE(chrf_score(&s, NULL, NULL), 100.0 * 5 * P * R / (4 * P + R), CHRF_TOL, 0, "corpus");

    /* Bytes that are not UTF-8 are characters of their own: an overlong
     * form (C0 80), a lone continuation byte, a cut sequence (E3 81). */
    chrf_init(&s);
    chrf_add(&s, "a\xC0\x80" "b\x80" "c\xE3\x81", "a\xC0\x80" "b");
    check_counts(&s, (long[]){8, 7, 6, 5, 4, 3}, (long[]){4, 3, 2, 1, 0, 0}, (long[]){4, 3, 2, 1, 0, 0},
                 "invalid UTF-8");
}

/* File mode: a pair's chrF, precision and recall, the pair added to the corpus too. */
static void score_line(void *corpus, const char *hyp, const char *ref) {
    ChrfStats one;
    double p, rc;
    chrf_init(&one);
    chrf_add(&one, hyp, ref);
    chrf_add(corpus, hyp, ref);
    const double f = chrf_score(&one, &p, &rc);
    printf("%.17g %.17g %.17g\n", f, p, rc);
}

static void score_corpus(void *corpus) {
    double p, rc;
    const double f = chrf_score(corpus, &p, &rc);
    printf("corpus %.17g %.17g %.17g\n", f, p, rc);
}

static int score_files(const char *hyp_path, const char *ref_path) {
    ChrfStats corpus;
    chrf_init(&corpus);
    return score_pairs("test_chrf", hyp_path, ref_path, &corpus, score_line, score_corpus);
}

int main(int argc, char **argv) { return metric_test_main(argc, argv, "test_chrf", score_files, check_fixtures); }
