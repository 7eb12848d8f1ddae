/* backend.h: the run-time seam between the model and the hardware.
 *
 * A Backend is a table of ops (kernels/ops_list.h states their contract: shapes,
 * row-major, backward ops accumulate unless told to write) plus the context they run in: the
 * device, its stream, the GEMM library's handle and plan cache, a workspace
 * arena, and the allocator that hands out (and accounts for) every buffer.
 * The model, the loss, the optimizer, the decoder and the trainer call only
 * this table, so one build trains on the CPU or a GPU chosen at run time
 * (`--device auto|cpu|cuda`). kernels/cpu and kernels/cuda each fill it; the
 * CUDA headers stay private to kernels/cuda (ggml's backend table and the
 * project's own comm_impl.h are the model for this shape).
 *
 * Memory. backend_alloc tags each buffer with what it holds, so a rank can
 * report its peak memory by category (the "peak GPU memory per rank" of the
 * run report). Library overhead (CUDA context, cuBLASLt, NCCL) is not
 * allocated here but measured around its set-up and noted with
 * backend_note_library. No op allocates behind the allocator: the ops that
 * need temporary space take it from the backend's workspace arena, which
 * is itself an allocation tagged MEM_WORKSPACE.
 *
 * Host and device meet only at named points: backend_upload (the batch,
 * through pinned staging on CUDA), backend_download (the step's scalars,
 * checkpoint and export copies, decoding's logits), backend_sync, and the
 * collectives' staging copies (backend_comm_copy: shared-memory groups on
 * a GPU). On the CPU backend device memory is host memory (host_visible),
 * so the copies are memcpy and callers may skip them.
 *
 * Precision (`--dtype fp32|bf16`): master weights, gradients, AdamW moments,
 * LayerNorm statistics, softmax and the loss stay fp32. In bf16 mode the
 * GEMMs (gemm, linear_fwd, linear_bwd) round their operands to bf16 and
 * accumulate in fp32, and a linear layer's bias enters as its bf16
 * rounding, as its weight does (autocast's rule; cuBLASLt's bias epilogue
 * on a GEMM that stores bf16 takes a bf16 vector). Weights and biases come
 * from the compute copy registered with
 * backend_add_compute_weights (a bf16 twin on CUDA, re-cast once per step by
 * backend_recast_weights; on the CPU the rounding is emulated at the same
 * points so CPU tests prove the logic).
 *
 * Gradients in bf16 mode follow PyTorch autocast's contract: the gradient
 * of a linear layer's output (dy), and those of ReLU, dropout and
 * attention's q, k, v that flow into a linear layer's backward, are bf16
 * values; LayerNorm and softmax keep fp32 arithmetic; weight gradients
 * accumulate in fp32. A linear layer's bias gradient db is the fp32 sum
 * (accumulated in double on the CPU and in the separate CUDA pass; in fp32
 * by cuBLASLt's BGRADB epilogue, within ops' stated band) of the same
 * bf16 dy its GEMMs read: linear_bwd's every form, bias_bwd,
 * residual_ln_bwd's d_bias and linear_bwd16_drelu's db_h (the FFN's first
 * layer's, summed from the masked bf16 hidden gradient; by cuBLASLt's
 * DRELU_BGRAD from the fp32 values before their rounding, within the
 * op's band) (ops_list.h). A producer whose consumer is a
 * linear backward writes that bf16 dy itself where an op says so (the
 * FFN's hidden gradient: linear_bwd16's dx16; an attention sub-block's
 * output gradient for out_proj: residual_ln_bwd's d_branch16, without
 * sequence parallelism; attention's q, k, v gradients for their
 * projections: the attention backward ops' dq16, dk16, dv16, with q, k, v
 * kept in bf16; an FFN sub-block's output gradient for fc2, made by the
 * layer boundary's dropout backward: dropout_bwd_at's dx16, without
 * sequence parallelism, with fc2's input kept in bf16), so no fp32 copy of
 * it is written and read again; elsewhere
 * the GEMMs round the fp32 dy they are given, the same values. What these
 * gradients flow into stays fp32: the linear layers' input gradients (dx),
 * which are summed over tp, over q, k and v, across decoder layers (the
 * encoder output's) and micro-batches, or sent between pipeline stages.
 */
#ifndef TPTRAIN_BACKEND_H
#define TPTRAIN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { BACKEND_CPU = 0, BACKEND_CUDA = 1 } BackendKind;
typedef enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 } Dtype;
typedef enum { ACT_RELU = 0, ACT_GELU = 1 } Activation;
/* Bytes of one row of a ReLU bit-mask over cols elements
 * (linear_relu_fwd16): cols bits rounded up to a multiple of 128, the
 * leading dimension cuBLASLt's ReLU aux epilogues require. */
static inline size_t relu_mask_row_bytes(int cols) { return cols > 0 ? (size_t)(cols + 127) / 128 * 16 : 0; }
/* How a backward op that takes it delivers its input gradient (ops_list.h):
 * GRAD_ADD accumulates (dx += ...), the ops' convention; GRAD_WRITE
 * overwrites (dx = ..., whatever dx held, NaN included), which spares the
 * caller a pass to zero dx and the op a read of those zeros. What is
 * written is what GRAD_ADD gives into zeros, bit for bit, but for the sign
 * of a zero: a -0 result (an underflow, a -0 input) is written as -0
 * where 0 + -0 gives +0 (the same value; no op spends work to change it). */
typedef enum { GRAD_ADD = 0, GRAD_WRITE = 1 } GradMode;
static inline bool grad_mode_valid(GradMode m) { return m == GRAD_ADD || m == GRAD_WRITE; }
/* The attention backward ops' pair of gradient sets (ops_list.h): fp32 dq,
 * dk, dv, or the bf16 dq16, dk16, dv16, chosen when any of those is given
 * and only written (GRAD_WRITE). Checks the pair for op (an error naming it
 * when both sets or an accumulating bf16 set are given); whether the bf16
 * set is the one. */
bool attn_grads_bf16(const char *op, GradMode mode, const void *dq, const void *dk, const void *dv, const void *dq16,
                     const void *dk16, const void *dv16);

/* What a buffer holds: the categories of the memory report. */
typedef enum {
    MEM_MASTER = 0,  // fp32 master weights
    MEM_COMPUTE,     // compute weights (bf16 twin on CUDA; an alias on the CPU: 0 bytes)
    MEM_GRAD,        // gradients
    MEM_OPTIM,       // optimizer state (AdamW m, v)
    MEM_ACT,         // activations (carved once for the largest batch) and batch ids
    MEM_WORKSPACE,   // the ops' workspace arena, GEMM workspace, step scalars, decode state
    MEM_COMM,        // communication staging buffers
    MEM_CKPT,        // host snapshot of an asynchronous checkpoint save (page-locked on CUDA)
    MEM_LIBRARY,     // CUDA context, cuBLASLt, NCCL: measured, not allocated here
    MEM_N_TAGS
} MemTag;

typedef struct {
    size_t cur[MEM_N_TAGS], peak[MEM_N_TAGS];
    size_t total_cur, total_peak;  // device memory: all tags but MEM_LIBRARY, less host_*: the allocator's figures
    size_t host_cur, host_peak;    // page-locked host memory (backend_alloc_host): in its tag, not in total
    size_t device_used_peak;       // the largest figure backend_device_used returned (0: none yet, or no device)
    long n_allocs;                 // calls to backend_alloc and backend_alloc_host so far
} MemStats;

const char *mem_tag_name(MemTag t);  // "master", "compute", ...

typedef struct Backend Backend;
#define BACKEND_MAX_WEIGHT_RANGES 8

/* The table. The op entries come from ops_list.h (their contracts are
 * there); the memory entries serve the allocator functions below. Every
 * entry is required. */
/* Multi-tensor ops (sumsq_segs, adamw_segs) walk a table of segments, so
 * the whole gradient norm or optimizer step is one launch however many
 * tensors there are. A segment is n elements: at x[x_at] (the summed
 * values; the parameters for AdamW), g[g_at] (AdamW's gradients) and
 * state[s_at] (AdamW's m and v); acc names the accumulator sumsq_segs adds
 * it to, decay whether AdamW decays it. Fixed-width fields: the same bytes
 * are read on the device. */
typedef struct {
    uint64_t x_at, g_at, s_at, n;
    int32_t acc, decay;
} OpSeg;
/* A GPU block's share of a segment: elements [lo, lo + OP_SEG_CHUNK_ELEMS) of segment seg. */
typedef struct {
    int32_t seg, pad;
    uint64_t lo;
} OpSegChunk;
#define OP_SEG_CHUNK_ELEMS 32768u
#define OP_SEG_MAX_ACC 4  // accumulators a table may name
/* Made once at set-up (op_segs_create, kernels/ops.h) and uploaded: one
 * device buffer with the segments, each segment's first chunk (n_segs + 1
 * prefix), the chunks, one double per chunk for partial sums and a counter
 * that the last block of sumsq_segs resets. The host copy serves the CPU
 * reference and sizes the launches. */
typedef struct {
    OpSeg *segs;  // [n_segs] host copy, segments with n > 0 in the order given
    int n_segs, n_chunks;
    void *dev;    // the one device buffer (tagged), carved below
    const OpSeg *d_segs;
    const int32_t *d_first;  // [n_segs + 1]
    const OpSegChunk *d_chunks;
    double *d_partials;      // [n_chunks]
    uint32_t *d_ticket;
} OpSegTable;

/* Helpers for the readers of ops_list.h: an entry's parameter list with the
 * backend put first, its argument list likewise, and either list bare. */
#define TP_OP_WITH_BE(...) (Backend *be, __VA_ARGS__)
#define TP_OP_ARGS_WITH_BE(...) (be, __VA_ARGS__)
#define TP_OP_BARE(...) __VA_ARGS__

typedef struct BackendOps {
    const char *name;  // "cpu", "cuda"
    /* memory (raw: the accounting is done by backend.c) */
    void *(*dev_alloc)(Backend *be, size_t n_bytes);
    void (*dev_free)(Backend *be, void *p);
    void (*upload)(Backend *be, void *dst_dev, const void *src_host, size_t n_bytes);
    void (*download)(Backend *be, void *dst_host, const void *src_dev, size_t n_bytes);
    void (*sync)(Backend *be);
    /* page-locked host memory (CUDA: cudaMallocHost; CPU: plain), NULL when none is left */
    void *(*host_alloc)(Backend *be, size_t n_bytes);
    void (*host_free)(Backend *be, void *p);
    /* upload without staging, ordered after queued work, returning once the copy is complete */
    void (*upload_wait)(Backend *be, void *dst_dev, const void *src_host, size_t n_bytes);
    void *(*stream)(Backend *be);                           // cudaStream_t as void *; NULL on the CPU
    bool (*device_used)(Backend *be, size_t *used_bytes);   // false: no device memory to ask about
    void (*recast)(Backend *be, void *compute, const float *master, size_t n_elems);  // fp32 -> compute dtype
    void (*destroy)(Backend *be);
    /* ops: one entry per op of ops_list.h, void (*name)(Backend *be, parameters) */
#define OP(name, cls, cpu, cuda, params, args) void (*name) TP_OP_WITH_BE params;
#include "ops_list.h"
    /* time marks for --profile (kernels/profile.h): a set of n_marks points
     * taken in queue order (CUDA events recorded on the stream; the wall
     * clock on the CPU). marks_read waits for mark n - 1 and writes the
     * seconds of marks 0..n-1 since mark 0; nothing waits per mark. */
    void *(*marks_new)(Backend *be, int n_marks);
    void (*mark)(Backend *be, void *marks, int i);
    void (*marks_read)(Backend *be, void *marks, int n, double *seconds);
    void (*marks_free)(Backend *be, void *marks);
    /* graphs (backend_capture_begin below): capture_end returns the
     * backend's graph, or NULL with one sentence in err */
    void (*capture_begin)(Backend *be);
    void *(*capture_end)(Backend *be, char *err, size_t err_len);
    void (*graph_launch)(Backend *be, void *graph);
    void (*graph_free)(Backend *be, void *graph);
} BackendOps;

/* Values of one micro-batch that the ops read from device memory instead of
 * their arguments while a backend has them set (backend_set_step_vars), so
 * that a graph captured once replays with new values (CUDA graphs):
 * dropout_fwd_at, dropout_bwd_at, residual_ln_fwd and residual_ln_bwd draw
 * the mask of stream stream_base + stream_id (dropout_stream's fields are
 * disjoint bits, so a base of dropout_stream(step, micro, 0, 0, 0) and an
 * argument of dropout_stream(0, 0, layer, site, tp) draw exactly the mask
 * of dropout_stream(step, micro, layer, site, tp)); xent_vp_grad_inplace
 * and xent_vp_grad_inplace16 scale by loss_scale instead of their dloss.
 * Fixed-width fields: the same bytes are read on the device. */
typedef struct {
    uint64_t stream_base;
    float loss_scale;
    uint32_t pad;
} StepVars;

/* The context. Backends keep their private state behind impl. */


struct Backend {
    const BackendOps *ops;
    BackendKind kind;
    Dtype dtype;          // GEMM operand precision
    bool host_visible;    // device pointers are host pointers (CPU)
    int device;           // GPU ordinal (-1 on the CPU)
    char device_name[128];
    size_t device_total_bytes;  // GPU memory (0 on the CPU)
    size_t mem_limit;           // TPTRAIN_DEVICE_MEMORY_LIMIT: most device bytes the allocator hands out (0: none)
    MemStats mem;
    /* Master weights and their compute copies (backend_add_compute_weights):
     * one range per model living on this backend. */
    struct { const float *master; void *compute; size_t n_elems; } weights[BACKEND_MAX_WEIGHT_RANGES];
    int n_weights;
    /* workspace arena (backend_workspace) */
    void *ws;
    size_t ws_bytes;
    struct BackendAlloc *allocs;  // live allocations (pointer, size, tag)
    struct OpProfile *profile;    // --profile's state (kernels/profile.h), NULL when off
    const StepVars *step_vars;    // device memory the ops read (backend_set_step_vars), NULL when off
    bool capturing;               // between backend_capture_begin and _end
    uint64_t n_frees;             // device buffers freed so far: a graph's pointers hold while it is unchanged
    void *capture;                // the backend's capture state (CPU: the recording)
    void *impl;
};

/* A backend as the build links it, the seam's registration: its kind, how
 * many devices it sees, and its constructor (local_rank picks the device;
 * NULL + one sentence in err). Each backend defines its entry
 * (cpu/backend_cpu.c: backend_cpu_entry, cuda/backend_cuda.cu:
 * backend_cuda_entry); backend_list.c, chosen by the build, lists those it
 * links: the CPU always, CUDA when the build has it. backend.c looks them
 * up by kind and names no backend. */
typedef struct {
    BackendKind kind;
    int (*device_count)(void);
    Backend *(*create)(Dtype dtype, int local_rank, char *err, size_t err_len);
} BackendEntry;
extern const BackendEntry backend_cpu_entry, backend_cuda_entry;
/* The entries this build links, NULL-terminated. */
extern const BackendEntry *const backend_entries[];

/* Which backend `--device auto|cpu|cuda` means here. */
typedef enum { DEVICE_AUTO = 0, DEVICE_CPU = 1, DEVICE_CUDA = 2 } DeviceChoice;
/* "auto" | "cpu" | "cuda" and "fp32" | "bf16": 0, or -1 for anything else. */
int device_choice_parse(const char *s, DeviceChoice *out);
int dtype_parse(const char *s, Dtype *out);

/* Creates the backend asked for. local_rank picks the GPU (local_rank %
 * visible GPUs). auto = cuda when this build has CUDA and a GPU is
 * visible, else cpu. NULL + one sentence in err when cuda is asked for and
 * unavailable ("--device cuda: this build has no CUDA" / "no GPU is
 * visible"), or when TPTRAIN_DEVICE_MEMORY_LIMIT (bytes of device memory
 * the tagged allocator may hand out, on either backend: what lets the
 * out-of-memory path run on a CPU) is not a whole number of bytes >= 1. */
Backend *backend_create(DeviceChoice choice, Dtype dtype, int local_rank, char *err, size_t err_len);
void backend_destroy(Backend *be);
/* Whether this build and machine can run the CUDA backend; the number of
 * visible GPUs in *n_gpus (0 without CUDA). */
bool backend_cuda_available(int *n_gpus);
const char *dtype_name(Dtype d);

/* Tagged allocation of device memory, zero-filled. When the device is out
 * of memory (cudaMalloc or the host allocation failed, or the request
 * would pass mem_limit) the process ends (exit 1) with one sentence naming
 * the rank, the tag, the bytes asked for, the bytes in use and the limit,
 * and what to change (--batch-tokens, --recompute, --zero, more ranks). */
void *backend_alloc(Backend *be, size_t n_bytes, MemTag tag);
void backend_free(Backend *be, void *p);  // NULL is a no-op
/* Page-locked host memory for the tag (pinned on CUDA: copies from it run
 * asynchronously at full speed), released with backend_free. Counted in
 * the tag's figures and in mem.host_*, not in mem.total_* (not device
 * memory). Dies like backend_alloc when none is left. */
void *backend_alloc_host(Backend *be, size_t n_bytes, MemTag tag);
/* The GEMM library's workspace a backend of this kind allocates at creation
 * (MEM_WORKSPACE): cuBLASLt's 32 MiB on CUDA (what cuBLAS asks for on
 * Hopper), none on the CPU. backend_cuda_create allocates with it and the
 * planner predicts with it. */
size_t backend_gemm_workspace_bytes(BackendKind kind);
/* Notes memory a library took (measured by the caller), for the report. */
void backend_note_library(Backend *be, size_t n_bytes);
/* Device memory in use now, by every process on this GPU (cudaMemGetInfo:
 * total - free) into *used_bytes, also kept as mem.device_used_peak when
 * larger; false (and 0) on a backend without device memory (CPU). */
bool backend_device_used(Backend *be, size_t *used_bytes);
/* The backend's queue, for libraries that take one (NCCL): a cudaStream_t
 * as void * on CUDA, NULL on the CPU. */
void *backend_stream(Backend *be);

/* Copies for collectives that stage device buffers through host memory
 * (tp/comm.h's CommDeviceCopy has the same fields; the program copies them
 * across, so kernels/ never includes tp/). ctx is the Backend. to_host /
 * to_device run on the backend's stream after its queued work and return
 * once the copy is complete; host_alloc / host_free make the staging
 * buffer as page-locked memory tagged MEM_COMM. The communicators holding
 * such a buffer must be freed before the backend. */
typedef struct {
    void *ctx;
    void (*to_host)(void *ctx, void *dst_host, const void *src_dev, size_t n_bytes);
    void (*to_device)(void *ctx, void *dst_dev, const void *src_host, size_t n_bytes);
    void *(*host_alloc)(void *ctx, size_t n_bytes);
    void (*host_free)(void *ctx, void *p);
} BackendCommCopy;
/* Fills *out and returns true when the backend's buffers are not host
 * memory (CUDA); false on a host-visible backend (CPU), whose buffers a
 * collective reads and writes as they are. */
bool backend_comm_copy(Backend *be, BackendCommCopy *out);
/* At least n_bytes of scratch for the ops that need it (grows, never shrinks;
 * growing waits for queued work). Backends call it; callers may reserve.
 * The arena is scratch_arena_bytes(the largest request) (scratch_sizes.h). */
void *backend_workspace(Backend *be, size_t n_bytes);

void backend_upload(Backend *be, void *dst_dev, const void *src_host, size_t n_bytes);
void backend_download(Backend *be, void *dst_host, const void *src_dev, size_t n_bytes);
void backend_sync(Backend *be);

/* Host access to a whole device buffer (checkpoint and export points).
 * backend_host_view: a readable host copy of n_elems floats, or the device
 * pointer itself where device memory is host memory; release with
 * backend_host_view_free. backend_host_stage: a writable host buffer for
 * them (the device pointer itself, or a fresh one); backend_host_commit
 * uploads it and releases it. */
const float *backend_host_view(Backend *be, const float *dev, size_t n_elems);
void backend_host_view_free(const float *view, const float *dev);
float *backend_host_stage(Backend *be, float *dev, size_t n_elems);
void backend_host_commit(Backend *be, float *dev, float *stage, size_t n_elems);

/* Registers a model's master weights (fp32, n_elems) so that in bf16 mode
 * the GEMMs read weights inside that range from a compute copy; allocates
 * the copy (MEM_COMPUTE) where the backend keeps one (CUDA), and casts it.
 * backend_remove_compute_weights forgets the range (and frees its copy). */
void backend_add_compute_weights(Backend *be, const float *master, size_t n_elems);
void backend_remove_compute_weights(Backend *be, const float *master);
/* Re-casts every compute copy from its master weights (after each optimizer
 * step, and after weights are loaded). */
void backend_recast_weights(Backend *be);
/* The compute copy of the weight tensor W (a pointer into a registered
 * master range), or NULL when W is not in one or there is no copy. */
const void *backend_compute_twin(const Backend *be, const float *W);

/* ---- Graphs: ops recorded once, replayed many times (CUDA graphs) ----------
 * backend_capture_begin starts recording the ops this thread queues on the
 * backend: from then on they are recorded, not run. backend_capture_end
 * stops and returns the recording as a graph, or NULL with one sentence in
 * err when the backend could not make one (then nothing ran: the caller
 * runs the ops again without capture). backend_graph_launch queues the
 * graph's ops again, in order, with the very arguments they were recorded
 * with: pointers, sizes and values. So whatever changes between launches
 * must live in device memory: the batch's ids (uploaded before the launch
 * into the same buffers) and the StepVars (backend_set_step_vars); and the
 * buffers the graph names must not move (backend_free counts into
 * n_frees: a graph captured at another count may name freed memory).
 * Between begin and end nothing may allocate, free, upload, download or
 * synchronise: each dies naming itself (a program error, not bad input).
 * CUDA: stream capture, cudaGraphInstantiate, cudaGraphLaunch. CPU: each
 * op's entry with its arguments kept in a list and called again in order
 * (kernels/cpu/graph_record.cc): the same contract, so the CPU tests prove
 * that what a graph replays is what the step computes. */
void backend_capture_begin(Backend *be);
void *backend_capture_end(Backend *be, char *err, size_t err_len);
void backend_graph_launch(Backend *be, void *graph);
void backend_graph_free(Backend *be, void *graph);  // NULL is a no-op
/* Makes the ops named at StepVars read *step_vars (device memory, or NULL:
 * back to their arguments). The caller keeps it valid while it is set. */
void backend_set_step_vars(Backend *be, const StepVars *step_vars);

#endif
