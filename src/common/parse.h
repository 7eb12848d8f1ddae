/* parse.h: the one strict number parser of the project.
 *
 * Every number a user types (flags of train_mt, translate_mt and tprun) or a
 * launcher passes (RANK, WORLD_SIZE, ... in runtime.c) goes through here, so
 * they are all refused the same way: the whole string must be the number.
 * Refused: an empty string, leading or trailing spaces, trailing garbage
 * ("4x", "1e"), values that overflow the type (strtol's saturation is an
 * error, never a silently clamped or wrapped value), NaN and infinities, and
 * anything outside the caller's range. Integers are decimal with an optional
 * '-'; reals take what strtod takes (1e-3, 0x1p-4) as long as the result is
 * finite and not rounded to zero or infinity.
 *
 * On refusal the functions return -1 and leave one sentence in err naming
 * `what` (the flag or variable) and the value as typed, e.g.
 *   --beam expects an integer in [0, 1000], got '4294967297'
 */
#ifndef TPTRAIN_PARSE_H
#define TPTRAIN_PARSE_H

#include <stddef.h>

/* Integer in [lo, hi]. 0, or -1 with err. *out is untouched on refusal. */
int parse_int(const char *what, const char *s, long lo, long hi, long *out, char *err, size_t err_len);

/* Either end of a real interval may be open. */
enum { PARSE_CLOSED = 0, PARSE_LO_OPEN = 1, PARSE_HI_OPEN = 2 };

/* Finite real in [lo, hi] (ends opened by `open`, a PARSE_* mask). 0, or -1
 * with err naming the interval as it is: "in (0, 1]". */
int parse_double_in(const char *what, const char *s, double lo, double hi, int open, double *out, char *err,
                    size_t err_len);

/* Finite real in the closed interval [lo, hi]. */
int parse_double(const char *what, const char *s, double lo, double hi, double *out, char *err, size_t err_len);

#endif
