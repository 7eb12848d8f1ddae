/* test_step_graphs: the graph cache of train/graphs.h and the backend's
 * graphs under it (kernels/backend.h), on the CPU backend or a GPU
 * (`test_step_graphs cpu|gpu`).
 *
 * The phase captured here is two of the ops that read the StepVars: a
 * dropout whose mask stream is the StepVars' base plus a fixed stream id,
 * and the loss gradient written over the logits, scaled by the StepVars'
 * loss scale. Each "step" uploads new inputs and new StepVars, runs the
 * phase through step_graphs_run and compares the result bit for bit with
 * the same ops queued directly with the full stream id and the scale as
 * arguments (StepVars off). So a replay must read its inputs and StepVars
 * from memory as they are now, not as they were at the capture.
 * Then the cache's rules: first sight op by op, second captured, then
 * replayed; a graph is captured again after the backend freed a buffer or
 * the layout generation moved; no room, no graph; and (CPU) what a capture
 * cannot hold (an upload) ends the process naming itself. On a GPU, a call
 * the driver refuses inside a capture (a wait on the capturing stream)
 * makes the capture fail as a whole, not the process: the phase runs op by
 * op with the same bits, graphs are off from then on, and the reason names
 * the call. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "kernels/ops.h"
#include "train/graphs.h"
#ifdef TPTRAIN_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#define N_DROP 1000
#define ROWS 6
#define VOCAB 40
#define SEED 0x1234abcdULL

typedef struct {
    Backend *be;
    float *x, *y;           // dropout in, out (N_DROP)
    float *logits, *lse;    // (ROWS, VOCAB), (ROWS)
    int32_t *targets;       // (ROWS)
    uint64_t rel_stream;    // the stream id the phase passes
    int runs;               // calls of the phase's function
    bool refused_call;      // GPU: the phase also waits on the stream (a capture cannot hold that)
} Phase;

static void phase_ops(void *ctx) {
    Phase *p = ctx;
    p->runs++;
#ifdef TPTRAIN_TEST_CUDA
    if (p->refused_call) (void)cudaStreamSynchronize((cudaStream_t)backend_stream(p->be));  // fine outside a capture
#endif
    op_dropout_fwd_at(p->be, p->y, p->x, N_DROP, 0, 0.3f, SEED, p->rel_stream);
    op_xent_vp_grad_inplace(p->be, p->logits, p->lse, p->targets, 123.0f, ROWS, VOCAB, VOCAB, 0, VOCAB, 0.1f, -1);
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
}

typedef struct {
    float x[N_DROP], logits[ROWS * VOCAB], lse[ROWS];
    int32_t targets[ROWS];
} Inputs;

static void make_inputs(Inputs *in, unsigned seed) {
    for (int i = 0; i < N_DROP; i++) in->x[i] = frand(&seed);
    for (int i = 0; i < ROWS * VOCAB; i++) in->logits[i] = frand(&seed);
    for (int r = 0; r < ROWS; r++) {
        in->lse[r] = 3.0f + frand(&seed);
        in->targets[r] = r == 2 ? -1 : (int32_t)((seed >> 9) % VOCAB);  // row 2 ignored
        (void)frand(&seed);
    }
}

static void upload_inputs(Phase *p, const Inputs *in) {
    backend_upload(p->be, p->x, in->x, sizeof in->x);
    backend_upload(p->be, p->logits, in->logits, sizeof in->logits);
    backend_upload(p->be, p->lse, in->lse, sizeof in->lse);
    backend_upload(p->be, p->targets, in->targets, sizeof in->targets);
}

/* What the phase must give for (step k, scale): the ops with the full
 * stream id and the scale as arguments, StepVars off. */
static void expected(Phase *p, const Inputs *in, uint32_t k, float scale, float *y, float *g) {
    const StepVars *saved = p->be->step_vars;
    backend_set_step_vars(p->be, NULL);
    upload_inputs(p, in);
    op_dropout_fwd_at(p->be, p->y, p->x, N_DROP, 0, 0.3f, SEED, dropout_stream(k, 0, 0, 0, 0) + p->rel_stream);
    op_xent_vp_grad_inplace(p->be, p->logits, p->lse, p->targets, scale, ROWS, VOCAB, VOCAB, 0, VOCAB, 0.1f, -1);
    backend_download(p->be, y, p->y, N_DROP * sizeof(float));
    backend_download(p->be, g, p->logits, ROWS * VOCAB * sizeof(float));
    backend_set_step_vars(p->be, saved);
}

/* One step: new inputs and StepVars, the phase through the cache, the bits checked. */
static void step(Phase *p, StepGraphs *g, StepVars *sv_dev, uint32_t k, int B, uint64_t gen, const char *what) {
    Inputs in;
    make_inputs(&in, 1000u + k);
    const float scale = 1.0f / (float)(10 + k);
    static float want_y[N_DROP], want_g[ROWS * VOCAB], got_y[N_DROP], got_g[ROWS * VOCAB];
    expected(p, &in, k, scale, want_y, want_g);
    upload_inputs(p, &in);
    const StepVars sv = {.stream_base = dropout_stream(k, 0, 0, 0, 0), .loss_scale = scale};
    backend_upload(p->be, sv_dev, &sv, sizeof sv);
    step_graphs_run(g, GRAPH_FORWARD, 0, B, 1, 1, gen, phase_ops, p);
    backend_download(p->be, got_y, p->y, sizeof got_y);
    backend_download(p->be, got_g, p->logits, sizeof got_g);
    CHECK(memcmp(got_y, want_y, sizeof got_y) == 0, "%s (step %u): the dropout's bits differ", what, k);
    CHECK(memcmp(got_g, want_g, sizeof got_g) == 0, "%s (step %u): the loss gradient's bits differ", what, k);
    int dropped = 0;
    for (int i = 0; i < N_DROP; i++) dropped += got_y[i] == 0.0f;
    CHECK(dropped > 200 && dropped < 400, "%s: %d of %d dropped at p 0.3", what, dropped, N_DROP);
}

static void check_stats(StepGraphs *g, const Phase *p, long captured, long replayed, long eager, long stale, int kept,
                        int runs, const char *what) {
    const GraphStats s = step_graphs_stats(g);
    CHECK(s.captured == captured && s.replayed == replayed && s.eager == eager && s.stale == stale &&
              s.kept == kept && !s.failed && p->runs == runs,
          "%s: captured %ld replayed %ld eager %ld stale %ld kept %d runs %d, want %ld %ld %ld %ld %d %d", what,
          s.captured, s.replayed, s.eager, s.stale, s.kept, p->runs, captured, replayed, eager, stale, kept, runs);
}

/* CPU: an upload inside a capture ends the process with its sentence. */
static void check_capture_refuses_upload(Backend *be, float *buf) {
    char path[] = "/tmp/test_step_graphs_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        float v = 1.0f;
        backend_capture_begin(be);
        backend_upload(be, buf, &v, sizeof v);
        _exit(0);  // not reached: the upload dies
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0, "an upload inside a capture did not end the process");
    char msg[512] = "";
    const ssize_t n = pread(fd, msg, sizeof msg - 1, 0);
    msg[n > 0 ? n : 0] = '\0';
    CHECK(strstr(msg, "backend_upload inside a graph capture") != NULL, "the message: %s", msg);
    close(fd);
    unlink(path);
}

int main(int argc, char **argv) {
    const bool gpu = argc > 1 && strcmp(argv[1], "gpu") == 0;
    char err[256];
    Backend *be = backend_create(gpu ? DEVICE_CUDA : DEVICE_CPU, DTYPE_F32, 0, err, sizeof err);
    if (!be) {
        fprintf(stderr, "test_step_graphs: %s\n", err);
        return 1;
    }
    Phase p = {.be = be, .rel_stream = dropout_stream(0, 0, 3, 2, 1)};
    p.x = backend_alloc(be, N_DROP * sizeof(float), MEM_ACT);
    p.y = backend_alloc(be, N_DROP * sizeof(float), MEM_ACT);
    p.logits = backend_alloc(be, ROWS * VOCAB * sizeof(float), MEM_ACT);
    p.lse = backend_alloc(be, ROWS * sizeof(float), MEM_ACT);
    p.targets = backend_alloc(be, ROWS * sizeof(int32_t), MEM_ACT);
    StepVars *sv = backend_alloc(be, sizeof(StepVars), MEM_WORKSPACE);
    backend_set_step_vars(be, sv);

    StepGraphs *g = step_graphs_new(be, 2);
    step(&p, g, sv, 1, 1, 0, "first sight");
    check_stats(g, &p, 0, 0, 1, 0, 0, 1, "first sight: op by op");
    step(&p, g, sv, 2, 1, 0, "capture");
    check_stats(g, &p, 1, 0, 1, 0, 1, 2, "second sight: captured and launched");
    for (uint32_t k = 3; k <= 6; k++) step(&p, g, sv, k, 1, 0, "replay");
    check_stats(g, &p, 1, 4, 1, 0, 1, 2, "replays: the function is not called");

    backend_free(be, backend_alloc(be, 64, MEM_WORKSPACE));  // a buffer freed: the graph may name it
    step(&p, g, sv, 7, 1, 0, "after a free");
    check_stats(g, &p, 2, 4, 1, 1, 1, 3, "a free: stale, captured again");
    step(&p, g, sv, 8, 1, 5, "after a layout change");
    check_stats(g, &p, 3, 4, 1, 2, 1, 4, "a new layout generation: stale, captured again");
    step(&p, g, sv, 9, 1, 5, "replay");
    check_stats(g, &p, 3, 5, 1, 2, 1, 4, "replayed at the new generation");

    step(&p, g, sv, 10, 2, 5, "shape 2");  // another shape: first sight, then the second graph
    step(&p, g, sv, 11, 2, 5, "shape 2");
    step(&p, g, sv, 12, 3, 5, "shape 3");  // no room left for a third: op by op for good
    step(&p, g, sv, 13, 3, 5, "shape 3");
    step(&p, g, sv, 14, 3, 5, "shape 3");
    check_stats(g, &p, 4, 5, 5, 2, 2, 9, "room for two graphs: the third shape runs op by op");
    step_graphs_free(g);

    if (gpu) {  // a refused call inside the capture: the capture fails, the run goes on op by op
        g = step_graphs_new(be, 2);
        p.refused_call = true;
        p.runs = 0;
        step(&p, g, sv, 20, 1, 0, "refused: first sight");
        step(&p, g, sv, 21, 1, 0, "refused: the capture fails, op by op");
        step(&p, g, sv, 22, 1, 0, "refused: graphs off");
        const GraphStats s = step_graphs_stats(g);
        CHECK(s.failed && s.captured == 0 && s.kept == 0 && s.eager == 3 && p.runs == 4,
              "a refused capture: failed %d captured %ld kept %d eager %ld runs %d", s.failed, s.captured, s.kept,
              s.eager, p.runs);
        step_graphs_free(g);
    }
    backend_set_step_vars(be, NULL);

    if (!gpu) check_capture_refuses_upload(be, p.x);
    backend_free(be, sv);
    backend_free(be, p.x);
    backend_free(be, p.y);
    backend_free(be, p.logits);
    backend_free(be, p.lse);
    backend_free(be, p.targets);
    backend_destroy(be);
    return check_report(gpu ? "test_step_graphs gpu" : "test_step_graphs cpu");
}
