/* flags.h: the one place where a program's command line is checked for
 * flags it does not know, before getopt_long sees it.
 *
 * getopt_long accepts any unambiguous prefix (--max-step for --max-steps),
 * so a typo can silently become another setting; and its refusals are
 * followed by each program's whole usage. Every program (train_mt,
 * translate_mt, ckpt, tprun) instead names flags exactly and answers an
 * unknown one with one sentence and the nearest known flag:
 *   train_mt: unknown flag --max-stpes; did you mean --max-steps?
 */
#ifndef TPTRAIN_FLAGS_H
#define TPTRAIN_FLAGS_H

#include <getopt.h>
#include <stddef.h>

/* The known name (without dashes) nearest to `name` (without dashes) by
 * edit distance, or NULL when none is close enough to be a typo of it. */
const char *flag_nearest(const char *name, const char *const *known, int n_known);

/* Prints "PROG: unknown flag ARG; did you mean --NEAR?" (or "; see PROG
 * --help" when nothing is near) on stderr. arg is the flag as typed; a
 * "=value" part is left out of the message. */
void flag_unknown(const char *prog, const char *arg, const char *const *known, int n_known);

/* Checks argv (up to a lone "--") against a getopt_long table: every
 * --name or --name=value must name an entry exactly, a flag that takes a
 * value must have one, a flag that takes none must not get "=value", and
 * a single-dash word other than "-" is refused too (every flag here is
 * long). Values of flags that take one are skipped. 0 when all is well,
 * else -1 with one sentence printed. */
int flags_check_exact(const char *prog, int argc, char *const *argv, const struct option *opts);

#endif
