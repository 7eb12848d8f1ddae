/* err.c: the fatal-error path and checked allocation shared by all code.
 * The rank appears once per line: from the launcher when there is one,
 * from here only for ranks started some other way (forked test ranks). */
#include "err.h"

static int g_log_rank = -1; /* process-wide by nature: one rank per process */

int tp_log_rank(void) { return g_log_rank; }
void tp_set_log_rank(int rank) { g_log_rank = rank; }

/* Whether this process's lines already carry its rank: tprun (which sets
 * TPRUN_JOB_ID for its workers) prefixes every line "[rank N] " or writes
 * rank_N.log, so a rank of our own would print "[rank 0] [rank 0]". */
static int launcher_labels_lines(void) {
    const char *job = getenv("TPRUN_JOB_ID");
    return job && job[0];
}

void tp_die(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_log_rank >= 0 && !launcher_labels_lines())
        fprintf(stderr, "[rank %d] error: %s (%s:%d)\n", g_log_rank, msg, file, line);
    else
        fprintf(stderr, "error: %s (%s:%d)\n", msg, file, line);
    fflush(stderr);
    exit(1);
}

void *tp_xmalloc(size_t n_bytes, const char *file, int line) {
    void *p = malloc(n_bytes ? n_bytes : 1);
    if (!p) tp_die(file, line, "out of memory allocating %zu bytes", n_bytes);
    return p;
}

void *tp_xcalloc(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) tp_die(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *tp_xrealloc(void *p, size_t n_bytes, const char *file, int line) {
    void *q = realloc(p, n_bytes ? n_bytes : 1);
    if (!q) tp_die(file, line, "out of memory reallocating to %zu bytes", n_bytes);
    return q;
}

void tp_error_set(char *buf, size_t n_bytes, const char *fmt, ...) {
    if (!buf || n_bytes == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n_bytes, fmt, ap);
    va_end(ap);
}
