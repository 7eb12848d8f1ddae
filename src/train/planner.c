/* planner.c: predicted memory per rank and step time (see planner.h). */
#include "train/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kernels/ops.h"

#include <cjson/cJSON.h>

#include "err.h"
#include "fileio.h"
#include "train/pipeline.h"
#include "data/batch.h"
#include "transformer/decode.h"
#include "transformer/params.h"
#include "tp/comm_shm.h"
#include "kernels/scratch_sizes.h"

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* Activation bytes of one model: per slot the largest carve of the shapes it
 * holds, the scratch the largest of all; on a GPU the batch ids too. */
typedef struct {
    size_t *slot;    // [n_slots] floats
    size_t *ids;     // [n_slots] int32 (GPU)
    size_t scratch;  // floats
    int n_slots;
} ActPlan;

static void act_add(ActPlan *a, const PlanInput *in, int tp, const ModelStage *st, ModelRecompute rc, bool sp,
                    int slot, PlanShape s) {
    size_t n_slot, n_scratch;
    const bool bf16 = in->dtype == DTYPE_BF16;
    model_plan_activations(&in->cfg, tp, st, rc, sp, bf16, bf16 && in->flash, s.B, s.S, s.T, &n_slot, &n_scratch);
    a->slot[slot] = max_z(a->slot[slot], n_slot);
    a->scratch = max_z(a->scratch, n_scratch);
    if (in->gpu) a->ids[slot] = max_z(a->ids[slot], (size_t)s.B * s.S + 2 * (size_t)s.B * s.T + 2 * (size_t)s.B);
}

static size_t act_bytes(const ActPlan *a) {
    size_t n = a->scratch * sizeof(float);
    for (int i = 0; i < a->n_slots; i++) n += a->slot[i] * sizeof(float) + a->ids[i] * sizeof(int32_t);
    return n;
}

static void act_init(ActPlan *a, int n_slots) {
    a->n_slots = n_slots;
    a->slot = TP_CALLOC((size_t)n_slots, sizeof *a->slot);
    a->ids = TP_CALLOC((size_t)n_slots, sizeof *a->ids);
    a->scratch = 0;
}

static void act_free(ActPlan *a) {
    free(a->slot);
    free(a->ids);
}

/* Bytes of a whole-stack model's table on tp shards (the decode and the
 * evaluation copies). */
static size_t table_elems(const ModelConfig *cfg, int tp, const ModelStage *st) {
    ParamTable tab;
    param_table_build_stage(cfg, tp, st, &tab);
    const size_t n = tab.n_elems;
    param_table_free(&tab);
    return n;
}

static size_t largest_tensor(const ModelConfig *cfg, int tp, const ModelStage *st) {
    ParamTable tab;
    param_table_build_stage(cfg, tp, st, &tab);
    size_t n = 0;
    for (int i = 0; i < tab.n; i++) n = max_z(n, tab.t[i].n_elems);
    param_table_free(&tab);
    return n;
}

/* The optimizer's two segment tables (transformer/optim.c: the norm's and
 * AdamW's), a segment per tensor: exact without ZeRO; a ZeRO shard holds
 * pieces of the tensors, a few more segments of fewer chunks. */
static double seg_tables_bytes(const ParamTable *tab) {
    size_t chunks = 0;
    int n = 0;
    for (int i = 0; i < tab->n; i++) {
        chunks += op_segs_chunks(tab->t[i].n_elems);
        n += tab->t[i].n_elems > 0;
    }
    return 2.0 * (double)op_segs_bytes(n, chunks);
}

/* ---- NCCL's buffers ---------------------------------------------------------
 * As NCCL documents them: NCCL_BUFFSIZE bytes (default 4 MiB) per channel
 * for each peer a rank connects to (a ring: one peer with two ranks, two
 * with more), in every communicator of more than one rank. The channel
 * count is NCCL's choice by topology; NCCL_MAX_NCHANNELS (else
 * NCCL_MIN_NCHANNELS) fixes it where set, else PLAN_NCCL_CHANNELS is
 * assumed. A run measures the real figure (comm_nccl_device_bytes, the
 * library column of its memory report). */
static size_t env_size(const char *name, size_t dflt) {
    const char *s = getenv(name);
    char *end = NULL;
    const unsigned long long v = s && *s ? strtoull(s, &end, 10) : 0;
    return s && *s && end && *end == '\0' && v > 0 ? (size_t)v : dflt;
}

size_t planner_nccl_buffsize(void) { return env_size("NCCL_BUFFSIZE", PLAN_NCCL_BUFFSIZE); }

int planner_nccl_channels(void) {
    return (int)env_size("NCCL_MAX_NCHANNELS", env_size("NCCL_MIN_NCHANNELS", PLAN_NCCL_CHANNELS));
}

double planner_nccl_bytes(int n_ranks) {
    if (n_ranks < 2) return 0.0;
    const int peers = n_ranks == 2 ? 1 : 2;
    return (double)planner_nccl_channels() * peers * (double)planner_nccl_buffsize();
}

/* The most source and target tokens of shapes[i] for i = first, first + step, ... < end. */
static void rows_max(const PlanShape *shapes, size_t first, size_t step, size_t end, int *Ns, int *Nt) {
    for (size_t i = first; i < end; i += step) {
        *Ns = *Ns > shapes[i].B * shapes[i].S ? *Ns : shapes[i].B * shapes[i].S;
        *Nt = *Nt > shapes[i].B * shapes[i].T ? *Nt : shapes[i].B * shapes[i].T;
    }
}

size_t planner_scratch_arena(const PlanInput *in, int rank) {
    if (!in->gpu) return 0;  // the CPU's arena holds bf16 operand copies only: not modelled
    const int tp = in->tp, dp = in->dp, pp = in->pp, M = in->micro;
    const int r_dp = (rank / tp) % dp, r_pp = rank / (tp * dp);
    const bool bf16 = in->dtype == DTYPE_BF16;
    const ModelStage *st = &in->stages[r_pp];
    int Ns = 0, Nt = 0;
    for (int s = 0; s < in->n_steps; s++)
        rows_max(in->train, ((size_t)s * dp + r_dp) * M, 1, ((size_t)s * dp + r_dp + 1) * M, &Ns, &Nt);
    size_t need = planner_scratch_stage(&in->cfg, bf16, tp, st, in->seq_par, Ns, Nt, true);
    if (r_dp == 0 && (pp == 1 || r_pp == 0) && in->n_eval > 0) {  // evaluation (pp > 1: the whole stack, no sp)
        const ModelStage whole = model_stage_whole(&in->cfg);
        Ns = Nt = 0;
        rows_max(in->eval, 0, 1, (size_t)in->n_eval, &Ns, &Nt);
        const size_t e = planner_scratch_stage(&in->cfg, bf16, tp, pp > 1 ? &whole : st, pp == 1 && in->seq_par,
                                               Ns, Nt, false);
        need = max_z(need, e);
    }
    if (rank == 0 && in->decode)
        need = max_z(need, planner_scratch_decode(&in->cfg, bf16, in->decode_n, in->decode_S, in->beam));
    return scratch_arena_bytes(need);
}

void planner_memory(const PlanInput *in, int rank, PlanRank *out) {
    memset(out, 0, sizeof *out);
    const int tp = in->tp, dp = in->dp, pp = in->pp, M = in->micro;
    out->rank = rank;
    out->tp = rank % tp;
    out->dp = (rank / tp) % dp;
    out->pp = rank / (tp * dp);
    const ModelStage *st = &in->stages[out->pp];
    const bool gpu_bf16 = in->gpu && in->dtype == DTYPE_BF16;
    const size_t f = sizeof(float);
    double *tag = out->tag;

    /* the stage's model: weights, gradients, optimizer */
    ParamTable tab;
    param_table_build_stage(&in->cfg, tp, st, &tab);
    out->n_params = tab.n_elems;
    tag[MEM_MASTER] = (double)(tab.n_elems * f);
    if (gpu_bf16) tag[MEM_COMPUTE] = (double)(tab.n_elems * sizeof(uint16_t));
    GradSyncConfig g = in->grad;
    g.staged = pp > 1;
    GradSyncPlan gp;
    grad_sync_plan(&tab, &g, dp, &gp);
    const double segs = seg_tables_bytes(&tab);
    param_table_free(&tab);
    tag[MEM_GRAD] = (double)gp.grad_bytes;
    tag[MEM_OPTIM] = (double)gp.optim_bytes;
    /* the asynchronous save's snapshot (train/ckpt_async.c), page-locked host
     * memory: both moments, and the weights where the rank writes the model shard */
    const double snapshot = in->ckpt_snapshot ? (double)gp.optim_bytes + (out->dp == 0 ? (double)(out->n_params * f) : 0.0)
                                              : 0.0;
    double comm = (double)gp.comm_bytes;
    if (pp > 1 && !model_stage_has_embed(st))  // the embedding group's zeros (train/step.c)
        comm += (double)((size_t)(vocab_padded(&in->cfg, tp) / tp) * (size_t)in->cfg.d_model * f);
    /* the model's loss scalars, the step's scalars, the segment tables, and the
     * GEMM library's workspace the backend allocates at creation (cuBLASLt's on a GPU) */
    double ws = (2 + 5) * (double)f + segs + (double)backend_gemm_workspace_bytes(in->gpu ? BACKEND_CUDA : BACKEND_CPU);
    /* the ops' scratch arena: what the largest request grows it to (a GPU) */
    out->scratch = (double)planner_scratch_arena(in, rank);
    ws += out->scratch;
    /* NCCL (a GPU per rank): the world's communicator and the tp, dp and pp
     * groups split from it hold NCCL's buffers, the library's share */
    if (in->nccl)
        out->nccl = planner_nccl_bytes(tp * dp * pp) + planner_nccl_bytes(tp) + planner_nccl_bytes(dp) +
                    planner_nccl_bytes(pp);
    tag[MEM_LIBRARY] = out->nccl;
    /* staged groups (ranks sharing a GPU): each group with peers holds a
     * page-locked host buffer, tagged comm but not device memory */
    if (in->staged)
        out->staging = (double)(comm_shm_stage_bytes(tp) + comm_shm_stage_bytes(dp) + comm_shm_stage_bytes(pp));

    /* activations: micro-batch i in slot i mod (the stage's most in flight) */
    ActPlan acts;
    act_init(&acts, pipeline_max_in_flight(pp, out->pp, M));
    for (int s = 0; s < in->n_steps; s++)
        for (int i = 0; i < M; i++)
            act_add(&acts, in, tp, st, in->recompute, in->seq_par, i % acts.n_slots,
                    in->train[((size_t)s * dp + out->dp) * M + i]);
    double act = 0.0;
    /* evaluation: dp rank 0's tp group; with stages on a whole-stack copy on pp rank 0 */
    const bool evaluates = out->dp == 0 && (pp == 1 || out->pp == 0);
    /* dev BLEU on rank 0: a whole training model (tp 1, pp 1) decodes itself, in its own slot */
    const bool decode_on_m = rank == 0 && in->decode && tp == 1 && pp == 1;
    double transient_eval = 0.0;
    if (evaluates && pp == 1) {
        for (int e = 0; e < in->n_eval; e++)
            act_add(&acts, in, tp, st, in->recompute, in->seq_par, (M - 1) % acts.n_slots, in->eval[e]);
        if (decode_on_m)
            act_add(&acts, in, tp, st, in->recompute, in->seq_par, (M - 1) % acts.n_slots,
                    (PlanShape){in->decode_n, in->decode_S, 1});
    }
    act += (double)act_bytes(&acts);
    act_free(&acts);
    const ModelStage whole = model_stage_whole(&in->cfg);
    if (evaluates && pp > 1) {  // the stack: no gradients, no recomputation, one slot
        const size_t n = table_elems(&in->cfg, tp, &whole);
        tag[MEM_MASTER] += (double)(n * f);
        if (gpu_bf16) tag[MEM_COMPUTE] += (double)(n * sizeof(uint16_t));
        ws += 2 * (double)f;
        ActPlan sa;
        act_init(&sa, 1);
        for (int e = 0; e < in->n_eval; e++) act_add(&sa, in, tp, &whole, MODEL_RECOMPUTE_NONE, false, 0, in->eval[e]);
        act += (double)act_bytes(&sa);
        act_free(&sa);
    }
    if (evaluates && in->gather_at_eval)  // model_gather's buffer, whatever tp
        transient_eval = (double)((size_t)tp * largest_tensor(&in->cfg, tp, pp > 1 ? &whole : st) * f);
    double transient_ws = 0.0;
    if (rank == 0 && in->decode && !decode_on_m) {  // a whole model for dev BLEU: weights, the encoder's activations
        const size_t n = table_elems(&in->cfg, 1, &whole);
        tag[MEM_MASTER] += (double)(n * f);
        if (gpu_bf16) tag[MEM_COMPUTE] += (double)(n * sizeof(uint16_t));
        ws += 2 * (double)f;
        ActPlan da;
        act_init(&da, 1);
        act_add(&da, in, 1, &whole, MODEL_RECOMPUTE_NONE, false, 0, (PlanShape){in->decode_n, in->decode_S, 1});
        act += (double)act_bytes(&da);
        act_free(&da);
    }
    if (rank == 0 && in->decode)  // the decode state
        transient_ws = (double)decode_workspace_bytes(&in->cfg, in->decode_n, in->beam, in->decode_S);
    tag[MEM_ACT] = act;
    double held = 0.0;
    for (int t = 0; t < MEM_LIBRARY; t++) held += tag[t];
    held += comm + ws;
    /* the largest transient on top of what is held: ZeRO-2's live buckets in
     * backward, or at evaluation the gather buffer and then the decode state */
    const double tr_train = (double)gp.grad_live_bytes;
    const double tr_eval = transient_eval > transient_ws ? transient_eval : transient_ws;
    out->allocator_peak = held + (tr_train > tr_eval ? tr_train : tr_eval);
    tag[MEM_GRAD] += tr_train;
    tag[MEM_COMM] = comm + transient_eval + out->staging;
    tag[MEM_WORKSPACE] = ws + transient_ws;
    tag[MEM_CKPT] = snapshot;  // after `held`: not device memory
}

/* ---- time ------------------------------------------------------------------ */

static int add_shape(int (*out)[3], int n, int M, int N, int K) {
    for (int i = 0; i < n; i++)
        if (out[i][0] == M && out[i][1] == N && out[i][2] == K) return n;
    if (n >= PLAN_MAX_GEMMS) return n;
    out[n][0] = M, out[n][1] = N, out[n][2] = K;
    return n + 1;
}

int planner_gemm_shapes(const PlanInput *in, int tp, const ModelStage *st, PlanShape s, int (*out)[3]) {
    const int C = in->cfg.d_model, Cl = C / tp, Fl = in->cfg.d_ff / tp, Vl = vocab_padded(&in->cfg, tp) / tp;
    const int Ns = s.B * s.S, Nt = s.B * s.T;
    int n = 0;
    if (st->enc_hi > st->enc_lo) {
        n = add_shape(out, n, Ns, Cl, C);  // q, k, v
        n = add_shape(out, n, Ns, C, Cl);  // output projection
        n = add_shape(out, n, Ns, Fl, C);
        n = add_shape(out, n, Ns, C, Fl);
    }
    if (st->dec_hi > st->dec_lo) {
        n = add_shape(out, n, Nt, Cl, C);
        n = add_shape(out, n, Nt, C, Cl);
        n = add_shape(out, n, Ns, Cl, C);  // cross keys and values
        n = add_shape(out, n, Nt, Fl, C);
        n = add_shape(out, n, Nt, C, Fl);
    }
    if (st->head) n = add_shape(out, n, Nt, Vl, C);
    return n;
}

static double gemm_rate(const PlanCalib *c, int M, int N, int K) {
    double best = 0.0, near = 0.0, d_near = 1e300;
    for (int i = 0; i < c->n_gemm; i++) {
        if (c->gemm[i].M == M && c->gemm[i].N == N && c->gemm[i].K == K) return c->gemm[i].flops_per_s;
        const double d = fabs(log((double)c->gemm[i].M * c->gemm[i].N * c->gemm[i].K / ((double)M * N * K)));
        if (d < d_near) d_near = d, near = c->gemm[i].flops_per_s;
        if (c->gemm[i].flops_per_s > best) best = c->gemm[i].flops_per_s;
    }
    return near > 0.0 ? near : best > 0.0 ? best : 1e9;  // the nearest size measured
}

/* Every rank of sync at once (NULL: alone), so that each measures with
 * the others as busy as in the run. */
static void sync_ranks(Comm *sync) {
    if (sync) TP_CHECK(comm_barrier(sync) == 0, "%s", comm_error(sync));
}

/* Seconds of f() repeated until at least min_s passed (after one warm-up
 * call and the ranks' meeting), per call. */
static double time_per_call(Backend *be, void (*f)(void *), void *ctx, double min_s, Comm *sync) {
    f(ctx);
    backend_sync(be);
    sync_ranks(sync);
    int n = 0;
    const double t0 = tp_now_s();
    double t;
    do {
        f(ctx);
        n++;
        backend_sync(be);
        t = tp_now_s() - t0;
    } while (t < min_s);
    return t / n;
}

typedef struct {
    Backend *be;
    float *x, *w, *y, *b;
    int M, N, K;
    float *q, *k, *v, *P;
    int32_t *len;
    int B, H, T, D;
} Bench;

static void bench_gemm(void *p) {
    Bench *b = p;
    op_linear_fwd(b->be, b->y, b->x, b->w, NULL, b->M, b->K, b->N);
}
static void bench_add(void *p) {
    Bench *b = p;
    op_add(b->be, b->y, b->x, b->w, (size_t)b->M);
}
static void bench_attn(void *p) {
    Bench *b = p;
    op_attention_fwd(b->be, b->y, b->P, b->q, b->k, b->v, b->len, b->B, b->H, b->T, b->T, b->D, false);
}

static float *zeros(Backend *be, size_t n) { return backend_alloc(be, (n ? n : 1) * sizeof(float), MEM_WORKSPACE); }

static void layer_costs(const PlanInput *in, const PlanCalib *c, int tp, const ModelStage *st, PlanShape s,
                        double *layers_fwd, double *head_fwd, double *attn_fwd, double *attn_out);

/* Seconds of one training micro-batch (forward and backward) of model m
 * on a batch of shape s: the mean of eight after a warm-up. */
static double model_step_s(Backend *be, Model *m, PlanShape s, Comm *sync) {
    OwnedBatch b;
    owned_batch_alloc(&b, s.B, s.S, s.T, m->cfg.pad_id);
    const int tok = m->cfg.vocab_size > 5 ? 5 : m->cfg.vocab_size - 1;
    for (int r = 0; r < s.B; r++) {
        b.src_len[r] = s.S, b.tgt_len[r] = s.T;
        for (int t = 0; t < s.S; t++) b.src[(size_t)r * s.S + t] = tok;
        for (int t = 0; t < s.T; t++) b.tgt_in[(size_t)r * s.T + t] = b.tgt_out[(size_t)r * s.T + t] = tok;
    }
    const DropoutKey key = {.seed = 1};
    enum { REPS = 8 };
    double t0 = 0.0;
    for (int rep = 0; rep <= REPS; rep++) {  // the first warms the allocator and caches
        if (rep == 1) {
            sync_ranks(sync);
            t0 = tp_now_s();
        }
        model_zero_grad(m);
        int n_tok = 0;
        model_forward(m, &b.view, true, key, &n_tok);
        model_backward(m, &b.view, true, key, 1.0f / (float)(n_tok ? n_tok : 1));
        backend_sync(be);
    }
    const double mean = (tp_now_s() - t0) / REPS;
    owned_batch_free(&b);
    return mean;
}

/* The shape an eighth as many rows: the fixed cost's lever. */
static PlanShape small_shape(PlanShape s) { return (PlanShape){s.B / 8 > 0 ? s.B / 8 : 1, s.S, s.T}; }

/* A 1+1-layer model of the config (tp 1, dropout as configured) trains a
 * micro-batch of the largest shape and one of an eighth its rows; what
 * each takes beyond the GEMMs and attention the calibration prices is the
 * rest (LayerNorm, softmax, dropout, loss, embeddings, the calls
 * themselves): a fixed cost per layer and micro-batch, and a cost per
 * activation float its slot keeps (the two solved from the two shapes). */
static void elem_calibrate(Backend *be, const PlanInput *in, PlanShape big, PlanCalib *c, Comm *sync) {
    ModelConfig one = in->cfg;
    one.enc_layers = one.dec_layers = 1;
    Model m;
    char err[256];
    TP_CHECK(model_create_ex(&m, be, &one, NULL, 1, 0, err, sizeof err) == 0, "%s", err);
    PlanInput in1 = *in;
    in1.cfg = one;
    const ModelStage whole = model_stage_whole(&one);
    const PlanShape shapes[2] = {big, small_shape(big)};
    double rest[2], floats[2];
    for (int k = 0; k < 2; k++) {
        const double t = model_step_s(be, &m, shapes[k], sync);
        double layers, head, attn, attn_out;
        layer_costs(&in1, c, 1, &whole, shapes[k], &layers, &head, &attn, &attn_out);
        size_t slot, scratch;
        model_plan_activations(&one, 1, &whole, MODEL_RECOMPUTE_NONE, false, m.keep_bf16, false, shapes[k].B, shapes[k].S,
                               shapes[k].T, &slot, &scratch);
        rest[k] = t - 3.0 * (layers + head);
        if (rest[k] < 0.05 * t) rest[k] = 0.05 * t;
        floats[k] = (double)slot;
    }
    model_free(&m);
    double per_float = floats[0] > floats[1] ? (rest[0] - rest[1]) / (floats[0] - floats[1]) : 0.0;
    if (per_float <= 0.0) per_float = rest[0] / floats[0];  // no lever (one row): all per float
    double fixed = (rest[0] - per_float * floats[0]) / 2.0;
    if (fixed < 0.0) fixed = 0.0, per_float = rest[0] / floats[0];
    c->elem[c->n_elem].tokens = (double)big.B * (big.S + big.T);
    c->elem[c->n_elem].per_float = per_float;
    c->elem[c->n_elem++].fixed_per_layer = fixed;
}

/* The element-wise calibration nearest in size to micro-batches of `tokens` (-1: none). */
static int elem_nearest(const PlanCalib *c, double tokens) {
    int best = -1;
    for (int i = 0; i < c->n_elem; i++)
        if (best < 0 || fabs(log(c->elem[i].tokens / tokens)) < fabs(log(c->elem[best].tokens / tokens))) best = i;
    return best;
}

void planner_calibrate_compute(Backend *be, const PlanInput *in, PlanCalib *c, Comm *sync) {
    /* the largest training shape: the GEMMs of every stage at every tp the input allows */
    PlanShape big = {1, 1, 1};
    const size_t n_train = (size_t)in->n_steps * in->dp * in->micro;
    for (size_t i = 0; i < n_train; i++)
        if ((size_t)in->train[i].B * (in->train[i].S + in->train[i].T) > (size_t)big.B * (big.S + big.T))
            big = in->train[i];
    const ModelStage whole = model_stage_whole(&in->cfg);
    int shapes[PLAN_MAX_GEMMS][3];
    int n = planner_gemm_shapes(in, in->tp, &whole, big, shapes);
    for (int k2 = 0; k2 < 2; k2++) {  // and at tp 1: the element-wise calibration's model at its two shapes
        int one[PLAN_MAX_GEMMS][3];
        const int k = planner_gemm_shapes(in, 1, &whole, k2 ? small_shape(big) : big, one);
        for (int i = 0; i < k; i++) n = add_shape(shapes, n, one[i][0], one[i][1], one[i][2]);
    }
    Bench b = {.be = be};
    for (int i = 0; i < n && c->n_gemm < PLAN_MAX_GEMMS; i++) {
        bool have = false;
        for (int j = 0; j < c->n_gemm && !have; j++)
            have = c->gemm[j].M == shapes[i][0] && c->gemm[j].N == shapes[i][1] && c->gemm[j].K == shapes[i][2];
        if (have) continue;
        b.M = shapes[i][0], b.N = shapes[i][1], b.K = shapes[i][2];
        b.x = zeros(be, (size_t)b.M * b.K);
        b.w = zeros(be, (size_t)b.N * b.K);
        b.y = zeros(be, (size_t)b.M * b.N);
        const double s = time_per_call(be, bench_gemm, &b, 0.05, sync);
        c->gemm[c->n_gemm].M = b.M, c->gemm[c->n_gemm].N = b.N, c->gemm[c->n_gemm].K = b.K;
        c->gemm[c->n_gemm++].flops_per_s = 2.0 * b.M * b.N * (double)b.K / s;
        backend_free(be, b.x), backend_free(be, b.w), backend_free(be, b.y);
    }
    if (c->mem_bw <= 0.0) {
        b.M = 1 << 22;  // 16 MiB per operand: past the caches
        b.x = zeros(be, (size_t)b.M), b.w = zeros(be, (size_t)b.M), b.y = zeros(be, (size_t)b.M);
        c->mem_bw = 3.0 * sizeof(float) * b.M / time_per_call(be, bench_add, &b, 0.05, sync);
        backend_free(be, b.x), backend_free(be, b.w), backend_free(be, b.y);
    }
    if (c->attn_flops_per_s <= 0.0) {
        b.B = 8, b.H = in->cfg.n_heads, b.T = big.S > big.T ? big.S : big.T, b.D = in->cfg.d_model / in->cfg.n_heads;
        const size_t n_qkv = (size_t)b.B * b.T * b.H * b.D;
        b.q = zeros(be, n_qkv), b.k = zeros(be, n_qkv), b.v = zeros(be, n_qkv), b.y = zeros(be, n_qkv);
        b.P = zeros(be, (size_t)b.B * b.H * b.T * b.T);
        int32_t *len = TP_MALLOC((size_t)b.B * sizeof *len);
        for (int i = 0; i < b.B; i++) len[i] = b.T;
        b.len = backend_alloc(be, (size_t)b.B * sizeof(int32_t), MEM_WORKSPACE);
        backend_upload(be, b.len, len, (size_t)b.B * sizeof(int32_t));
        free(len);
        c->attn_flops_per_s = 4.0 * b.B * b.H * (double)b.T * b.T * b.D / time_per_call(be, bench_attn, &b, 0.05, sync);
        backend_free(be, b.q), backend_free(be, b.k), backend_free(be, b.v), backend_free(be, b.y);
        backend_free(be, b.P), backend_free(be, b.len);
    }
    /* after the rates it subtracts; once per size of micro-batch (within 2x) */
    const double tokens = (double)big.B * (big.S + big.T);
    const int near = elem_nearest(c, tokens);
    if (c->n_elem < PLAN_MAX_ELEM && (near < 0 || fabs(log(c->elem[near].tokens / tokens)) > log(2.0)))
        elem_calibrate(be, in, big, c, sync);  // a full table: the nearest prices it
}

void planner_calibrate_comm(Backend *be, Comm *comm, PlanCalib *c) {
    const int g = comm_size(comm), r = comm_rank(comm);
    if (g < 2 || g > PLAN_MAX_GROUP) return;
    /* allreduce: latency from 16 floats, bandwidth from 4 MiB */
    const size_t small = 16, large = (size_t)1 << 20;
    float *buf = zeros(be, large);
    double t[2];
    const size_t sizes[2] = {small, large};
    for (int k = 0; k < 2; k++) {
        const int reps = k == 0 ? 200 : 10;
        TP_CHECK(comm_allreduce(comm, buf, sizes[k], COMM_SUM) == 0, "%s", comm_error(comm));  // warm-up
        TP_CHECK(comm_barrier(comm) == 0, "%s", comm_error(comm));
        const double t0 = tp_now_s();
        for (int i = 0; i < reps; i++) TP_CHECK(comm_allreduce(comm, buf, sizes[k], COMM_SUM) == 0, "%s", comm_error(comm));
        t[k] = (tp_now_s() - t0) / reps;
    }
    /* Under load: in a run the members reach a collective from compute,
     * and where ranks share cores one may be descheduled; its latency then
     * is what a small allreduce adds to a loop of ~1 ms GEMMs, every group
     * of the size at once. */
    Bench w = {.be = be, .M = 256, .N = 256, .K = 256};
    w.x = zeros(be, 256 * 256), w.w = zeros(be, 256 * 256), w.y = zeros(be, 256 * 256);
    double loaded[2];
    for (int k = 0; k < 2; k++) {
        enum { REPS = 100 };
        bench_gemm(&w);
        backend_sync(be);
        TP_CHECK(comm_barrier(comm) == 0, "%s", comm_error(comm));
        const double t0 = tp_now_s();
        for (int i = 0; i < REPS; i++) {
            bench_gemm(&w);
            backend_sync(be);
            if (k == 1) TP_CHECK(comm_allreduce(comm, buf, small, COMM_SUM) == 0, "%s", comm_error(comm));
        }
        loaded[k] = (tp_now_s() - t0) / REPS;
    }
    backend_free(be, w.x), backend_free(be, w.w), backend_free(be, w.y);
    /* every member adopts member 0's figures (they must agree for the plan to be one) */
    float fig[3] = {(float)t[0], (float)t[1], (float)(loaded[1] > loaded[0] ? loaded[1] - loaded[0] : 0.0)};
    TP_CHECK(comm_broadcast(comm, fig, sizeof fig, 0) == 0, "%s", comm_error(comm));
    c->ar_lat[g] = fig[0];
    c->ar_bw[g] = fig[1] > fig[0] ? (double)(large - small) * sizeof(float) / (fig[1] - fig[0]) : 1e12;
    c->ar_loaded[g] = fig[2];
    /* a stage message: ping-pong between members 0 and 1 */
    float p2p[2] = {0.0f, 0.0f};
    if (r < 2) {
        for (int k = 0; k < 2; k++) {
            const int reps = k == 0 ? 200 : 10;
            const size_t n = sizes[k] * sizeof(float);
            const double t0 = tp_now_s();
            for (int i = 0; i < reps; i++) {
                if (r == 0) {
                    TP_CHECK(comm_send(comm, buf, n, 1) == 0 && comm_recv(comm, buf, n, 1) == 0, "%s", comm_error(comm));
                } else {
                    TP_CHECK(comm_recv(comm, buf, n, 0) == 0 && comm_send(comm, buf, n, 0) == 0, "%s", comm_error(comm));
                }
            }
            p2p[k] = (float)((tp_now_s() - t0) / (2.0 * reps));
        }
    }
    TP_CHECK(comm_broadcast(comm, p2p, sizeof p2p, 0) == 0, "%s", comm_error(comm));
    if (g == 2 || c->p2p_lat <= 0.0) {
        c->p2p_lat = p2p[0];
        c->p2p_bw = p2p[1] > p2p[0] ? (double)(large - small) * sizeof(float) / (p2p[1] - p2p[0]) : 1e12;
    }
    backend_free(be, buf);
}

/* An allreduce of n bytes in a group of g: the figures for g, else for the
 * nearest size measured (scaled by the ring's 2 (g - 1) / g), else a guess
 * from the memory bandwidth. */
static double allreduce_s(const PlanCalib *c, int g, double n) {
    if (g < 2) return 0.0;
    if (g <= PLAN_MAX_GROUP && c->ar_bw[g] > 0.0) return fmax(c->ar_lat[g], c->ar_loaded[g]) + n / c->ar_bw[g];
    int best = 0;
    for (int h = 2; h <= PLAN_MAX_GROUP; h++)
        if (c->ar_bw[h] > 0.0 && (best == 0 || abs(h - g) < abs(best - g))) best = h;
    if (best) {
        const double scale = (2.0 * (g - 1) / g) / (2.0 * (best - 1) / best);
        return fmax(c->ar_lat[best], c->ar_loaded[best]) * g / best + n * scale / c->ar_bw[best];
    }
    return 20e-6 * g + 2.0 * n / (c->mem_bw > 0.0 ? c->mem_bw : 1e10);
}

static double p2p_s(const PlanCalib *c, double n) {
    if (c->p2p_bw > 0.0) return c->p2p_lat + n / c->p2p_bw;
    return 20e-6 + n / (c->mem_bw > 0.0 ? c->mem_bw : 1e10);
}

/* Forward seconds of a micro-batch of shape s on a tp rank of stage st:
 * its layers' GEMMs and attention, the output layer's GEMM, and of it the
 * attention alone and the attention blocks' output projections (what
 * selective recomputation runs again: model.c's attn_out_fwd). */
static void layer_costs(const PlanInput *in, const PlanCalib *c, int tp, const ModelStage *st, PlanShape s,
                        double *layers_fwd, double *head_fwd, double *attn_fwd, double *attn_out) {
    const ModelConfig *cfg = &in->cfg;
    const int C = cfg->d_model, Cl = C / tp, Fl = cfg->d_ff / tp, Vl = vocab_padded(cfg, tp) / tp;
    const double Ns = (double)s.B * s.S, Nt = (double)s.B * s.T, Hl = cfg->n_heads / tp, dh = C / cfg->n_heads;
    const int n_enc = st->enc_hi - st->enc_lo, n_dec = st->dec_hi - st->dec_lo;
#define GEMM(M, N, K) (2.0 * (double)(M) * (N) * (K) / gemm_rate(c, (int)(M), (N), (K)))
    const double enc_gemm = 3 * GEMM(Ns, Cl, C) + GEMM(Ns, C, Cl) + GEMM(Ns, Fl, C) + GEMM(Ns, C, Fl);
    const double dec_gemm = 4 * GEMM(Nt, Cl, C) + 2 * GEMM(Nt, C, Cl) + 2 * GEMM(Ns, Cl, C) + GEMM(Nt, Fl, C) +
                            GEMM(Nt, C, Fl);
    *head_fwd = st->head ? GEMM(Nt, Vl, C) : 0.0;
    *attn_out = n_enc * GEMM(Ns, C, Cl) + 2.0 * n_dec * GEMM(Nt, C, Cl);
#undef GEMM
    const double ar = c->attn_flops_per_s > 0.0 ? c->attn_flops_per_s : 1e9;
    const double enc_attn = 4.0 * s.B * Hl * (double)s.S * s.S * dh / ar;
    const double dec_attn = 4.0 * s.B * Hl * ((double)s.T * s.T + (double)s.T * s.S) * dh / ar;
    *attn_fwd = n_enc * enc_attn + n_dec * dec_attn;
    *layers_fwd = n_enc * enc_gemm + n_dec * dec_gemm + *attn_fwd;
}

/* One micro-batch of shape s on a tp rank of stage st: seconds of compute
 * (forward, backward, recomputation) and of tp communication. */
static void micro_cost(const PlanInput *in, const PlanCalib *c, const ModelStage *st, PlanShape s, double *compute,
                       double *tp_comm) {
    const ModelConfig *cfg = &in->cfg;
    const int tp = in->tp, C = cfg->d_model;
    const double Ns = (double)s.B * s.S, Nt = (double)s.B * s.T;
    const int n_enc = st->enc_hi - st->enc_lo, n_dec = st->dec_hi - st->dec_lo;
    double layers_fwd, head_gemm, attn, attn_out;
    layer_costs(in, c, tp, st, s, &layers_fwd, &head_gemm, &attn, &attn_out);
    /* element-wise work: in proportion to the activations a slot keeps */
    size_t slot, scratch;
    const bool bf16 = in->dtype == DTYPE_BF16;
    model_plan_activations(cfg, tp, st, MODEL_RECOMPUTE_NONE, in->seq_par, bf16, bf16 && in->flash, s.B, s.S, s.T,
                           &slot, &scratch);
    const int e = elem_nearest(c, (double)s.B * (s.S + s.T));
    const double elem = e < 0 ? 0.0 : c->elem[e].per_float * (double)slot + c->elem[e].fixed_per_layer * (n_enc + n_dec);
    double t = 3.0 * (layers_fwd + head_gemm) + elem;  // forward, and backward's two GEMMs per GEMM
    if (in->recompute == MODEL_RECOMPUTE_SELECTIVE) t += 0.5 * attn + attn_out;
    if (in->recompute == MODEL_RECOMPUTE_FULL) t += layers_fwd + elem / 3.0;
    *compute = t;
    /* tp: per sub-block one allreduce forward and one backward of (N, C);
     * with sequence parallelism a reduce-scatter and an allgather each (half
     * the bytes each); the embeddings' and the loss's; full recomputation
     * repeats forward's */
    double comm = 0.0;
    if (tp > 1) {
        const double fwd_calls_s = 2.0 * n_enc + (st->enc_embed ? 1 : 0);
        const double fwd_calls_t = 3.0 * n_dec + (st->dec_embed ? 1 : 0);
        const double passes = 2.0 + (in->recompute == MODEL_RECOMPUTE_FULL ? 1.0 : 0.0);
        const double bs = Ns * C * sizeof(float), bt = Nt * C * sizeof(float);
        const double per_s = in->seq_par ? 2.0 * allreduce_s(c, tp, bs / 2.0) : allreduce_s(c, tp, bs);
        const double per_t = in->seq_par ? 2.0 * allreduce_s(c, tp, bt / 2.0) : allreduce_s(c, tp, bt);
        comm = passes * (fwd_calls_s * per_s + fwd_calls_t * per_t);
        if (in->recompute == MODEL_RECOMPUTE_SELECTIVE)  // the attention blocks' ends rebuilt: their ROW reduce
            comm += (in->seq_par ? 0.5 : 1.0) * (n_enc * per_s + 2.0 * n_dec * per_t);
        if (st->head) comm += 3.0 * allreduce_s(c, tp, Nt * 3 * sizeof(float));  // the loss's row statistics
    }
    *tp_comm = comm;
}

/* micro_cost by (stage, shape), remembered: a plan prices the same shapes
 * many times (every step of every dp rank) */
enum { MEMO_SIZE = 1 << 14 };
typedef struct {
    int k, B, S, T;  // B 0: empty
    double comp, comm;
} CostMemo;

static void micro_cost_memo(const PlanInput *in, const PlanCalib *c, CostMemo *memo, int *n_memo, int k, PlanShape s,
                            double *comp, double *comm) {
    unsigned h = ((unsigned)s.B * 73856093u ^ (unsigned)s.S * 19349663u ^ (unsigned)s.T * 83492791u ^
                  (unsigned)k * 2654435761u) & (MEMO_SIZE - 1);
    for (; memo[h].B; h = (h + 1) & (MEMO_SIZE - 1))
        if (memo[h].k == k && memo[h].B == s.B && memo[h].S == s.S && memo[h].T == s.T) {
            *comp = memo[h].comp, *comm = memo[h].comm;
            return;
        }
    micro_cost(in, c, &in->stages[k], s, comp, comm);
    if (in->pp > 1) {  // the stage's messages: its input's gradient back, its output on
        const int tp = in->tp;
        const double rows_s = in->seq_par ? ceil((double)s.B * s.S / tp) : (double)s.B * s.S;
        const double rows_t = in->seq_par ? ceil((double)s.B * s.T / tp) : (double)s.B * s.T;
        const double bytes = (rows_s + rows_t) * in->cfg.d_model * sizeof(float);
        *comm += ((k > 0) + (k < in->pp - 1)) * p2p_s(c, bytes);
    }
    if (*n_memo < MEMO_SIZE / 2 && s.B > 0) {
        memo[h] = (CostMemo){k, s.B, s.S, s.T, *comp, *comm};
        ++*n_memo;
    }
}

void planner_time(const PlanInput *in, const PlanCalib *c, PlanRank *ranks) {
    const int tp = in->tp, dp = in->dp, pp = in->pp, M = in->micro, W = tp * dp * pp;
    const int n_steps = in->n_steps > 0 ? in->n_steps : 1;
    CostMemo *memo = TP_CALLOC(MEMO_SIZE, sizeof *memo);
    int n_memo = 0;
    /* Every step: each dp rank's pipeline (1F1B) takes one micro-batch's
     * way through every stage and back, then the other M - 1 at the pace of
     * its slowest stage: sum_k t_k + (M - 1) max_k t_k, with t_k a stage's
     * average micro-batch; the step waits for the slowest dp rank (the
     * gradients' allreduce). The rates were measured with every rank busy;
     * where ranks share the compute (more ranks than cores, or than GPUs),
     * a rank waiting in a bubble gives its share to the others, so the step
     * is the larger of that critical path at a rank's own pace (x relief)
     * and the machine's total work (the mean busy time over the ranks). */
    const double relief = in->slots > 0 && in->slots < W ? (double)in->slots / W : 1.0;
    double pipe = 0.0;
    double *comp = TP_CALLOC((size_t)dp * pp, sizeof *comp), *comm = TP_CALLOC((size_t)dp * pp, sizeof *comm);
    for (int g = 0; g < in->n_steps; g++) {
        double slowest = 0.0, busy = 0.0;
        for (int r = 0; r < dp; r++) {
            double t_max = 0.0, t_sum = 0.0;
            for (int k = 0; k < pp; k++) {
                double t = 0.0;
                for (int i = 0; i < M; i++) {
                    double a, b;
                    micro_cost_memo(in, c, memo, &n_memo, k, in->train[((size_t)g * dp + r) * M + i], &a, &b);
                    t += a + b;
                    comp[r * pp + k] += a, comm[r * pp + k] += b;
                }
                busy += tp * t;
                t_sum += t / M;
                if (t / M > t_max) t_max = t / M;
            }
            const double p = t_sum + (M - 1) * t_max;
            if (p > slowest) slowest = p;
        }
        busy /= (double)W;
        pipe += relief * slowest > busy ? relief * slowest : busy;
    }
    free(memo);
    pipe /= n_steps;
    for (int rank = 0; rank < W; rank++) {
        PlanRank *out = &ranks[rank];
        const int s = rank / (tp * dp), d = (rank / tp) % dp;
        const double comp_mine = comp[d * pp + s] / n_steps, comm_mine = comm[d * pp + s] / n_steps;
        const double bwd_mine = 2.0 / 3.0 * comp_mine / M;  // the last micro-batch's backward
        /* dp: the stage's gradients (bf16: half the bytes) per bucket, hidden
         * behind the last micro-batch's backward when overlapped; ZeRO-2 every
         * micro-batch; ZeRO 1/2 allgather the weights after the update */
        ParamTable tab;
        param_table_build_stage(&in->cfg, tp, &in->stages[s], &tab);
        const double n_params = (double)tab.n_elems;
        param_table_free(&tab);
        double exposed = 0.0;
        if (dp > 1) {
            const double bytes = n_params * (in->grad.dtype == COMM_BF16 ? 2.0 : 4.0);
            const double n_buckets = ceil(n_params / (double)(in->grad.bucket_elems ? in->grad.bucket_elems : 1));
            const double per_bucket = allreduce_s(c, dp, bytes / n_buckets);
            const double dp_comm = n_buckets * per_bucket * (in->grad.zero >= 2 ? M : 1);
            const double hidden = in->grad.overlap ? bwd_mine * (in->grad.zero >= 2 ? M : 1) : 0.0;
            exposed = dp_comm - hidden > per_bucket ? dp_comm - hidden : per_bucket;
            if (in->grad.zero >= 1) exposed += 0.5 * allreduce_s(c, dp, n_params * 4.0);
        }
        /* the optimizer and the gradient norm stream the stage's buffers: AdamW
         * reads 4 and writes 3 per element of its state, zeroing and the norm 2 */
        const double state = in->grad.zero >= 1 ? n_params / dp : n_params;
        const double bw = c->mem_bw > 0.0 ? c->mem_bw : 1e10;
        const double opt = (7.0 * state + 2.0 * n_params) * sizeof(float) / bw;
        out->t_bubble = pipe > comp_mine + comm_mine ? pipe - comp_mine - comm_mine : 0.0;
        out->t_comm = comm_mine + exposed;
        out->t_compute = comp_mine + opt;
        out->t_step = pipe + exposed + opt;
    }
    free(comp);
    free(comm);
}

/* ---- the calibration file: {"machines": {key: {...}}} ---------------------------- */

static cJSON *calib_json(const PlanCalib *c) {
    cJSON *o = cJSON_CreateObject(), *g = cJSON_AddArrayToObject(o, "gemm"), *ar = cJSON_AddArrayToObject(o, "allreduce");
    for (int i = 0; i < c->n_gemm; i++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->gemm[i].M));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->gemm[i].N));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->gemm[i].K));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->gemm[i].flops_per_s));
        cJSON_AddItemToArray(g, e);
    }
    for (int k = 2; k <= PLAN_MAX_GROUP; k++) {
        if (c->ar_bw[k] <= 0.0) continue;
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(k));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->ar_lat[k]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->ar_bw[k]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->ar_loaded[k]));
        cJSON_AddItemToArray(ar, e);
    }
    cJSON_AddNumberToObject(o, "mem_bw", c->mem_bw);
    cJSON_AddNumberToObject(o, "attn_flops_per_s", c->attn_flops_per_s);
    cJSON *el = cJSON_AddArrayToObject(o, "elem");  // [tokens, seconds per float, seconds per layer]
    for (int i = 0; i < c->n_elem; i++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->elem[i].tokens));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->elem[i].per_float));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(c->elem[i].fixed_per_layer));
        cJSON_AddItemToArray(el, e);
    }
    cJSON_AddNumberToObject(o, "p2p_lat", c->p2p_lat);
    cJSON_AddNumberToObject(o, "p2p_bw", c->p2p_bw);
    cJSON_AddNumberToObject(o, "ranks", c->ranks);
    cJSON_AddNumberToObject(o, "library_bytes", c->library_bytes);
    return o;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

int planner_calib_load(const char *path, PlanCalib *c) {
    char err[256];
    char *text = read_text_file(path, err, sizeof err);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "machines"), c->key);
    int rc = -1;
    if (cJSON_IsObject(o)) {
        const cJSON *e;
        c->n_gemm = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "gemm")) {
            if (cJSON_GetArraySize(e) != 4 || c->n_gemm >= PLAN_MAX_GEMMS) continue;
            bool positive = true;  // an edited entry that is not a size and a rate is measured again
            for (int k = 0; k < 4; k++) positive = positive && cJSON_GetArrayItem(e, k)->valuedouble > 0.0;
            if (!positive) continue;
            c->gemm[c->n_gemm].M = cJSON_GetArrayItem(e, 0)->valueint;
            c->gemm[c->n_gemm].N = cJSON_GetArrayItem(e, 1)->valueint;
            c->gemm[c->n_gemm].K = cJSON_GetArrayItem(e, 2)->valueint;
            c->gemm[c->n_gemm++].flops_per_s = cJSON_GetArrayItem(e, 3)->valuedouble;
        }
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "allreduce")) {
            const int g = cJSON_GetArraySize(e) == 4 ? cJSON_GetArrayItem(e, 0)->valueint : 0;
            if (g < 2 || g > PLAN_MAX_GROUP) continue;
            c->ar_lat[g] = cJSON_GetArrayItem(e, 1)->valuedouble;
            c->ar_bw[g] = cJSON_GetArrayItem(e, 2)->valuedouble;
            c->ar_loaded[g] = cJSON_GetArrayItem(e, 3)->valuedouble;
        }
        c->mem_bw = num(o, "mem_bw");
        c->attn_flops_per_s = num(o, "attn_flops_per_s");
        c->n_elem = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "elem")) {
            if (cJSON_GetArraySize(e) != 3 || c->n_elem >= PLAN_MAX_ELEM) continue;
            const double t = cJSON_GetArrayItem(e, 0)->valuedouble;
            if (!(t > 0.0)) continue;  // a size of nothing prices nothing
            c->elem[c->n_elem].tokens = t;
            c->elem[c->n_elem].per_float = cJSON_GetArrayItem(e, 1)->valuedouble;
            c->elem[c->n_elem++].fixed_per_layer = cJSON_GetArrayItem(e, 2)->valuedouble;
        }
        c->p2p_lat = num(o, "p2p_lat");
        c->p2p_bw = num(o, "p2p_bw");
        c->ranks = (int)num(o, "ranks");
        c->library_bytes = num(o, "library_bytes");
        rc = 0;
    }
    cJSON_Delete(root);
    return rc;
}

int planner_calib_save(const char *path, const PlanCalib *c, char *err, size_t err_len) {
    char why[256];
    char *text = read_text_file(path, why, sizeof why);
    const bool existed = text != NULL;
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *machines = cJSON_GetObjectItemCaseSensitive(root, "machines");
    if (existed && !cJSON_IsObject(machines)) {  // a file that is not ours is left as it is
        cJSON_Delete(root);
        tp_error_set(err, err_len, "%s is not a calibration file (no \"machines\" object): left as it is; give "
                                   "--plan-cache another path", path);
        return -1;
    }
    if (!root) {  // absent: started afresh
        root = cJSON_CreateObject();
        machines = cJSON_AddObjectToObject(root, "machines");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(machines, c->key);
    cJSON_AddItemToObject(machines, c->key, calib_json(c));
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    TP_CHECK(out, "out of memory writing the calibration");
    const int rc = write_file_atomic(path, out, strlen(out), err, err_len);
    free(out);
    return rc;
}
