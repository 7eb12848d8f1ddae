/* pipeline.h: the 1F1B schedule of one training step, model-agnostic.
 *
 * A step runs M micro-batches through p pipeline stages. Stage s (0-based)
 * runs min(p - s - 1, M) forwards first (warm-up), then alternates one
 * forward and one backward (steady state) and ends with the backwards left
 * (cool-down), as in PipeDream-Flush / Megatron's non-interleaved schedule.
 * A stage holds at most min(p - s, M) micro-batches in flight (forward
 * done, backward not), which bounds its activation memory. With p = 1 the
 * schedule is F0 B0 F1 B1 ...: plain gradient accumulation.
 *
 * The schedule is a list of actions per stage; pipeline_run executes one
 * stage's list through callbacks (the model's forward and backward of one
 * micro-batch and the point-to-point exchanges with the neighbouring
 * stages), so this file knows nothing of the model or of the transport.
 * Each forward of a stage other than the last sends its output to the next
 * stage, each backward of a stage other than the first sends its input
 * gradient to the previous one: 2 (p - 1) M messages per step in all.
 */
#ifndef TPTRAIN_PIPELINE_H
#define TPTRAIN_PIPELINE_H

typedef enum { PIPE_FORWARD = 0, PIPE_BACKWARD = 1 } PipeOp;

typedef struct {
    PipeOp op;
    int micro;  // micro-batch index, 0..M-1
} PipeAction;

/* Stage s's actions (2M of them) into out; returns the count. */
int pipeline_schedule(int p, int s, int m, PipeAction *out);
/* Warm-up forwards and the largest number of micro-batches in flight at stage s. */
int pipeline_warmup(int p, int s, int m);
int pipeline_max_in_flight(int p, int s, int m);
/* The idle fraction of an ideal 1F1B step with equal stage times: (p - 1) / (m + p - 1). */
double pipeline_bubble_theory(int p, int m);

typedef struct {
    void *ctx;
    int p, s, m;  // stages, this stage, micro-batches
    /* forward of micro-batch i (its input already received) */
    void (*forward)(void *ctx, int micro);
    /* backward of micro-batch i (its output gradient already received);
     * last is set for the stage's final backward of the step (where the
     * data-parallel gradient reduction may start) */
    void (*backward)(void *ctx, int micro, int last);
    /* The exchanges with the neighbours, blocking (NULL when p = 1):
     * micro-batch i's input from stage s - 1, its output to s + 1, its
     * output gradient from s + 1, its input gradient to s - 1. */
    void (*recv_prev)(void *ctx, int micro);
    void (*send_next)(void *ctx, int micro);
    void (*recv_next)(void *ctx, int micro);
    void (*send_prev)(void *ctx, int micro);
} PipeStage;

/* Runs stage st->s's schedule; returns the number of forwards and
 * backwards run. The exchanges follow Megatron's non-interleaved 1F1B:
 * warm-up forwards each receive their input and send their output; in the
 * steady state a forward's output goes out while the gradient for the
 * next backward comes in, and a backward's input gradient goes out while
 * the next forward's input comes in. Those pairs are ordered by the stage's
 * parity (an even stage sends first, an odd one receives first), so the
 * step completes even when every send waits for its receive (no buffering
 * in the transport). */
int pipeline_run(const PipeStage *st);

#endif
