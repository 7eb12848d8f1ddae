/* backend.c: what every backend shares: choosing one at run time, the tagged
 * allocator with its current and peak bytes per tag (device memory and
 * page-locked host memory), the workspace arena, the compute-weight
 * registration, and the staging hooks the shared-memory collectives take
 * (backend_comm_copy, built on the table's copies). The backends themselves
 * only fill the table and provide raw allocation and copies; they are
 * found through their entries (backend.h's BackendEntry, listed by
 * backend_list.c), by kind. */
#include "backend.h"
#include "profile.h"
#include "scratch_sizes.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "err.h"
#include "parse.h"

/* One live allocation. A list: a rank holds a few dozen buffers at most. */
typedef struct BackendAlloc {
    void *p;
    size_t n_bytes;
    MemTag tag;
    bool host;  // backend_alloc_host: page-locked host memory
    struct BackendAlloc *next;
} BackendAlloc;

/* The entry of kind in this build, or NULL when it does not link one. */
static const BackendEntry *backend_entry(BackendKind kind) {
    for (int i = 0; backend_entries[i]; i++)
        if (backend_entries[i]->kind == kind) return backend_entries[i];
    return NULL;
}

const char *mem_tag_name(MemTag t) {
    static const char *names[MEM_N_TAGS] = {"master", "compute", "grads", "optimizer",
                                            "activations", "workspace", "comm", "ckpt", "library"};
    return t >= 0 && t < MEM_N_TAGS ? names[t] : "?";
}

const char *dtype_name(Dtype d) { return d == DTYPE_BF16 ? "bf16" : "fp32"; }

int device_choice_parse(const char *s, DeviceChoice *out) {
    static const struct { const char *name; DeviceChoice d; } all[] = {
        {"auto", DEVICE_AUTO}, {"cpu", DEVICE_CPU}, {"cuda", DEVICE_CUDA}};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, all[i].name) == 0) {
            *out = all[i].d;
            return 0;
        }
    return -1;
}

int dtype_parse(const char *s, Dtype *out) {
    if (s && (strcmp(s, "fp32") == 0 || strcmp(s, "bf16") == 0)) {
        *out = strcmp(s, "bf16") == 0 ? DTYPE_BF16 : DTYPE_F32;
        return 0;
    }
    return -1;
}

bool backend_cuda_available(int *n_gpus) {
    const BackendEntry *gpu = backend_entry(BACKEND_CUDA);
    int n = gpu ? gpu->device_count() : 0;
    if (n_gpus) *n_gpus = n;
    return n > 0;
}

/* TPTRAIN_DEVICE_MEMORY_LIMIT: bytes, a whole number (unset or empty: no limit). */
#define MEMORY_LIMIT_ENV "TPTRAIN_DEVICE_MEMORY_LIMIT"
static int memory_limit_env(size_t *out, char *err, size_t err_len) {
    const char *v = getenv(MEMORY_LIMIT_ENV);
    *out = 0;
    if (!v || !*v) return 0;
    long n;
    char why[256];
    if (parse_int(MEMORY_LIMIT_ENV, v, 1, LONG_MAX, &n, why, sizeof why)) {
        tp_error_set(err, err_len, "%s (bytes of device memory the allocator may hand out, e.g. 1073741824 for "
                     "1 GiB)", why);
        return -1;
    }
    *out = (size_t)n;
    return 0;
}

static Backend *backend_create_kind(DeviceChoice choice, Dtype dtype, int local_rank, char *err, size_t err_len);

Backend *backend_create(DeviceChoice choice, Dtype dtype, int local_rank, char *err, size_t err_len) {
    size_t limit;
    if (memory_limit_env(&limit, err, err_len)) return NULL;
    Backend *be = backend_create_kind(choice, dtype, local_rank, err, err_len);
    if (be) be->mem_limit = limit;
    return be;
}

static Backend *backend_create_kind(DeviceChoice choice, Dtype dtype, int local_rank, char *err, size_t err_len) {
    const BackendEntry *cpu = backend_entry(BACKEND_CPU), *gpu = backend_entry(BACKEND_CUDA);
    if (choice == DEVICE_CPU) return cpu->create(dtype, local_rank, err, err_len);
    if (gpu && gpu->device_count() > 0) return gpu->create(dtype, local_rank, err, err_len);
    if (choice == DEVICE_AUTO) return cpu->create(dtype, local_rank, err, err_len);
    if (gpu) tp_error_set(err, err_len, "--device cuda: no GPU is visible to this process");
    else
        tp_error_set(err, err_len, "--device cuda: this build of tptrain has no CUDA backend (it was configured "
                                   "without nvcc or with -DTPTRAIN_CUDA=OFF)");
    return NULL;
}

void backend_destroy(Backend *be) {
    if (!be) return;
    backend_profile_disable(be);
    backend_sync(be);
    while (be->n_weights) backend_remove_compute_weights(be, be->weights[0].master);
    backend_free(be, be->ws);
    be->ws = NULL;
    while (be->allocs) backend_free(be, be->allocs->p);
    be->ops->destroy(be);  // frees be itself
}

/* What to change when a buffer of this tag does not fit: the planner's
 * levers for it (train_mt --plan predicts every rank's peak by tag). */
static const char *oom_advice(MemTag tag) {
    switch (tag) {
    case MEM_ACT:
    case MEM_WORKSPACE:
        return "lower --batch-tokens, add --recompute selective or full (or --sequence-parallel with --tp > 1), or "
               "spread the model over more ranks (--tp, --pp)";
    case MEM_COMM: return "lower --grad-bucket-mb or --batch-tokens, or use --comm nccl where every rank has a GPU";
    case MEM_CKPT: return "save with --save-mode sync (no host snapshot), or spread the model over more ranks";
    default:
        return "shard the state with --zero 1 (optimizer) or --zero 2 (gradients too), spread the model over more "
               "ranks (--tp, --pp), or lower --batch-tokens to leave it room";
    }
}

/* The end of a run that asked for more memory than there is: one sentence. */
__attribute__((noreturn)) static void out_of_memory(const Backend *be, size_t n_bytes, MemTag tag, bool host) {
    const double mib = 1.0 / 1048576.0;
    const size_t used = host ? be->mem.host_cur : be->mem.total_cur;
    char limit[160] = "";
    if (!host && be->mem_limit)
        snprintf(limit, sizeof limit, " of the %.1f MiB (%zu bytes) " MEMORY_LIMIT_ENV " allows", be->mem_limit * mib,
                 be->mem_limit);
    else if (!host && be->device_total_bytes)
        snprintf(limit, sizeof limit, " of the device's %.1f MiB", be->device_total_bytes * mib);
    fprintf(stderr, "rank %d is out of %s memory on %s: %s asked for %.1f MiB (%zu bytes) with %.1f MiB (%zu bytes) "
            "in use%s; to fit, %s (train_mt --plan predicts each rank's peak)\n",
            tp_log_rank() > 0 ? tp_log_rank() : 0,
            host ? "page-locked host" : be->kind == BACKEND_CUDA ? "GPU" : "host", be->device_name, mem_tag_name(tag),
            n_bytes * mib, n_bytes, used * mib, used, limit, oom_advice(tag));
    fflush(stderr);
    exit(1);
}

/* Records a live allocation and adds it to the figures of its tag and kind. */
static void *track(Backend *be, void *p, size_t n_bytes, MemTag tag, bool host) {
    if (!p) out_of_memory(be, n_bytes, tag, host);
    BackendAlloc *a = TP_MALLOC(sizeof *a);
    *a = (BackendAlloc){.p = p, .n_bytes = n_bytes, .tag = tag, .host = host, .next = be->allocs};
    be->allocs = a;
    MemStats *s = &be->mem;
    s->cur[tag] += n_bytes;
    if (s->cur[tag] > s->peak[tag]) s->peak[tag] = s->cur[tag];
    size_t *cur = host ? &s->host_cur : &s->total_cur, *peak = host ? &s->host_peak : &s->total_peak;
    *cur += n_bytes;
    if (*cur > *peak) *peak = *cur;
    s->n_allocs++;
    return p;
}

/* The calls a graph capture cannot hold (backend.h). */
static void not_capturing(const Backend *be, const char *what) {
    TP_CHECK(!be->capturing, "%s inside a graph capture (a program error: the captured ops must not %s)", what,
             "allocate, free, copy to or from the host, or wait");
}

void *backend_alloc(Backend *be, size_t n_bytes, MemTag tag) {
    TP_CHECK(tag >= 0 && tag < MEM_LIBRARY, "backend_alloc: tag %d cannot be allocated", (int)tag);
    not_capturing(be, "backend_alloc");
    if (n_bytes == 0) n_bytes = 1;
    if (be->mem_limit && n_bytes > be->mem_limit - (be->mem.total_cur < be->mem_limit ? be->mem.total_cur : be->mem_limit))
        out_of_memory(be, n_bytes, tag, false);
    return track(be, be->ops->dev_alloc(be, n_bytes), n_bytes, tag, false);
}

void *backend_alloc_host(Backend *be, size_t n_bytes, MemTag tag) {
    TP_CHECK(tag >= 0 && tag < MEM_LIBRARY, "backend_alloc_host: tag %d cannot be allocated", (int)tag);
    not_capturing(be, "backend_alloc_host");
    if (n_bytes == 0) n_bytes = 1;
    return track(be, be->ops->host_alloc(be, n_bytes), n_bytes, tag, true);
}

void backend_free(Backend *be, void *p) {
    if (!p) return;
    not_capturing(be, "backend_free");
    for (BackendAlloc **pp = &be->allocs; *pp; pp = &(*pp)->next) {
        BackendAlloc *a = *pp;
        if (a->p != p) continue;
        be->mem.cur[a->tag] -= a->n_bytes;
        *(a->host ? &be->mem.host_cur : &be->mem.total_cur) -= a->n_bytes;
        *pp = a->next;
        const bool host = a->host;
        free(a);
        if (host) {
            be->ops->host_free(be, p);
        } else {
            be->ops->dev_free(be, p);
            be->n_frees++;
        }
        return;
    }
    tp_die(__FILE__, __LINE__, "backend_free: %p was not allocated by this backend", p);
}

void backend_note_library(Backend *be, size_t n_bytes) {
    be->mem.cur[MEM_LIBRARY] += n_bytes;
    if (be->mem.cur[MEM_LIBRARY] > be->mem.peak[MEM_LIBRARY]) be->mem.peak[MEM_LIBRARY] = be->mem.cur[MEM_LIBRARY];
}

bool backend_device_used(Backend *be, size_t *used_bytes) {
    size_t used = 0;
    const bool has = be->ops->device_used(be, &used);
    if (!has) used = 0;
    if (used > be->mem.device_used_peak) be->mem.device_used_peak = used;
    if (used_bytes) *used_bytes = used;
    return has;
}

void *backend_stream(Backend *be) { return be->ops->stream(be); }

/* The staging hooks of backend_comm_copy: ctx is the Backend. */
static void comm_to_host(void *ctx, void *dst_host, const void *src_dev, size_t n_bytes) {
    backend_download((Backend *)ctx, dst_host, src_dev, n_bytes);  // waits for the stream: complete
}

static void comm_to_device(void *ctx, void *dst_dev, const void *src_host, size_t n_bytes) {
    Backend *be = ctx;
    if (n_bytes) be->ops->upload_wait(be, dst_dev, src_host, n_bytes);
}

static void *comm_host_alloc(void *ctx, size_t n_bytes) { return backend_alloc_host((Backend *)ctx, n_bytes, MEM_COMM); }

static void comm_host_free(void *ctx, void *p) { backend_free((Backend *)ctx, p); }

bool backend_comm_copy(Backend *be, BackendCommCopy *out) {
    if (be->host_visible) return false;
    *out = (BackendCommCopy){.ctx = be, .to_host = comm_to_host, .to_device = comm_to_device,
                             .host_alloc = comm_host_alloc, .host_free = comm_host_free};
    return true;
}

size_t backend_gemm_workspace_bytes(BackendKind kind) { return kind == BACKEND_CUDA ? (size_t)32 << 20 : 0; }

void *backend_workspace(Backend *be, size_t n_bytes) {
    if (n_bytes <= be->ws_bytes && be->ws) return be->ws;
    if (be->ws) {
        backend_sync(be);  // queued ops may still read the old arena
        backend_free(be, be->ws);
    }
    be->ws_bytes = scratch_arena_bytes(n_bytes);  // a step of a fixed grid: the planner's figure too
    be->ws = backend_alloc(be, be->ws_bytes, MEM_WORKSPACE);
    return be->ws;
}

void backend_upload(Backend *be, void *dst_dev, const void *src_host, size_t n_bytes) {
    not_capturing(be, "backend_upload");
    if (n_bytes) be->ops->upload(be, dst_dev, src_host, n_bytes);
}

void backend_download(Backend *be, void *dst_host, const void *src_dev, size_t n_bytes) {
    not_capturing(be, "backend_download");
    if (n_bytes) be->ops->download(be, dst_host, src_dev, n_bytes);
}

void backend_sync(Backend *be) {
    not_capturing(be, "backend_sync");
    be->ops->sync(be);
}

/* ---- graphs ---------------------------------------------------------------------- */

void backend_capture_begin(Backend *be) {
    TP_CHECK(!be->capturing, "backend_capture_begin: a capture is already open");
    TP_CHECK(!be->profile, "backend_capture_begin: graphs and --profile do not mix (the profile marks every op)");
    be->ops->capture_begin(be);
    be->capturing = true;
}

void *backend_capture_end(Backend *be, char *err, size_t err_len) {
    TP_CHECK(be->capturing, "backend_capture_end: no capture is open");
    be->capturing = false;
    return be->ops->capture_end(be, err, err_len);
}

void backend_graph_launch(Backend *be, void *graph) {
    not_capturing(be, "backend_graph_launch");
    be->ops->graph_launch(be, graph);
}

void backend_graph_free(Backend *be, void *graph) {
    if (graph) be->ops->graph_free(be, graph);
}

void backend_set_step_vars(Backend *be, const StepVars *step_vars) { be->step_vars = step_vars; }

const float *backend_host_view(Backend *be, const float *dev, size_t n_elems) {
    if (be->host_visible) return dev;
    float *h = TP_MALLOC((n_elems ? n_elems : 1) * sizeof(float));
    backend_download(be, h, dev, n_elems * sizeof(float));
    return h;
}

void backend_host_view_free(const float *view, const float *dev) {
    if (view != dev) free((void *)view);
}

float *backend_host_stage(Backend *be, float *dev, size_t n_elems) {
    return be->host_visible ? dev : TP_CALLOC(n_elems ? n_elems : 1, sizeof(float));
}

void backend_host_commit(Backend *be, float *dev, float *stage, size_t n_elems) {
    if (stage == dev) return;
    backend_upload(be, dev, stage, n_elems * sizeof(float));
    free(stage);
}

void backend_add_compute_weights(Backend *be, const float *master, size_t n_elems) {
    TP_CHECK(be->n_weights < BACKEND_MAX_WEIGHT_RANGES, "backend: more than %d models on one backend",
             BACKEND_MAX_WEIGHT_RANGES);
    void *compute = NULL;  // fp32, or bf16 emulated at the GEMM (CPU): no copy
    if (be->dtype == DTYPE_BF16 && be->kind == BACKEND_CUDA)
        compute = backend_alloc(be, n_elems * sizeof(uint16_t), MEM_COMPUTE);
    int k = be->n_weights++;
    be->weights[k].master = master;
    be->weights[k].compute = compute;
    be->weights[k].n_elems = n_elems;
    if (compute) be->ops->recast(be, compute, master, n_elems);
}

void backend_remove_compute_weights(Backend *be, const float *master) {
    for (int k = 0; k < be->n_weights; k++) {
        if (be->weights[k].master != master) continue;
        backend_free(be, be->weights[k].compute);
        be->weights[k] = be->weights[--be->n_weights];
        return;
    }
}

void backend_recast_weights(Backend *be) {
    for (int k = 0; k < be->n_weights; k++)
        if (be->weights[k].compute)
            be->ops->recast(be, be->weights[k].compute, be->weights[k].master, be->weights[k].n_elems);
}

const void *backend_compute_twin(const Backend *be, const float *W) {
    for (int k = 0; k < be->n_weights; k++) {
        const float *m = be->weights[k].master;
        if (be->weights[k].compute && W >= m && W < m + be->weights[k].n_elems)
            return (const uint16_t *)be->weights[k].compute + (W - m);
    }
    return NULL;
}

bool attn_grads_bf16(const char *op, GradMode mode, const void *dq, const void *dk, const void *dv, const void *dq16,
                     const void *dk16, const void *dv16) {
    const bool h = dq16 || dk16 || dv16;
    TP_CHECK(!h || !(dq || dk || dv), "%s: give the gradients as fp32 (dq, dk, dv) or as bf16 (dq16, dk16, dv16), "
             "not both", op);
    TP_CHECK(!h || mode == GRAD_WRITE, "%s: dq16, dk16, dv16 are written (GRAD_WRITE), not accumulated", op);
    return h;
}
