/* parse.c: strict integers and reals (see parse.h for what is refused).
 *
 * strtol/strtod do the conversion; everything they forgive is checked
 * around them: leading white space (they skip it), an empty string (they
 * return 0), a partial parse (end short of the terminator), saturation
 * (ERANGE), and for reals NaN, infinities and underflow to zero or a
 * denormal. The value is quoted as typed, cut at a sane length so a
 * megabyte argument does not become a megabyte message. */
#include "parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"

#define QUOTE_MAX 64  // characters of the value quoted in a refusal

/* The value for a message: as typed, cut to QUOTE_MAX characters. */
static void quote(const char *s, char *out, size_t n) {
    if (!s) s = "";
    size_t len = strlen(s);
    if (len <= QUOTE_MAX) snprintf(out, n, "'%s'", s);
    else snprintf(out, n, "'%.*s...' (%zu characters)", QUOTE_MAX, s, len);
}

int parse_int(const char *what, const char *s, long lo, long hi, long *out, char *err, size_t err_len) {
    char q[QUOTE_MAX + 48];
    quote(s, q, sizeof q);
    /* First character: a digit, or '-' then a digit (no space, no '+'). */
    const char *p = s ? s : "";
    const char *digits = *p == '-' ? p + 1 : p;
    int ok = *digits >= '0' && *digits <= '9';
    long v = 0;
    if (ok) {
        char *end = NULL;
        errno = 0;
        v = strtol(p, &end, 10);
        ok = errno == 0 && end != p && *end == '\0' && v >= lo && v <= hi;
    }
    if (!ok) {
        tp_error_set(err, err_len, "%s expects an integer in [%ld, %ld], got %s", what, lo, hi, q);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_double_in(const char *what, const char *s, double lo, double hi, int open, double *out, char *err,
                    size_t err_len) {
    char q[QUOTE_MAX + 48];
    quote(s, q, sizeof q);
    const char *p = s ? s : "";
    /* First character: a digit, '.', or a sign then one of those. strtod
     * would also take spaces, "nan", "inf" and "infinity": refused here. */
    const char *body = (*p == '-' || *p == '+') ? p + 1 : p;
    int ok = (*body >= '0' && *body <= '9') || (*body == '.' && body[1] >= '0' && body[1] <= '9');
    double v = 0.0;
    if (ok) {
        char *end = NULL;
        errno = 0;
        v = strtod(p, &end);
        /* ERANGE: overflow to +-HUGE_VAL or underflow to (nearly) zero; a
         * typed "1e-400" is not the 0 it would become. */
        ok = errno == 0 && end != p && *end == '\0' && isfinite(v);
    }
    if (ok) {
        int lo_ok = (open & PARSE_LO_OPEN) ? v > lo : v >= lo;
        int hi_ok = (open & PARSE_HI_OPEN) ? v < hi : v <= hi;
        ok = lo_ok && hi_ok;
    }
    if (!ok) {
        tp_error_set(err, err_len, "%s expects a number in %c%g, %g%c, got %s", what,
                     (open & PARSE_LO_OPEN) ? '(' : '[', lo, hi, (open & PARSE_HI_OPEN) ? ')' : ']', q);
        return -1;
    }
    *out = v;
    return 0;
}

int parse_double(const char *what, const char *s, double lo, double hi, double *out, char *err, size_t err_len) {
    return parse_double_in(what, s, lo, hi, PARSE_CLOSED, out, err, err_len);
}
