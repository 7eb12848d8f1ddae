/* micro_runs.h: what the model tests that hold one configuration against
 * another share (test_keep_bf16, test_flash_model): two micro-batches of
 * different shapes in flight on a model the caller set up (two activation
 * slots: F0 F1 B0 B1, dropout keys per micro-batch), and the tp ranks
 * forked over shared memory, each running the test's comparisons. */
#ifndef TPTRAIN_TEST_MICRO_RUNS_H
#define TPTRAIN_TEST_MICRO_RUNS_H
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L  /* fork, waitpid: include this header first */
#endif
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "data/synthetic.h"
#include "tp/comm_shm.h"
#include "transformer/model.h"

enum { MICRO_N = 2 };

typedef struct {
    float loss;
    float *grads;  // (tab.n_elems) host copy
    size_t act_bytes;
} MicroRun;

/* The reverse task's batches i = 0, 1 (5 - 2i sentences of lengths 3 ..
 * max_len[i]) forward, then both backward, on m with two slots and zeroed
 * gradients; the loss sum, every gradient and the activation bytes. */
static inline MicroRun micro_run(Model *m, const int max_len[MICRO_N]) {
    MicroRun r = {0};
    Backend *be = m->be;
    const ModelConfig *cfg = &m->cfg;
    model_set_slots(m, MICRO_N);
    OwnedBatch b[MICRO_N];
    int n_tok = 0;
    for (int i = 0; i < MICRO_N; i++) {
        synth_batch(&b[i], SYNTH_REVERSE, config_tokens(cfg), 5 - 2 * i, 3, max_len[i], 17, (uint64_t)i + 1);
        n_tok += batch_target_tokens(&b[i].view, cfg->pad_id);
    }
    float *loss = backend_alloc(be, sizeof(float), MEM_WORKSPACE);
    model_zero_grad(m);
    for (int i = 0; i < MICRO_N; i++) {
        model_use_slot(m, i);
        model_forward_step(m, &b[i].view, true, (DropoutKey){.seed = 5, .step = 2, .micro = (uint32_t)i}, loss);
    }
    for (int i = 0; i < MICRO_N; i++) {
        model_use_slot(m, i);
        model_backward(m, &b[i].view, true, (DropoutKey){.seed = 5, .step = 2, .micro = (uint32_t)i},
                       1.0f / (float)n_tok);
    }
    backend_download(be, &r.loss, loss, sizeof r.loss);
    r.grads = malloc(m->tab.n_elems * sizeof(float));
    backend_download(be, r.grads, m->grads, m->tab.n_elems * sizeof(float));
    r.act_bytes = model_activation_bytes(m);  // both slots and the scratch
    backend_free(be, loss);
    for (int i = 0; i < MICRO_N; i++) owned_batch_free(&b[i]);
    return r;
}

/* A CPU backend of that precision (NULL after a failed check). */
static inline Backend *micro_cpu_backend(Dtype dtype) {
    char err[256];
    Backend *be = backend_create(DEVICE_CPU, dtype, 0, err, sizeof err);
    CHECK(be != NULL, "CPU backend: %s", err);
    return be;
}

/* One forked rank: its tp group over shared memory, then
 * compare(&group); the exit status is 0 when every check passed. */
static inline int micro_rank(const char *job, int tp, int rank, void (*compare)(const TpGroup *g)) {
    char err[512];
    Comm *comm = comm_shm_create(job, "tp", rank, tp, 20.0, err, sizeof err);
    if (!comm) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 10;
    }
    const TpGroup g = {.size = tp, .rank = rank, .comm = comm};
    compare(&g);
    comm_free(comm);
    fflush(stdout);  // the rank ends with _exit
    fflush(stderr);
    return g_check_failures ? 1 : 0;
}

/* tp ranks forked, each micro_rank(..., compare), and waited for. */
static inline void micro_fork_ranks(const char *tag, int tp, void (*compare)(const TpGroup *g)) {
    fflush(stdout);
    char job[64];
    snprintf(job, sizeof job, "%s%ld", tag, (long)getpid());
    pid_t pids[8];
    for (int r = 0; r < tp && r < 8; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(micro_rank(job, tp, r, compare));
    }
    for (int r = 0; r < tp && r < 8; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp %d rank %d failed (status %d)", tp, r, st);
    }
}

#endif
