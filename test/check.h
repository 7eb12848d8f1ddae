/* check.h: the tiny assertion layer every C test uses. A failed check prints
 * the expression and location and makes the test exit non-zero at the end. */
#ifndef TPTRAIN_TEST_CHECK_H
#define TPTRAIN_TEST_CHECK_H
#include <stdio.h>
#include <math.h>

static int g_check_failures = 0;
static int g_check_count = 0;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        g_check_count++;                                                    \
        if (!(cond)) {                                                      \
            g_check_failures++;                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol, what)                                   \
    CHECK(fabs((double)(a) - (double)(b)) <=                                  \
              (atol) + (rtol) * fabs((double)(b)),                            \
          "%s: got %.9g want %.9g", (what), (double)(a), (double)(b))

static inline int check_report(const char *name) {
    if (g_check_count == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    printf("%s: %d checks, %d failed\n", name, g_check_count, g_check_failures);
    return g_check_failures ? 1 : 0;
}

/* main of a metric's test (test_bleu, test_chrf): `NAME HYP REF` prints the
 * scores of two files (score, for the Python oracle), `NAME` runs the C
 * checks (checks) and reports; anything else is a usage error (2). */
static inline int metric_test_main(int argc, char **argv, const char *name, int (*score)(const char *, const char *),
                                   void (*checks)(void)) {
    if (argc == 3) return score(argv[1], argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [HYP REF]\n", name);
        return 2;
    }
    checks();
    return check_report(name);
}
#endif
