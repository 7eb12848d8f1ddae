/* grad_sync.c: buckets, their reduction and the optional communication
 * thread (see grad_sync.h).
 *
 * The thread takes buckets in reduction order from a counter the main
 * thread raises as backward finishes them; the two meet under one mutex,
 * and the dp communicator is used by the thread alone between begin and
 * finish, so the collectives keep the same order on every rank. On a
 * host-visible backend (CPU) the ops the thread runs (copies, casts) touch
 * only the finished bucket and the staging buffer. A device backend keeps
 * the reduction on the caller's thread after backward (its stream orders
 * the work) until overlap has been proven there.
 *
 * Time, on one clock with one accounting: a bucket's communication runs
 * from the moment it could start (handed over, or the bucket before it
 * done) to its end, so the buckets' times add up to every moment some
 * reduction was pending, thread wake-ups included. The step waits (is
 * exposed) only from a hand-over or wait of its own to the end of the
 * bucket it waits for: always inside those moments, so the exposed part
 * can never exceed the whole (it used to be measured as the caller's wall
 * time around finish, which also held work that is not communication and
 * the thread's wake-up, while the whole counted only the collectives). */
#include "train/grad_sync.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "kernels/ops.h"

struct GradSync {
    Backend *be;
    Comm *dp;
    GradSyncConfig cfg;
    BucketLayout L;
    int dp_size, dp_rank;
    void *stage;          // (the longest padded bucket) fp32 or bf16 staging, MEM_COMM
    float *zeros;         // (dp) fp32 zeros: the bf16 padding's source, MEM_COMM
    float *grads;         // the step's gradient buffer
    int launched;         // buckets handed over (reduction order)
    int done;             // buckets reduced
    double exposed_s, comm_s;
    double *launched_at;  // [L.n] when each bucket was handed over (tp_now_s)
    double last_end;      // when the last bucket's reduction ended
    bool accumulate;      // ZeRO-2, a micro-batch after the step's first: add into the shard
    bool threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;
    /* ZeRO-2: gradient storage per bucket, made when backward reaches it and
     * released once its piece is in the shard */
    Model *m;
    float **mem;          // [L.n] (dp q_k) or NULL
    float **tensor_at;    // [tab.n] each tensor's gradient (NULL: no storage now)
    int *bucket_of;       // [tab.n]
    bool *reduced;        // [L.n] its piece is in the shard: storage may go
    float *shard;         // (L.shard_elems) the reduced pieces, MEM_GRAD
};

/* ---- layout --------------------------------------------------------------------- */

size_t bucket_elems_for_mb(double mib) {
    const double e = mib * 1024.0 * 1024.0 / sizeof(float);
    return e >= 1.0 ? (size_t)e : 1;
}

void bucket_layout_build(BucketLayout *L, size_t n_elems, size_t bucket_elems, int dp) {
    TP_CHECK(dp >= 1, "bucket layout for dp %d", dp);
    memset(L, 0, sizeof *L);
    size_t E = bucket_elems > 0 ? bucket_elems : 1;
    E = (E + (size_t)dp - 1) / (size_t)dp * (size_t)dp;
    L->dp = dp;
    L->n_elems = n_elems;
    L->bucket_elems = E;
    L->n = (int)((n_elems + E - 1) / E);
    L->b = TP_CALLOC((size_t)(L->n > 0 ? L->n : 1), sizeof *L->b);
    size_t at = 0;
    for (int k = 0; k < L->n; k++) {
        GradBucket *b = &L->b[k];
        b->hi = n_elems - (size_t)k * E;
        b->lo = b->hi > E ? b->hi - E : 0;
        b->q = (b->hi - b->lo + (size_t)dp - 1) / (size_t)dp;
        b->at = at;
        at += b->q;
    }
    L->shard_elems = at;
}

void bucket_layout_build_aligned(BucketLayout *L, const ParamTable *tab, size_t bucket_elems, int dp,
                                 bool embed_alone) {
    TP_CHECK(dp >= 1, "bucket layout for dp %d", dp);
    memset(L, 0, sizeof *L);
    L->dp = dp;
    L->n_elems = tab->n_elems;
    L->bucket_elems = bucket_elems > 0 ? bucket_elems : 1;
    L->b = TP_CALLOC((size_t)(tab->n > 0 ? tab->n : 1), sizeof *L->b);
    size_t hi = tab->n_elems, at = 0;
    for (int i = tab->n - 1; i >= 0; i--) {  // close a bucket once it holds bucket_elems
        const size_t lo = tab->t[i].offset;
        const bool embed_next = embed_alone && i == 1 && strcmp(tab->t[0].name, "embed.weight") == 0;
        if (hi - lo < L->bucket_elems && i > 0 && !embed_next) continue;
        GradBucket *b = &L->b[L->n++];
        *b = (GradBucket){.lo = lo, .hi = hi, .q = (hi - lo + (size_t)dp - 1) / (size_t)dp, .at = at};
        at += b->q;
        hi = lo;
    }
    L->shard_elems = at;
}

void bucket_layout_for_stage(BucketLayout *L, const ParamTable *tab, int zero, size_t bucket_elems, int dp,
                             bool staged) {
    if (zero >= 2) bucket_layout_build_aligned(L, tab, bucket_elems, dp, staged);
    else bucket_layout_build(L, tab->n_elems, bucket_elems, dp);
}

void bucket_layout_free(BucketLayout *L) {
    free(L->b);
    memset(L, 0, sizeof *L);
}

void bucket_piece(const BucketLayout *L, int k, int r, size_t *lo, size_t *hi) {
    const GradBucket *b = &L->b[k];
    const size_t a = b->lo + (size_t)r * b->q, e = a + b->q;
    *lo = a < b->hi ? a : b->hi;
    *hi = e < b->hi ? e : b->hi;
}

int bucket_ranges(const BucketLayout *L, int r, OptRange *out) {
    int n = 0;
    for (int k = L->n - 1; k >= 0; k--) {  // ascending lo
        size_t lo, hi;
        bucket_piece(L, k, r, &lo, &hi);
        if (hi > lo) out[n++] = (OptRange){.lo = lo, .hi = hi, .at = L->b[k].at};
    }
    return n;
}

/* ---- one bucket ------------------------------------------------------------------ */

/* ZeRO-2: bucket k's own storage (zero-padded to dp q) reduce-scattered in
 * place, this rank's piece copied into the shard. */
static void reduce_bucket_owned(GradSync *g, int k) {
    const GradBucket *b = &g->L.b[k];
    Backend *be = g->be;
    Comm *dp = g->dp;
    float *mem = g->mem[k];  // (dp q)
    const size_t padded = b->q * (size_t)g->dp_size, mine_at = (size_t)g->dp_rank * b->q;
    if (g->cfg.dtype == COMM_BF16) {
        uint16_t *s16 = g->stage;  // (padded) bf16
        op_to_bf16(be, s16, mem, padded);
        comm_ok(comm_reduce_scatter_t(dp, s16, s16 + mine_at, b->q, COMM_BF16), dp);
        op_from_bf16(be, mem + mine_at, s16 + mine_at, b->q);
    } else {
        comm_ok(comm_reduce_scatter(dp, mem, mem + mine_at, b->q), dp);
    }
    float *piece = g->shard + b->at;
    if (g->accumulate) op_add(be, piece, piece, mem + mine_at, b->q);  // a later micro-batch
    else op_copy(be, piece, mem + mine_at, b->q);
}

static void reduce_bucket(GradSync *g, int k) {
    if (g->cfg.zero >= 2) {
        reduce_bucket_owned(g, k);
        return;
    }
    const GradBucket *b = &g->L.b[k];
    Backend *be = g->be;
    Comm *dp = g->dp;
    float *src = g->grads + b->lo;  // (len)
    const size_t len = b->hi - b->lo, padded = b->q * (size_t)g->dp_size;
    size_t plo, phi;  // this rank's piece, clipped to the bucket
    bucket_piece(&g->L, k, g->dp_rank, &plo, &phi);
    const size_t mine_at = (size_t)g->dp_rank * b->q, valid = phi - plo;
    if (g->cfg.dtype == COMM_BF16) {
        uint16_t *s16 = g->stage;  // (padded) bf16
        op_to_bf16(be, s16, src, len);
        if (padded > len) op_to_bf16(be, s16 + len, g->zeros, padded - len);
        if (g->cfg.zero == 0) {
            comm_ok(comm_allreduce_t(dp, s16, len, COMM_BF16, COMM_SUM), dp);
            op_from_bf16(be, src, s16, len);
        } else {
            comm_ok(comm_reduce_scatter_t(dp, s16, s16 + mine_at, b->q, COMM_BF16), dp);  // in place
            op_from_bf16(be, g->grads + plo, s16 + mine_at, valid);
        }
    } else if (g->cfg.zero == 0) {
        comm_ok(comm_allreduce(dp, src, len, COMM_SUM), dp);
    } else if (padded == len) {
        comm_ok(comm_reduce_scatter(dp, src, src + mine_at, b->q), dp);  // in place, as NCCL allows
    } else {
        float *s = g->stage;  // (padded)
        op_copy(be, s, src, len);
        op_zero(be, s + len, padded - len);
        comm_ok(comm_reduce_scatter(dp, s, s + mine_at, b->q), dp);
        op_copy(be, g->grads + plo, s + mine_at, valid);
    }
}

/* Reduces bucket k, handed over at `avail`, on whichever thread reduces;
 * returns the communication time it adds: from when it could start (handed
 * over, or the bucket before it done: g->last_end, this thread's own) to
 * its end, which becomes the new last_end (*end). */
static double reduce_timed(GradSync *g, int k, double avail, double *end) {
    const double from = avail > g->last_end ? avail : g->last_end;
    reduce_bucket(g, k);
    *end = tp_now_s();
    return *end - from;
}

/* ---- the communication thread --------------------------------------------------- */

static void *comm_thread(void *arg) {
    GradSync *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->quit && g->done == g->launched) pthread_cond_wait(&g->cv, &g->mu);
        if (g->done == g->launched) break;  // quit with nothing pending
        const int k = g->done;
        const double avail = g->launched_at[k];
        pthread_mutex_unlock(&g->mu);
        double end;
        const double dt = reduce_timed(g, k, avail, &end);
        pthread_mutex_lock(&g->mu);
        g->comm_s += dt;
        g->last_end = end;
        g->done++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ---- the step -------------------------------------------------------------------- */

/* The staging buffer's bytes: a bf16 copy of the longest bucket, or (ZeRO,
 * fp32) the padded bucket at the buffer's start; ZeRO's allgather of that
 * bucket too. */
static size_t staging_bytes(const BucketLayout *L, const GradSyncConfig *cfg) {
    size_t bytes = 0;
    for (int k = 0; k < L->n; k++) {
        const GradBucket *b = &L->b[k];
        const size_t padded = b->q * (size_t)L->dp;
        const bool uneven = padded != b->hi - b->lo;
        size_t need = 0;
        if (cfg->dtype == COMM_BF16) need = padded * sizeof(uint16_t);
        if (cfg->zero >= 1 && uneven && padded * sizeof(float) > need) need = padded * sizeof(float);
        if (need > bytes) bytes = need;
    }
    return bytes;
}

void grad_sync_plan(const ParamTable *tab, const GradSyncConfig *cfg_in, int dp, GradSyncPlan *out) {
    GradSyncConfig cfg = *cfg_in;
    if (dp == 1) cfg.dtype = COMM_F32;  // as grad_sync_create: nothing is sent
    BucketLayout L;
    bucket_layout_for_stage(&L, tab, cfg.zero, cfg.bucket_elems, dp, cfg.staged);
    memset(out, 0, sizeof *out);
    const size_t f = sizeof(float);
    out->grad_bytes = (cfg.zero >= 2 ? (L.shard_elems ? L.shard_elems : 1) : L.n_elems) * f;
    out->optim_bytes = 2 * (cfg.zero >= 1 ? L.shard_elems : L.n_elems) * f;
    if (dp > 1) {
        const size_t st = staging_bytes(&L, &cfg);
        if (st) out->comm_bytes = st + (cfg.dtype == COMM_BF16 ? (size_t)dp * f : 0);
    }
    if (cfg.zero >= 2) {
        /* storage alive at once while backward runs: the bucket holding the
         * tied embedding (the output layer's gradient comes first, the
         * lookup's last), the bucket being filled and the one being reduced */
        size_t first = 0, second = 0;
        for (int k = 0; k < L.n; k++) {
            const size_t b = L.b[k].q * (size_t)dp * f;
            if (L.b[k].lo == 0) {
                out->grad_live_bytes += b;
                continue;
            }
            if (b > first) second = first, first = b;
            else if (b > second) second = b;
        }
        out->grad_live_bytes += first + second;
    }
    out->n_buckets = L.n;
    bucket_layout_free(&L);
}

GradSync *grad_sync_create(Backend *be, Comm *dp, Model *m, const GradSyncConfig *cfg) {
    TP_CHECK(cfg->zero >= 0 && cfg->zero <= 2, "ZeRO stage %d is not built (0, 1 or 2)", cfg->zero);
    TP_CHECK(cfg->dtype == COMM_F32 || cfg->dtype == COMM_BF16, "gradient dtype %d", (int)cfg->dtype);
    TP_CHECK(dp || cfg->zero == 0, "ZeRO needs a data-parallel group");
    GradSync *g = TP_CALLOC(1, sizeof *g);
    g->be = be;
    g->dp = dp;
    g->cfg = *cfg;
    g->dp_size = dp ? comm_size(dp) : 1;
    g->dp_rank = dp ? comm_rank(dp) : 0;
    if (g->dp_size == 1) g->cfg.dtype = COMM_F32;  // nothing is sent: a cast would only lose bits
    cfg = &g->cfg;
    bucket_layout_for_stage(&g->L, &m->tab, cfg->zero, cfg->bucket_elems, g->dp_size, cfg->staged);
    const size_t stage_bytes = staging_bytes(&g->L, cfg);
    if (cfg->zero >= 2) {
        g->m = m;
        model_release_grads(m);  // first: the whole buffer and the shard never coexist
        g->shard = backend_alloc(be, (g->L.shard_elems ? g->L.shard_elems : 1) * sizeof(float), MEM_GRAD);
        g->mem = TP_CALLOC((size_t)g->L.n + 1, sizeof *g->mem);
        g->reduced = TP_CALLOC((size_t)g->L.n + 1, sizeof *g->reduced);
        g->tensor_at = TP_CALLOC((size_t)m->tab.n + 1, sizeof *g->tensor_at);
        g->bucket_of = TP_CALLOC((size_t)m->tab.n + 1, sizeof *g->bucket_of);
        for (int k = 0; k < g->L.n; k++)
            for (int i = param_table_index_at(&m->tab, g->L.b[k].lo);
                 i < m->tab.n && m->tab.t[i].offset < g->L.b[k].hi; i++)
                g->bucket_of[i] = k;
    }
    if (g->dp_size > 1 && stage_bytes > 0) {
        g->stage = backend_alloc(be, stage_bytes, MEM_COMM);
        if (cfg->dtype == COMM_BF16) g->zeros = backend_alloc(be, (size_t)g->dp_size * sizeof(float), MEM_COMM);
    }
    g->launched_at = TP_CALLOC((size_t)g->L.n + 1, sizeof *g->launched_at);
    g->threaded = cfg->overlap && g->dp_size > 1 && be->host_visible;
    if (g->threaded) {
        pthread_mutex_init(&g->mu, NULL);
        pthread_cond_init(&g->cv, NULL);
        TP_CHECK(pthread_create(&g->thread, NULL, comm_thread, g) == 0, "cannot start the gradient thread");
    }
    return g;
}

void grad_sync_free(GradSync *g) {
    if (!g) return;
    if (g->threaded) {
        pthread_mutex_lock(&g->mu);
        g->quit = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    backend_free(g->be, g->stage);
    backend_free(g->be, g->zeros);
    if (g->mem)
        for (int k = 0; k < g->L.n; k++) backend_free(g->be, g->mem[k]);
    backend_free(g->be, g->shard);
    free(g->mem);
    free(g->launched_at);
    free(g->reduced);
    free(g->tensor_at);
    free(g->bucket_of);
    bucket_layout_free(&g->L);
    free(g);
}

const BucketLayout *grad_sync_layout(const GradSync *g) { return &g->L; }
int grad_sync_rank(const GradSync *g) { return g->dp_rank; }
int grad_sync_zero(const GradSync *g) { return g->cfg.zero; }
bool grad_sync_sharded(const GradSync *g) { return g->cfg.zero >= 1; }
float *grad_sync_shard(GradSync *g) { return g->shard; }
double grad_sync_exposed_s(const GradSync *g) { return g->exposed_s; }
double grad_sync_comm_s(const GradSync *g) { return g->comm_s; }

void grad_sync_begin(GradSync *g, float *grads, bool accumulate) {
    TP_CHECK(!accumulate || g->cfg.zero >= 2, "only ZeRO-2 reduces every micro-batch");
    g->grads = grads;
    g->accumulate = accumulate;
    g->launched = g->done = 0;
    if (!accumulate) g->comm_s = g->exposed_s = 0.0;
    if (g->reduced) memset(g->reduced, 0, (size_t)g->L.n * sizeof *g->reduced);
}

/* ZeRO-2: points the model's gradient views at the storage there is. */
static void bind_storage(GradSync *g) {
    const ParamTable *tab = &g->m->tab;
    for (int i = 0; i < tab->n; i++) {
        const int k = g->bucket_of[i];
        g->tensor_at[i] = g->mem[k] ? g->mem[k] + (tab->t[i].offset - g->L.b[k].lo) : NULL;
    }
    model_bind_grads(g->m, g->tensor_at);
}

/* ZeRO-2: storage for bucket k (zeroed: backward accumulates into it). */
static bool make_storage(GradSync *g, int k) {
    if (g->mem[k] || g->reduced[k]) return false;
    g->mem[k] = backend_alloc(g->be, g->L.b[k].q * (size_t)g->dp_size * sizeof(float), MEM_GRAD);
    return true;
}

/* ZeRO-2: releases the storage of buckets whose pieces are in the shard
 * (the allocator is the caller's thread's alone). */
static bool release_reduced(GradSync *g) {
    int done = g->done;
    if (g->threaded) {
        pthread_mutex_lock(&g->mu);
        done = g->done;
        pthread_mutex_unlock(&g->mu);
    }
    bool changed = false;
    for (int k = 0; k < done; k++) {
        if (!g->mem[k]) continue;
        backend_free(g->be, g->mem[k]);
        g->mem[k] = NULL;
        g->reduced[k] = true;
        changed = true;
    }
    return changed;
}

/* ZeRO-2 with the thread: buckets handed over but not yet reduced keep
 * their storage, so before making more, backward waits until at most this
 * many are pending (otherwise a thread slower than backward would let the
 * whole gradient pile up, ZeRO-2's saving lost). The wait counts as exposed. */
#define ZERO2_MAX_PENDING 2

void grad_sync_needed(GradSync *g, size_t lo, size_t hi) {
    if (g->cfg.zero < 2) return;
    if (g->threaded) {
        const double t0 = tp_now_s();
        pthread_mutex_lock(&g->mu);
        const bool waits = g->launched - g->done > ZERO2_MAX_PENDING;
        while (g->launched - g->done > ZERO2_MAX_PENDING) pthread_cond_wait(&g->cv, &g->mu);
        if (waits && g->last_end > t0) g->exposed_s += g->last_end - t0;  // until the bucket it waited for ended
        pthread_mutex_unlock(&g->mu);
    }
    bool changed = release_reduced(g);
    for (int k = 0; k < g->L.n; k++)
        if (g->L.b[k].lo < hi && lo < g->L.b[k].hi) changed |= make_storage(g, k);
    if (changed) bind_storage(g);
}

/* Hands over buckets [launched, upto) (the caller's thread reduces them
 * when there is no communication thread and `now` is set: all of that is
 * exposed). Returns the hand-over's time. */
static double launch(GradSync *g, int upto, bool now) {
    const double t = tp_now_s();
    if (g->threaded) {
        pthread_mutex_lock(&g->mu);
        if (upto > g->launched) {
            for (int k = g->launched; k < upto; k++) g->launched_at[k] = t;
            g->launched = upto;
            pthread_cond_broadcast(&g->cv);
        }
        pthread_mutex_unlock(&g->mu);
    } else if (now && upto > g->launched) {
        double end = t, add = 0.0;
        for (; g->launched < upto; g->launched++) add += reduce_timed(g, g->launched, t, &end);
        g->last_end = end;
        g->done = g->launched;
        g->comm_s += add;  // the same sum to both: exposed stays <= comm to the last bit
        g->exposed_s += add;
    }
    return t;
}

void grad_sync_ready(GradSync *g, size_t from) {
    if (g->dp_size == 1 && g->cfg.zero == 0) return;
    int upto = g->launched;
    while (upto < g->L.n && g->L.b[upto].lo >= from) upto++;
    launch(g, upto, g->cfg.zero >= 2);  // ZeRO-2 without the thread: reduce now, so the storage can go
}

void grad_sync_finish(GradSync *g) {
    if (g->dp_size == 1 && g->cfg.zero == 0) return;
    if (g->cfg.zero >= 2) {  // buckets backward never reached (no rows here) hold zeros
        bool changed = false;
        for (int k = g->launched; k < g->L.n; k++) changed |= make_storage(g, k);
        if (changed) bind_storage(g);
    }
    const double t = launch(g, g->L.n, true);
    if (g->threaded) {
        pthread_mutex_lock(&g->mu);
        while (g->done < g->L.n) pthread_cond_wait(&g->cv, &g->mu);
        if (g->last_end > t) g->exposed_s += g->last_end - t;  // until the last bucket ended, not our wake-up
        pthread_mutex_unlock(&g->mu);
    }
    if (g->cfg.zero >= 2 && release_reduced(g)) bind_storage(g);
}

void grad_sync_allgather_params(GradSync *g, float *params) {
    if (g->cfg.zero == 0) return;
    const double t0 = tp_now_s();
    for (int k = 0; k < g->L.n; k++) {
        const GradBucket *b = &g->L.b[k];
        const size_t len = b->hi - b->lo, padded = b->q * (size_t)g->dp_size;
        float *dst = params + b->lo;                               // (len)
        float *mine = params + b->lo + (size_t)g->dp_rank * b->q;  // (q) in place
        if (padded == len) {
            comm_ok(comm_allgather(g->dp, mine, dst, b->q), g->dp);
            continue;
        }
        /* a bucket whose length is not a multiple of dp (ZeRO-1: the one at
         * the buffer's start): its last piece runs past it, so gather through
         * the staging buffer */
        float *s = g->stage;  // (padded) fp32
        size_t lo, hi;
        bucket_piece(&g->L, k, g->dp_rank, &lo, &hi);
        op_zero(g->be, s + (size_t)g->dp_rank * b->q, b->q);
        op_copy(g->be, s + (size_t)g->dp_rank * b->q, params + lo, hi - lo);
        comm_ok(comm_allgather(g->dp, s + (size_t)g->dp_rank * b->q, s, b->q), g->dp);
        op_copy(g->be, dst, s, len);
    }
    const double dt = tp_now_s() - t0;
    g->comm_s += dt;
    g->exposed_s += dt;
}
