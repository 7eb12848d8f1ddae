/* shm_reclaim.c: owner records on shared-memory segments and the removal of
 * segments whose owner is dead (see shm_reclaim.h for the rules).
 *
 * Why this shape: the only evidence a dead job leaves is the segment
 * itself, so the record is the first thing written into it and the judgement
 * needs nothing but the record and /proc. It errs on the side of leaving a
 * segment: whatever cannot be read or judged (no record yet, a torn or
 * foreign record, another user, another pid namespace) stays. A segment is
 * removed by name with unlinkat on the directory it was listed in, so the
 * memory goes once the last mapping of it is gone (a dead owner has none).
 */
#define _GNU_SOURCE
#include "tp/shm_reclaim.h"

#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"

void shm_owner_of(int pid, ShmOwner *out) {
    memset(out, 0, sizeof *out);
    out->magic = SHM_OWNER_MAGIC;
    out->pid = pid;
    char state;
    uint64_t start = 0;
    if (proc_state(pid, &state, &start) == 0) out->start_ticks = start;
    out->pid_ns = proc_pid_ns(pid);
}

/* 1 when the record's creator is certainly gone, 0 when it is alive or
 * cannot be judged from here. */
static int owner_dead(const ShmOwner *o) {
    if (o->magic != SHM_OWNER_MAGIC || o->pid <= 0 || o->reserved != 0) return 0;
    if (o->pid_ns != proc_pid_ns(getpid())) return 0;  // pids of another namespace mean nothing here
    return proc_gone(o->pid, o->start_ticks, 0);
}

/* Removes this user's regular segments in dir whose names start with prefix
 * (no leading '/') and whose creator is gone: certainly dead (dead_only, any
 * job's segments), or not alive as far as can be told (a job's own segments,
 * which need no record to be removed). Returns how many; their bytes in
 * n_bytes. */
static int reclaim_scan(const char *dir, const char *prefix, bool dead_only, size_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    DIR *d = opendir(dir ? dir : SHM_DIR);
    if (!d) return 0;
    const size_t prefix_len = strlen(prefix);
    const uid_t me = geteuid();
    int n_removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, prefix_len) != 0) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st;
        ShmOwner o;
        const int ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == me;
        const int has_owner = pread(fd, &o, sizeof o, 0) == (ssize_t)sizeof o;
        close(fd);
        /* shorter than a record and older than SHM_UNRECORDED_AGE_S: its
         * creator died between creating it and writing the record */
        const int orphan = ours && st.st_size < (off_t)sizeof o && time(NULL) - st.st_mtime > SHM_UNRECORDED_AGE_S;
        /* a job's own segment with a live creator can only be a rank of
         * another node of this job on the same host: kept */
        const int gone = dead_only ? (has_owner && owner_dead(&o)) || orphan
                                   : !(has_owner && o.magic == SHM_OWNER_MAGIC && !owner_dead(&o));
        if (ours && gone && unlinkat(dirfd(d), e->d_name, 0) == 0) {
            n_removed++;
            if (n_bytes) *n_bytes += (size_t)st.st_size;
        }
    }
    closedir(d);
    return n_removed;
}

int shm_reclaim_stale(const char *dir, size_t *n_bytes) {
    return reclaim_scan(dir, SHM_NAME_PREFIX + 1, true, n_bytes);  // directory entries have no leading '/'
}

int shm_reclaim_job(const char *dir, const char *job_id, size_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    char prefix[128];
    if (!job_id || !job_id[0] || strchr(job_id, '/') ||
        snprintf(prefix, sizeof prefix, "%s%s-", SHM_NAME_PREFIX + 1, job_id) >= (int)sizeof prefix)
        return 0;
    return reclaim_scan(dir, prefix, false, n_bytes);
}

int shm_owned_create(const char *name) {
    if (!name || strncmp(name, SHM_NAME_PREFIX, strlen(SHM_NAME_PREFIX)) != 0) {
        errno = EINVAL;
        return -1;
    }
    shm_reclaim_stale(NULL, NULL);
    shm_unlink(name);  // a leftover under this very name (a killed attempt of the same job id)
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return -1;
    /* The record without its magic first, then the magic: a reader that
     * sees the magic sees a complete record. */
    ShmOwner o;
    shm_owner_of(getpid(), &o);
    const uint64_t magic = o.magic;
    o.magic = 0;
    if (pwrite(fd, &o, sizeof o, 0) != (ssize_t)sizeof o ||
        pwrite(fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic) {
        int saved = errno ? errno : EIO;
        close(fd);
        shm_unlink(name);
        errno = saved;
        return -1;
    }
    return fd;
}
