/* pipeline.c: the 1F1B schedule (see pipeline.h). */
#include "train/pipeline.h"

#include <stdlib.h>

#include "err.h"

int pipeline_warmup(int p, int s, int m) {
    const int w = p - s - 1;
    return w < m ? w : m;
}

int pipeline_max_in_flight(int p, int s, int m) {
    const int w = p - s;
    return w < m ? w : m;
}

double pipeline_bubble_theory(int p, int m) { return (double)(p - 1) / (double)(m + p - 1); }

int pipeline_schedule(int p, int s, int m, PipeAction *out) {
    TP_CHECK(p >= 1 && s >= 0 && s < p && m >= 1, "pipeline schedule: stage %d of %d with %d micro-batches", s, p,
             m);
    const int warm = pipeline_warmup(p, s, m);
    int n = 0, f = 0, b = 0;
    for (; f < warm; f++) out[n++] = (PipeAction){PIPE_FORWARD, f};
    for (; f < m; f++, b++) {  // steady state: one forward, one backward
        out[n++] = (PipeAction){PIPE_FORWARD, f};
        out[n++] = (PipeAction){PIPE_BACKWARD, b};
    }
    for (; b < m; b++) out[n++] = (PipeAction){PIPE_BACKWARD, b};  // cool-down
    return n;
}

int pipeline_run(const PipeStage *st) {
    PipeAction *a = TP_MALLOC((size_t)2 * (size_t)st->m * sizeof *a);
    const int n = pipeline_schedule(st->p, st->s, st->m, a);
    for (int i = 0; i < n; i++) {
        if (a[i].op == PIPE_FORWARD) st->forward(st->ctx, a[i].micro);
        else st->backward(st->ctx, a[i].micro, i == n - 1);
    }
    free(a);
    return n;
}
