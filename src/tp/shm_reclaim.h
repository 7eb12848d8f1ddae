/* shm_reclaim.h: named shared-memory segments that say who made them, and
 * the clean-up of those whose maker has died.
 *
 * A segment lives under its name in /dev/shm only while a group forms (see
 * comm_shm.h); a job killed outright in that window (SIGKILL to tprun takes
 * every rank with it) leaves it there, megabytes each, for good. So every
 * segment tptrain creates starts with an owner record (magic, creator pid,
 * the creator's start time and pid namespace), written before the segment
 * is even sized, and whoever creates the next one (a rank 0 forming a group;
 * tprun at start) first removes every segment whose name has the project's
 * prefix, whose record is ours, and whose creator is gone: no such pid, a
 * zombie, or a pid reused by a process started at another time; and tprun
 * removes its own job's segments when the job ends, however it ends. A
 * segment shorter than a record, SHM_UNRECORDED_AGE_S after it was last
 * written, is one whose creator died between creating it and writing the
 * record (the two calls follow each other at once; a job killed within its
 * first second left such 0-byte segments): removed too. A segment without a
 * record of full length, of another user, of another pid namespace (its pids
 * cannot be judged from here) or outside the prefix is never touched.
 */
#ifndef TPTRAIN_SHM_RECLAIM_H
#define TPTRAIN_SHM_RECLAIM_H

#include <stddef.h>
#include <stdint.h>

#define SHM_NAME_PREFIX "/tpt-"                 // every segment tptrain creates
#define SHM_OWNER_MAGIC 0x316e776f2d747074ULL  // "tpt-own1"
#define SHM_UNRECORDED_AGE_S 60                // a segment still without its record this long: its creator died

/* The first bytes of every segment. */
typedef struct {
    uint64_t magic;        // SHM_OWNER_MAGIC once the record is complete
    int32_t pid;           // creator
    uint32_t reserved;     // 0
    uint64_t start_ticks;  // creator's start time (clock ticks after boot; 0 = unknown)
    uint64_t pid_ns;       // inode of the creator's pid namespace (0 = unknown)
} ShmOwner;

/* Creates the segment `name` (which must begin with SHM_NAME_PREFIX) for
 * this process: reclaims stale segments first, replaces a leftover of the
 * same name, opens it O_EXCL with mode 0600 and writes the owner record at
 * offset 0 (the segment is then sizeof(ShmOwner) bytes: the caller sizes
 * it). Returns the descriptor, or -1 with errno. */
int shm_owned_create(const char *name);

/* Removes every stale segment under dir (NULL = /dev/shm). Returns how many
 * were removed; *n_bytes (may be NULL) receives their total size. */
int shm_reclaim_stale(const char *dir, size_t *n_bytes);

/* Removes every segment of job job_id (names "tpt-<job_id>-...", this
 * user's regular files) under dir (NULL = /dev/shm) but those whose owner
 * record names a live process (a rank of another node of the job on the
 * same host): tprun calls it once every rank of its attempt is reaped, and
 * the job id is tprun's own random one. A
 * rank killed before it sized its segment leaves only the 32-byte record.
 * Returns how many were removed; *n_bytes (may be NULL) their total size. */
int shm_reclaim_job(const char *dir, const char *job_id, size_t *n_bytes);

/* Fills the owner record for process pid (the caller's own, in practice). */
void shm_owner_of(int pid, ShmOwner *out);

#endif
