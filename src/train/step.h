/* step.h: one training step on any backend: forward and backward of the
 * (local share of the) global batch, the data-parallel gradient reduction,
 * the global norm over the tensor-parallel group and clipping, AdamW, the
 * re-cast of the compute weights, and the step's one read of its scalars.
 * train_mt.c's main only wires flags, data, evaluation and checkpoints to
 * it; the pipeline schedule and ZeRO will grow here. */
#ifndef TPTRAIN_STEP_H
#define TPTRAIN_STEP_H

#include "kernels/backend.h"
#include "tp/comm.h"
#include "transformer/model.h"
#include "transformer/optim.h"

typedef struct {
    Model *m;
    AdamW *opt;
    Backend *be;
    Comm *tp, *dp;       // this rank's groups (size-1 groups allowed)
    float clip_norm;     // <= 0: no clipping
    float *sc;           // device: the step's scalars (loss sum, then grad_clip's four)
} Trainer;

typedef struct {
    float loss;          // mean over the global batch's target tokens
    float grad_norm;     // before clipping
    float lr;
    double comm_s;       // wall time in data-parallel collectives
} StepResult;

void trainer_init(Trainer *t, Model *m, AdamW *opt, Comm *tp, Comm *dp, float clip_norm);
void trainer_free(Trainer *t);

/* One step at learning rate lr on this rank's batch b (B may be 0 when the
 * rank has no rows this step) of a global batch with n_global target
 * tokens. Every rank of the tp and dp groups calls it. */
void train_step(Trainer *t, const Batch *b, long n_global, DropoutKey key, float lr, StepResult *out);

#endif
