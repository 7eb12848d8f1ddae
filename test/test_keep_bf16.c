/* test_keep_bf16.c: keeping the GEMM-only activations in bf16
 * (model_set_keep_bf16) changes the memory, not the results.
 *
 * In bf16 mode the GEMMs multiply bf16 roundings of their operands, so a
 * LayerNorm output, an attention output or an FFN activation that backward
 * needs only as a GEMM operand can be kept as that rounding: the CPU
 * backend's bf16 emulation rounds where the GPU does, and this test runs
 * there. For ReLU and GELU, recompute none, selective and full, one rank and
 * tp 2 with and without sequence parallelism (ranks forked, talking over
 * shared memory), two micro-batches of different shapes in flight (two
 * activation slots: F0 F1 B0 B1) with dropout on: the loss sum and every
 * gradient of the rank's shard are bitwise those of keeping them in fp32,
 * and the activation bytes are fewer. In fp32 mode the switch does nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "data/synthetic.h"
#include "tp/comm_shm.h"
#include "transformer/model.h"

enum { NMB = 2 };

static ModelConfig test_config(Activation act) {
    ModelConfig c;
    char err[256];
    config_preset("tiny", &c, err, sizeof err);
    c.act = act;
    c.enc_layers = 2;
    c.dec_layers = 2;
    c.dropout = 0.1f;
    return c;
}

typedef struct {
    float loss;
    float *grads;  // (tab.n_elems) host copy
    size_t act_bytes;
} Run;

/* Two micro-batches forward, then both backward, on a fresh model. */
static Run run(Backend *be, const ModelConfig *cfg, const TpGroup *g, bool sp, ModelRecompute rc, bool keep) {
    char err[256];
    Model m;
    Run r = {0};
    CHECK(model_create(&m, be, cfg, g, 3, err, sizeof err) == 0, "%s", err);
    CHECK(model_set_sequence_parallel(&m, sp, err, sizeof err) == 0, "%s", err);
    model_set_slots(&m, NMB);
    model_set_recompute(&m, rc);
    model_set_keep_bf16(&m, keep);
    CHECK(m.keep_bf16 == keep, "keep_bf16 %d after asking for %d in bf16 mode", m.keep_bf16, keep);
    OwnedBatch b[NMB];
    int n_tok = 0;
    for (int i = 0; i < NMB; i++) {
        synth_batch(&b[i], SYNTH_REVERSE, config_tokens(cfg), 5 - 2 * i, 3, 9 - 3 * i, 17, (uint64_t)i + 1);
        n_tok += batch_target_tokens(&b[i].view, cfg->pad_id);
    }
    float *loss = backend_alloc(be, sizeof(float), MEM_WORKSPACE);
    model_zero_grad(&m);
    for (int i = 0; i < NMB; i++) {
        model_use_slot(&m, i);
        model_forward_step(&m, &b[i].view, true, (DropoutKey){.seed = 5, .step = 2, .micro = (uint32_t)i}, loss);
    }
    for (int i = 0; i < NMB; i++) {
        model_use_slot(&m, i);
        model_backward(&m, &b[i].view, true, (DropoutKey){.seed = 5, .step = 2, .micro = (uint32_t)i},
                       1.0f / (float)n_tok);
    }
    backend_download(be, &r.loss, loss, sizeof r.loss);
    r.grads = malloc(m.tab.n_elems * sizeof(float));
    backend_download(be, r.grads, m.grads, m.tab.n_elems * sizeof(float));
    r.act_bytes = model_activation_bytes(&m);  // both slots and the scratch
    backend_free(be, loss);
    for (int i = 0; i < NMB; i++) owned_batch_free(&b[i]);
    model_free(&m);
    return r;
}

/* keep on against keep off for every configuration this rank runs. */
static void compare_all(Backend *be, const TpGroup *g, const char *who) {
    const Activation acts[2] = {ACT_RELU, ACT_GELU};
    for (int a = 0; a < 2; a++) {
        const ModelConfig cfg = test_config(acts[a]);
        for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++)
            for (int sp = 0; sp <= (g->size > 1); sp++) {
                const Run off = run(be, &cfg, g, sp, (ModelRecompute)rc, false);
                const Run on = run(be, &cfg, g, sp, (ModelRecompute)rc, true);
                char what[160];
                snprintf(what, sizeof what, "%s %s recompute %s%s", who, activation_name(acts[a]),
                         model_recompute_name((ModelRecompute)rc), sp ? " sequence parallel" : "");
                CHECK(memcmp(&on.loss, &off.loss, sizeof on.loss) == 0, "%s: loss %.9g kept in bf16, %.9g in fp32",
                      what, on.loss, off.loss);
                ParamTable tab;
                param_table_build_stage(&cfg, g->size, NULL, &tab);
                size_t n_diff = 0;
                for (size_t k = 0; k < tab.n_elems; k++) n_diff += memcmp(&on.grads[k], &off.grads[k], 4) != 0;
                CHECK(n_diff == 0, "%s: %zu of %zu gradients differ", what, n_diff, tab.n_elems);
                param_table_free(&tab);
                CHECK(on.act_bytes < off.act_bytes, "%s: %zu activation bytes kept in bf16, %zu in fp32", what,
                      on.act_bytes, off.act_bytes);
                if (g->rank == 0)
                    printf("%s: bitwise equal; activations %zu -> %zu bytes (%.2fx)\n", what, off.act_bytes,
                           on.act_bytes, (double)on.act_bytes / (double)off.act_bytes);
                free(on.grads);
                free(off.grads);
            }
    }
}

static Backend *bf16_backend(void) {
    char err[256];
    Backend *be = backend_create(DEVICE_CPU, DTYPE_BF16, 0, err, sizeof err);
    CHECK(be != NULL, "CPU backend: %s", err);
    return be;
}

static int run_rank(const char *job, int tp, int rank) {
    char err[512];
    Comm *comm = comm_shm_create(job, "tp", rank, tp, 20.0, err, sizeof err);
    if (!comm) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 10;
    }
    Backend *be = bf16_backend();
    if (!be) return 11;
    const TpGroup g = {.size = tp, .rank = rank, .comm = comm};
    char who[32];
    snprintf(who, sizeof who, "tp %d rank %d", tp, rank);
    compare_all(be, &g, who);
    backend_destroy(be);
    comm_free(comm);
    fflush(stdout);  // the rank ends with _exit
    fflush(stderr);
    return g_check_failures ? 1 : 0;
}

int main(void) {
    /* fp32: nothing to keep in bf16 */
    char err[256];
    const ModelConfig cfg = test_config(ACT_RELU);
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 3, err, sizeof err) == 0, "%s", err);
    model_set_keep_bf16(&m, true);
    CHECK(!m.keep_bf16, "fp32 mode keeps activations in bf16");
    model_free(&m);

    Backend *be = bf16_backend();
    if (be) {
        const TpGroup one = {.size = 1, .rank = 0, .comm = NULL};
        compare_all(be, &one, "tp 1");
        backend_destroy(be);
    }
    fflush(stdout);
    const int tp = 2;
    char job[64];
    snprintf(job, sizeof job, "kb%ld", (long)getpid());
    pid_t pids[2];
    for (int r = 0; r < tp; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(run_rank(job, tp, r));
    }
    for (int r = 0; r < tp; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp %d rank %d failed (status %d)", tp, r, st);
    }
    return check_report("test_keep_bf16");
}
