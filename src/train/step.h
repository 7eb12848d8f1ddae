/* step.h: one training step on any backend: forward and backward of the
 * (local share of the) global batch, the data-parallel gradient reduction
 * (train/grad_sync.h: bucketed, overlapped with backward where it can be,
 * fp32 or bf16, or ZeRO-1's reduce-scatter), the global norm over the
 * tensor-parallel group and clipping, AdamW (on this rank's shard under
 * ZeRO, then the allgather of the updated weights), the re-cast of the
 * compute weights, and the step's one read of its scalars. train_mt's run
 * (src/app/run.c) only wires flags, data, evaluation and checkpoints to it. The
 * micro-batches run through the pipeline schedule (train/pipeline.h). */
#ifndef TPTRAIN_STEP_H
#define TPTRAIN_STEP_H

#include "kernels/backend.h"
#include "tp/comm.h"
#include "train/grad_sync.h"
#include "train/graphs.h"
#include "transformer/model.h"
#include "transformer/optim.h"

typedef struct {
    Model *m;
    AdamW *opt;
    Backend *be;
    Comm *tp, *dp;       // this rank's groups (size-1 groups allowed)
    GradSync *gs;        // the dp reduction (not owned)
    float clip_norm;     // <= 0: no clipping
    float *sc;           // device: the step's scalars (loss sum, then grad_clip's four)
    OpSegTable *norm_segs; // the gradient norm's segment table (grad_norm_segs), made at the first step
    Comm *pp;            // the pipeline group (NULL or size 1: no pipeline)
    float *embed_zeros;  // pp > 1 on a stage without the embedding: its share of the embedding group's sum
    double pp_wait_s;    // wall time in the pipeline's exchanges, summed over steps
    long pp_sent, pp_received;  // stage messages (one micro-batch's boundary tensors), summed over steps
    StepGraphs *graphs;  // trainer_use_graphs: forward and backward replayed as graphs; NULL: off
    StepVars *step_vars; // device: what the graphs read per micro-batch (with graphs)
} Trainer;

typedef struct {
    float loss;          // mean over the global batch's target tokens
    float grad_norm;     // before clipping
    float lr;
    double comm_s;       // wall time in data-parallel collectives (hidden or not)
    double exposed_comm_s;  // of which the step waited for (not hidden behind backward)
    double pp_wait_s;    // in the pipeline's exchanges (the stage's idle time, transfers included)
} StepResult;

/* opt must have been made by grad_sync_adamw_init(gs, ...) so that its
 * state matches the reduction (the whole buffer, or the ZeRO shard). */
void trainer_init(Trainer *t, Model *m, AdamW *opt, Comm *tp, Comm *dp, GradSync *gs, float clip_norm);
/* Pipeline stages: m is the stage of pp rank comm_rank(pp) (model_create_stage).
 * Each step then runs the 1F1B schedule with the neighbouring stages, sums
 * the tied embedding's gradients over the stages that hold it (a pp
 * allreduce in which the others add zeros) before the dp reduction of its
 * bucket, and sums the loss and the norm over the stages. ZeRO-2 is not
 * supported with stages. */
void trainer_set_pipeline(Trainer *t, Comm *pp);
void trainer_free(Trainer *t);

/* Replays each micro-batch's forward and backward as graphs from the
 * second time its shape comes (train/graphs.h: at most max_graphs of
 * them), with results equal bit for bit to the steps run op by op. One
 * rank only (tp, dp and pp 1: the collectives are not captured): -1 and one
 * sentence in err otherwise. Not with --profile (train_mt refuses the pair
 * with its flags; backend_capture_begin stops a capture under a profile). */
int trainer_use_graphs(Trainer *t, int max_graphs, char *err, size_t err_len);

/* AdamW state for what the rank updates under gs: the whole buffer
 * (zero 0) or its ZeRO pieces. */
void grad_sync_adamw_init(GradSync *gs, AdamW *opt, Backend *be, const OptimConfig *cfg);

/* One step at learning rate lr on this rank's n_micro micro-batches b[i]
 * (B may be 0 when the rank has no rows) of a global batch with n_global
 * target tokens: their gradients accumulate, and the dp reduction runs once
 * (ZeRO-2: once per micro-batch). key.micro is the rank's first global
 * micro-batch index (its dp rank); micro-batch i uses key.micro + i dp.
 * Every rank of the tp and dp groups calls it. */
void train_step(Trainer *t, const Batch *b, int n_micro, long n_global, DropoutKey key, float lr, StepResult *out);

#endif
