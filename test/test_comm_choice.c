/* test_comm_choice.c: the runtime's --comm decision and its groups, on CPU.
 *
 * runtime_choose_comm is a pure function of (build has NCCL, buffers on a
 * GPU, ranks on this node, visible GPUs, request): a table of cases covers
 * every rule and the exact refusal sentences. Then runtime_init itself:
 * a world of one refusing an impossible --comm nccl (for the reason this
 * build has), and four forked ranks that share "one GPU" (host memory
 * behind counting copy hooks) with pp = 2: automatic layout, staged shm
 * data groups, the pp group carrying a message between the stages, and the
 * host control group never going through the hooks.
 */
#define _GNU_SOURCE
#include "check.h"
#include "comm_ranks.h"
#include "tp/runtime.h"

enum { NCCL = RUNTIME_COMM_NCCL, SHM = RUNTIME_COMM_SHM, AUTO = RUNTIME_COMM_AUTO };

typedef struct {
    bool have_nccl, gpu;
    int local_world, visible;  // the world: local_world ranks, except in the world-of-one cases below
    int request;
    int want;  // NCCL or SHM; -1 = refused
    const char *msg;  // the refusal
} Case;

static const char NO_NCCL[] =
    "--comm nccl is not available: this build has no NCCL (it needs CUDA, nccl.h and libnccl at build time)";
static const char NO_GPU[] = "--comm nccl needs the model on a GPU: this run keeps it in host memory";

static const Case CASES[] = {
    // auto: NCCL only when built with it, on GPU buffers, with a GPU per rank.
    {false, false, 1, 0, AUTO, SHM, NULL},
    {false, false, 4, 0, AUTO, SHM, NULL},
    {false, true, 2, 2, AUTO, SHM, NULL},
    {true, false, 4, 4, AUTO, SHM, NULL},
    {true, true, 1, 1, AUTO, SHM, NULL},  // a world of one: no NCCL communicator at all
    {true, true, 4, 4, AUTO, NCCL, NULL},
    {true, true, 4, 8, AUTO, NCCL, NULL},
    {true, true, 4, 1, AUTO, SHM, NULL},  // 4 ranks share one GPU: staged shm
    {true, true, 3, 2, AUTO, SHM, NULL},
    {true, true, 2, 0, AUTO, SHM, NULL},
    // shm: always possible.
    {true, true, 4, 4, SHM, SHM, NULL},
    {true, false, 1, 0, SHM, SHM, NULL},
    {false, true, 8, 1, SHM, SHM, NULL},
    // nccl: granted when possible, else refused naming why.
    {true, true, 2, 2, NCCL, NCCL, NULL},
    {true, true, 1, 8, NCCL, NCCL, NULL},
    {false, true, 1, 1, NCCL, -1, NO_NCCL},
    {false, false, 4, 0, NCCL, -1, NO_NCCL},
    {true, false, 1, 1, NCCL, -1, NO_GPU},
    {true, true, 4, 1, NCCL, -1, "--comm nccl needs one GPU per rank: 4 ranks share 1 GPU on this node"},
    {true, true, 3, 2, NCCL, -1, "--comm nccl needs one GPU per rank: 3 ranks share 2 GPUs on this node"},
    {true, true, 2, 0, NCCL, -1, "--comm nccl needs one GPU per rank: no GPU is visible on this node"},
    {true, true, 1, 1, 7, -1, "--comm must be auto, nccl or shm (got choice 7)"},
};

static void check_table(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const Case *k = &CASES[i];
        RuntimeComm out = (RuntimeComm)99;
        char err[256] = "";
        int rc = runtime_choose_comm((RuntimeComm)k->request, k->have_nccl, k->gpu, k->local_world, k->local_world,
                                     k->visible, &out, err, sizeof err);
        if (k->want < 0) {
            CHECK(rc == -1 && strcmp(err, k->msg) == 0, "case %zu: want the refusal \"%s\", got rc %d \"%s\"", i,
                  k->msg, rc, err);
        } else {
            CHECK(rc == 0 && (int)out == k->want, "case %zu: want %s, got rc %d, %s (%s)", i,
                  runtime_comm_name((RuntimeComm)k->want), rc, runtime_comm_name(out), err);
        }
    }
    /* one GPU per node on two nodes: the world of 2 meets through NCCL;
     * a world of one on a GPU makes none unless asked */
    RuntimeComm w = (RuntimeComm)99;
    char e2[256] = "";
    CHECK(runtime_choose_comm(RUNTIME_COMM_AUTO, true, true, 2, 1, 1, &w, e2, sizeof e2) == 0 && w == RUNTIME_COMM_NCCL,
          "two nodes of one GPU each: nccl (%s)", e2);
    CHECK(runtime_choose_comm(RUNTIME_COMM_AUTO, true, true, 1, 1, 8, &w, e2, sizeof e2) == 0 && w == RUNTIME_COMM_SHM,
          "a world of one on a GPU: no NCCL communicator");
    CHECK(runtime_choose_comm(RUNTIME_COMM_NCCL, true, true, 1, 1, 1, &w, e2, sizeof e2) == 0 && w == RUNTIME_COMM_NCCL,
          "a world of one asking --comm nccl gets it");
    RuntimeComm c = (RuntimeComm)99;
    CHECK(runtime_comm_parse("auto", &c) == 0 && c == RUNTIME_COMM_AUTO, "parse auto");
    CHECK(runtime_comm_parse("nccl", &c) == 0 && c == RUNTIME_COMM_NCCL, "parse nccl");
    CHECK(runtime_comm_parse("shm", &c) == 0 && c == RUNTIME_COMM_SHM, "parse shm");
    CHECK(runtime_comm_parse("mpi", &c) == -1 && runtime_comm_parse("", &c) == -1 && runtime_comm_parse(NULL, &c) == -1,
          "junk is refused");
}

/* ---- runtime_init ---- */

typedef struct {
    long calls;
    double bytes;
} Counter;

static void count_to_host(void *ctx, void *dst, const void *src, size_t n_bytes) {
    Counter *k = ctx;
    k->calls++;
    k->bytes += (double)n_bytes;
    memcpy(dst, src, n_bytes);
}

static void count_to_device(void *ctx, void *dst, const void *src, size_t n_bytes) {
    Counter *k = ctx;
    k->calls++;
    k->bytes += (double)n_bytes;
    memcpy(dst, src, n_bytes);
}

/* A world of one: impossible requests are refused, shm on GPU buffers needs hooks. */
static void check_solo(void) {
    rank_env_clear();
    Runtime rt;
    char err[512] = "";
    RuntimeOptions o = {.n_heads = 4, .d_ff = 8, .timeout_s = 5.0, .comm = RUNTIME_COMM_NCCL};
    CHECK(runtime_init(&rt, &o, err, sizeof err) == -1 && strcmp(err, runtime_have_nccl() ? NO_GPU : NO_NCCL) == 0,
          "--comm nccl on CPU buffers: %s", err);
    CHECK(rt.ctrl == NULL && rt.tp == NULL, "a refused runtime holds no communicator");
    o.comm = RUNTIME_COMM_SHM;
    o.device_is_gpu = true;
    o.n_visible_gpus = 1;
    CHECK(runtime_init(&rt, &o, err, sizeof err) == -1 && strstr(err, "device-copy hooks"), "staged without hooks: %s",
          err);
    o = (RuntimeOptions){.n_heads = 4, .d_ff = 8, .timeout_s = 5.0};
    CHECK(runtime_init(&rt, &o, err, sizeof err) == 0, "solo: %s", err);
    CHECK(rt.comm == RUNTIME_COMM_SHM && !rt.staged && rt.mesh.world == 1 && rt.mesh.pp == 1, "solo on CPU: shm");
    CHECK(rt.ctrl && rt.tp && rt.dp && rt.pp && !rt.nccl_world && comm_size(rt.pp) == 1, "solo groups");
    runtime_free(&rt);
    CHECK(rt.ctrl == NULL && rt.pp == NULL, "runtime_free clears the groups");
}

/* Four ranks on one "GPU", pp = 2: tp 2 inside each stage (automatic), dp 1. */
static void rank_shared_gpu(int rank, int n, int fd, void *arg) {
    (void)fd;
    (void)arg;
    rank_env_clear();
    rank_env_set(rank, n);
    Counter k = {0, 0};
    const CommDeviceCopy hooks = {.ctx = &k, .to_host = count_to_host, .to_device = count_to_device};
    const RuntimeOptions o = {.pp = 2,
                              .n_heads = 4,
                              .d_ff = 8,
                              .timeout_s = 20.0,
                              .device_is_gpu = true,
                              .n_visible_gpus = 1,
                              .device = 0,
                              .device_copy = &hooks};
    Runtime rt;
    char err[512] = "";
    CHECK(runtime_init(&rt, &o, err, sizeof err) == 0, "rank %d: %s", rank, err);
    if (err[0]) return;
    const Mesh *m = &rt.mesh;
    CHECK(rt.comm == RUNTIME_COMM_SHM && rt.staged, "4 ranks on 1 GPU: staged shm");
    CHECK(m->tp == 2 && m->dp == 1 && m->pp == 2 && m->pp_rank == rank / 2, "layout tp %d dp %d pp %d", m->tp, m->dp,
          m->pp);
    CHECK(comm_size(rt.ctrl) == 4 && comm_size(rt.tp) == 2 && comm_size(rt.dp) == 1 && comm_size(rt.pp) == 2,
          "group sizes %d %d %d %d", comm_size(rt.ctrl), comm_size(rt.tp), comm_size(rt.dp), comm_size(rt.pp));
    // The pp group: stage 0 sends to stage 1.
    float act[3] = {(float)rank, 1.5f, -2.0f};
    if (m->pp_rank == 0) {
        CHECK(comm_send(rt.pp, act, sizeof act, 1) == 0, "pp send: %s", comm_error(rt.pp));
    } else {
        CHECK(comm_recv(rt.pp, act, sizeof act, 0) == 0, "pp recv: %s", comm_error(rt.pp));
        CHECK(act[0] == (float)(rank - 2) && act[1] == 1.5f, "pp message from rank %d: %g", rank - 2, act[0]);
    }
    // The tp group goes through the hooks.
    const long before = k.calls;
    float x[2] = {(float)m->tp_rank, 1.0f};
    CHECK(comm_allreduce(rt.tp, x, 2, COMM_SUM) == 0 && x[0] == 1.0f && x[1] == 2.0f, "tp allreduce: %s",
          comm_error(rt.tp));
    CHECK(k.calls == before + 2, "a staged allreduce makes one copy each way (%ld calls)", k.calls - before);
    // The control group never does.
    int32_t flag = rank == 3 ? 7 : 0;
    CHECK(comm_broadcast(rt.ctrl, &flag, sizeof flag, 3) == 0 && flag == 7, "ctrl broadcast: %s", comm_error(rt.ctrl));
    CHECK(k.calls == before + 2, "the host control group used the device hooks");
    runtime_free(&rt);
}

int main(void) {
    init_job("tc");
    check_table();
    check_solo();
    Run *run = malloc(sizeof *run);
    run_ranks("4 ranks on one GPU, pp 2", 4, rank_shared_gpu, NULL, run);
    check_all_ok("4 ranks on one GPU, pp 2", run);
    CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    free(run);
    return check_report("test_comm_choice");
}
