/* corpus_leftover.c: the temporaries a killed preparation leaves in its
 * cache folder, removed by the next start (see corpus.h).
 *
 * Every temporary of a preparation carries its maker's pid in its name:
 * the tokenizer's sample spm_train.<pid>.txt, the encoding workers' pieces
 * <stem>.tok.part<i>.<pid>.{en,ja}, and every file written atomically per
 * process, <name>.tmp.<pid> (the token files, the records, spm.model). The
 * maker is judged as a shared-memory segment's owner is (common/proc.h):
 * gone when no process has the pid, or the one that has it is a zombie or
 * started after the file last changed (the maker was alive then). Nothing
 * else is touched: another name, another user's file, a file whose maker
 * may be alive (a job preparing the same cache now). */
#define _GNU_SOURCE
#include "data/corpus_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proc.h"

#define PID_MAX_DIGITS 10  // pids fit in an int

/* The number of the n digits at s, or 0 when they are not 1..INT_MAX. */
static int pid_of(const char *s, size_t n) {
    if (n == 0 || n > PID_MAX_DIGITS || strspn(s, "0123456789") < n || s[0] == '0') return 0;
    const long long v = strtoll(s, NULL, 10);
    return v > 0 && v <= INT_MAX ? (int)v : 0;
}

/* The last occurrence of needle in s, or NULL. */
static const char *last_of(const char *s, const char *needle) {
    const char *at = NULL;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) at = p;
    return at;
}

/* The maker's pid of a temporary's name, 0 for any other name. */
static int leftover_pid(const char *name) {
    const size_t len = strlen(name);
    const char *digits = "0123456789";
    if (strncmp(name, "spm_train.", 10) == 0 && len > 14 && strcmp(name + len - 4, ".txt") == 0)
        return pid_of(name + 10, len - 14);
    const char *tmp = last_of(name, ".tmp.");
    if (tmp && tmp > name && strspn(tmp + 5, digits) == strlen(tmp + 5)) return pid_of(tmp + 5, strlen(tmp + 5));
    const char *part = last_of(name, ".tok.part");  // <stem>.tok.part<i>.<pid>.<en|ja>
    if (part && part > name) {
        const char *i = part + 9;
        const size_t n_i = strspn(i, digits);
        const char *pid = i + n_i + 1;
        const size_t n = n_i > 0 && i[n_i] == '.' ? strspn(pid, digits) : 0;
        if (n > 0 && (strcmp(pid + n, ".en") == 0 || strcmp(pid + n, ".ja") == 0)) return pid_of(pid, n);
    }
    return 0;
}

int corpus_remove_leftovers(const char *cache_dir, bool verbose) {
    DIR *d = opendir(cache_dir);
    if (!d) return 0;
    const uid_t me = geteuid();
    int n_removed = 0;
    long long n_bytes = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const int pid = leftover_pid(e->d_name);
        struct stat st;
        if (pid <= 0 || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != me)
            continue;
        const int64_t changed_ns = (int64_t)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
        if (proc_gone(pid, 0, changed_ns) && unlinkat(dirfd(d), e->d_name, 0) == 0) {
            n_removed++;
            n_bytes += st.st_size;
        }
    }
    closedir(d);
    if (n_removed && verbose) {
        printf("corpus: removed %d leftover file%s (%.1f MB) of preparations whose process is gone from %s\n",
               n_removed, n_removed == 1 ? "" : "s", (double)n_bytes / 1e6, cache_dir);
        fflush(stdout);
    }
    return n_removed;
}
