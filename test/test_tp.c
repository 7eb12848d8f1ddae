/* test_tp.c: the tensor-parallel model against the whole model, in one test
 * process that forks tp ranks talking over the shared-memory backend.
 *
 * For tp = 2 and 4: the loss and every gradient (assembled from the shards)
 * equal those of the tp = 1 model on the same batch, without dropout and
 * (tp = 2 and 4 again) with every dropout on: the sub-blocks' outputs
 * (replicated: the same mask on every rank), the attention probabilities
 * and the FFN activations (split over tp by heads and columns: each rank
 * draws its window of the unsharded tensor's mask, so a tp run draws
 * exactly the one-rank run's masks and differs from it only in the order
 * of its sums); the number of tp
 * allreduces is Megatron's (forward: one per sub-block, plus the two
 * embedding lookups and the two loss statistics; backward: one per
 * sub-block, plus the output layer's and the encoder output's input
 * gradients); and after optimizer steps every replicated tensor is bitwise
 * identical on all tp ranks.
 *
 * GELU, not ReLU: with ReLU a pre-activation within rounding of 0 may flip
 * between layouts (the GEMMs are blocked differently), moving a gradient by
 * far more than rounding. Tolerance: TP_RTOL = 1e-5 of each tensor's largest
 * gradient (fp32 sums in another order: ~1e-7 observed).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "data/synthetic.h"
#include "testfs.h"
#include "tp/comm_shm.h"
#include "transformer/model.h"
#include "transformer/optim.h"

#define TP_RTOL 1e-5

/* The dropouts of the runs with dropout, and their key. */
#define DROP_P 0.1f
#define DROP_ATTN 0.2f
#define DROP_ACT 0.3f
static const DropoutKey DROP_KEY = {.seed = 11, .step = 2, .micro = 1};

static ModelConfig test_config(bool drop) {
    ModelConfig c;
    char err[256];
    config_preset("tiny", &c, err, sizeof err);
    c.dropout = drop ? DROP_P : 0.0f;
    c.attn_dropout = drop ? DROP_ATTN : 0.0f;
    c.act_dropout = drop ? DROP_ACT : 0.0f;
    c.act = ACT_GELU;
    c.vocab_size = 62;  /* not a multiple of 4: the vocabulary is padded for tp = 4 */
    c.enc_layers = 2;
    c.dec_layers = 3;
    return c;
}

/* What a rank reports: loss, allreduce counts, gathered grads (rank 0). */
typedef struct { float loss; long fwd, bwd; int repl_ok; } RankResult;

static int run_rank(const char *job, const char *dir, int tp, int rank, bool drop) {
    char err[512];
    Comm *comm = comm_shm_create(job, "tp", rank, tp, 20.0, err, sizeof err);
    if (!comm) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 10;
    }
    ModelConfig cfg = test_config(drop);
    const DropoutKey key0 = drop ? DROP_KEY : (DropoutKey){0};
    Model m;
    TpGroup g = {.size = tp, .rank = rank, .comm = comm};
    if (model_create(&m, NULL, &cfg, &g, 5, err, sizeof err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 11;
    }
    OwnedBatch b;
    synth_batch(&b, SYNTH_REVERSE, config_tokens(&cfg), 6, 3, 9, 17, 1);
    RankResult res = {0};
    int n = 0;
    model_zero_grad(&m);
    comm_reset_stats(comm);
    res.loss = model_forward(&m, &b.view, drop, key0, &n);
    res.fwd = comm_stats(comm).allreduce;
    comm_reset_stats(comm);
    model_backward(&m, &b.view, drop, key0, 1.0f / (float)n);
    res.bwd = comm_stats(comm).allreduce;

    /* Gradients assembled from the shards (model_gather reads `params`). */
    Model whole, gview = m;
    gview.params = m.grads;
    if (rank == 0) model_create(&whole, NULL, &cfg, NULL, 5, err, sizeof err);
    model_gather(&gview, rank == 0 ? &whole : NULL);

    /* A few optimizer steps with dropout: replicated tensors must stay identical. */
    OptimConfig oc = optim_defaults();
    oc.lr = 1e-2f;
    oc.warmup = 0;
    AdamW opt;
    adamw_init(&opt, m.be, &oc, m.tab.n_elems);
    m.cfg.dropout = 0.2f;
    for (int step = 1; step <= 3; step++) {
        OwnedBatch sb;
        synth_batch(&sb, SYNTH_COPY, config_tokens(&cfg), 8, 3, 9, 23, (uint64_t)step);
        DropoutKey key = {.seed = 9, .step = (uint32_t)step};
        model_zero_grad(&m);
        model_forward(&m, &sb.view, true, key, &n);
        model_backward(&m, &sb.view, true, key, 1.0f / (float)n);
        float gn = grad_global_norm(m.be, &m.tab, m.grads, comm);
        clip_grads(m.be, m.grads, m.tab.n_elems, gn, 1.0f);
        adamw_step(&opt, m.params, m.grads, &m.tab, oc.lr);
        owned_batch_free(&sb);
    }
    res.repl_ok = 1;
    float *all = malloc(m.tab.n_elems * (size_t)tp * sizeof(float));
    for (int i = 0; i < m.tab.n; i++) {
        const ParamInfo *p = &m.tab.t[i];
        if (p->split != SPLIT_REPL) continue;
        if (comm_allgather(comm, m.params + p->offset, all, p->n_elems)) return 12;
        for (int r = 1; r < tp; r++)
            if (memcmp(all, all + (size_t)r * p->n_elems, p->n_elems * sizeof(float)) != 0) res.repl_ok = 0;
    }
    free(all);
    adamw_free(&opt);

    char path[512];
    snprintf(path, sizeof path, "%s/rank%d.bin", dir, rank);
    FILE *f = fopen(path, "wb");
    if (!f) return 13;
    fwrite(&res, sizeof res, 1, f);
    if (rank == 0) fwrite(whole.params, sizeof(float), whole.tab.n_elems, f);
    fclose(f);
    if (rank == 0) model_free(&whole);
    owned_batch_free(&b);
    model_free(&m);
    comm_free(comm);
    return 0;
}

static void check_layout(int tp, const Model *ref, float ref_loss, bool drop) {
    char dir[64], job[64];
    snprintf(dir, sizeof dir, "/tmp/test_tp.XXXXXX");
    if (!mkdtemp(dir)) return;
    snprintf(job, sizeof job, "tt%ld%d", (long)getpid(), tp);
    pid_t pids[8];
    for (int r = 0; r < tp; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(run_rank(job, dir, tp, r, drop));
    }
    for (int r = 0; r < tp; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp %d rank %d failed (status %d)", tp, r, st);
    }
    const ModelConfig *c = &ref->cfg;
    const long fwd_want = 2 + 2L * c->enc_layers + 3L * c->dec_layers + 2;
    const long bwd_want = 2L * c->enc_layers + 3L * c->dec_layers + 2;
    for (int r = 0; r < tp; r++) {
        char path[512];
        snprintf(path, sizeof path, "%s/rank%d.bin", dir, r);
        size_t n = 0;
        uint8_t *bytes = read_bytes(path, &n);
        CHECK(bytes && n >= sizeof(RankResult), "tp %d rank %d wrote no result", tp, r);
        if (!bytes || n < sizeof(RankResult)) continue;
        RankResult res;
        memcpy(&res, bytes, sizeof res);
        CHECK_CLOSE(res.loss, ref_loss, TP_RTOL, 0.0, "loss vs tp=1");
        CHECK(res.fwd == fwd_want, "tp %d: %ld forward allreduces, Megatron's count is %ld", tp, res.fwd, fwd_want);
        CHECK(res.bwd == bwd_want, "tp %d: %ld backward allreduces, Megatron's count is %ld", tp, res.bwd, bwd_want);
        CHECK(res.repl_ok, "tp %d rank %d: replicated tensors differ across tp ranks", tp, r);
        if (r == 0) {
            CHECK(n == sizeof res + ref->tab.n_elems * sizeof(float), "tp %d: gathered gradients have the wrong size",
                  tp);
            const float *grads = (const float *)(bytes + sizeof res);
            for (int i = 0; i < ref->tab.n && n == sizeof res + ref->tab.n_elems * sizeof(float); i++) {
                const ParamInfo *p = &ref->tab.t[i];
                double mx = 0, diff = 0;
                for (size_t j = 0; j < p->n_elems; j++) {
                    double a = ref->grads[p->offset + j], b = grads[p->offset + j];
                    mx = fabs(a) > mx ? fabs(a) : mx;
                    diff = fabs(a - b) > diff ? fabs(a - b) : diff;
                }
                CHECK(diff <= TP_RTOL * mx + 1e-12, "tp %d: gradient of %s differs by %.3g (max %.3g)", tp, p->name,
                      diff, mx);
            }
        }
        free(bytes);
    }
    printf("tp %d%s: loss and %d gradients match tp 1; %ld + %ld allreduces per step\n", tp,
           drop ? " with dropout, attention and activation dropout" : "", ref->tab.n, fwd_want, bwd_want);
    remove_tree(dir);
}

/* The tp = 1 loss and gradients, then tp = 2 and 4 against them. */
static void check_all(bool drop) {
    ModelConfig cfg = test_config(drop);
    const DropoutKey key = drop ? DROP_KEY : (DropoutKey){0};
    char err[256];
    Model ref;
    CHECK(model_create(&ref, NULL, &cfg, NULL, 5, err, sizeof err) == 0, "%s", err);
    OwnedBatch b;
    synth_batch(&b, SYNTH_REVERSE, config_tokens(&cfg), 6, 3, 9, 17, 1);
    int n = 0;
    model_zero_grad(&ref);
    float loss = model_forward(&ref, &b.view, drop, key, &n);
    model_backward(&ref, &b.view, drop, key, 1.0f / (float)n);
    fflush(stdout);
    check_layout(2, &ref, loss, drop);
    check_layout(4, &ref, loss, drop);
    owned_batch_free(&b);
    model_free(&ref);
}

int main(void) {
    check_all(false);
    check_all(true);
    return check_report("test_tp");
}
