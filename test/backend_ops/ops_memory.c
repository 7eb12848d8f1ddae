/* ops_memory.c: no op allocates behind the allocator.
 *
 * The test binary is linked with --wrap for malloc, calloc, realloc,
 * posix_memalign and aligned_alloc, so every host allocation made by the
 * project's code (the kernels library, backend.c, the CPU reference)
 * passes through the counters here; allocations inside shared libraries
 * (libc's own, OpenBLAS, the CUDA libraries) are not seen, which is what
 * this test wants: it checks our code. Around a pass over every op of the
 * table (on buffers allocated beforehand):
 *  - the first (cold) pass may grow the workspace arena, but every host
 *    allocation it makes must be one that backend_alloc accounts for
 *    (HOST_ALLOCS_PER_BACKEND_ALLOC each);
 *  - the second (warm) pass allocates nothing at all: backend.mem.n_allocs
 *    and the host counters stay put and, on CUDA, the device's free memory
 *    (cudaMemGetInfo) and the stream-ordered pool's reserved memory do too.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "harness.h"

/* ---- counting wrappers ------------------------------------------------------------------ */

static atomic_long g_host_allocs;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);

void *__wrap_malloc(size_t n) {
    atomic_fetch_add(&g_host_allocs, 1);
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size) {
    atomic_fetch_add(&g_host_allocs, 1);
    return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) {
    atomic_fetch_add(&g_host_allocs, 1);
    return __real_realloc(p, n);
}
int __wrap_posix_memalign(void **p, size_t align, size_t n) {
    atomic_fetch_add(&g_host_allocs, 1);
    return __real_posix_memalign(p, align, n);
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    atomic_fetch_add(&g_host_allocs, 1);
    return __real_aligned_alloc(align, n);
}

/* backend_alloc makes one host allocation for its record of the buffer,
 * and on the CPU one more for the buffer itself (posix_memalign). */
static long host_allocs_per_backend_alloc(const Target *t) { return t->is_cpu ? 2 : 1; }

/* ---- every op, on buffers made beforehand ------------------------------------------------- */

enum { B = 2, T = 16, C = 32, H = 2, D = C / H, V = 100, N = B * T, FF = 48, NV_LOCAL = 56 };

typedef struct {
    float *master;                 // registered compute weights: W (FF, C) | b (FF) | E (V, C)
    float *W, *b, *E;
    float *x, *y, *h, *dh, *dx, *dW, *db, *tmp;  // (N, C), (N, C), (N, FF), (N, FF), (N, C), (FF, C), (FF), (N, C)
    float *g, *bt, *mean, *rstd;   // (C), (C), (N), (N)
    float *q, *k, *v, *att, *P, *dP, *dq, *dk, *dv;  // (B, T, C) and (B, H, T, T)
    float *logits, *dlogits, *losses, *lse, *row_max, *stats;  // (N, V), (N, V), (N), (N), (N), (N, 3)
    float *m, *vv, *scalars;       // AdamW moments of W (FF, C); device scalars (4)
    int32_t *ids, *ids2, *k_len;   // (N), (N), (B)
    float *host;                   // (N, C) host buffer for the copy points
} EveryOp;

static float *randbuf(const Target *t, size_t n, Rng *rng, float lo, float hi) {
    float *h = rand_floats(n, rng, lo, hi);
    float *d = dev_from(t, h, n);
    free(h);
    return d;
}

static void every_op_setup(const Target *t, EveryOp *e, Rng *rng) {
    Backend *be = t->be;
    memset(e, 0, sizeof *e);
    const size_t n_master = (size_t)FF * C + FF + (size_t)V * C;
    e->master = randbuf(t, n_master, rng, -0.5f, 0.5f);
    e->W = e->master, e->b = e->W + (size_t)FF * C, e->E = e->b + FF;
    backend_add_compute_weights(be, e->master, n_master);
    float **acts[] = {&e->x, &e->y, &e->dx, &e->tmp, &e->q, &e->k, &e->v, &e->att, &e->dq, &e->dk, &e->dv};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) *acts[i] = randbuf(t, (size_t)N * C, rng, -1, 1);
    e->h = randbuf(t, (size_t)N * FF, rng, -1, 1), e->dh = randbuf(t, (size_t)N * FF, rng, -1, 1);
    e->dW = randbuf(t, (size_t)FF * C, rng, -1, 1), e->db = randbuf(t, FF, rng, -1, 1);
    e->g = randbuf(t, C, rng, 0.5f, 1.5f), e->bt = randbuf(t, C, rng, -0.5f, 0.5f);
    e->mean = randbuf(t, N, rng, -1, 1), e->rstd = randbuf(t, N, rng, 0.5f, 1.5f);
    e->P = randbuf(t, (size_t)B * H * T * T, rng, 0, 1), e->dP = randbuf(t, (size_t)B * H * T * T, rng, -1, 1);
    e->logits = randbuf(t, (size_t)N * V, rng, -3, 3), e->dlogits = randbuf(t, (size_t)N * V, rng, -1, 1);
    e->losses = randbuf(t, N, rng, 0, 1), e->lse = randbuf(t, N, rng, 0, 1);
    e->row_max = randbuf(t, N, rng, 2, 3), e->stats = randbuf(t, (size_t)N * 3, rng, 1, 2);
    e->m = randbuf(t, (size_t)FF * C, rng, -0.1f, 0.1f), e->vv = randbuf(t, (size_t)FF * C, rng, 0, 0.01f);
    e->scalars = randbuf(t, 4, rng, 0.5f, 1.0f);
    int32_t ids[N], k_len[B] = {T, T / 2};
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(rng_next(rng) % V);
    e->ids = dev_from_i32(t, ids, N), e->ids2 = dev_from_i32(t, ids, N), e->k_len = dev_from_i32(t, k_len, B);
    e->host = host_alloc((size_t)N * C);
    backend_sync(be);
}

static void every_op_free(const Target *t, EveryOp *e) {
    backend_remove_compute_weights(t->be, e->master);
    void *bufs[] = {e->master, e->x, e->y, e->h, e->dh, e->dx, e->dW, e->db, e->tmp, e->g, e->bt, e->mean, e->rstd,
                    e->q, e->k, e->v, e->att, e->P, e->dP, e->dq, e->dk, e->dv, e->logits, e->dlogits, e->losses,
                    e->lse, e->row_max, e->stats, e->m, e->vv, e->scalars, e->ids, e->ids2, e->k_len};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(t, bufs[i]);
    free(e->host);
}

/* Every entry of the table once (memory entries through their backend_* points). */
static void every_op_run(const Target *t, EveryOp *e) {
    Backend *be = t->be;
    backend_upload(be, e->tmp, e->host, (size_t)N * C * sizeof(float));
    op_zero(be, e->y, (size_t)N * C);
    op_copy(be, e->y, e->x, (size_t)N * C);
    op_copy(be, e->y + 5, e->y, (size_t)N * C - 5);  // overlapping: through the workspace on CUDA
    op_copy_ids(be, e->ids2, e->ids, N);
    op_embedding_fwd(be, e->x, e->ids, e->E, 2.0f, N, C, 0, V);
    op_add_positions(be, e->x, B, T, C);
    op_layernorm_fwd(be, e->y, e->mean, e->rstd, e->x, e->g, e->bt, N, C, 1e-5f);
    op_linear_fwd(be, e->h, e->y, e->W, e->b, N, C, FF);  // W registered: its twin in bf16 on CUDA
    op_act_fwd(be, e->h, e->h, (size_t)N * FF, ACT_GELU);
    op_act_bwd(be, e->dh, GRAD_WRITE, e->h, e->h, (size_t)N * FF, ACT_RELU);
    op_bias_add(be, e->h, e->b, N, FF);
    op_bias_bwd(be, e->db, e->dh, N, FF);
    op_linear_bwd(be, e->dx, GRAD_WRITE, e->dW, e->db, e->dh, e->y, e->W, N, C, FF);
    op_gemm(be, false, true, N, V, C, 1.0f, e->y, e->E, 0.0f, e->logits);  // tied output layer
    op_gemm(be, true, false, C, C, N, 0.5f, e->x, e->y, 1.0f, e->tmp);
    op_attention_fwd(be, e->att, e->P, e->q, e->k, e->v, e->k_len, B, H, T, T, D, true);
    op_attention_bwd(be, e->dq, e->dk, e->dv, GRAD_WRITE, e->att, e->P, e->q, e->k, e->v, e->dP, B, H, T, T, D);
    {  // q, k, v's first halves as bf16 bits; lse (B, H, T) in stats, delta in dP
        const uint16_t *q16 = (const uint16_t *)e->q, *k16 = (const uint16_t *)e->k, *v16 = (const uint16_t *)e->v;
        op_attention_flash_fwd(be, (uint16_t *)e->att, e->stats, q16, k16, v16, e->k_len, B, H, T, T, D, true);
        op_attention_flash_bwd(be, e->dq, e->dk, e->dv, NULL, NULL, NULL, GRAD_WRITE, e->x, e->stats, q16, k16, v16,
                               e->k_len, e->dP, B, H, T, T, D, true);
        op_attention_flash_bwd(be, NULL, NULL, NULL, (uint16_t *)e->dq, (uint16_t *)e->dk, (uint16_t *)e->dv,
                               GRAD_WRITE, e->x, e->stats, q16, k16, v16, e->k_len, e->dP, B, H, T, T, D, true);
    }
    op_softmax_fwd(be, e->dP, e->dP, e->k_len, B, H, T, T, 0.25f, false);
    op_softmax_bwd(be, e->dP, e->dP, e->P, B, H, T, T, 0.25f);
    op_dropout_fwd(be, e->y, e->y, (size_t)N * C, 0.1f, 7, 9);
    op_dropout_bwd(be, e->dx, GRAD_ADD, e->y, (size_t)N * C, 0.1f, 7, 9);
    op_dropout_bwd_at(be, NULL, (uint16_t *)e->tmp, GRAD_WRITE, e->y, (size_t)N * C, 0, 0.1f, 7, 9);  // bf16 bits
    op_add(be, e->y, e->x, e->y, (size_t)N * C);
    op_accumulate(be, e->dx, e->y, (size_t)N * C);
    op_scale(be, e->dx, 0.5f, (size_t)N * C);
    op_xent_fwd(be, e->losses, e->lse, e->logits, e->ids, N, V, 0.1f, 0);
    op_xent_bwd(be, e->dlogits, e->logits, e->lse, e->ids, 0.01f, N, V, 0.1f, 0);
    op_xent_vp_max(be, e->row_max, e->logits, N, V, NV_LOCAL);
    op_xent_vp_sums(be, e->stats, e->logits, e->row_max, e->ids, N, V, NV_LOCAL, 0, 0);
    op_xent_vp_loss(be, e->losses, e->lse, e->row_max, e->stats, e->ids, N, V, 0.1f, 0);
    op_xent_vp_bwd(be, e->dlogits, e->logits, e->lse, e->ids, 0.01f, N, V, NV_LOCAL, 0, V, 0.1f, 0);
    op_embedding_bwd(be, e->dx, e->dq, e->ids, 2.0f, N, C, 0, V < N ? V : N);
    op_layernorm_bwd(be, e->dx, e->dq, e->dk, e->y, e->x, e->mean, e->rstd, e->g, N, C);
    op_residual_ln_fwd(be, e->tmp, e->y, NULL, e->mean, e->rstd, e->x, e->att, e->bt, e->g, e->bt, N, C, 1e-5f, 0, 0.1f, 7,
                       9);
    op_residual_ln_bwd(be, e->dx, e->dv, NULL, e->dq, e->dk, e->db, e->y, e->tmp, e->mean, e->rstd, e->g, N, C, 0, 0.1f,
                       7, 9);
    op_zero(be, e->scalars, 4);
    op_sum_acc(be, e->scalars, e->losses, N);
    op_sumsq_acc(be, e->scalars + 1, e->dW, (size_t)FF * C);
    op_clip_coef(be, e->scalars + 2, e->scalars + 1, 1, 1.0f);
    op_scale_by(be, e->dW, e->scalars + 3, (size_t)FF * C);
    op_adamw(be, e->W, e->dW, e->m, e->vv, (size_t)FF * C, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    backend_recast_weights(be);
    backend_download(be, e->host, e->dx, (size_t)N * C * sizeof(float));
    backend_sync(be);
}

void test_no_hidden_allocs(const Target *t, Rng *rng) {
    Backend *be = t->be;
    EveryOp e;
    every_op_setup(t, &e, rng);

    long allocs0 = be->mem.n_allocs, host0 = atomic_load(&g_host_allocs);
    every_op_run(t, &e);  // cold: may grow the workspace arena, through backend_alloc only
    long d_allocs = be->mem.n_allocs - allocs0, d_host = atomic_load(&g_host_allocs) - host0;
    TCHECK(d_host == host_allocs_per_backend_alloc(t) * d_allocs,
           "%s: a first pass over every op made %ld host allocations; backend_alloc accounts for %ld (%ld calls)",
           t->name, d_host, host_allocs_per_backend_alloc(t) * d_allocs, d_allocs);

#ifdef TPTRAIN_TEST_CUDA
    const size_t free0 = t->is_cpu ? 0 : gpu_free_bytes(), pool0 = t->is_cpu ? 0 : gpu_pool_reserved_bytes(be);
#endif
    allocs0 = be->mem.n_allocs, host0 = atomic_load(&g_host_allocs);
    const size_t bytes0 = be->mem.total_cur;
    every_op_run(t, &e);  // warm: nothing at all
    d_allocs = be->mem.n_allocs - allocs0, d_host = atomic_load(&g_host_allocs) - host0;
    TCHECK(d_allocs == 0 && be->mem.total_cur == bytes0,
           "%s: a warm pass over every op called backend_alloc %ld times (%zu -> %zu bytes)", t->name, d_allocs,
           bytes0, be->mem.total_cur);
    TCHECK(d_host == 0, "%s: a warm pass over every op made %ld host allocations", t->name, d_host);
#ifdef TPTRAIN_TEST_CUDA
    if (!t->is_cpu) {
        const size_t free1 = gpu_free_bytes(), pool1 = gpu_pool_reserved_bytes(be);
        TCHECK(free1 == free0, "%s: device free memory moved in a warm pass: %zu -> %zu bytes", t->name, free0,
               free1);
        TCHECK(pool0 == 0 && pool1 == 0, "%s: the cudaMallocAsync pool holds %zu -> %zu bytes (it is never used)",
               t->name, pool0, pool1);
        printf("test_backend_ops: %s: warm pass over every op: device free %.1f MiB before and after, pool %zu "
               "bytes\n", t->name, free1 / 1048576.0, pool1);
    }
#endif
    every_op_free(t, &e);
}

/* ---- the collectives' staging copies ------------------------------------------------------ */

/* backend_comm_copy: a host-visible backend has no hooks (the collectives
 * use its buffers as they are), no stream and no device memory to report.
 * On a device: the page-locked staging buffer is tagged comm, counted as
 * host memory and not in the device total, and returned by host_free;
 * to_host sees the result of work queued before it (a large scale on the
 * stream); what to_device wrote is what a later op reads, although the
 * staging buffer is overwritten the moment to_device returns; and the
 * device reports memory in use beyond this backend's allocations. */
void test_comm_copy(const Target *t, Rng *rng) {
    Backend *be = t->be;
    BackendCommCopy cc;
    const bool has = backend_comm_copy(be, &cc);
    size_t used = 0;
    const bool has_dev = backend_device_used(be, &used);
    TCHECK(has == !be->host_visible && has_dev == !be->host_visible && (backend_stream(be) != NULL) == has,
           "%s: staging hooks %d, device memory %d, stream %p for a %s backend", t->name, has, has_dev,
           backend_stream(be), be->host_visible ? "host-visible" : "device");
    if (!has) return;
    TCHECK(used > be->mem.total_cur && be->mem.device_used_peak >= used,
           "%s: device memory in use %zu above this backend's %zu", t->name, used, be->mem.total_cur);
    TCHECK(cc.ctx == be && cc.to_host && cc.to_device && cc.host_alloc && cc.host_free, "%s: every hook", t->name);
    const size_t n = (size_t)1 << 22, n_bytes = n * sizeof(float);  // 16 MiB: the scale takes a while
    float *h = rand_floats(n, rng, -1, 1);
    float *d = dev_from(t, h, n);
    const MemStats m0 = be->mem;
    float *stage = cc.host_alloc(cc.ctx, n_bytes);
    TCHECK(stage && be->mem.cur[MEM_COMM] == m0.cur[MEM_COMM] + n_bytes && be->mem.host_cur == m0.host_cur + n_bytes &&
               be->mem.total_cur == m0.total_cur,
           "%s: the staging buffer: comm %zu, host %zu, device total %zu (before: %zu, %zu, %zu)", t->name,
           be->mem.cur[MEM_COMM], be->mem.host_cur, be->mem.total_cur, m0.cur[MEM_COMM], m0.host_cur, m0.total_cur);
    op_scale(be, d, 2.0f, n);
    cc.to_host(cc.ctx, stage, d, n_bytes);  // no sync between: the hook orders itself after the scale
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += stage[i] != 2.0f * h[i];
    TCHECK(bad == 0, "%s: to_host missed the queued scale on %zu of %zu values", t->name, bad, n);
    for (size_t i = 0; i < n; i++) stage[i] = h[i] + 1.0f;
    cc.to_device(cc.ctx, d, stage, n_bytes);
    memset(stage, 0xFF, n_bytes);  // reused at once, as the collectives do (NaN if the copy read it late)
    op_scale(be, d, 0.5f, n);
    float *got = dev_fetch(t, d, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != (h[i] + 1.0f) * 0.5f;
    TCHECK(bad == 0, "%s: to_device then scale: %zu of %zu values wrong", t->name, bad, n);
    free(got);
    cc.host_free(cc.ctx, stage);
    TCHECK(be->mem.cur[MEM_COMM] == m0.cur[MEM_COMM] && be->mem.host_cur == m0.host_cur &&
               be->mem.host_peak >= n_bytes,
           "%s: host_free returns the staging buffer", t->name);
    free(h);
    dev_free(t, d);
}
