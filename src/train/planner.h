/* planner.h: memory per rank and step time of a layout, before launch.
 *
 * Memory: every buffer the run would allocate, by the memory report's tags,
 * from the same size functions the run allocates with (the parameter
 * tables, the activation walks on a model shell, the gradient buckets, the
 * decode state), for the batch shapes the run will see. Nothing is
 * allocated. The allocator's peak is the buffers held for the whole run
 * plus the largest of the transient ones (ZeRO-2's live gradient buckets in
 * backward, the tp gather and the decode state at evaluation).
 *
 * Time: FLOPs and bytes per op from the config and the shapes, priced with
 * a calibration of the machine (planner_calibrate: GEMM rates at the
 * model's shapes, memory bandwidth, collective latency and bandwidth),
 * split into compute, exposed communication and pipeline bubble.
 * docs/planner.md gives the formulas.
 */
#ifndef TPTRAIN_PLANNER_H
#define TPTRAIN_PLANNER_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/backend.h"
#include "tp/comm.h"
#include "train/grad_sync.h"
#include "transformer/config.h"
#include "transformer/model.h"
#include "transformer/stage.h"

typedef struct {
    int B, S, T;
} PlanShape;

/* A layout and what the run feeds it. */
typedef struct {
    ModelConfig cfg;
    int tp, dp, pp, micro;      // the mesh and micro-batches per dp rank and step
    const ModelStage *stages;   // [pp]
    ModelRecompute recompute;
    bool seq_par;
    GradSyncConfig grad;        // zero, bucket_elems, dtype, overlap (staged is set from pp)
    bool gpu;                   // a CUDA backend (batch ids uploaded, bf16 compute copies, cuBLASLt's workspace)
    bool staged;                // the data groups are shared memory staging device buffers (ranks share a GPU)
    bool nccl;                  // the groups are NCCL communicators (a GPU per rank)
    Dtype dtype;
    bool flash;                 // flash attention (model_set_attention; in bf16 only)
    int slots;                  // ranks that compute at once without slowing each other: the cores on
                                // CPU, the GPUs on a GPU machine (0: as many as ranks)
    /* training micro-batches: train[(g dp + r) micro + i] is dp rank r's
     * micro-batch i of step g, for g < n_steps */
    const PlanShape *train;
    int n_steps;
    /* evaluation on dp rank 0's tp group (dev loss): the batches' shapes */
    const PlanShape *eval;
    int n_eval;
    bool gather_at_eval;        // model_gather before evaluation (a corpus with tp or pp > 1)
    bool decode;                // rank 0 decodes dev sentences (with tp or pp > 1 on a whole copy it holds)
    int decode_n, decode_S, beam;  // the largest decode batch: sentences, source length (eos included)
    bool ckpt_snapshot;         // --save with --save-mode async: a host snapshot of the rank's state (MEM_CKPT)
} PlanInput;

typedef struct {
    int rank, tp, dp, pp;
    double tag[MEM_N_TAGS];     // predicted peak bytes per tag (MEM_LIBRARY: the calibrated overhead)
    double allocator_peak;      // predicted peak of the allocator's device total (all tags but the library,
                                // less the page-locked host staging counted under comm)
    double staging;             // of tag[MEM_COMM]: the groups' host staging buffers (comm_shm_stage_bytes)
                                // (tag[MEM_CKPT], the asynchronous save's snapshot, is host memory too)
    double scratch;             // of tag[MEM_WORKSPACE]: the ops' scratch arena (planner_scratch_arena)
    double nccl;                // tag[MEM_LIBRARY] before the measured context: NCCL's buffers (planner_nccl_bytes)
    /* seconds per step */
    double t_compute, t_comm, t_bubble, t_step;
    size_t n_params;            // this rank's parameters (its stage's table)
} PlanRank;

/* Rank r's (the mesh order: tp fastest, then dp, then pp) predicted memory
 * into out (the time fields are left 0). */
void planner_memory(const PlanInput *in, int rank, PlanRank *out);
/* The CUDA ops' scratch arena of a rank (0 on the CPU): scratch_arena_bytes
 * of its largest request over training, evaluation and decoding. */
size_t planner_scratch_arena(const PlanInput *in, int rank);
/* NCCL's device buffers in a communicator of n_ranks (0 for one), as NCCL
 * documents them: NCCL_BUFFSIZE (default PLAN_NCCL_BUFFSIZE) per channel
 * per ring peer; channels from NCCL_MAX_NCHANNELS or NCCL_MIN_NCHANNELS,
 * else the PLAN_NCCL_CHANNELS assumed (NCCL picks by topology). */
#define PLAN_NCCL_BUFFSIZE ((size_t)4 << 20)
#define PLAN_NCCL_CHANNELS 16
double planner_nccl_bytes(int n_ranks);
size_t planner_nccl_buffsize(void);
int planner_nccl_channels(void);
/* The largest scratch request (kernels/scratch_sizes.h) of a model of stage
 * st on tp shards for Ns source and Nt target tokens: forward, and with
 * backward its gradients; of decoding n sentences of S source tokens
 * (beam rows each) on the whole model (plan_scratch.c). */
size_t planner_scratch_stage(const ModelConfig *cfg, bool bf16, int tp, const ModelStage *st, bool seq_par, int Ns,
                             int Nt, bool backward);
size_t planner_scratch_decode(const ModelConfig *cfg, bool bf16, int n, int S, int beam);

/* ---- time ------------------------------------------------------------------ */

enum { PLAN_MAX_GEMMS = 256, PLAN_MAX_GROUP = 16, PLAN_MAX_ELEM = 16 };

/* What the machine does, measured by the planner_calibrate functions. */
typedef struct {
    char key[256];              // the machine: host, processor or GPU, dtype, ranks per node, threads per rank
    int n_gemm;
    struct { int M, N, K; double flops_per_s; } gemm[PLAN_MAX_GEMMS];  // linear-layer rates at the shapes measured
    double mem_bw;              // bytes/s of a streaming element-wise op (read 2, write 1)
    /* the ops that are not GEMMs or attention (LayerNorm, softmax, dropout,
     * loss, embeddings, the calls): seconds per activation float kept and
     * per layer and micro-batch, forward and backward, from a 1+1-layer
     * model's steps at two shapes less their GEMMs and attention */
    int n_elem;
    struct {
        double tokens;          // the micro-batch measured: rows x (source + target length)
        double per_float, fixed_per_layer;
    } elem[PLAN_MAX_ELEM];      // one per micro-batch size (within 2x), the nearest prices a shape
    double attn_flops_per_s;    // the attention op's rate (forward)
    /* allreduce of n bytes in a group of g ranks: ar_lat[g] + n / ar_bw[g]
     * seconds (0: not measured); a stage message: p2p_lat + n / p2p_bw */
    double ar_lat[PLAN_MAX_GROUP + 1], ar_bw[PLAN_MAX_GROUP + 1];
    double ar_loaded[PLAN_MAX_GROUP + 1];  // the latency between compute on a loaded machine (the larger counts)
    double p2p_lat, p2p_bw;
    int ranks;                  // ranks that measured at once, each with the key's threads: the rates
                                // are those of a rank while that many compute (docs/planner.md)
    double library_bytes;       // the device's library overhead (CUDA context, cuBLASLt, NCCL)
} PlanCalib;

/* The linear layers' (M, N, K) of a micro-batch of shape s on one tp rank
 * of a stage, each once, into out (room for PLAN_MAX_GEMMS); returns the count. */
int planner_gemm_shapes(const PlanInput *in, int tp, const ModelStage *st, PlanShape s, int (*out)[3]);
/* Measures the GEMM rates at the shapes not yet in c, the memory bandwidth,
 * the attention rate and the element-wise cost on backend be (seconds).
 * With sync, every member calls it at once with the same c and in and
 * each measurement starts together (contention as in the run). */
void planner_calibrate_compute(Backend *be, const PlanInput *in, PlanCalib *c, Comm *sync);
/* Measures allreduce latency and bandwidth in group comm (every member
 * calls it at once) and, with two or more members, a stage message's
 * between members 0 and 1. */
void planner_calibrate_comm(Backend *be, Comm *comm, PlanCalib *c);
/* Reads the calibration for c->key from path: 0, or -1 when absent or unreadable. */
int planner_calib_load(const char *path, PlanCalib *c);
/* Writes it (atomically; other machines' entries kept). Returns 0 or -1 with err. */
int planner_calib_save(const char *path, const PlanCalib *c, char *err, size_t err_len);

/* Every rank's predicted step time: the t_ fields of ranks[tp dp pp] (the
 * mesh order), memory left as is; the pipeline of every step is priced once. */
void planner_time(const PlanInput *in, const PlanCalib *c, PlanRank *ranks);

#endif
