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
#include "transformer/decode.h"
#include "transformer/params.h"

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
    model_plan_activations(&in->cfg, tp, st, rc, sp, s.B, s.S, s.T, &n_slot, &n_scratch);
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
    param_table_free(&tab);
    tag[MEM_GRAD] = (double)gp.grad_bytes;
    tag[MEM_OPTIM] = (double)gp.optim_bytes;
    double comm = (double)gp.comm_bytes;
    if (pp > 1 && !model_stage_has_embed(st))  // the embedding group's zeros (train/step.c)
        comm += (double)((size_t)(vocab_padded(&in->cfg, tp) / tp) * (size_t)in->cfg.d_model * f);
    double ws = (2 + 5) * (double)f;  // the model's loss scalars, the step's scalars

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
    double transient_eval = 0.0;
    if (evaluates && pp == 1) {
        for (int e = 0; e < in->n_eval; e++)
            act_add(&acts, in, tp, st, in->recompute, in->seq_par, (M - 1) % acts.n_slots, in->eval[e]);
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
    if (rank == 0 && in->decode) {  // the whole model for dev BLEU: weights, the encoder's activations, the state
        const size_t n = table_elems(&in->cfg, 1, &whole);
        tag[MEM_MASTER] += (double)(n * f);
        if (gpu_bf16) tag[MEM_COMPUTE] += (double)(n * sizeof(uint16_t));
        ws += 2 * (double)f;
        ActPlan da;
        act_init(&da, 1);
        act_add(&da, in, 1, &whole, MODEL_RECOMPUTE_NONE, false, 0, (PlanShape){in->decode_n, in->decode_S, 1});
        act += (double)act_bytes(&da);
        act_free(&da);
        transient_ws = (double)decode_workspace_bytes(&in->cfg, in->decode_n, in->beam, in->decode_S);
    }
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
    tag[MEM_COMM] = comm + transient_eval;
    tag[MEM_WORKSPACE] = ws + transient_ws;
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

/* Seconds of f() repeated until at least min_s passed (after one warm-up call), per call. */
static double time_per_call(Backend *be, void (*f)(void *), void *ctx, double min_s) {
    f(ctx);
    backend_sync(be);
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

void planner_calibrate_compute(Backend *be, const PlanInput *in, PlanCalib *c) {
    /* the largest training shape: the GEMMs of every stage at every tp the input allows */
    PlanShape big = {1, 1, 1};
    const size_t n_train = (size_t)in->n_steps * in->dp * in->micro;
    for (size_t i = 0; i < n_train; i++)
        if ((size_t)in->train[i].B * (in->train[i].S + in->train[i].T) > (size_t)big.B * (big.S + big.T))
            big = in->train[i];
    const ModelStage whole = model_stage_whole(&in->cfg);
    int shapes[PLAN_MAX_GEMMS][3];
    const int n = planner_gemm_shapes(in, in->tp, &whole, big, shapes);
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
        const double s = time_per_call(be, bench_gemm, &b, 0.05);
        c->gemm[c->n_gemm].M = b.M, c->gemm[c->n_gemm].N = b.N, c->gemm[c->n_gemm].K = b.K;
        c->gemm[c->n_gemm++].flops_per_s = 2.0 * b.M * b.N * (double)b.K / s;
        backend_free(be, b.x), backend_free(be, b.w), backend_free(be, b.y);
    }
    if (c->mem_bw <= 0.0) {
        b.M = 1 << 22;  // 16 MiB per operand: past the caches
        b.x = zeros(be, (size_t)b.M), b.w = zeros(be, (size_t)b.M), b.y = zeros(be, (size_t)b.M);
        c->mem_bw = 3.0 * sizeof(float) * b.M / time_per_call(be, bench_add, &b, 0.05);
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
        c->attn_flops_per_s = 4.0 * b.B * b.H * (double)b.T * b.T * b.D / time_per_call(be, bench_attn, &b, 0.05);
        backend_free(be, b.q), backend_free(be, b.k), backend_free(be, b.v), backend_free(be, b.y);
        backend_free(be, b.P), backend_free(be, b.len);
    }
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
    /* every member adopts member 0's figures (they must agree for the plan to be one) */
    float fig[2] = {(float)t[0], (float)t[1]};
    TP_CHECK(comm_broadcast(comm, fig, sizeof fig, 0) == 0, "%s", comm_error(comm));
    c->ar_lat[g] = fig[0];
    c->ar_bw[g] = fig[1] > fig[0] ? (double)(large - small) * sizeof(float) / (fig[1] - fig[0]) : 1e12;
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
    if (g <= PLAN_MAX_GROUP && c->ar_bw[g] > 0.0) return c->ar_lat[g] + n / c->ar_bw[g];
    int best = 0;
    for (int h = 2; h <= PLAN_MAX_GROUP; h++)
        if (c->ar_bw[h] > 0.0 && (best == 0 || abs(h - g) < abs(best - g))) best = h;
    if (best) {
        const double scale = (2.0 * (g - 1) / g) / (2.0 * (best - 1) / best);
        return c->ar_lat[best] * g / best + n * scale / c->ar_bw[best];
    }
    return 20e-6 * g + 2.0 * n / (c->mem_bw > 0.0 ? c->mem_bw : 1e10);
}

static double p2p_s(const PlanCalib *c, double n) {
    if (c->p2p_bw > 0.0) return c->p2p_lat + n / c->p2p_bw;
    return 20e-6 + n / (c->mem_bw > 0.0 ? c->mem_bw : 1e10);
}

/* One micro-batch of shape s on a tp rank of stage st: seconds of compute
 * (forward, backward, recomputation) and of tp communication. */
static void micro_cost(const PlanInput *in, const PlanCalib *c, const ModelStage *st, PlanShape s, double *compute,
                       double *tp_comm) {
    const ModelConfig *cfg = &in->cfg;
    const int tp = in->tp, C = cfg->d_model, Cl = C / tp, Fl = cfg->d_ff / tp, Vl = vocab_padded(cfg, tp) / tp;
    const double Ns = (double)s.B * s.S, Nt = (double)s.B * s.T, Hl = cfg->n_heads / tp, dh = C / cfg->n_heads;
    const int n_enc = st->enc_hi - st->enc_lo, n_dec = st->dec_hi - st->dec_lo;
#define GEMM(M, N, K) (2.0 * (double)(M) * (N) * (K) / gemm_rate(c, (int)(M), (N), (K)))
    const double enc_gemm = 3 * GEMM(Ns, Cl, C) + GEMM(Ns, C, Cl) + GEMM(Ns, Fl, C) + GEMM(Ns, C, Fl);
    const double dec_gemm = 4 * GEMM(Nt, Cl, C) + 2 * GEMM(Nt, C, Cl) + 2 * GEMM(Ns, Cl, C) + GEMM(Nt, Fl, C) +
                            GEMM(Nt, C, Fl);
    const double head_gemm = st->head ? GEMM(Nt, Vl, C) : 0.0;
#undef GEMM
    const double ar = c->attn_flops_per_s > 0.0 ? c->attn_flops_per_s : 1e9;
    const double enc_attn = 4.0 * s.B * Hl * (double)s.S * s.S * dh / ar;
    const double dec_attn = 4.0 * s.B * Hl * ((double)s.T * s.T + (double)s.T * s.S) * dh / ar;
    /* element-wise work: the activations a micro-batch writes in forward,
     * read in backward and their gradients written and read: ~6 passes */
    size_t slot, scratch;
    model_plan_activations(cfg, tp, st, MODEL_RECOMPUTE_NONE, in->seq_par, s.B, s.S, s.T, &slot, &scratch);
    const double elem = 6.0 * sizeof(float) * (double)slot / (c->mem_bw > 0.0 ? c->mem_bw : 1e10);
    const double layers_fwd = n_enc * (enc_gemm + enc_attn) + n_dec * (dec_gemm + dec_attn);
    double t = 3.0 * (layers_fwd + head_gemm) + elem;  // forward, and backward's two GEMMs per GEMM
    if (in->recompute == MODEL_RECOMPUTE_SELECTIVE) t += 0.5 * (n_enc * enc_attn + n_dec * dec_attn);
    if (in->recompute == MODEL_RECOMPUTE_FULL) t += layers_fwd + elem / 6.0;
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
        if (st->head) comm += 3.0 * allreduce_s(c, tp, Nt * 3 * sizeof(float));  // the loss's row statistics
    }
    *tp_comm = comm;
}

void planner_time(const PlanInput *in, const PlanCalib *c, int rank, PlanRank *out) {
    const int tp = in->tp, dp = in->dp, pp = in->pp, M = in->micro;
    const int s = rank / (tp * dp), d = (rank / tp) % dp;
    /* the average micro-batch of this dp rank over the steps planned, per stage */
    double t_micro_max = 0.0, t_micro_mine = 0.0, comm_mine = 0.0, bwd_mine = 0.0;
    const int n_steps = in->n_steps > 0 ? in->n_steps : 1;
    for (int k = 0; k < pp; k++) {
        double comp = 0.0, comm = 0.0;
        for (int g = 0; g < in->n_steps; g++)
            for (int i = 0; i < M; i++) {
                double a, b;
                micro_cost(in, c, &in->stages[k], in->train[((size_t)g * dp + d) * M + i], &a, &b);
                comp += a, comm += b;
            }
        comp /= (double)n_steps * M;
        comm /= (double)n_steps * M;
        double msg = 0.0;  // the stage's messages per micro-batch: its input's gradient back, its output on
        if (pp > 1) {
            const PlanShape sh = in->train[(size_t)d * M];
            const double rows_s = in->seq_par ? ceil((double)sh.B * sh.S / tp) : (double)sh.B * sh.S;
            const double rows_t = in->seq_par ? ceil((double)sh.B * sh.T / tp) : (double)sh.B * sh.T;
            const double bytes = (rows_s + rows_t) * in->cfg.d_model * sizeof(float);
            msg = ((k > 0) + (k < pp - 1)) * p2p_s(c, bytes);
        }
        const double t = comp + comm + msg;
        if (t > t_micro_max) t_micro_max = t;
        if (k == s) t_micro_mine = t, comm_mine = comm + msg, bwd_mine = 2.0 / 3.0 * comp;
    }
    /* the step: 1F1B takes (M + p - 1) slowest-stage micro-batches; this
     * stage computes M of its own, the rest is bubble */
    const double pipe = (M + pp - 1) * t_micro_max;
    out->t_bubble = pipe - M * t_micro_mine;
    /* dp: the stage's gradients (bf16: half the bytes) per bucket, hidden
     * behind the last micro-batch's backward when overlapped; ZeRO-2 every
     * micro-batch; ZeRO 1/2 allgather the weights after the update */
    ParamTable tab;
    param_table_build_stage(&in->cfg, tp, &in->stages[s], &tab);
    const double n_params = (double)tab.n_elems;
    param_table_free(&tab);
    double dp_comm = 0.0, exposed = 0.0;
    if (dp > 1) {
        const double bytes = n_params * (in->grad.dtype == COMM_BF16 ? 2.0 : 4.0);
        const double n_buckets = ceil(n_params / (double)(in->grad.bucket_elems ? in->grad.bucket_elems : 1));
        const double per_bucket = allreduce_s(c, dp, bytes / n_buckets);
        dp_comm = n_buckets * per_bucket * (in->grad.zero >= 2 ? M : 1);
        const double hidden = in->grad.overlap ? bwd_mine * (in->grad.zero >= 2 ? M : 1) : 0.0;
        exposed = dp_comm - hidden > per_bucket ? dp_comm - hidden : per_bucket;
        if (in->grad.zero >= 1) exposed += 0.5 * allreduce_s(c, dp, n_params * 4.0);
    }
    /* the optimizer and the gradient norm stream the stage's buffers: AdamW
     * reads 4 and writes 3 per element of its state, zeroing and the norm 2 */
    const double state = in->grad.zero >= 1 ? n_params / dp : n_params;
    const double bw = c->mem_bw > 0.0 ? c->mem_bw : 1e10;
    const double opt = (7.0 * state + 2.0 * n_params) * sizeof(float) / bw;
    out->t_comm = M * comm_mine + exposed;
    out->t_compute = M * (t_micro_mine - comm_mine) + opt;
    out->t_step = pipe + exposed + opt;
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
        cJSON_AddItemToArray(ar, e);
    }
    cJSON_AddNumberToObject(o, "mem_bw", c->mem_bw);
    cJSON_AddNumberToObject(o, "attn_flops_per_s", c->attn_flops_per_s);
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
            c->gemm[c->n_gemm].M = cJSON_GetArrayItem(e, 0)->valueint;
            c->gemm[c->n_gemm].N = cJSON_GetArrayItem(e, 1)->valueint;
            c->gemm[c->n_gemm].K = cJSON_GetArrayItem(e, 2)->valueint;
            c->gemm[c->n_gemm++].flops_per_s = cJSON_GetArrayItem(e, 3)->valuedouble;
        }
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "allreduce")) {
            const int g = cJSON_GetArraySize(e) == 3 ? cJSON_GetArrayItem(e, 0)->valueint : 0;
            if (g < 2 || g > PLAN_MAX_GROUP) continue;
            c->ar_lat[g] = cJSON_GetArrayItem(e, 1)->valuedouble;
            c->ar_bw[g] = cJSON_GetArrayItem(e, 2)->valuedouble;
        }
        c->mem_bw = num(o, "mem_bw");
        c->attn_flops_per_s = num(o, "attn_flops_per_s");
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
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!cJSON_IsObject(root)) {  // absent or unreadable: started afresh
        cJSON_Delete(root);
        root = cJSON_CreateObject();
    }
    cJSON *machines = cJSON_GetObjectItemCaseSensitive(root, "machines");
    if (!cJSON_IsObject(machines)) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "machines");
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
