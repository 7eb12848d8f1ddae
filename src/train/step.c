/* step.c: the training step (see step.h). Everything between the batch
 * upload and the final read stays on the backend's device: the loss sum,
 * the norm and the clipping factor are device scalars, so a GPU step never
 * waits on the host until its end. The gradient reduction starts from the
 * model's backward (its grads_final hook) bucket by bucket. */
#include "train/step.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "kernels/ops.h"
#include "train/pipeline.h"

enum { SC_LOSS = 0, SC_CLIP = 1, SC_N = 5 };  // SC_CLIP..+3: grad_clip's sumsq parts, norm, factor

static void on_grads_final(void *ctx, size_t from) { grad_sync_ready(ctx, from); }
static void on_grads_needed(void *ctx, size_t lo, size_t hi) { grad_sync_needed(ctx, lo, hi); }

void trainer_init(Trainer *t, Model *m, AdamW *opt, Comm *tp, Comm *dp, GradSync *gs, float clip_norm) {
    *t = (Trainer){.m = m, .opt = opt, .be = m->be, .tp = tp, .dp = dp, .gs = gs, .clip_norm = clip_norm};
    t->sc = backend_alloc(t->be, SC_N * sizeof(float), MEM_WORKSPACE);
}

void trainer_free(Trainer *t) {
    if (t->be) {
        step_graphs_free(t->graphs);
        backend_free(t->be, t->step_vars);
        backend_free(t->be, t->sc);
        backend_free(t->be, t->embed_zeros);
        op_segs_free(t->be, t->norm_segs);
    }
    *t = (Trainer){0};
}

static int pp_size(const Trainer *t) { return t->pp ? comm_size(t->pp) : 1; }

void trainer_set_pipeline(Trainer *t, Comm *pp) {
    t->pp = pp;
    if (pp_size(t) > 1 && !model_stage_has_embed(&t->m->stage)) {
        const size_t n = (size_t)t->m->vocab_local * (size_t)t->m->cfg.d_model;
        t->embed_zeros = backend_alloc(t->be, n * sizeof(float), MEM_COMM);
    }
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

/* The micro-batches through the 1F1B schedule (pipeline.h); with one
 * stage F0 B0 F1 B1 ...: gradient accumulation. Micro-batch i's
 * activations live in slot i mod (the stage's largest number in flight). */
typedef struct {
    Trainer *t;
    const Batch *b;  // [m]
    float scale;     // 1 / the global batch's target tokens
    DropoutKey key;
    int dp_size;
    int n_micro;
} MicroCtx;

static void use_slot(MicroCtx *c, int i) {
    Model *m = c->t->m;
    model_use_slot(m, i % m->n_slots);
}

static DropoutKey key_of(const MicroCtx *c, int i) {
    DropoutKey k = c->key;
    k.micro += (uint32_t)(i * c->dp_size);  // the global micro-batch index: dp rank + i dp
    return k;
}

/* Test-only fault hook: with TPTRAIN_FAULT_STEP=N set, rank
 * TPTRAIN_FAULT_RANK (default 0) dies (SIGKILL) or, with
 * TPTRAIN_FAULT_MODE=stop, stops answering (SIGSTOP) as it begins the
 * forward pass of its last micro-batch of step N: mid-step, while the other
 * stages wait on it in an exchange. */
static void fault_mid_step(uint32_t step, int i, int n_micro) {
    static int armed = -1;
    static long at, rank;
    if (armed < 0) {
        const char *s = getenv("TPTRAIN_FAULT_STEP"), *r = getenv("TPTRAIN_FAULT_RANK");
        armed = s != NULL;
        at = s ? atol(s) : 0;
        rank = r ? atol(r) : 0;
    }
    const int me = tp_log_rank() < 0 ? 0 : tp_log_rank();
    if (!armed || (long)step != at || i != n_micro - 1 || me != rank) return;
    const char *mode = getenv("TPTRAIN_FAULT_MODE");
    const bool stop = mode && strcmp(mode, "stop") == 0;
    fprintf(stderr, "fault injection: rank %d %s at step %ld, micro-batch %d\n", me,
            stop ? "stops answering" : "is killed", at, i);
    fflush(stderr);
    raise(stop ? SIGSTOP : SIGKILL);
}

/* ---- graphs (trainer_use_graphs) ---- */

int trainer_use_graphs(Trainer *t, int max_graphs, char *err, size_t err_len) {
    const int tp = t->tp ? comm_size(t->tp) : 1, dp = t->dp ? comm_size(t->dp) : 1;
    if (tp > 1 || dp > 1 || pp_size(t) > 1) {
        tp_error_set(err, err_len, "--cuda-graphs on needs one rank (this run has tp %d, dp %d, pp %d): the "
                     "collectives are not captured", tp, dp, pp_size(t));
        return -1;
    }
    if (!t->graphs) {
        t->graphs = step_graphs_new(t->be, max_graphs);
        t->step_vars = backend_alloc(t->be, sizeof(StepVars), MEM_WORKSPACE);
    }
    return 0;
}

/* The key the captured ops are given: the step and the micro-batch come
 * from the StepVars' stream_base on the device instead (backend.h). */
static DropoutKey graph_key(DropoutKey k) {
    k.step = 0;
    k.micro = 0;
    return k;
}

typedef struct {
    MicroCtx *c;
    int i;
} PhaseCtx;

static void run_forward(void *ctx) {
    const PhaseCtx *p = ctx;
    Trainer *t = p->c->t;
    model_forward_step(t->m, &p->c->b[p->i], true, graph_key(key_of(p->c, p->i)), t->sc + SC_LOSS);
}

static void run_backward(void *ctx) {
    const PhaseCtx *p = ctx;
    model_backward(p->c->t->m, &p->c->b[p->i], true, graph_key(key_of(p->c, p->i)), p->c->scale);
}

/* Micro-batch i's ids and StepVars to the device, then its forward (one
 * stage: its backward comes before the next micro-batch's forward, so the
 * StepVars hold for both). */
static void graph_forward(MicroCtx *c, int i) {
    Trainer *t = c->t;
    Model *m = t->m;
    const Batch *b = &c->b[i];
    model_stage_batch(m, b);
    const DropoutKey k = key_of(c, i);
    const StepVars sv = {.stream_base = dropout_stream(k.step, k.micro, 0, 0, 0), .loss_scale = c->scale};
    backend_upload(t->be, t->step_vars, &sv, sizeof sv);
    PhaseCtx p = {c, i};
    step_graphs_run(t->graphs, GRAPH_FORWARD, m->slot, b->B, b->S, b->T, m->layout_gen, run_forward, &p);
    model_unstage_batch(m);
}

static void graph_backward(MicroCtx *c, int i) {
    Model *m = c->t->m;
    const Batch *b = &c->b[i];
    PhaseCtx p = {c, i};
    step_graphs_run(c->t->graphs, GRAPH_BACKWARD, m->slot, b->B, b->S, b->T, m->layout_gen, run_backward, &p);
}

static void micro_forward(void *ctx, int i) {
    MicroCtx *c = ctx;
    fault_mid_step(c->key.step, i, c->n_micro);
    use_slot(c, i);
    if (c->b[i].B == 0) return;
    if (c->t->graphs) graph_forward(c, i);
    else model_forward_step(c->t->m, &c->b[i], true, key_of(c, i), c->t->sc + SC_LOSS);
}

/* With stages, the gradients from offset 0 (the tied embedding) are
 * released to the dp reduction only after the embedding group's sum, once
 * the schedule is done (ZeRO-2 reduces them every micro-batch and sums the
 * shard's embedding piece instead: finish_stage_grads). */
static void on_grads_final_stage(void *ctx, size_t from) {
    if (from > 0) grad_sync_ready(ctx, from);
}

static void micro_backward(void *ctx, int i, int last) {
    MicroCtx *c = ctx;
    Trainer *t = c->t;
    Model *m = t->m;
    const bool zero2 = grad_sync_zero(t->gs) >= 2, staged = pp_size(t) > 1;
    /* stages 0 and 1 reduce once, while the last micro-batch's backward
     * runs; ZeRO-2 reduces every micro-batch into its shard */
    const bool reduce = last || zero2;
    if (zero2) grad_sync_begin(t->gs, m->grads, i > 0);
    m->grads_final = reduce ? (staged && !zero2 ? on_grads_final_stage : on_grads_final) : NULL;
    m->grads_needed = on_grads_needed;
    m->grads_final_ctx = t->gs;
    use_slot(c, i);
    if (c->b[i].B > 0 && t->graphs) graph_backward(c, i);
    else if (c->b[i].B > 0) model_backward(m, &c->b[i], true, key_of(c, i), c->scale);
    m->grads_final = NULL;
    m->grads_needed = NULL;
    if (reduce && (!staged || zero2)) grad_sync_finish(t->gs);
}

/* ---- the exchanges with the neighbouring stages ---- */

/* A failed exchange (the neighbour died, or did not answer within the
 * group's timeout) ends this rank naming both stages; tprun then stops the
 * job. */
static void xfer(MicroCtx *c, float *buf, size_t n, int peer, bool send, int i, bool grad) {
    Trainer *t = c->t;
    if (n == 0) return;
    const double t0 = tp_now_s();
    const int rc = send ? comm_send(t->pp, buf, n * sizeof(float), peer) : comm_recv(t->pp, buf, n * sizeof(float), peer);
    TP_CHECK(rc == 0, "pipeline stage %d: %s micro-batch %d's %s %s stage %d failed: %s", comm_rank(t->pp),
             send ? "sending" : "receiving", i, grad ? "gradients" : "activations", send ? "to" : "from", peer,
             comm_error(t->pp));
    t->pp_wait_s += tp_now_s() - t0;
}

static void exchange(MicroCtx *c, int i, StageIO io, int peer, bool send, bool grad) {
    xfer(c, io.enc, io.n_enc, peer, send, i, grad);
    xfer(c, io.dec, io.n_dec, peer, send, i, grad);
    if (send) c->t->pp_sent++;
    else c->t->pp_received++;
}

static int stage_rank(const MicroCtx *c) { return comm_rank(c->t->pp); }

static void recv_prev(void *ctx, int i) {
    MicroCtx *c = ctx;
    const Batch *b = &c->b[i];
    if (b->B == 0) return;
    use_slot(c, i);
    exchange(c, i, model_stage_input(c->t->m, b->B, b->S, b->T), stage_rank(c) - 1, false, false);
}

static void send_next(void *ctx, int i) {
    MicroCtx *c = ctx;
    if (c->b[i].B == 0) return;
    use_slot(c, i);
    exchange(c, i, model_stage_output(c->t->m), stage_rank(c) + 1, true, false);
}

static void recv_next(void *ctx, int i) {
    MicroCtx *c = ctx;
    const Batch *b = &c->b[i];
    if (b->B == 0) return;
    use_slot(c, i);
    exchange(c, i, model_stage_output_grad(c->t->m, b->B, b->S, b->T), stage_rank(c) + 1, false, true);
}

static void send_prev(void *ctx, int i) {
    MicroCtx *c = ctx;
    if (c->b[i].B == 0) return;
    use_slot(c, i);
    exchange(c, i, model_stage_input_grad(c->t->m), stage_rank(c) - 1, true, true);
}

/* The embedding group's sum (stages without the embedding add zeros), then
 * the dp reduction of what is left: the buckets from offset 0. */
static void finish_stage_grads(Trainer *t) {
    Model *m = t->m;
    size_t n = (size_t)m->vocab_local * (size_t)m->cfg.d_model;
    const bool has = model_stage_has_embed(&m->stage), zero2 = grad_sync_zero(t->gs) >= 2;
    float *g = has ? m->g.embed : t->embed_zeros;
    if (zero2) {
        /* reduced into the shards already: the embedding is a bucket of its
         * own on every stage holding it, so rank r's piece is the same
         * ceil(n / dp) elements everywhere: sum those */
        const BucketLayout *L = grad_sync_layout(t->gs);
        const size_t q = (n + (size_t)L->dp - 1) / (size_t)L->dp;
        if (has) {
            const GradBucket *b = &L->b[L->n - 1];  // the first in the buffer: the embedding
            TP_CHECK(b->lo == 0 && b->hi == n && b->q == q,
                     "ZeRO-2 with stages: the embedding is not a bucket of its own");
            g = grad_sync_shard(t->gs) + b->at;
        }
        n = q;
    }
    if (!has) op_zero(t->be, g, n);  // the allreduce leaves the sum in it
    const double t0 = tp_now_s();
    comm_ok(comm_allreduce(t->pp, g, n, COMM_SUM), t->pp);
    t->pp_wait_s += tp_now_s() - t0;
    if (zero2) return;
    grad_sync_ready(t->gs, 0);
    grad_sync_finish(t->gs);
}

void train_step(Trainer *t, const Batch *b, int n_micro, long n_global, DropoutKey key, float lr, StepResult *out) {
    Model *m = t->m;
    Backend *be = t->be;
    model_zero_grad(m);
    op_zero(be, t->sc, SC_N);
    if (grad_sync_zero(t->gs) < 2) grad_sync_begin(t->gs, m->grads, false);
    MicroCtx mc = {.t = t, .b = b, .scale = n_global > 0 ? 1.0f / (float)n_global : 0.0f, .key = key,
                   .dp_size = t->dp ? comm_size(t->dp) : 1, .n_micro = n_micro};
    const int p = pp_size(t), s = p > 1 ? comm_rank(t->pp) : 0;
    const int slots = pipeline_max_in_flight(p, s, n_micro);
    if (m->n_slots != slots) model_set_slots(m, slots);
    const double wait0 = t->pp_wait_s;
    const PipeStage st = {.ctx = &mc, .p = p, .s = s, .m = n_micro, .forward = micro_forward,
                          .backward = micro_backward, .recv_prev = recv_prev, .send_next = send_next,
                          .recv_next = recv_next, .send_prev = send_prev};
    if (t->graphs) backend_set_step_vars(be, t->step_vars);
    pipeline_run(&st);
    backend_set_step_vars(be, NULL);
    if (p > 1) finish_stage_grads(t);
    const double t0 = tp_now_s();
    if (p > 1) comm_ok(comm_allreduce(t->pp, t->sc + SC_LOSS, 1, COMM_SUM), t->pp);  // the last stage's
    if (t->dp && comm_size(t->dp) > 1)
        comm_ok(comm_allreduce(t->dp, t->sc + SC_LOSS, 1, COMM_SUM), t->dp);  // the global loss sum
    double own = tp_now_s() - t0;
    /* the norm sums over the stages; the embedding counts on the first only */
    const GradNormPipe pipe = {.pp = p > 1 ? t->pp : NULL, .skip_embed = s > 0};
    if (grad_sync_sharded(t->gs)) {
        const AdamW *o = t->opt;
        float *shard = grad_sync_shard(t->gs);  // ZeRO-2; ZeRO-1 keeps its pieces in place
        float *g = shard ? shard : m->grads;
        if (!t->norm_segs) t->norm_segs = grad_norm_segs(be, &m->tab, shard != NULL, o->ranges, o->n_ranges, &pipe);
        grad_clip_ranges(be, t->norm_segs, g, shard != NULL, o->ranges, o->n_ranges, t->tp, t->dp, &pipe, t->clip_norm,
                         t->sc + SC_CLIP);
        adamw_step(t->opt, m->params, g, &m->tab, lr);
        grad_sync_allgather_params(t->gs, m->params);
    } else {
        if (!t->norm_segs) t->norm_segs = grad_norm_segs(be, &m->tab, false, NULL, 0, &pipe);
        grad_clip(be, &m->tab, t->norm_segs, m->grads, t->tp, &pipe, t->clip_norm, t->sc + SC_CLIP);
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
    out->pp_wait_s = t->pp_wait_s - wait0;
}
