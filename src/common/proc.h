/* proc.h: whether the process that made something is gone, judged from a
 * pid and what is known of when that process ran (Linux /proc).
 *
 * Two kinds of leftovers share this one rule: shared-memory segments whose
 * owner record holds the maker's pid and start time (tp/shm_reclaim.h), and
 * the temporaries of a corpus preparation whose names hold the maker's pid
 * (data/corpus.h), where the file's own change time says when the maker was
 * alive. A pid alone is not enough: pids are reused, so a live process
 * under the pid is the maker only if it started no later than that. */
#ifndef TPTRAIN_PROC_H
#define TPTRAIN_PROC_H

#include <stdint.h>

/* A process started this long after a file it is taken to have written
 * changed is not its maker: the boot time /proc reports is read at a
 * second's resolution, so closer calls are left alone. */
#define PROC_START_SLACK_NS 2000000000LL

/* Field 3 (state) and field 22 (start time, clock ticks after boot) of
 * /proc/<pid>/stat. 0, or -1 with errno (ENOENT: no such process). */
int proc_state(int pid, char *state, uint64_t *start_ticks);

/* Inode of /proc/<pid>/ns/pid, 0 when unknown. */
uint64_t proc_pid_ns(int pid);

/* 1 when the maker of something is certainly gone, 0 when it may be alive
 * (or cannot be judged): no process has the pid, it is a zombie, or the
 * process under the pid is a later one: its start time is not start_ticks
 * (when non-zero), or it started after alive_at_ns (CLOCK_REALTIME, when
 * non-zero; PROC_START_SLACK_NS of doubt), a moment the maker was alive. */
int proc_gone(int pid, uint64_t start_ticks, int64_t alive_at_ns);

#endif
