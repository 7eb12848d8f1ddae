/* comm_shm.c: comm.h over POSIX shared memory, for ranks on one host:
 * the segment, the barrier, staging of device buffers, set-up and teardown.
 * The collectives are in comm_shm_coll.c, send / recv in comm_shm_p2p.c;
 * the layout is in comm_shm_impl.h.
 *
 * One segment per group: a header, one cache line per rank (its pid and a
 * monotonic barrier counter), the point-to-point pair words, two sets of
 * per-rank data slots of SLOT_BYTES, then the point-to-point rings.
 *
 * The barrier is a counter per rank: a rank stores how many barriers it has
 * reached, then waits until every counter has caught up. Per-rank counters
 * tell a waiter exactly which peers are missing, so a dead peer (its pid
 * gone or a zombie) or a timeout is reported by rank. Waiting spins briefly,
 * then sleeps on a futex word that the last arriver bumps; the sleep has a
 * 50 ms timeout so missing peers are re-checked without burning a core
 * (tests run many ranks on few cores).
 */
#define _GNU_SOURCE
#include "tp/comm_shm.h"
#include "tp/comm_shm_impl.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "tp/shm_reclaim.h"

#define SHM_MAGIC 0x316d68732d747074ULL  // "tpt-shm1"
#define SHM_VERSION 3u  // 2: point-to-point rings; 3: the owner record first (shm_reclaim.h)
#define MAX_RANKS 1024
#define NAME_MAX_LEN 96

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free to live in shared memory");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to live in shared memory");

_Static_assert(sizeof(RankWord) == 64, "one cache line per rank");
_Static_assert(sizeof(PairWord) == 192, "head, tail and wake on their own cache lines");

#define HEADER_BYTES ((size_t)1024)
_Static_assert(sizeof(ShmHeader) <= HEADER_BYTES, "header fits its reserved space");

const char *const SHM_KIND_NAME[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                     "barrier",   "send",           "recv",      "join"};

/* ---- small helpers ---- */

void shm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Shared (not private) futex: the word lives in memory mapped by several processes. */
void shm_futex_wait(_Atomic uint32_t *word, uint32_t expected, double timeout_s) {
    struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void shm_futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static uint64_t job_key_of(const char *job_id, const char *group) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (const char *p = job_id; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    h = (h ^ 0xffu) * 1099511628211ULL;  // separator
    for (const char *p = group; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    return h ? h : 1;
}

static int name_char_ok(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
           ch == '_' || ch == '.';
}

/* "/tpt-<job>-<group>"; when a part is long or has characters a shm name
 * cannot hold, the parts are shortened and sanitised and a hash of the
 * full pair keeps the name unique. */
static void segment_name(char *out, size_t out_len, const char *job_id, const char *group) {
    int plain = strlen(job_id) + strlen(group) + 6 <= NAME_MAX_LEN;
    for (const char *p = job_id; *p && plain; p++) plain = name_char_ok(*p);
    for (const char *p = group; *p && plain; p++) plain = name_char_ok(*p);
    if (plain) {
        snprintf(out, out_len, "/tpt-%s-%s", job_id, group);
        return;
    }
    char job_s[41], group_s[21];
    size_t i;
    for (i = 0; job_id[i] && i < sizeof job_s - 1; i++) job_s[i] = name_char_ok(job_id[i]) ? job_id[i] : '_';
    job_s[i] = 0;
    for (i = 0; group[i] && i < sizeof group_s - 1; i++) group_s[i] = name_char_ok(group[i]) ? group[i] : '_';
    group_s[i] = 0;
    snprintf(out, out_len, "/tpt-%s-%s-%016llx", job_s, group_s,
             (unsigned long long)job_key_of(job_id, group));
}

/* A peer is gone when its pid no longer exists or is a zombie (exited, not
 * yet reaped by its parent: kill() still succeeds on it). */
int shm_peer_gone(pid_t pid) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');  // the command name may hold spaces and parentheses
    if (!p || p[1] != ' ') return 0;
    return p[2] == 'Z' || p[2] == 'X';
}

static size_t n_pairs(int size) { return (size_t)size * (size_t)(size - 1); }

static size_t segment_bytes(int size, size_t ring_bytes) {
    return HEADER_BYTES + (size_t)size * sizeof(RankWord) + n_pairs(size) * sizeof(PairWord) +
           2 * (size_t)size * SLOT_BYTES + n_pairs(size) * ring_bytes;
}

unsigned char *shm_slot(const ShmComm *c, uint64_t parity, int q) {
    return c->slots + ((size_t)parity * (size_t)c->size + (size_t)q) * SLOT_BYTES;
}

static void map_layout(ShmComm *c, void *base) {
    unsigned char *p = base;
    c->hdr = (ShmHeader *)p;
    p += HEADER_BYTES;
    c->words = (RankWord *)p;
    p += (size_t)c->size * sizeof(RankWord);
    c->pairs = (PairWord *)p;
    p += n_pairs(c->size) * sizeof(PairWord);
    c->slots = p;
    p += 2 * (size_t)c->size * SLOT_BYTES;
    c->rings = p;
}

/* ---- barrier ---- */

static int first_missing(const ShmComm *c, uint64_t target) {
    for (int q = 0; q < c->size; q++)
        if (atomic_load(&c->words[q].seq) < target) return q;
    return -1;
}

static void arrive(ShmComm *c) {
    c->seq++;
    atomic_store(&c->words[c->rank].seq, c->seq);
    // Only the rank that completes the barrier wakes sleepers: with
    // sequentially consistent stores and loads, at least one of any set of
    // simultaneous last arrivers sees all counters.
    if (first_missing(c, c->seq) < 0) {
        atomic_fetch_add(&c->hdr->wake, 1);
        if (atomic_load(&c->hdr->n_sleepers) > 0) shm_futex_wake_all(&c->hdr->wake);
    }
}

int shm_fail(ShmComm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    c->failed = 1;
    return -1;
}

/* Waits until every rank has reached barrier c->seq. call_no: which call of
 * this kind (1-based), for the messages. */
static int wait_all(ShmComm *c, Kind kind, long call_no) {
    const uint64_t target = c->seq;
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (first_missing(c, target) < 0) return 0;
        shm_cpu_relax();
    }
    const double t0 = tp_now_s();
    double next_check = t0 + CHECK_PERIOD_S;
    for (;;) {
        uint32_t w = atomic_load(&c->hdr->wake);
        int missing = first_missing(c, target);
        if (missing < 0) return 0;
        double t = tp_now_s();
        if (t >= next_check) {
            next_check = t + CHECK_PERIOD_S;
            for (int q = missing; q < c->size; q++) {
                if (atomic_load(&c->words[q].seq) >= target) continue;
                pid_t pid = atomic_load(&c->words[q].pid);
                if (shm_peer_gone(pid)) {
                    if (kind == K_JOIN)
                        return shm_fail(c, "comm %s: rank %d (pid %d) exited while the group was forming", c->group, q,
                                        (int)pid);
                    return shm_fail(c, "comm %s: rank %d (pid %d) exited during %s", c->group, q, (int)pid,
                                    SHM_KIND_NAME[kind]);
                }
            }
            if (t - t0 >= c->timeout_s) {
                if (kind == K_JOIN)
                    return shm_fail(c, "comm %s: rank %d did not join within %g s", c->group, missing, c->timeout_s);
                return shm_fail(c, "comm %s: rank %d did not reach %s #%ld within %g s", c->group, missing,
                                SHM_KIND_NAME[kind], call_no, c->timeout_s);
            }
        }
        atomic_fetch_add(&c->hdr->n_sleepers, 1);
        if (first_missing(c, target) >= 0) shm_futex_wait(&c->hdr->wake, w, CHECK_PERIOD_S);
        atomic_fetch_sub(&c->hdr->n_sleepers, 1);
    }
}

int shm_sync_all(ShmComm *c, Kind kind, long call_no) {
    arrive(c);
    return wait_all(c, kind, call_no);
}

/* ---- creation ---- */

static const CommOps *shm_ops(void);

static Comm *create_fail(ShmComm *c, const char *name, int unlink_name, char *err, size_t err_len) {
    tp_error_set(err, err_len, "%s", c->err);
    if (unlink_name) shm_unlink(name);
    if (c->hdr) munmap(c->hdr, c->map_bytes);
    free(c);
    return NULL;
}

/* Rank 0: reclaim segments of dead jobs and any stale one of this name,
 * create with this process as the recorded owner, initialise, and publish
 * the job key last. */
static int create_segment(ShmComm *c, const char *name, const char *job_id, uint64_t key, int *created) {
    int fd = shm_owned_create(name);
    if (fd < 0) return shm_fail(c, "comm %s: cannot create shared memory %s (%s)", c->group, name, strerror(errno));
    *created = 1;
    int rc = posix_fallocate(fd, 0, (off_t)c->map_bytes);  // fail here, not with SIGBUS when /dev/shm is full
    if (rc != 0) {
        close(fd);
        return shm_fail(c, "comm %s: cannot reserve %.1f MiB of shared memory for %s (%s)", c->group,
                        (double)c->map_bytes / (1 << 20), name, strerror(rc));
    }
    void *base = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return shm_fail(c, "comm %s: cannot map %s (%s)", c->group, name, strerror(errno));
    map_layout(c, base);
    ShmHeader *h = c->hdr;
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->size = c->size;
    h->slot_bytes = SLOT_BYTES;
    h->ring_bytes = c->ring_bytes;
    h->total_bytes = c->map_bytes;
    snprintf(h->job_id, sizeof h->job_id, "%s", job_id);
    snprintf(h->group, sizeof h->group, "%s", c->group);
    atomic_store(&h->wake, 0);
    atomic_store(&h->n_sleepers, 0);
    for (int q = 0; q < c->size; q++) {
        atomic_store(&c->words[q].seq, 0);
        atomic_store(&c->words[q].pid, 0);
    }
    for (size_t k = 0; k < n_pairs(c->size); k++) {
        atomic_store(&c->pairs[k].head, 0);
        atomic_store(&c->pairs[k].tail, 0);
        atomic_store(&c->pairs[k].wake, 0);
        atomic_store(&c->pairs[k].n_sleepers, 0);
    }
    atomic_store(&c->words[0].pid, (int32_t)getpid());
    atomic_store_explicit(&h->job_key, key, memory_order_release);
    return 0;
}

/* Other ranks: open the segment once it exists with this job's key, a live
 * creator and a free slot for this rank; returns 1 when joined, 0 to retry
 * (why in *why), -1 on a hard error. */
static int try_join(ShmComm *c, const char *name, const char *job_id, uint64_t key, char *why, size_t why_len) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        snprintf(why, why_len, "rank 0 did not create the shared memory %s", name);
        return 0;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != c->map_bytes) {
        close(fd);
        snprintf(why, why_len, "the shared memory %s has %lld bytes, expected %zu for a group of %d", name,
                 (long long)st.st_size, c->map_bytes, c->size);
        return 0;
    }
    void *base = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        shm_fail(c, "comm %s: cannot map %s (%s)", c->group, name, strerror(errno));
        return -1;
    }
    map_layout(c, base);
    ShmHeader *h = c->hdr;
    const char *bad = NULL;
    if (atomic_load_explicit(&h->job_key, memory_order_acquire) != key) bad = "it belongs to another job";
    else if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->slot_bytes != SLOT_BYTES ||
             h->ring_bytes != c->ring_bytes)
        bad = "it has another layout";
    else if (h->size != c->size || strcmp(h->job_id, job_id) != 0 || strcmp(h->group, c->group) != 0)
        bad = "it was made for another group";
    else if (shm_peer_gone(atomic_load(&c->words[0].pid)))
        bad = "its creator has exited";
    else {
        int32_t expected = 0;
        if (atomic_compare_exchange_strong(&c->words[c->rank].pid, &expected, (int32_t)getpid())) {
            /* Every rank that has a pid here has mapped the segment: the last
             * one to claim its slot takes the name away at once (of several
             * claiming together, at least one sees them all). */
            int all = 1;
            for (int q = 0; q < c->size && all; q++) all = atomic_load(&c->words[q].pid) != 0;
            if (all) shm_unlink(name);
            return 1;
        }
        snprintf(why, why_len, "rank %d of the shared memory %s is already taken by pid %d", c->rank, name,
                 (int)expected);
    }
    if (bad) snprintf(why, why_len, "the shared memory %s is stale: %s", name, bad);
    munmap(base, c->map_bytes);
    c->hdr = NULL;
    return 0;
}

Comm *comm_shm_create(const char *job_id, const char *group, int rank, int size, double timeout_s, char *err,
                      size_t err_len) {
    if (!job_id || !*job_id || !group || !*group) {
        tp_error_set(err, err_len, "comm: the job id and the group name must not be empty");
        return NULL;
    }
    if (size < 1 || size > MAX_RANKS || rank < 0 || rank >= size) {
        tp_error_set(err, err_len, "comm %s: rank %d of a group of %d is invalid (1 to %d ranks)", group, rank,
                     size, MAX_RANKS);
        return NULL;
    }
    if (!(timeout_s > 0)) {
        tp_error_set(err, err_len, "comm %s: the timeout (%g s) must be positive", group, timeout_s);
        return NULL;
    }
    ShmComm *c = TP_CALLOC(1, sizeof *c);
    c->base.ops = shm_ops();
    snprintf(c->group, sizeof c->group, "%s", group);
    c->rank = rank;
    c->size = size;
    c->timeout_s = timeout_s;
    if (size == 1) return &c->base;  // no peers: collectives are no-ops or copies

    c->ring_bytes = shm_ring_bytes(size);
    c->map_bytes = segment_bytes(size, c->ring_bytes);
    char name[NAME_MAX_LEN + 32];
    segment_name(name, sizeof name, job_id, group);
    const uint64_t key = job_key_of(job_id, group);
    if (rank == 0) {
        int created = 0;
        if (create_segment(c, name, job_id, key, &created) != 0) return create_fail(c, name, created, err, err_len);
    } else {
        const double t0 = tp_now_s();
        double pause_s = 0.001;
        char why[256] = "";
        for (;;) {
            int rc = try_join(c, name, job_id, key, why, sizeof why);
            if (rc < 0) return create_fail(c, name, 0, err, err_len);
            if (rc == 1) break;
            if (tp_now_s() - t0 >= timeout_s) {
                shm_fail(c, "comm %s: rank %d could not join within %g s: %s", group, rank, timeout_s, why);
                return create_fail(c, name, 0, err, err_len);
            }
            sleep_s(pause_s);
            if (pause_s < 0.01) pause_s *= 2;
        }
    }
    // Everyone has mapped the segment once all have reached the first barrier.
    if (shm_sync_all(c, K_JOIN, 0) != 0) return create_fail(c, name, rank == 0, err, err_len);
    if (rank == 0) shm_unlink(name);
    return &c->base;
}

/* ---- calls and staging ---- */

size_t comm_shm_stage_bytes(int group_size) { return group_size > 1 ? STAGE_BYTES : 0; }

static int make_stage(ShmComm *c) {
    c->stage = c->hooks.host_alloc ? c->hooks.host_alloc(c->hooks.ctx, STAGE_BYTES) : malloc(STAGE_BYTES);
    if (!c->stage)
        return shm_fail(c, "comm %s: cannot allocate its %zu MiB host staging buffer for device buffers", c->group,
                        STAGE_BYTES >> 20);
    return 0;
}

static void release_stage(ShmComm *c) {
    if (!c->stage) return;
    if (c->hooks.host_free)
        c->hooks.host_free(c->hooks.ctx, c->stage);
    else
        free(c->stage);
    c->stage = NULL;
}

int shm_begin(ShmComm *c, Kind kind, long *counter, double *t0) {
    if (c->failed) return -1;
    (*counter)++;
    c->calls[kind]++;
    *t0 = tp_now_s();
    if (c->staged && !c->stage && comm_shm_stage_bytes(c->size) > 0) return make_stage(c);
    return 0;
}

int shm_end(ShmComm *c, double t0, int rc) {
    c->stats.seconds += tp_now_s() - t0;
    return rc;
}

void shm_copy_in(ShmComm *c, void *host_dst, const void *user_src, size_t n_bytes) {
    if (n_bytes == 0) return;
    if (!c->staged) {
        memcpy(host_dst, user_src, n_bytes);
        return;
    }
    for (size_t k = 0; k < n_bytes; k += STAGE_BYTES) {
        const size_t piece = n_bytes - k < STAGE_BYTES ? n_bytes - k : STAGE_BYTES;
        c->hooks.to_host(c->hooks.ctx, c->stage, (const char *)user_src + k, piece);
        memcpy((char *)host_dst + k, c->stage, piece);
    }
}

void shm_copy_out(ShmComm *c, void *user_dst, const void *host_src, size_t n_bytes) {
    if (n_bytes == 0) return;
    if (!c->staged) {
        memcpy(user_dst, host_src, n_bytes);
        return;
    }
    for (size_t k = 0; k < n_bytes; k += STAGE_BYTES) {
        const size_t piece = n_bytes - k < STAGE_BYTES ? n_bytes - k : STAGE_BYTES;
        memcpy(c->stage, (const char *)host_src + k, piece);
        c->hooks.to_device(c->hooks.ctx, (char *)user_dst + k, c->stage, piece);
    }
}

/* Overlapping buffers are allowed unstaged (memmove); staged, the caller's
 * device buffers must not overlap. */
int shm_copy_user(ShmComm *c, void *user_dst, const void *user_src, size_t n_bytes) {
    if (n_bytes == 0 || user_dst == user_src) return 0;
    if (!c->staged) {
        memmove(user_dst, user_src, n_bytes);
        return 0;
    }
    if (!c->stage && make_stage(c) != 0) return -1;  // a group of one stages only here
    for (size_t k = 0; k < n_bytes; k += STAGE_BYTES) {
        const size_t piece = n_bytes - k < STAGE_BYTES ? n_bytes - k : STAGE_BYTES;
        c->hooks.to_host(c->hooks.ctx, c->stage, (const char *)user_src + k, piece);
        c->hooks.to_device(c->hooks.ctx, (char *)user_dst + k, c->stage, piece);
    }
    return 0;
}

void *shm_result_at(ShmComm *c, void *user) { return c->staged ? c->stage : user; }

void shm_result_done(ShmComm *c, void *user, size_t n_bytes) {
    if (c->staged && n_bytes) c->hooks.to_device(c->hooks.ctx, user, c->stage, n_bytes);
}

/* A refusal leaves the communicator usable; a poisoned one keeps its first error. */
static int refuse(ShmComm *c, const char *what) {
    if (!c->failed) snprintf(c->err, sizeof c->err, "comm %s: %s", c->group, what);
    return -1;
}

static int shm_set_device_copy(Comm *comm, const CommDeviceCopy *hooks) {
    ShmComm *c = (ShmComm *)comm;
    if (hooks && (!hooks->to_host || !hooks->to_device))
        return refuse(c, "device-copy hooks need both to_host and to_device");
    if (hooks && !hooks->host_alloc != !hooks->host_free)
        return refuse(c, "device-copy hooks need both host_alloc and host_free, or neither");
    release_stage(c);  // made by the previous hooks' allocator
    if (hooks)
        c->hooks = *hooks;
    else
        memset(&c->hooks, 0, sizeof c->hooks);
    c->staged = hooks != NULL;
    return 0;
}

/* ---- accessors ---- */

static int shm_rank(const Comm *c) { return ((const ShmComm *)c)->rank; }
static int shm_size(const Comm *c) { return ((const ShmComm *)c)->size; }
static const char *shm_error(const Comm *c) { return ((const ShmComm *)c)->err; }
static CommStats shm_stats(const Comm *c) { return ((const ShmComm *)c)->stats; }
static void shm_reset_stats(Comm *c) { memset(&((ShmComm *)c)->stats, 0, sizeof(CommStats)); }

static void shm_free(Comm *comm) {
    ShmComm *c = (ShmComm *)comm;
    release_stage(c);
    shm_free_self_msgs(c);
    if (c->hdr) munmap(c->hdr, c->map_bytes);
    free(c);
}

static const CommOps *shm_ops(void) {
    static const CommOps ops = {
        .name = "shm",
        .allreduce = shm_allreduce,
        .reduce_scatter = shm_reduce_scatter,
        .allgather = shm_allgather,
        .broadcast = shm_broadcast,
        .barrier = shm_barrier,
        .send = shm_send,
        .recv = shm_recv,
        .set_device_copy = shm_set_device_copy,
        .rank = shm_rank,
        .size = shm_size,
        .error = shm_error,
        .stats = shm_stats,
        .reset_stats = shm_reset_stats,
        .free = shm_free,
    };
    return &ops;
}
