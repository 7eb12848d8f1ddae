/* comm_shm_impl.h: the shared-memory communicator's private parts, shared
 * by comm_shm.c (segment, barrier, staging, set-up), comm_shm_coll.c
 * (collectives) and comm_shm_p2p.c (send / recv). Private to src/tp.
 *
 * Segment layout (one per group of two or more ranks):
 *   header | RankWord (size) | PairWord (size, size-1) | slots (2, size, SLOT_BYTES) | rings (size, size-1, ring_bytes)
 * RankWords carry the barrier counters and pids, slots the collectives'
 * data, and each ordered pair (src, dst) of ranks has its own byte ring and
 * PairWord for point-to-point messages.
 */
#ifndef TPTRAIN_COMM_SHM_IMPL_H
#define TPTRAIN_COMM_SHM_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tp/comm_impl.h"
#include "tp/shm_reclaim.h"

#define SLOT_BYTES ((size_t)4 << 20)        // per rank slot: the chunk of every collective
#define STAGE_BYTES SLOT_BYTES              // host staging buffer for device buffers (see comm_set_device_copy)
#define DIRECT_MAX_BYTES ((size_t)64 << 10) // chunks up to this size are reduced whole by every rank
#define SPIN_ITERS 200                      // polls before sleeping on a futex
#define CHECK_PERIOD_S 0.05                 // how often a waiter re-checks missing peers

typedef enum { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_BARRIER, K_SEND, K_RECV, K_JOIN } Kind;
extern const char *const SHM_KIND_NAME[];

typedef struct {
    ShmOwner owner;  // first, written before anything else: stale segments are reclaimed by it (shm_reclaim.h)
    uint64_t magic;
    uint32_t version;
    int32_t size;
    uint64_t slot_bytes;
    uint64_t ring_bytes;
    uint64_t total_bytes;
    char job_id[128];
    char group[128];
    _Atomic uint32_t wake;        // futex word: bumped by the rank that completes a barrier
    _Atomic uint32_t n_sleepers;  // ranks inside (or about to enter) futex wait
    _Atomic uint64_t job_key;     // hash of (job id, group); written last by rank 0
} ShmHeader;

typedef struct {
    _Alignas(64) _Atomic uint64_t seq;  // barriers this rank has reached
    _Atomic int32_t pid;                 // 0 until the rank has joined
} RankWord;

/* One ordered pair's ring: a byte stream of messages (8-byte size, payload,
 * padding to 8 bytes). Only the sender moves head, only the receiver tail;
 * both bump wake after moving theirs. */
typedef struct {
    _Alignas(64) _Atomic uint64_t head;  // bytes published by the sender
    _Alignas(64) _Atomic uint64_t tail;  // bytes consumed by the receiver
    _Alignas(64) _Atomic uint32_t wake;  // futex word
    _Atomic uint32_t n_sleepers;
} PairWord;

/* A message a rank sent to itself, kept until it receives it. */
typedef struct SelfMsg {
    struct SelfMsg *next;
    size_t n_bytes;
    unsigned char data[];  // (n_bytes) host copy
} SelfMsg;

typedef struct {
    Comm base;          // first: comm.c dispatches through base.ops
    char group[128];
    int rank, size;
    double timeout_s;
    ShmHeader *hdr;        // NULL for a group of one
    RankWord *words;       // (size)
    PairWord *pairs;       // (size, size - 1)
    unsigned char *slots;  // (2, size, SLOT_BYTES)
    unsigned char *rings;  // (size, size - 1, ring_bytes)
    size_t ring_bytes;
    size_t map_bytes;
    uint64_t seq;          // barriers this rank has reached
    uint64_t n_uses;       // data exchanges so far: parity picks the slot set
    int failed;            // poisoned: every later call fails at once
    long calls[K_JOIN];    // calls per kind since creation (not reset with the stats): "#K" in messages
    char err[512];
    CommStats stats;
    int staged;            // user buffers are device memory, reached only through hooks
    CommDeviceCopy hooks;
    void *stage;           // (STAGE_BYTES) host staging, made on first staged call
    SelfMsg *self_head, *self_tail;
} ShmComm;

/* comm_shm.c */
void shm_cpu_relax(void);
void shm_futex_wait(_Atomic uint32_t *word, uint32_t expected, double timeout_s);
void shm_futex_wake_all(_Atomic uint32_t *word);
int shm_peer_gone(pid_t pid);
int shm_fail(ShmComm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int shm_sync_all(ShmComm *c, Kind kind, long call_no);
unsigned char *shm_slot(const ShmComm *c, uint64_t parity, int q);  // (SLOT_BYTES)
/* Starts a call: fails at once when poisoned; counts it; makes the stage
 * when staged. */
int shm_begin(ShmComm *c, Kind kind, long *counter, double *t0);
int shm_end(ShmComm *c, double t0, int rc);

/* Every access to a caller's buffer goes through these: plain memory
 * copies, or the device-copy hooks through the stage when staged. */
void shm_copy_in(ShmComm *c, void *host_dst, const void *user_src, size_t n_bytes);
void shm_copy_out(ShmComm *c, void *user_dst, const void *host_src, size_t n_bytes);
int shm_copy_user(ShmComm *c, void *user_dst, const void *user_src, size_t n_bytes);
/* Where a result of n_bytes <= STAGE_BYTES is computed: the caller's memory
 * itself, or the stage; shm_result_done then delivers it. */
void *shm_result_at(ShmComm *c, void *user);
void shm_result_done(ShmComm *c, void *user, size_t n_bytes);

/* comm_shm_coll.c */
int shm_allreduce(Comm *comm, void *buf, size_t n_elems, CommDtype dt, CommOp op);
int shm_reduce_scatter(Comm *comm, const void *in, void *out, size_t n_elems, CommDtype dt);
int shm_allgather(Comm *comm, const void *in, void *out, size_t n_elems, CommDtype dt);
int shm_broadcast(Comm *comm, void *buf, size_t n_bytes, int root);
int shm_barrier(Comm *comm);

/* comm_shm_p2p.c */
size_t shm_ring_bytes(int size);  // per ordered pair, for a group of size ranks
int shm_send(Comm *comm, const void *buf, size_t n_bytes, int peer);
int shm_recv(Comm *comm, void *buf, size_t n_bytes, int peer);
void shm_free_self_msgs(ShmComm *c);

#endif
