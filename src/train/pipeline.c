/* pipeline.c: the 1F1B schedule (see pipeline.h). */
#include "train/pipeline.h"

#include <stdbool.h>
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

/* One send and one receive with the same neighbour, ordered by the
 * stage's parity (an even stage sends first), so that the two sides of a
 * pair never both wait in a send. */
static void send_recv(const PipeStage *st, void (*send)(void *, int), int send_micro, void (*recv)(void *, int),
                      int recv_micro) {
    if (st->s % 2 == 0) {
        send(st->ctx, send_micro);
        recv(st->ctx, recv_micro);
    } else {
        recv(st->ctx, recv_micro);
        send(st->ctx, send_micro);
    }
}

int pipeline_run(const PipeStage *st) {
    TP_CHECK(st->p >= 1 && st->s >= 0 && st->s < st->p && st->m >= 1, "pipeline: stage %d of %d with %d micro-batches",
             st->s, st->p, st->m);
    const bool first = st->s == 0, final = st->s == st->p - 1;
    const int warm = pipeline_warmup(st->p, st->s, st->m), steady = st->m - warm;
    int f = 0, b = 0, n = 0;
    for (int k = 0; k < warm; k++, f++, n++) {
        if (!first) st->recv_prev(st->ctx, f);
        st->forward(st->ctx, f);
        if (!final) st->send_next(st->ctx, f);
    }
    if (steady > 0 && !first) st->recv_prev(st->ctx, f);
    for (int k = 0; k < steady; k++, n += 2) {
        st->forward(st->ctx, f);
        if (!final) send_recv(st, st->send_next, f, st->recv_next, b);  // output of f out, gradient of b in
        f++;
        st->backward(st->ctx, b, b == st->m - 1);
        if (k == steady - 1) {
            if (!first) st->send_prev(st->ctx, b);
        } else {
            if (!first) send_recv(st, st->send_prev, b, st->recv_prev, f);  // gradient of b out, input of f in
        }
        b++;
    }
    for (; b < st->m; b++, n++) {  // cool-down
        if (!final) st->recv_next(st->ctx, b);
        st->backward(st->ctx, b, b == st->m - 1);
        if (!first) st->send_prev(st->ctx, b);
    }
    return n;
}
