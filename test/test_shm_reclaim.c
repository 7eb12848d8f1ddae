/* test_shm_reclaim.c: shared-memory segments of dead jobs are removed, and
 * nothing else is.
 *
 * A rank 0 killed with SIGKILL while its group forms (what SIGKILL to tprun
 * does to every rank) leaves its segment in /dev/shm: a real one is made
 * that way here. Beside it: the segment of a live rank 0 still forming its
 * group, a file with the project's prefix but no owner record, and a file
 * outside the prefix carrying a dead owner's record. Then a new job forms
 * its group: the dead job's segment is gone, the others are untouched. Also:
 * the last rank to map a segment takes its name away at once, even while
 * rank 0 is stopped (before, the name lived until rank 0 ran again), and a
 * pid reused by a later process does not keep a segment alive.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "tp/comm.h"
#include "tp/comm_shm.h"
#include "tp/shm_reclaim.h"

#define FORM_TIMEOUT_S 60.0  // a forming group waits this long for its peers (the test kills it before)
#define APPEAR_S 10.0        // how long a segment may take to appear

static char g_tag[64];  // unique to this run: every name below carries it

static void shm_path(char *out, size_t n, const char *name) { snprintf(out, n, "/dev/shm/%s", name); }

static int exists(const char *name) {
    char path[256];
    shm_path(path, sizeof path, name);
    return access(path, F_OK) == 0;
}

/* Waits until /dev/shm/name exists with a complete owner record. */
static int wait_owned(const char *name) {
    char path[256];
    shm_path(path, sizeof path, name);
    for (double t0 = tp_now_s(); tp_now_s() - t0 < APPEAR_S;) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            ShmOwner o;
            ssize_t r = pread(fd, &o, sizeof o, 0);
            close(fd);
            if (r == (ssize_t)sizeof o && o.magic == SHM_OWNER_MAGIC) return 1;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* A child that becomes rank `rank` of a group of `size` and then waits for
 * the test to end it. */
static pid_t start_rank(const char *job, int rank, int size) {
    pid_t pid = fork();
    if (pid == 0) {
        char err[512];
        Comm *c = comm_shm_create(job, "world", rank, size, FORM_TIMEOUT_S, err, sizeof err);
        if (!c) _exit(3);
        pause();
        _exit(0);
    }
    return pid;
}

static void kill_wait(pid_t pid, int sig) {
    kill(pid, sig);
    waitpid(pid, NULL, 0);
}

static void write_file(const char *name, const void *bytes, size_t n) {
    char path[256];
    shm_path(path, sizeof path, name);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(fd >= 0 && write(fd, bytes, n) == (ssize_t)n, "cannot write %s", path);
    if (fd >= 0) close(fd);
}

/* A job of two ranks forms its group and runs one allreduce. */
static int run_job(const char *job) {
    pid_t kids[2];
    for (int r = 0; r < 2; r++) {
        kids[r] = fork();
        if (kids[r] == 0) {
            char err[512];
            Comm *c = comm_shm_create(job, "world", r, 2, FORM_TIMEOUT_S, err, sizeof err);
            if (!c) {
                fprintf(stderr, "rank %d: %s\n", r, err);
                _exit(3);
            }
            float x = 1.0f + (float)r;
            int rc = comm_allreduce(c, &x, 1, COMM_SUM);
            comm_free(c);
            _exit(rc == 0 && x == 3.0f ? 0 : 4);
        }
    }
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    return ok;
}

static void test_reclaim(void) {
    char dead_job[96], live_job[96], new_job[96];
    char dead_name[160], live_name[160], new_name[160], noowner_name[160], foreign_name[160];
    snprintf(dead_job, sizeof dead_job, "%s-dead", g_tag);
    snprintf(live_job, sizeof live_job, "%s-live", g_tag);
    snprintf(new_job, sizeof new_job, "%s-new", g_tag);
    snprintf(dead_name, sizeof dead_name, "tpt-%s-world", dead_job);
    snprintf(live_name, sizeof live_name, "tpt-%s-world", live_job);
    snprintf(new_name, sizeof new_name, "tpt-%s-world", new_job);
    snprintf(noowner_name, sizeof noowner_name, "tpt-%s-noowner", g_tag);
    snprintf(foreign_name, sizeof foreign_name, "other-%s-foreign", g_tag);

    // A live rank 0 forming its group (first: creating a segment reclaims).
    pid_t live = start_rank(live_job, 0, 2);
    CHECK(wait_owned(live_name), "live rank 0 did not create %s", live_name);

    // A rank 0 killed while its group forms: the segment stays behind.
    pid_t dead = start_rank(dead_job, 0, 2);
    CHECK(wait_owned(dead_name), "rank 0 did not create %s", dead_name);
    char path[256];
    shm_path(path, sizeof path, dead_name);
    int fd = open(path, O_RDONLY);
    ShmOwner dead_owner;
    CHECK(fd >= 0 && pread(fd, &dead_owner, sizeof dead_owner, 0) == (ssize_t)sizeof dead_owner,
          "cannot read the owner record");
    if (fd >= 0) close(fd);
    CHECK(dead_owner.pid == dead, "owner pid %d, the creator is %d", dead_owner.pid, (int)dead);
    kill_wait(dead, SIGKILL);
    CHECK(exists(dead_name), "the killed rank's segment vanished by itself: nothing to test");

    // Files that must never be removed.
    char junk[64];
    memset(junk, 0x5a, sizeof junk);
    write_file(noowner_name, junk, sizeof junk);                       // our prefix, no record
    write_file(foreign_name, &dead_owner, sizeof dead_owner);          // a dead owner, not our prefix

    // A new job forms its group: the dead job's segment is reclaimed.
    CHECK(run_job(new_job), "the new job failed");
    CHECK(!exists(dead_name), "the dead job's segment %s is still in /dev/shm", dead_name);
    CHECK(exists(live_name), "the live job's segment %s was removed", live_name);
    CHECK(exists(noowner_name), "a segment without an owner record was removed");
    CHECK(exists(foreign_name), "a file outside the project's prefix was removed");
    CHECK(!exists(new_name), "the new job's own segment is still named after the group formed");

    // The live job is still intact: its rank 1 can join it.
    pid_t joiner = start_rank(live_job, 1, 2);
    for (double t0 = tp_now_s(); exists(live_name) && tp_now_s() - t0 < APPEAR_S;) usleep(10000);
    CHECK(!exists(live_name), "rank 1 could not join the live job (its segment is still named)");
    kill_wait(joiner, SIGKILL);
    kill_wait(live, SIGKILL);

    // The reclaimer itself: a dead owner's record is enough, a live or
    // reused pid is not. shm_owner_of(pid) of a process that is gone.
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    ShmOwner rec;
    shm_owner_of((int)getpid(), &rec);  // this process's namespace and a real start time...
    waitpid(gone, NULL, 0);
    rec.pid = (int32_t)gone;            // ...for a pid that no longer exists
    write_file(dead_name, &rec, sizeof rec);
    ShmOwner reused;
    shm_owner_of((int)getpid(), &reused);
    reused.start_ticks += 1;            // this pid, but started at another time: a reused pid
    char reused_name[160];
    snprintf(reused_name, sizeof reused_name, "tpt-%s-reused", g_tag);
    write_file(reused_name, &reused, sizeof reused);
    ShmOwner mine;
    shm_owner_of((int)getpid(), &mine);
    char mine_name[160];
    snprintf(mine_name, sizeof mine_name, "tpt-%s-mine", g_tag);
    write_file(mine_name, &mine, sizeof mine);
    // Shorter than a record: a creator killed between creating and recording. Old: removed; new: kept
    // (its creator may be between the two calls right now).
    char bare_old[160], bare_new[160];
    snprintf(bare_old, sizeof bare_old, "tpt-%s-bare-old", g_tag);
    snprintf(bare_new, sizeof bare_new, "tpt-%s-bare-new", g_tag);
    write_file(bare_old, "", 0);
    write_file(bare_new, "", 0);
    shm_path(path, sizeof path, bare_old);
    const struct timespec long_ago[2] = {{.tv_sec = time(NULL) - 2 * SHM_UNRECORDED_AGE_S},
                                         {.tv_sec = time(NULL) - 2 * SHM_UNRECORDED_AGE_S}};
    CHECK(utimensat(AT_FDCWD, path, long_ago, 0) == 0, "cannot age %s", path);
    size_t n_bytes = 0;
    int n = shm_reclaim_stale(NULL, &n_bytes);
    CHECK(!exists(bare_old), "a record-less segment %d s old was kept", 2 * SHM_UNRECORDED_AGE_S);
    CHECK(exists(bare_new), "a record-less segment just made was removed (its creator may be recording)");
    CHECK(n >= 2 && n_bytes >= 2 * sizeof(ShmOwner), "reclaimed %d segments (%zu bytes), want at least 2", n,
          n_bytes);
    CHECK(!exists(dead_name), "a record of a pid that is gone kept its segment");
    CHECK(!exists(reused_name), "a reused pid kept a dead owner's segment");
    CHECK(exists(mine_name), "a live owner's segment was removed");
    CHECK(exists(noowner_name) && exists(foreign_name), "a segment outside the rules was removed");

    char p2[256];
    const char *leftovers[] = {noowner_name, foreign_name, mine_name, live_name, dead_name, reused_name, bare_old,
                               bare_new};
    for (size_t i = 0; i < sizeof leftovers / sizeof *leftovers; i++) {
        shm_path(p2, sizeof p2, leftovers[i]);
        unlink(p2);
    }
}

/* The last rank to map a segment unlinks its name, whatever rank 0 is doing. */
static void test_window(void) {
    char job[96], name[160];
    snprintf(job, sizeof job, "%s-window", g_tag);
    snprintf(name, sizeof name, "tpt-%s-world", job);
    pid_t r0 = start_rank(job, 0, 2);
    CHECK(wait_owned(name), "rank 0 did not create %s", name);
    usleep(100 * 1000);  // rank 0 is waiting for its peer
    kill(r0, SIGSTOP);   // and now cannot run at all
    pid_t r1 = start_rank(job, 1, 2);
    double t0 = tp_now_s();
    while (exists(name) && tp_now_s() - t0 < APPEAR_S) usleep(5000);
    CHECK(!exists(name), "the segment is still named %.1f s after the last rank mapped it (rank 0 stopped)",
          tp_now_s() - t0);
    kill(r0, SIGCONT);
    kill_wait(r1, SIGKILL);
    kill_wait(r0, SIGKILL);
    char path[256];
    shm_path(path, sizeof path, name);
    unlink(path);
}

int main(void) {
    snprintf(g_tag, sizeof g_tag, "reclaimtest%d", (int)getpid());
    test_reclaim();
    test_window();
    return check_report("test_shm_reclaim");
}
