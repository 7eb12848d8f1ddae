/* step.c: the training step (see step.h). Everything between the batch
 * upload and the final read stays on the backend's device: the loss sum,
 * the norm and the clipping factor are device scalars, so a GPU step never
 * waits on the host until its end. The gradient reduction starts from the
 * model's backward (its grads_final hook) bucket by bucket. */
#include "train/step.h"

#include <stdlib.h>

#include "clock.h"
#include "err.h"
#include "kernels/ops.h"
#include "train/pipeline.h"

enum { SC_LOSS = 0, SC_CLIP = 1, SC_N = 5 };  // SC_CLIP..+3: grad_clip's sumsq parts, norm, factor

static void comm_ok(int rc, const Comm *c) { TP_CHECK(rc == 0, "%s", comm_error(c)); }

static void on_grads_final(void *ctx, size_t from) { grad_sync_ready(ctx, from); }
static void on_grads_needed(void *ctx, size_t lo, size_t hi) { grad_sync_needed(ctx, lo, hi); }

void trainer_init(Trainer *t, Model *m, AdamW *opt, Comm *tp, Comm *dp, GradSync *gs, float clip_norm) {
    *t = (Trainer){.m = m, .opt = opt, .be = m->be, .tp = tp, .dp = dp, .gs = gs, .clip_norm = clip_norm};
    t->sc = backend_alloc(t->be, SC_N * sizeof(float), MEM_WORKSPACE);
}

void trainer_free(Trainer *t) {
    if (t->be) backend_free(t->be, t->sc);
    *t = (Trainer){0};
}

void grad_sync_adamw_init(GradSync *gs, AdamW *opt, Backend *be, const OptimConfig *cfg) {
    const BucketLayout *L = grad_sync_layout(gs);
    if (!grad_sync_sharded(gs)) {
        adamw_init(opt, be, cfg, L->n_elems);
        return;
    }
    OptRange *r = TP_MALLOC((size_t)(L->n > 0 ? L->n : 1) * sizeof *r);
    const int n = bucket_ranges(L, grad_sync_rank(gs), r);
    adamw_init_sharded(opt, be, cfg, L->shard_elems, r, n);
    opt->grads_at_state = grad_sync_shard(gs) != NULL;
    opt->zero_stage = grad_sync_zero(gs);
    opt->zero_bucket_elems = L->bucket_elems;
    free(r);
}

/* One micro-batch after another through the schedule (pipeline.h; one
 * stage for now, so F0 B0 F1 B1 ...: gradient accumulation). */
typedef struct {
    Trainer *t;
    const Batch *b;  // [m]
    float scale;     // 1 / the global batch's target tokens
    DropoutKey key;
    int dp_size;
} MicroCtx;

static void micro_forward(void *ctx, int i) {
    MicroCtx *c = ctx;
    DropoutKey k = c->key;
    k.micro += (uint32_t)(i * c->dp_size);  // the global micro-batch index: dp rank + i dp
    if (c->b[i].B > 0) model_forward_step(c->t->m, &c->b[i], true, k, c->t->sc + SC_LOSS);
}

static void micro_backward(void *ctx, int i, int last) {
    MicroCtx *c = ctx;
    Trainer *t = c->t;
    Model *m = t->m;
    const bool zero2 = grad_sync_zero(t->gs) >= 2;
    /* stages 0 and 1 reduce once, while the last micro-batch's backward
     * runs; ZeRO-2 reduces every micro-batch into its shard */
    const bool reduce = last || zero2;
    if (zero2) grad_sync_begin(t->gs, m->grads, i > 0);
    m->grads_final = reduce ? on_grads_final : NULL;
    m->grads_needed = on_grads_needed;
    m->grads_final_ctx = t->gs;
    DropoutKey k = c->key;
    k.micro += (uint32_t)(i * c->dp_size);
    if (c->b[i].B > 0) model_backward(m, &c->b[i], true, k, c->scale);
    m->grads_final = NULL;
    m->grads_needed = NULL;
    if (reduce) grad_sync_finish(t->gs);
}

void train_step(Trainer *t, const Batch *b, int n_micro, long n_global, DropoutKey key, float lr, StepResult *out) {
    Model *m = t->m;
    Backend *be = t->be;
    model_zero_grad(m);
    op_zero(be, t->sc, SC_N);
    if (grad_sync_zero(t->gs) < 2) grad_sync_begin(t->gs, m->grads, false);
    MicroCtx mc = {.t = t, .b = b, .scale = n_global > 0 ? 1.0f / (float)n_global : 0.0f, .key = key,
                   .dp_size = t->dp ? comm_size(t->dp) : 1};
    const PipeStage st = {.ctx = &mc, .p = 1, .s = 0, .m = n_micro, .forward = micro_forward,
                          .backward = micro_backward};
    pipeline_run(&st);
    const double t0 = tp_now_s();
    if (t->dp && comm_size(t->dp) > 1)
        comm_ok(comm_allreduce(t->dp, t->sc + SC_LOSS, 1, COMM_SUM), t->dp);  // the global loss sum
    double own = tp_now_s() - t0;
    if (grad_sync_sharded(t->gs)) {
        const AdamW *o = t->opt;
        float *shard = grad_sync_shard(t->gs);  // ZeRO-2; ZeRO-1 keeps its pieces in place
        float *g = shard ? shard : m->grads;
        grad_clip_ranges(be, &m->tab, g, shard != NULL, o->ranges, o->n_ranges, t->tp, t->dp, t->clip_norm,
                         t->sc + SC_CLIP);
        adamw_step(t->opt, m->params, g, &m->tab, lr);
        grad_sync_allgather_params(t->gs, m->params);
    } else {
        grad_clip(be, &m->tab, m->grads, t->tp, t->clip_norm, t->sc + SC_CLIP);
        adamw_step(t->opt, m->params, m->grads, &m->tab, lr);
    }
    backend_recast_weights(be);
    float host[SC_N];
    backend_download(be, host, t->sc, sizeof host);  // the step's one read
    out->loss = n_global > 0 ? host[SC_LOSS] / (float)n_global : 0.0f;
    out->grad_norm = host[SC_CLIP + 2];
    out->lr = lr;
    out->comm_s = grad_sync_comm_s(t->gs) + own;
    out->exposed_comm_s = grad_sync_exposed_s(t->gs) + own;
}
