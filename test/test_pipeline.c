/* test_pipeline: the 1F1B schedule of train/pipeline.h, for every p <= 8
 * and M <= 16, executed by a simulation of p stages that exchange messages:
 * each stage runs its actions in order, a forward of stage s > 0 waits for
 * stage s - 1's output of that micro-batch, a backward of stage s < p - 1
 * for stage s + 1's gradient. Checked: no deadlock; each stage runs every
 * micro-batch's forward and backward once, each backward after its forward,
 * backwards in order; at most min(p - s, M) micro-batches in flight at
 * stage s; 2 (p - 1) M messages; and with unit-time forwards and backwards
 * the step takes 2 (M + p - 1) ticks, so the idle fraction is the textbook
 * (p - 1) / (M + p - 1). pipeline_run calls the callbacks in schedule order,
 * and p threads running it complete over rendezvous channels (every send
 * waits until its receive takes the message, the strictest transport), each
 * receive getting the micro-batch it expects; a deadlock fails the test
 * after a timeout instead of hanging it.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/pipeline.h"

static int failures;
#define CHECK(cond, ...)                                        \
    do {                                                        \
        if (!(cond)) {                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                       \
            fprintf(stderr, "\n");                              \
            failures++;                                         \
        }                                                       \
    } while (0)

enum { PMAX = 8, MMAX = 16 };

/* Simulates one step; returns the ticks it took (-1 on deadlock). */
static int simulate(int p, int m, int *messages) {
    PipeAction act[PMAX][2 * MMAX];
    int n[PMAX], next[PMAX] = {0}, in_flight[PMAX] = {0}, peak[PMAX] = {0};
    /* when (tick) stage s's output / input gradient of micro-batch i was sent; -1: not yet */
    int fwd_sent[PMAX][MMAX], bwd_sent[PMAX][MMAX], fwd_done[PMAX][MMAX], bwd_done[PMAX][MMAX];
    for (int s = 0; s < p; s++) {
        n[s] = pipeline_schedule(p, s, m, act[s]);
        CHECK(n[s] == 2 * m, "p %d m %d stage %d: %d actions", p, m, s, n[s]);
        for (int i = 0; i < m; i++) fwd_sent[s][i] = bwd_sent[s][i] = fwd_done[s][i] = bwd_done[s][i] = -1;
    }
    *messages = 0;
    int tick = 0, left = 0;
    for (int s = 0; s < p; s++) left += n[s];
    while (left > 0) {
        int progressed = 0;
        int f_now[PMAX], b_now[PMAX];
        for (int s = 0; s < p; s++) {
            f_now[s] = b_now[s] = -1;
            if (next[s] == n[s]) continue;
            const PipeAction a = act[s][next[s]];
            const int i = a.micro;
            if (a.op == PIPE_FORWARD) {
                if (s > 0 && (fwd_sent[s - 1][i] < 0 || fwd_sent[s - 1][i] >= tick)) continue;  // input not here
                CHECK(fwd_done[s][i] < 0, "p %d m %d stage %d: forward %d twice", p, m, s, i);
                f_now[s] = i;
            } else {
                if (s < p - 1 && (bwd_sent[s + 1][i] < 0 || bwd_sent[s + 1][i] >= tick)) continue;
                CHECK(fwd_done[s][i] >= 0, "p %d m %d stage %d: backward %d before its forward", p, m, s, i);
                CHECK(bwd_done[s][i] < 0, "p %d m %d stage %d: backward %d twice", p, m, s, i);
                CHECK(i == 0 || bwd_done[s][i - 1] >= 0, "p %d m %d stage %d: backward %d out of order", p, m, s, i);
                b_now[s] = i;
            }
        }
        for (int s = 0; s < p; s++) {  // every stage runs its action this tick, messages arrive next tick
            if (f_now[s] >= 0) {
                fwd_done[s][f_now[s]] = tick;
                if (s < p - 1) fwd_sent[s][f_now[s]] = tick, ++*messages;
                if (++in_flight[s] > peak[s]) peak[s] = in_flight[s];
            } else if (b_now[s] >= 0) {
                bwd_done[s][b_now[s]] = tick;
                if (s > 0) bwd_sent[s][b_now[s]] = tick, ++*messages;
                in_flight[s]--;
            } else continue;
            next[s]++;
            left--;
            progressed = 1;
        }
        tick++;
        if (!progressed) {
            /* nothing ran: only legal while a message is on its way (sent this tick) */
            int pending = 0;
            for (int s = 0; s < p; s++)
                for (int i = 0; i < m; i++) pending |= fwd_sent[s][i] == tick - 1 || bwd_sent[s][i] == tick - 1;
            if (!pending) return -1;
        }
    }
    for (int s = 0; s < p; s++) {
        const int want = m < p - s ? m : p - s;
        CHECK(peak[s] == want && pipeline_max_in_flight(p, s, m) == want,
              "p %d m %d stage %d: %d in flight (schedule says %d), want %d", p, m, s, peak[s],
              pipeline_max_in_flight(p, s, m), want);
        for (int i = 0; i < m; i++) CHECK(bwd_done[s][i] > fwd_done[s][i], "p %d m %d stage %d: micro %d", p, m, s, i);
    }
    return tick;
}

typedef struct {
    int log[2 * MMAX][3];
    int n;
} Recorder;

static void rec_forward(void *ctx, int i) {
    Recorder *r = ctx;
    r->log[r->n][0] = PIPE_FORWARD, r->log[r->n][1] = i, r->log[r->n][2] = 0, r->n++;
}
static void rec_backward(void *ctx, int i, int last) {
    Recorder *r = ctx;
    r->log[r->n][0] = PIPE_BACKWARD, r->log[r->n][1] = i, r->log[r->n][2] = last, r->n++;
}

static void no_exchange(void *ctx, int i) { (void)ctx, (void)i; }

/* ---- rendezvous transport: a channel per direction per neighbour pair ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int full, micro, taken;
} Chan;

static Chan fwd_ch[PMAX], bwd_ch[PMAX];  // fwd_ch[s]: s -> s + 1; bwd_ch[s]: s + 1 -> s

static void chan_init(Chan *c) {
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->full = c->taken = 0;
}

static int wait_until(Chan *c, int *cond, int want) {  // mutex held; 0, or -1 after 5 s
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    while (*cond != want)
        if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT) return -1;
    return 0;
}

static void chan_send(Chan *c, int micro, const char *what) {
    pthread_mutex_lock(&c->mu);
    int rc = wait_until(c, &c->full, 0);
    c->full = 1, c->micro = micro, c->taken = 0;
    pthread_cond_broadcast(&c->cv);
    if (rc == 0) rc = wait_until(c, &c->taken, 1);  // rendezvous: until the receiver has it
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        fprintf(stderr, "FAIL test_pipeline: deadlock in %s of micro-batch %d\n", what, micro);
        exit(1);
    }
}

static void chan_recv(Chan *c, int micro, const char *what) {
    pthread_mutex_lock(&c->mu);
    const int rc = wait_until(c, &c->full, 1);
    const int got = c->micro;
    c->full = 0, c->taken = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        fprintf(stderr, "FAIL test_pipeline: deadlock in %s of micro-batch %d\n", what, micro);
        exit(1);
    }
    CHECK(got == micro, "%s: expected micro-batch %d, got %d", what, micro, got);
}

typedef struct {
    int p, s, m;
    Recorder r;
} ThreadStage;

static void t_recv_prev(void *ctx, int i) { chan_recv(&fwd_ch[((ThreadStage *)ctx)->s - 1], i, "recv_prev"); }
static void t_send_next(void *ctx, int i) { chan_send(&fwd_ch[((ThreadStage *)ctx)->s], i, "send_next"); }
static void t_recv_next(void *ctx, int i) { chan_recv(&bwd_ch[((ThreadStage *)ctx)->s], i, "recv_next"); }
static void t_send_prev(void *ctx, int i) { chan_send(&bwd_ch[((ThreadStage *)ctx)->s - 1], i, "send_prev"); }

static void t_forward(void *ctx, int i) { rec_forward(&((ThreadStage *)ctx)->r, i); }
static void t_backward(void *ctx, int i, int last) { rec_backward(&((ThreadStage *)ctx)->r, i, last); }

static void *stage_thread(void *arg) {
    ThreadStage *t = arg;
    const PipeStage st = {.ctx = t, .p = t->p, .s = t->s, .m = t->m, .forward = t_forward, .backward = t_backward,
                          .recv_prev = t_recv_prev, .send_next = t_send_next, .recv_next = t_recv_next,
                          .send_prev = t_send_prev};
    pipeline_run(&st);
    return NULL;
}

/* p threads through rendezvous channels; each runs its schedule in order. */
static void run_threads(int p, int m) {
    ThreadStage ts[PMAX];
    pthread_t th[PMAX];
    for (int s = 0; s < p; s++) {
        chan_init(&fwd_ch[s]);
        chan_init(&bwd_ch[s]);
    }
    for (int s = 0; s < p; s++) {
        ts[s] = (ThreadStage){.p = p, .s = s, .m = m};
        pthread_create(&th[s], NULL, stage_thread, &ts[s]);
    }
    for (int s = 0; s < p; s++) pthread_join(th[s], NULL);
    for (int s = 0; s < p; s++) {
        PipeAction a[2 * MMAX];
        const int n = pipeline_schedule(p, s, m, a);
        CHECK(ts[s].r.n == n, "threads p %d m %d stage %d: ran %d of %d", p, m, s, ts[s].r.n, n);
        for (int k = 0; k < n && k < ts[s].r.n; k++)
            CHECK(ts[s].r.log[k][0] == (int)a[k].op && ts[s].r.log[k][1] == a[k].micro,
                  "threads p %d m %d stage %d: action %d out of schedule order", p, m, s, k);
    }
}

int main(void) {
    int worst_ticks = 0;
    for (int p = 1; p <= PMAX; p++)
        for (int m = 1; m <= MMAX; m++) {
            int messages;
            const int ticks = simulate(p, m, &messages);
            CHECK(ticks > 0, "p %d m %d: deadlock", p, m);
            CHECK(messages == 2 * (p - 1) * m, "p %d m %d: %d messages, want %d", p, m, messages, 2 * (p - 1) * m);
            /* unit-time actions: the critical path is 2 (m + p - 1) ticks (one
             * forward of each stage down, all m pairs at the last, one backward
             * of each stage up), the idle fraction (p - 1) / (m + p - 1) */
            CHECK(ticks == 2 * (m + p - 1), "p %d m %d: %d ticks, want %d", p, m, ticks, 2 * (m + p - 1));
            const double idle = 1.0 - (double)(2 * m) / ticks;
            const double theory = pipeline_bubble_theory(p, m);
            CHECK(idle > theory - 1e-12 && idle < theory + 1e-12, "p %d m %d: idle %.4f, theory %.4f", p, m, idle,
                  theory);
            if (ticks > worst_ticks) worst_ticks = ticks;
            for (int s = 0; s < p; s++) {
                Recorder r = {.n = 0};
                PipeAction a[2 * MMAX];
                const int n = pipeline_schedule(p, s, m, a);
                const PipeStage st = {.ctx = &r, .p = p, .s = s, .m = m, .forward = rec_forward,
                                      .backward = rec_backward, .recv_prev = no_exchange, .send_next = no_exchange,
                                      .recv_next = no_exchange, .send_prev = no_exchange};
                CHECK(pipeline_run(&st) == n && r.n == n, "p %d m %d stage %d: ran %d of %d", p, m, s, r.n, n);
                for (int k = 0; k < n && k < r.n; k++) {
                    CHECK(r.log[k][0] == (int)a[k].op && r.log[k][1] == a[k].micro,
                          "p %d m %d stage %d: action %d out of schedule order", p, m, s, k);
                    CHECK(r.log[k][2] == (k == n - 1), "p %d m %d stage %d: 'last' on action %d", p, m, s, k);
                }
            }
        }
    for (int p = 1; p <= PMAX; p++)
        for (int m = 1; m <= MMAX; m++) run_threads(p, m);
    /* p = 1 is gradient accumulation: F0 B0 F1 B1 ... */
    PipeAction a[8];
    pipeline_schedule(1, 0, 4, a);
    for (int k = 0; k < 8; k++)
        CHECK(a[k].op == (k % 2 ? PIPE_BACKWARD : PIPE_FORWARD) && a[k].micro == k / 2, "p 1: action %d", k);
    /* p = 4, M = 8, stage 0: 3 warm-up forwards, then F3 B0 F4 B1 ... */
    PipeAction b[16];
    pipeline_schedule(4, 0, 8, b);
    CHECK(pipeline_warmup(4, 0, 8) == 3 && b[0].micro == 0 && b[2].micro == 2 && b[3].op == PIPE_FORWARD &&
              b[3].micro == 3 && b[4].op == PIPE_BACKWARD && b[4].micro == 0 && b[15].op == PIPE_BACKWARD &&
              b[15].micro == 7,
          "p 4 m 8 stage 0 schedule");
    if (failures) {
        fprintf(stderr, "test_pipeline: %d failures\n", failures);
        return 1;
    }
    printf("test_pipeline: ok: p 1..%d x M 1..%d: no deadlock, 2(p-1)M messages, in flight min(p-s, M), "
           "2(M+p-1) ticks = bubble (p-1)/(M+p-1) (longest %d ticks); threads over rendezvous channels complete\n", PMAX, MMAX, worst_ticks);
    return 0;
}
