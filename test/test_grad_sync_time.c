/* test_grad_sync_time.c: the data-parallel communication time and its
 * exposed part (grad_sync_comm_s / grad_sync_exposed_s, the training
 * summary's "X s data-parallel communication of which Y s exposed"): on
 * two forked ranks, for ZeRO 0 and 1, with and without the communication
 * thread, every step's exposed part is at most the whole and the
 * reduction's sums are right. Backward is simulated: buckets are filled and
 * handed over in order with a little work between them, so the thread has
 * something to overlap with and the caller something to wait for. It used
 * to measure the exposed part as the caller's wall time around finish
 * (work that is not communication, the thread's wake-up) against a whole of
 * collectives only: without the thread, exposed exceeded it every step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_ranks.h"
#include "train/grad_sync.h"
#include "transformer/config.h"
#include "transformer/model.h"

#define N_RANKS 2
#define N_STEPS 12
#define BUCKET_ELEMS 2048     // small buckets: a dozen hand-overs a step
#define WORK_ITERS 20000      // the "backward" between hand-overs
/* exposed <= comm holds exactly where both get the same additions; where
 * the thread's bucket times are summed the order of the sum may round a
 * hair either way: far below a clock tick. */
#define TIME_ROUNDING_S 1e-9

static volatile double g_sink;

static void busy(int iters) {
    double x = 0.0;
    for (int i = 0; i < iters; i++) x += (double)i * 1e-9;
    g_sink = x;
}

static void rank_fn(int rank, int n, int out_fd, void *arg) {
    (void)arg;
    (void)out_fd;
    char err[512];
    Comm *dp = create_or_report("dp", rank, n, 30.0);
    if (!dp) return;
    ModelConfig cfg;
    CHECK(config_preset("tiny", &cfg, err, sizeof err) == 0, "%s", err);
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 5, err, sizeof err) == 0, "%s", err);
    const size_t n_elems = m.tab.n_elems;
    for (int zero = 0; zero <= 1; zero++)
        for (int overlap = 0; overlap <= 1; overlap++) {
            GradSyncConfig gc = {.zero = zero, .dtype = COMM_F32, .bucket_elems = BUCKET_ELEMS, .overlap = overlap};
            GradSync *g = grad_sync_create(m.be, dp, &m, &gc);
            const BucketLayout *L = grad_sync_layout(g);
            for (int step = 0; step < N_STEPS; step++) {
                grad_sync_begin(g, m.grads, false);
                for (int k = 0; k < L->n; k++) {  // backward: bucket k final, then the next one's work
                    for (size_t i = L->b[k].lo; i < L->b[k].hi; i++) m.grads[i] = (float)(rank + 1);
                    grad_sync_ready(g, L->b[k].lo);
                    busy(WORK_ITERS);
                }
                grad_sync_finish(g);
                const double comm = grad_sync_comm_s(g), exposed = grad_sync_exposed_s(g);
                CHECK(comm > 0.0 && exposed >= 0.0 && exposed <= comm + TIME_ROUNDING_S,
                      "zero %d overlap %d step %d: %.9f s communication of which %.9f s exposed", zero, overlap,
                      step, comm, exposed);
                /* the sum over the ranks, where this rank holds it */
                size_t bad = 0;
                for (int k = 0; k < L->n; k++) {
                    size_t lo = L->b[k].lo, hi = L->b[k].hi;
                    if (zero) bucket_piece(L, k, rank, &lo, &hi);
                    for (size_t i = lo; i < hi; i++) bad += m.grads[i] != (float)(n * (n + 1) / 2);
                }
                CHECK(bad == 0, "zero %d overlap %d: %zu of %zu reduced gradients wrong", zero, overlap, bad, n_elems);
            }
            grad_sync_free(g);
        }
    model_free(&m);
    comm_free(dp);
}

int main(void) {
    init_job("gst");
    Run *run = malloc(sizeof *run);
    run_ranks("grad sync time", N_RANKS, rank_fn, NULL, run);
    check_all_ok("grad sync time", run);
    for (int r = 0; r < N_RANKS; r++)
        if (!exited_ok(run, r)) fprintf(stderr, "rank %d output: %s\n", r, run->out[r]);
    CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    free(run);
    return check_report("test_grad_sync_time");
}
