/* runtime.h: one rank's view of a parallel job: where it sits in the mesh
 * and the communicators of its groups.
 *
 * Under tprun the environment gives RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE and TPRUN_JOB_ID (and MASTER_ADDR, MASTER_PORT,
 * TPRUN_TOKEN for the store NCCL meets through); without it the process is
 * a world of one. Layout: world = tp x dp x pp; tp and dp as asked, 0 means
 * automatic: tensor parallel inside a node (tp = ranks per node, lowered
 * until it divides the heads, d_ff and world / pp), data parallel across the
 * rest. pp is 1 for now but has its groups already.
 *
 * Two kinds of communicators:
 *  - ctrl, the host control group: a shared-memory world for the trainer's
 *    small host messages (flags, memory tables, barriers). Host buffers
 *    only, whatever the device.
 *  - tp, dp, pp, the data groups, for the model's buffers: NCCL (device
 *    buffers) or shared memory (host buffers on CPU; device buffers staged
 *    through host memory with the backend's device-copy hooks when several
 *    ranks share a GPU). runtime_choose_comm decides which.
 * NCCL must never receive a host pointer: host scalars go through ctrl, or
 * to the device first.
 */
#ifndef TPTRAIN_RUNTIME_H
#define TPTRAIN_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include "tp/comm.h"
#include "tp/mesh.h"

/* --comm: what the data groups run on. */
typedef enum { RUNTIME_COMM_AUTO = 0, RUNTIME_COMM_NCCL = 1, RUNTIME_COMM_SHM = 2 } RuntimeComm;

typedef struct {
    int tp, dp;                         // 0: automatic
    int pp;                             // pipeline stages; 0 is taken as 1
    int n_heads, d_ff;                  // the model's: for the automatic tp and its checks
    double timeout_s;                   // bounds every wait of every group (--comm-timeout)
    RuntimeComm comm;                   // --comm auto | nccl | shm
    bool device_is_gpu;                 // the model's buffers are device memory
    int n_visible_gpus;                 // GPUs this process can see (0 on CPU)
    int device;                         // this rank's device ordinal, for NCCL
    const CommDeviceCopy *device_copy;  // needed when the data groups are shm and device_is_gpu
    void *stream;                       // cudaStream_t for NCCL: the backend's (NULL = the default stream)
} RuntimeOptions;

typedef struct {
    Mesh mesh;
    int local_rank, local_world;
    bool launched;            // started by tprun (or another torchrun-style launcher)
    char job_id[64];
    RuntimeComm comm;         // the data groups' backend: RUNTIME_COMM_NCCL or RUNTIME_COMM_SHM
    bool staged;              // shm data groups stage device buffers through host memory
    Comm *ctrl;               // host control: shm world, host buffers only
    Comm *tp, *dp, *pp;       // data groups (size-1 groups are cheap)
    Comm *nccl_world;         // NCCL: the world the data groups were split from; NULL otherwise
} Runtime;

/* 0, or -1 with one sentence in err (bad environment, invalid layout,
 * impossible --comm, rendezvous failure). */
int runtime_init(Runtime *rt, const RuntimeOptions *opt, char *err, size_t err_len);
void runtime_free(Runtime *rt);

/* Picks tp for `auto`: the largest t <= local_world dividing world, n_heads and d_ff. */
int runtime_auto_tp(int world, int local_world, int n_heads, int d_ff);

/* The --comm decision, a pure function. auto = NCCL when the build has it,
 * the buffers are on a GPU and every rank of this node has its own GPU
 * (local_world <= visible_gpus); shm otherwise. nccl when impossible and
 * unknown requests are refused with one sentence. *out is
 * RUNTIME_COMM_NCCL or RUNTIME_COMM_SHM (staged when device_is_gpu). 0 or -1. */
/* world: every rank of the job; a world of one needs no collectives, so
 * auto never makes it an NCCL communicator (only an explicit --comm nccl). */
int runtime_choose_comm(RuntimeComm request, bool have_nccl, bool device_is_gpu, int world, int local_world,
                        int visible_gpus, RuntimeComm *out, char *err, size_t err_len);

/* This rank's place on its node as the launcher gives it, before any
 * communicator exists (the backend, and so the GPU, is chosen first):
 * LOCAL_RANK, else RANK, else 0, through the strict parser. 0, or -1 +
 * err. runtime_init reads the same into Runtime.local_rank. */
int runtime_env_local_rank(int *local_rank, char *err, size_t err_len);

/* Device memory the NCCL communicators took at creation (0 with shm):
 * library overhead for the memory report. */
size_t runtime_library_bytes(const Runtime *rt);

/* Whether this build has the NCCL communicator. */
bool runtime_have_nccl(void);

/* "auto", "nccl", "shm" <-> RuntimeComm; parse: 0 or -1. */
int runtime_comm_parse(const char *s, RuntimeComm *out);
const char *runtime_comm_name(RuntimeComm c);

#endif
