/* test_parse.c: the strict number parser (common/parse.h) on what strtol and
 * strtod forgive: empty strings, spaces, trailing garbage, overflow that
 * wraps or saturates, NaN and infinities, values outside the range, and the
 * refusal sentence (flag and value named). The programs' flags are checked
 * end to end in test_cli_input.sh. */
#include <float.h>
#include <string.h>

#include "check.h"
#include "parse.h"

static void int_ok(const char *s, long lo, long hi, long want) {
    char err[256] = "";
    long v = -12345;
    int rc = parse_int("--n", s, lo, hi, &v, err, sizeof err);
    CHECK(rc == 0 && v == want, "'%s' in [%ld, %ld]: rc %d, value %ld, err '%s'", s, lo, hi, rc, v, err);
}

static void int_refused(const char *s, long lo, long hi) {
    char err[256] = "";
    long v = -12345;
    int rc = parse_int("--n", s, lo, hi, &v, err, sizeof err);
    CHECK(rc == -1, "'%s' in [%ld, %ld] accepted as %ld", s, lo, hi, v);
    CHECK(v == -12345, "'%s': output written on refusal", s);
    char want[128];
    snprintf(want, sizeof want, "--n expects an integer in [%ld, %ld], got '%s'", lo, hi, s);
    CHECK(strcmp(err, want) == 0, "'%s': message '%s', want '%s'", s, err, want);
}

static void real_ok(const char *s, double lo, double hi, int open, double want) {
    char err[256] = "";
    double v = -12345;
    int rc = parse_double_in("--x", s, lo, hi, open, &v, err, sizeof err);
    CHECK(rc == 0 && v == want, "'%s': rc %d, value %g, err '%s'", s, rc, v, err);
}

static void real_refused(const char *s, double lo, double hi, int open, const char *want_msg) {
    char err[256] = "";
    double v = -12345;
    int rc = parse_double_in("--x", s, lo, hi, open, &v, err, sizeof err);
    CHECK(rc == -1, "'%s' accepted as %g", s, v);
    CHECK(v == -12345, "'%s': output written on refusal", s);
    CHECK(strcmp(err, want_msg) == 0, "'%s': message '%s', want '%s'", s, err, want_msg);
}

int main(void) {
    /* integers */
    int_ok("0", 0, 10, 0);
    int_ok("10", 0, 10, 10);
    int_ok("-3", -5, 5, -3);
    int_ok("007", 0, 10, 7);
    int_ok("9223372036854775807", 0, 9223372036854775807L, 9223372036854775807L);
    int_refused("", 0, 10);                      // empty: strtol gives 0
    int_refused(" 5", 0, 10);                    // leading space: strtol skips it
    int_refused("5 ", 0, 10);                    // trailing space
    int_refused("5x", 0, 10);                    // trailing garbage
    int_refused("+5", 0, 10);                    // a sign other than '-'
    int_refused("-", -10, 10);
    int_refused("0x10", 0, 100);                 // decimal only
    int_refused("1e3", 0, 10000);
    int_refused("11", 0, 10);                    // range
    int_refused("-1", 0, 10);
    int_refused("4294967297", 0, 1000);          // 2^32 + 1: wraps to 1 in an int
    int_refused("9223372036854775808", 0, 9223372036854775807L);  // saturates in a long
    int_refused("-9223372036854775809", -9223372036854775807L - 1, 0);
    int_refused("99999999999999999999999", 0, 10);

    /* reals */
    real_ok("0", 0, 1, PARSE_HI_OPEN, 0.0);
    real_ok("0.5", 0, 1, PARSE_HI_OPEN, 0.5);
    real_ok(".5", 0, 1, 0, 0.5);
    real_ok("1e-3", 0, 1, PARSE_LO_OPEN, 1e-3);
    real_ok("-2.5", -10, 10, 0, -2.5);
    real_ok("0x1p-2", 0, 1, 0, 0.25);
    real_ok("10", 0, 10, 0, 10.0);
    real_refused("", 0, 10, 0, "--x expects a number in [0, 10], got ''");
    real_refused("nan", 0, 10, 0, "--x expects a number in [0, 10], got 'nan'");
    real_refused("NaN", 0, 10, 0, "--x expects a number in [0, 10], got 'NaN'");
    real_refused("-nan", -10, 10, 0, "--x expects a number in [-10, 10], got '-nan'");
    real_refused("inf", 0, 10, 0, "--x expects a number in [0, 10], got 'inf'");
    real_refused("-infinity", -10, 10, 0, "--x expects a number in [-10, 10], got '-infinity'");
    real_refused("1e999", 0, DBL_MAX, 0, "--x expects a number in [0, 1.79769e+308], got '1e999'");
    real_refused("1e-400", 0, 1, 0, "--x expects a number in [0, 1], got '1e-400'");  // underflow is not 0
    real_refused(" 1", 0, 10, 0, "--x expects a number in [0, 10], got ' 1'");
    real_refused("1 ", 0, 10, 0, "--x expects a number in [0, 10], got '1 '");
    real_refused("1.5.2", 0, 10, 0, "--x expects a number in [0, 10], got '1.5.2'");
    real_refused("1e", 0, 10, 0, "--x expects a number in [0, 10], got '1e'");
    real_refused(".", 0, 10, 0, "--x expects a number in [0, 10], got '.'");
    real_refused("1", 0, 1, PARSE_HI_OPEN, "--x expects a number in [0, 1), got '1'");
    real_refused("0", 0, 1, PARSE_LO_OPEN, "--x expects a number in (0, 1], got '0'");
    real_refused("-0.1", 0, 1, 0, "--x expects a number in [0, 1], got '-0.1'");
    double v = 0;
    char err[256];
    CHECK(parse_double("--y", "2", 0, 1, &v, err, sizeof err) == -1 &&
              strcmp(err, "--y expects a number in [0, 1], got '2'") == 0,
          "parse_double closed range: '%s'", err);

    /* a very long value is quoted in part, with its length */
    char big[300];
    memset(big, '7', sizeof big - 1);
    big[sizeof big - 1] = 0;
    long n = 0;
    CHECK(parse_int("--n", big, 0, 10, &n, err, sizeof err) == -1 && strstr(err, "(299 characters)") != NULL &&
              strlen(err) < 160,
          "long value: '%s'", err);
    return check_report("test_parse");
}
