/* test_plan_gpu_sizes.c: the planner's GPU-only memory against the size
 * functions the run allocates with, on the CPU. A layout planned for a GPU
 * differs from the same layout planned for the CPU (fp32 both, so no bf16
 * copies) by exactly:
 *  - workspace: backend_gemm_workspace_bytes(BACKEND_CUDA), the cuBLASLt
 *    workspace backend_cuda_create allocates (test_rank_device gpu checks
 *    the allocation against the same function);
 *  - comm, when the ranks share a GPU (staged): comm_shm_stage_bytes of
 *    each of its tp, dp and pp groups (test_comm_staged and test_rank_device
 *    check the groups' allocations against it); page-locked host memory,
 *    so the allocator's device peak does not include it;
 *  - workspace: the CUDA ops' scratch arena, scratch_arena_bytes of the
 *    largest request (kernels/scratch_sizes.h, the functions the CUDA ops
 *    carve with);
 * plus the batch ids a GPU uploads (activations), which this test leaves to
 * test_plan.
 * The arena's request is checked against the real model: a CPU backend whose
 * scratch ops are wrapped to record what backend_cuda.cu asks for at each
 * call (the same size function, the same bf16-twin rule) runs a training
 * step, an evaluation and a beam search; the planner's walk must give the
 * same largest request, in fp32 and bf16, with weights whose bf16 twins are
 * not all aligned, and on each rank of a tp = 2 model with sequence
 * parallelism (forked ranks over shared memory). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "kernels/scratch_sizes.h"
#include "tp/comm_shm.h"
#include "train/planner.h"
#include "transformer/decode.h"

/* ---- the recorder: a CPU backend noting the CUDA backend's scratch requests ---- */

static BackendOps g_ops;         // the CPU's table with the scratch ops wrapped
static const BackendOps *g_cpu;  // the CPU's own
static size_t g_need;            // the largest request so far

static void note(size_t n) { g_need = n > g_need ? n : g_need; }

/* backend_cuda.cu's operand_of: a bf16 twin where x lies in a registered
 * weight range at a 16-byte aligned place of the compute copy. */
static bool twin(const Backend *be, const float *x) {
    if (be->dtype != DTYPE_BF16 || !x) return false;
    for (int k = 0; k < be->n_weights; k++) {
        const float *m = be->weights[k].master;
        if (x >= m && x < m + be->weights[k].n_elems) return (size_t)(x - m) * sizeof(uint16_t) % 16 == 0;
    }
    return false;
}

static bool bf16(const Backend *be) { return be->dtype == DTYPE_BF16; }

static void r_gemm(Backend *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, const float *B,
                   float beta, float *C) {
    note(scratch_gemm(bf16(be), M, N, K, twin(be, A), twin(be, B)));
    g_cpu->gemm(be, ta, tb, M, N, K, alpha, A, B, beta, C);
}
static void r_linear_fwd(Backend *be, float *y, const float *x, const float *W, const float *b, int N, int in,
                         int out) {
    note(scratch_linear_fwd(bf16(be), N, in, out, twin(be, W), false, b != NULL));
    g_cpu->linear_fwd(be, y, x, W, b, N, in, out);
}
static void r_linear_bwd(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                         const float *x, const float *W, int N, int in, int out) {
    /* fused bias-gradient epilogues: the CUDA backend's default, either precision; either dx mode needs the same */
    note(scratch_linear_bwd(bf16(be), true, dx != NULL, dW != NULL, db != NULL, N, in, out, twin(be, W), false));
    g_cpu->linear_bwd(be, dx, dx_mode, dW, db, dy, x, W, N, in, out);
}
static void r_linear_fwd_x16(Backend *be, float *y, const uint16_t *x16, const float *W, const float *b, int N,
                             int in, int out) {
    note(scratch_linear_fwd(bf16(be), N, in, out, twin(be, W), true, b != NULL));
    g_cpu->linear_fwd_x16(be, y, x16, W, b, N, in, out);
}
static void r_linear_fwd16(Backend *be, uint16_t *y16, float *tmp, const float *x, const uint16_t *x16,
                           const float *W, const float *b, bool relu, int N, int in, int out) {
    note(scratch_linear_fwd16(bf16(be), N, in, out, twin(be, W), x16 != NULL, b != NULL, tmp != NULL));
    g_cpu->linear_fwd16(be, y16, tmp, x, x16, W, b, relu, N, in, out);
}
static void r_linear_bwd_dy16(Backend *be, float *dx, GradMode dx_mode, float *dW, const uint16_t *dy16,
                              const float *x, const float *W, int N, int in, int out) {
    note(scratch_linear_bwd_dy16(bf16(be), dx != NULL, dW != NULL, N, in, out, twin(be, W)));
    g_cpu->linear_bwd_dy16(be, dx, dx_mode, dW, dy16, x, W, N, in, out);
}
static void r_linear_bwd16(Backend *be, float *dx, uint16_t *dx16, GradMode dx_mode, float *dW, float *db,
                           const float *dy, const uint16_t *dy16, const uint16_t *relu16, const float *x,
                           const uint16_t *x16, const float *W, int N, int in, int out) {
    note(scratch_linear_bwd16(bf16(be), true, dx != NULL, dx16 != NULL, dW != NULL, db != NULL, N, in, out,
                              twin(be, W), x16 != NULL, dy16 != NULL, relu16 != NULL));
    g_cpu->linear_bwd16(be, dx, dx16, dx_mode, dW, db, dy, dy16, relu16, x, x16, W, N, in, out);
}
static void r_linear_relu_fwd16(Backend *be, uint16_t *y16, float *tmp, uint8_t *mask, const float *x,
                                const uint16_t *x16, const float *W, const float *b, int N, int in, int out) {
    note(scratch_linear_fwd16(bf16(be), N, in, out, twin(be, W), x16 != NULL, b != NULL, tmp != NULL));
    g_cpu->linear_relu_fwd16(be, y16, tmp, mask, x, x16, W, b, N, in, out);
}
static void r_linear_bwd16_drelu(Backend *be, uint16_t *dh16, float *dW, float *db, float *db_h, const float *dy,
                                 const uint16_t *dy16, const uint8_t *mask, const uint16_t *x16, const float *W,
                                 int N, int in, int out) {
    note(scratch_linear_bwd16_drelu(bf16(be), true, dW != NULL, db != NULL, N, in, out, twin(be, W), dy16 != NULL));
    g_cpu->linear_bwd16_drelu(be, dh16, dW, db, db_h, dy, dy16, mask, x16, W, N, in, out);
}
static void r_linear_bwd_x16(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                             const uint16_t *x16, const float *W, int N, int in, int out) {
    note(scratch_linear_bwd(bf16(be), true, dx != NULL, dW != NULL, db != NULL, N, in, out, twin(be, W), true));
    g_cpu->linear_bwd_x16(be, dx, dx_mode, dW, db, dy, x16, W, N, in, out);
}
static void r_linear_bwd_relu_x16(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                                  const uint16_t *relu16, const uint16_t *x16, const float *W, int N, int in,
                                  int out) {
    note(scratch_linear_bwd_relu(bf16(be), true, dx != NULL, dW != NULL, db != NULL, N, in, out, twin(be, W)));
    g_cpu->linear_bwd_relu_x16(be, dx, dx_mode, dW, db, dy, relu16, x16, W, N, in, out);
}
static void r_copy(Backend *be, float *d, const float *s, size_t n) {
    const uintptr_t a = (uintptr_t)d, b = (uintptr_t)s, nb = n * sizeof(float);
    note(d != s && a < b + nb && b < a + nb ? nb : 0);  // cuda_copy_scratch_bytes: overlapping ranges only
    g_cpu->copy(be, d, s, n);
}
static void r_bias_bwd(Backend *be, float *db, const float *dy, int N, int C) {
    note(scratch_bias_bwd(N, C));
    g_cpu->bias_bwd(be, db, dy, N, C);
}
static void r_embedding_bwd(Backend *be, float *dt, const float *dout, const int32_t *ids, float scale, int N, int C,
                            int vs, int Vl) {
    note(N > 0 && C > 0 ? scratch_embedding_bwd(N, Vl) : 0);
    g_cpu->embedding_bwd(be, dt, dout, ids, scale, N, C, vs, Vl);
}
static void r_layernorm_bwd(Backend *be, float *dx, float *dg, float *db, const float *dy, const float *x,
                            const float *mean, const float *rstd, const float *g, int N, int C) {
    note(scratch_layernorm_bwd(N, C));
    g_cpu->layernorm_bwd(be, dx, dg, db, dy, x, mean, rstd, g, N, C);
}
static void r_residual_ln_bwd(Backend *be, float *dr, float *dbr, uint16_t *dbr16, float *dg, float *db, float *dbias,
                              const float *dy,
                              const float *x, const float *mean, const float *rstd, const float *g, int N, int C,
                              uint64_t first, float p, uint64_t seed, uint64_t st) {
    note(scratch_residual_ln_bwd(N, C));
    g_cpu->residual_ln_bwd(be, dr, dbr, dbr16, dg, db, dbias, dy, x, mean, rstd, g, N, C, first, p, seed, st);
}
static void r_sum_acc(Backend *be, float *acc, const float *x, size_t n) {
    note(scratch_sum(n));
    g_cpu->sum_acc(be, acc, x, n);
}
static void r_sumsq_acc(Backend *be, float *acc, const float *x, size_t n) {
    note(scratch_sum(n));
    g_cpu->sumsq_acc(be, acc, x, n);
}

static Backend *recorder(Dtype dtype) {
    char err[256];
    Backend *be = backend_create(DEVICE_CPU, dtype, 0, err, sizeof err);
    CHECK(be != NULL, "CPU backend: %s", err);
    g_cpu = be->ops;
    g_ops = *be->ops;
    g_ops.gemm = r_gemm, g_ops.linear_fwd = r_linear_fwd, g_ops.linear_bwd = r_linear_bwd, g_ops.copy = r_copy;
    g_ops.linear_fwd_x16 = r_linear_fwd_x16, g_ops.linear_bwd_x16 = r_linear_bwd_x16;
    g_ops.linear_bwd_relu_x16 = r_linear_bwd_relu_x16;
    g_ops.linear_fwd16 = r_linear_fwd16, g_ops.linear_bwd_dy16 = r_linear_bwd_dy16;
    g_ops.linear_bwd16 = r_linear_bwd16;
    g_ops.linear_relu_fwd16 = r_linear_relu_fwd16, g_ops.linear_bwd16_drelu = r_linear_bwd16_drelu;
    g_ops.bias_bwd = r_bias_bwd, g_ops.embedding_bwd = r_embedding_bwd, g_ops.layernorm_bwd = r_layernorm_bwd;
    g_ops.sum_acc = r_sum_acc, g_ops.sumsq_acc = r_sumsq_acc, g_ops.residual_ln_bwd = r_residual_ln_bwd;
    be->ops = &g_ops;
    return be;
}

/* A batch of B sentences, S source and T target tokens (ids in 4..V-1). */
static void fill_batch(OwnedBatch *ob, int B, int S, int T, int V) {
    owned_batch_alloc(ob, B, S, T, 0);
    for (int b = 0; b < B; b++) {
        ob->src_len[b] = S - b % 2;
        ob->tgt_len[b] = T - b % 3;
        for (int i = 0; i < ob->src_len[b]; i++) ob->src[b * S + i] = 4 + (b * 7 + i * 3) % (V - 4);
        for (int i = 0; i < ob->tgt_len[b]; i++) {
            ob->tgt_in[b * T + i] = i == 0 ? 2 : ob->tgt_out[b * T + i - 1];
            ob->tgt_out[b * T + i] = i + 1 == ob->tgt_len[b] ? 3 : 4 + (b * 5 + i * 11) % (V - 4);
        }
    }
}

/* The model's training step, then an evaluation at other shapes, then a
 * beam search, each against the planner's walk for the same rows. Returns
 * the training step's largest request. */
static size_t model_against_walk(const ModelConfig *cfg, Dtype dtype) {
    const bool b16 = dtype == DTYPE_BF16;
    const char *dt = b16 ? "bf16" : "fp32";
    Backend *be = recorder(dtype);
    Model m;
    char err[256];
    CHECK(model_create(&m, be, cfg, NULL, 5, err, sizeof err) == 0, "model: %s", err);
    const ModelStage whole = model_stage_whole(cfg);
    OwnedBatch tr, ev;
    fill_batch(&tr, 4, 9, 10, cfg->vocab_size);
    fill_batch(&ev, 6, 11, 7, cfg->vocab_size);
    int n_tok = 0;
    g_need = 0;
    model_zero_grad(&m);
    model_forward(&m, &tr.view, true, (DropoutKey){.seed = 1, .step = 1}, &n_tok);
    model_backward(&m, &tr.view, true, (DropoutKey){.seed = 1, .step = 1}, 1.0f / (float)n_tok);
    const size_t train = planner_scratch_stage(cfg, b16, 1, &whole, false, 4 * 9, 4 * 10, true);
    CHECK(g_need > 0 && train == g_need, "%s training step: the model asks for %zu bytes of scratch, the planner %zu",
          dt, g_need, train);
    g_need = 0;
    model_forward(&m, &ev.view, false, (DropoutKey){0}, &n_tok);
    const size_t eval = planner_scratch_stage(cfg, b16, 1, &whole, false, 6 * 11, 6 * 7, false);
    CHECK(g_need > 0 && eval == g_need, "%s evaluation: the model asks for %zu bytes of scratch, the planner %zu", dt,
          g_need, eval);
    g_need = 0;
    const SrcBatch sb = {.n = 5, .S = 11, .src = ev.src, .src_len = ev.src_len};
    Hypotheses h;
    decode_beam(&m, &sb, 3, 1.0f, &h);
    hypotheses_free(&h);
    const size_t dec = planner_scratch_decode(cfg, b16, 5, 11, 3);
    CHECK((g_need > 0 || !b16) && dec == g_need, "%s beam search: the model asks for %zu bytes of scratch, the planner %zu", dt,
          g_need, dec);
    printf("test_plan_gpu_sizes: %s largest scratch request: training %zu B, evaluation %zu B, decoding %zu B\n", dt,
           train, eval, dec);
    owned_batch_free(&tr);
    owned_batch_free(&ev);
    model_free(&m);
    backend_destroy(be);
    return train;
}

static PlanInput plan_input(const ModelConfig *cfg, const ModelStage *st, int tp, int dp, int pp, bool gpu,
                            bool staged, Dtype dtype) {
    static PlanShape shapes[64];
    for (int i = 0; i < 64; i++) shapes[i] = (PlanShape){4, 9, 10};
    return (PlanInput){.cfg = *cfg, .tp = tp, .dp = dp, .pp = pp, .micro = 2, .stages = st,
                       .grad = {.zero = 0, .dtype = COMM_F32, .bucket_elems = 1 << 16}, .gpu = gpu, .staged = staged,
                       .dtype = dtype, .train = shapes, .n_steps = 1, .eval = shapes, .n_eval = 1};
}

static void plan(const ModelConfig *cfg, const ModelStage *st, int tp, int dp, int pp, bool gpu, bool staged, int rank,
                 PlanRank *out) {
    PlanInput in = plan_input(cfg, st, tp, dp, pp, gpu, staged, DTYPE_F32);
    planner_memory(&in, rank, out);
}

/* A rank of a tp = 2 model with sequence parallelism (a forked process,
 * the groups over shared memory): its training step against the walk for
 * its shards and its share of the rows. Returns the exit status. */
static int tp_rank(const ModelConfig *cfg, Dtype dtype, int B, int S, int T, const char *job, int rank) {
    char err[256];
    Comm *comm = comm_shm_create(job, "tp", rank, 2, 20.0, err, sizeof err);
    if (!comm) return fprintf(stderr, "rank %d: %s\n", rank, err), 10;
    Backend *be = recorder(dtype);
    TpGroup g = {.size = 2, .rank = rank, .comm = comm};
    Model m;
    if (model_create(&m, be, cfg, &g, 5, err, sizeof err) || model_set_sequence_parallel(&m, true, err, sizeof err))
        return fprintf(stderr, "rank %d: %s\n", rank, err), 11;
    OwnedBatch tr;
    fill_batch(&tr, B, S, T, cfg->vocab_size);
    int n_tok = 0;
    g_need = 0;
    model_zero_grad(&m);
    model_forward(&m, &tr.view, true, (DropoutKey){.seed = 1, .step = 1}, &n_tok);
    model_backward(&m, &tr.view, true, (DropoutKey){.seed = 1, .step = 1}, 1.0f / (float)n_tok);
    const ModelStage whole = model_stage_whole(cfg);
    const size_t want = planner_scratch_stage(cfg, dtype == DTYPE_BF16, 2, &whole, true, B * S, B * T, true);
    const int rc = g_need > 0 && g_need == want ? 0 : 1;
    if (rc) fprintf(stderr, "rank %d of tp 2 (sp, %s): the model asks for %zu bytes of scratch, the planner %zu\n", rank,
                    dtype_name(dtype), g_need, want);
    owned_batch_free(&tr);
    model_free(&m);
    backend_destroy(be);
    comm_free(comm);
    return rc;
}

static void tp_against_walk(const ModelConfig *cfg, Dtype dtype, int B, int S, int T) {
    char job[64];
    snprintf(job, sizeof job, "tpgs%ld", (long)getpid());
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) _exit(tp_rank(cfg, dtype, B, S, T, job, r));
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp 2 rank %d (%s): status %d", r, dtype_name(dtype), st);
    }
}

/* The arena's size is a function of the largest request alone (backend.c
 * grows it to scratch_arena_bytes), whatever the order; and a bf16 plan
 * with decoding on rank 0 counts the decode walk. */
static void arena_checks(const ModelConfig *cfg) {
    CHECK(scratch_arena_bytes(0) == 0 && scratch_arena_bytes(1) == SCRATCH_ARENA_MIN &&
              scratch_arena_bytes(SCRATCH_ARENA_MIN + 1) == SCRATCH_ARENA_MIN * 3 / 2 &&
              scratch_arena_bytes(SCRATCH_ARENA_MIN * 3 / 2 + 1) == 2 * SCRATCH_ARENA_MIN,
          "the arena's grid: 64 KiB, then 2^k and 3 x 2^(k-1) bytes");
    const size_t orders[2][4] = {{1000, 90000, 70000, 150000}, {150000, 1000, 90000, 70000}};
    for (int o = 0; o < 2; o++) {
        char err[256];
        Backend *be = backend_create(DEVICE_CPU, DTYPE_F32, 0, err, sizeof err);
        CHECK(be != NULL, "CPU backend: %s", err);
        for (int i = 0; i < 4; i++) backend_workspace(be, orders[o][i]);
        CHECK(be->ws_bytes == scratch_arena_bytes(150000) && be->mem.peak[MEM_WORKSPACE] == be->ws_bytes,
              "order %d: the arena holds %zu B (peak %zu), the grid's step for the largest request is %zu", o,
              be->ws_bytes, be->mem.peak[MEM_WORKSPACE], scratch_arena_bytes(150000));
        backend_destroy(be);
    }
    const ModelStage whole = model_stage_whole(cfg);
    PlanInput in = plan_input(cfg, &whole, 1, 1, 1, true, false, DTYPE_BF16);
    in.decode = true, in.decode_n = 5, in.decode_S = 11, in.beam = 3;
    size_t need = planner_scratch_stage(cfg, true, 1, &whole, false, 36, 40, true);
    const size_t e = planner_scratch_stage(cfg, true, 1, &whole, false, 36, 40, false);
    const size_t d = planner_scratch_decode(cfg, true, 5, 11, 3);
    need = e > need ? e : need;
    need = d > need ? d : need;
    PlanRank out;
    planner_memory(&in, 0, &out);
    CHECK(out.scratch == (double)scratch_arena_bytes(need) && planner_scratch_arena(&in, 0) == scratch_arena_bytes(need),
          "bf16 with decoding: scratch arena %.0f B planned, the largest request %zu B makes %zu", out.scratch, need,
          scratch_arena_bytes(need));
}

/* NCCL's buffers (a GPU per rank): NCCL_BUFFSIZE per channel per ring peer
 * in the world and each group of more than one rank, in the library column
 * only (not the allocator's). */
static void nccl_checks(const ModelConfig *cfg) {
    setenv("NCCL_BUFFSIZE", "1048576", 1);
    setenv("NCCL_MAX_NCHANNELS", "3", 1);
    CHECK(planner_nccl_bytes(1) == 0.0 && planner_nccl_bytes(2) == 3.0 * 1048576 &&
              planner_nccl_bytes(4) == 2 * 3.0 * 1048576,
          "NCCL per communicator: 3 channels x 1 MiB x ring peers, got %.0f / %.0f", planner_nccl_bytes(2),
          planner_nccl_bytes(4));
    ModelStage st[2];
    char err[256];
    CHECK(model_stages_make(cfg, 2, NULL, st, err, sizeof err) == 0, "stages: %s", err);
    PlanInput in = plan_input(cfg, st, 2, 2, 2, true, false, DTYPE_BF16);
    PlanRank shm, nccl;
    planner_memory(&in, 5, &shm);
    in.nccl = true;
    planner_memory(&in, 5, &nccl);
    const double want = 2 * 3.0 * 1048576 + 3 * 3.0 * 1048576;  // the world of 8 (two peers), three groups of 2
    CHECK(nccl.tag[MEM_LIBRARY] == want && nccl.nccl == want && shm.tag[MEM_LIBRARY] == 0.0,
          "tp 2 dp 2 pp 2 over NCCL: library %.0f B planned, NCCL's buffers %.0f", nccl.tag[MEM_LIBRARY], want);
    CHECK(nccl.allocator_peak == shm.allocator_peak, "NCCL's buffers are not the allocator's");
    unsetenv("NCCL_MAX_NCHANNELS");
    unsetenv("NCCL_BUFFSIZE");
    CHECK(planner_nccl_bytes(2) == (double)PLAN_NCCL_CHANNELS * 4 * 1048576, "NCCL's defaults: 4 MiB x %d channels",
          PLAN_NCCL_CHANNELS);
}

int main(void) {
    ModelConfig cfg;
    char err[256];
    CHECK(config_preset("tiny", &cfg, err, sizeof err) == 0, "tiny preset: %s", err);
    cfg.vocab_size = 64;
    const int layouts[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 1}, {1, 1, 2}, {2, 2, 2}, {4, 1, 1}};
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
        const int tp = layouts[k][0], dp = layouts[k][1], pp = layouts[k][2];
        ModelStage st[2];
        if (pp == 1) st[0] = model_stage_whole(&cfg);
        else CHECK(model_stages_make(&cfg, pp, NULL, st, err, sizeof err) == 0, "stages: %s", err);
        const size_t want_stage = comm_shm_stage_bytes(tp) + comm_shm_stage_bytes(dp) + comm_shm_stage_bytes(pp);
        for (int r = 0; r < tp * dp * pp; r++) {
            PlanRank cpu, gpu, shared;
            plan(&cfg, st, tp, dp, pp, false, false, r, &cpu);
            plan(&cfg, st, tp, dp, pp, true, false, r, &gpu);
            plan(&cfg, st, tp, dp, pp, true, true, r, &shared);
            /* the scratch arena: the walk of this rank's stage at the plan's rows (4 x 9, 4 x 10) */
            const bool evaluates = (r / tp) % dp == 0 && (pp == 1 || r / (tp * dp) == 0);
            const ModelStage whole = model_stage_whole(&cfg);
            size_t need = planner_scratch_stage(&cfg, false, tp, &st[r / (tp * dp)], false, 36, 40, true);
            if (evaluates) {
                const size_t e = planner_scratch_stage(&cfg, false, tp, pp > 1 ? &whole : &st[0], false, 36, 40, false);
                need = e > need ? e : need;
            }
            CHECK(need > 0 && gpu.scratch == (double)scratch_arena_bytes(need) && cpu.scratch == 0.0,
                  "tp %d dp %d pp %d rank %d: scratch arena %.0f B planned, the ops' largest request %zu B makes %zu",
                  tp, dp, pp, r, gpu.scratch, need, scratch_arena_bytes(need));
            const double ws = gpu.tag[MEM_WORKSPACE] - cpu.tag[MEM_WORKSPACE];
            CHECK(ws == (double)backend_gemm_workspace_bytes(BACKEND_CUDA) + (double)scratch_arena_bytes(need) &&
                      backend_gemm_workspace_bytes(BACKEND_CUDA) == (size_t)32 << 20,
                  "tp %d dp %d pp %d rank %d: the GPU's workspace exceeds the CPU's by %.0f B, not cuBLASLt's %zu "
                  "and the scratch arena's %zu", tp, dp, pp, r, ws, backend_gemm_workspace_bytes(BACKEND_CUDA),
                  scratch_arena_bytes(need));
            CHECK(gpu.tag[MEM_COMM] == cpu.tag[MEM_COMM] && gpu.staging == 0.0,
                  "tp %d dp %d pp %d rank %d: a GPU per rank (NCCL) stages nothing", tp, dp, pp, r);
            CHECK(shared.tag[MEM_COMM] - gpu.tag[MEM_COMM] == (double)want_stage && shared.staging == (double)want_stage,
                  "tp %d dp %d pp %d rank %d: ranks sharing a GPU stage %.0f B, the groups allocate %zu", tp, dp, pp, r,
                  shared.tag[MEM_COMM] - gpu.tag[MEM_COMM], want_stage);
            CHECK(shared.allocator_peak == gpu.allocator_peak,
                  "tp %d dp %d pp %d rank %d: page-locked staging is not in the device allocator's peak", tp, dp, pp, r);
            CHECK(gpu.allocator_peak - cpu.allocator_peak >= ws, "the workspace is in the allocator's peak");
        }
        CHECK((tp * dp * pp == 1) == (want_stage == 0), "tp %d dp %d pp %d: a world of one stages nothing", tp, dp, pp);
    }
    model_against_walk(&cfg, DTYPE_F32);
    model_against_walk(&cfg, DTYPE_BF16);
    /* sizes that leave some weights without an aligned bf16 twin (offsets
     * not a multiple of 8 elements): their copies count too */
    ModelConfig odd = cfg;
    odd.d_model = 36, odd.n_heads = 4, odd.d_ff = 52, odd.vocab_size = 61;
    model_against_walk(&odd, DTYPE_F32);
    model_against_walk(&odd, DTYPE_BF16);
    tp_against_walk(&odd, DTYPE_BF16, 4, 9, 11);  // 36 and 44 rows: 18 and 22 each
    /* fp32 with a wide model: the LayerNorm partials of a rank's share of
     * 320 source rows (one chunk of 256, not the whole's two) are the
     * largest request */
    ModelConfig wide = cfg;
    wide.d_model = 400, wide.n_heads = 4, wide.d_ff = 64, wide.vocab_size = 61, wide.enc_layers = wide.dec_layers = 1;
    tp_against_walk(&wide, DTYPE_F32, 8, 40, 12);
    /* fp32, wider still, one rank: the fused residual + LayerNorm backward
     * (its gamma, beta and bias partials) is the largest request */
    ModelConfig wider = wide;
    wider.d_model = 1024;
    const size_t fused = scratch_residual_ln_bwd(4 * 10, wider.d_model);
    CHECK(model_against_walk(&wider, DTYPE_F32) == fused, "the wide fp32 model's largest request is not the fused "
          "residual + LayerNorm backward's %zu bytes", fused);
    arena_checks(&cfg);
    nccl_checks(&cfg);
    return check_report("test_plan_gpu_sizes");
}
