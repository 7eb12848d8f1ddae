/* err.h: one error-macro family for the whole project.
 *
 * Every failure prints the failed call as text with the process rank, file
 * and line, then exits (training state is not recoverable mid-step). Checks
 * that guard user input stay on in release builds: never assert() for them.
 * Recoverable input errors (a bad file, a bad config) are reported through
 * return codes and an error string instead; see tp_error_set().
 */
#ifndef TPTRAIN_ERR_H
#define TPTRAIN_ERR_H

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>

/* Exit status "saved on signal": a job asked to stop by a signal finished
 * its step, saved a complete checkpoint and exited; `--resume auto`
 * continues it bit for bit. train_mt exits with it and tprun passes it
 * through (EX_TEMPFAIL of sysexits.h: try again later). */
#define TP_EXIT_SAVED_ON_SIGNAL 75

/* This process's rank (-1 = not parallel): set once by the program. Fatal
 * messages show it, unless the process runs under tprun, which labels
 * every line itself. */
int tp_log_rank(void);
void tp_set_log_rank(int rank);

void tp_die(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* Fatal check on a condition; message printed with printf-style arguments. */
#define TP_CHECK(cond, ...)                                          \
    do {                                                             \
        if (!(cond)) tp_die(__FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

/* Allocation that never returns NULL. */
#define TP_MALLOC(n_bytes) tp_xmalloc((n_bytes), __FILE__, __LINE__)
#define TP_CALLOC(n, size) tp_xcalloc((n), (size), __FILE__, __LINE__)
#define TP_REALLOC(p, n_bytes) tp_xrealloc((p), (n_bytes), __FILE__, __LINE__)
void *tp_xmalloc(size_t n_bytes, const char *file, int line);
void *tp_xcalloc(size_t n, size_t size, const char *file, int line);
void *tp_xrealloc(void *p, size_t n_bytes, const char *file, int line);

/* File calls: FILE_CHECK(fwrite(...) == n, path) prints errno text. */
#define TP_FILE_CHECK(cond, path)                                          \
    do {                                                                   \
        if (!(cond))                                                       \
            tp_die(__FILE__, __LINE__, "%s: %s (%s)", (path), #cond,       \
                   strerror(errno));                                       \
    } while (0)

/* Recoverable errors: a function returns -1 and leaves one sentence here. */
void tp_error_set(char *buf, size_t n_bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
