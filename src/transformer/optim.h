/* optim.h: AdamW over the contiguous parameter buffer, the learning-rate
 * schedule (linear warmup, then inverse square root or cosine decay) and global-norm
 * gradient clipping, all on the backend's device. The optimizer state
 * (m, v) uses the parameter table's offsets, so it is two more buffers of
 * the same size (MEM_OPTIM). The norm and the clipping factor stay on the
 * device (grad_clip); grad_global_norm reads the norm back for callers
 * that want it at once (tests). */
#ifndef TPTRAIN_OPTIM_H
#define TPTRAIN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include "kernels/backend.h"
#include "tp/comm.h"
#include "transformer/params.h"

/* After the warmup: inverse square root of the step (Vaswani et al.; no
 * end in sight, so a run can be extended), or a cosine from the peak to 0
 * at decay_steps (the run's last step), which spends a short run's budget
 * better (or at the time horizon of --max-minutes: lr_at_frac). */
typedef enum { LR_INV_SQRT = 0, LR_COSINE = 1 } LrSchedule;

typedef struct {
    float lr;            // peak learning rate
    int warmup;          // steps of linear warmup (0: constant lr)
    LrSchedule schedule;
    int decay_steps;     // LR_COSINE: the step where lr reaches 0 (the run's length)
    float beta1, beta2, eps;
    float weight_decay;  // applied to tensors with decay = true
    float clip_norm;     // global gradient norm limit (<= 0: no clipping)
} OptimConfig;

/* A piece of the parameter buffer whose optimizer state a rank holds:
 * parameters [lo, hi) <-> state (and shard gradients) [at, at + hi - lo).
 * The whole buffer is the one range {0, n, 0}; under ZeRO (train/grad_sync.h)
 * a rank holds one piece of every gradient bucket. */
typedef struct {
    size_t lo, hi, at;
} OptRange;

typedef struct {
    OptimConfig cfg;
    Backend *be;
    float *m, *v;        // (n_elems) first and second moments, device
    size_t n_elems;      // state elements (a ZeRO shard may end in padding)
    OptRange *ranges;    // [n_ranges], ascending lo
    int n_ranges;
    bool sharded;        // the state covers a ZeRO shard, not the whole buffer
    bool grads_at_state; // adamw_step's grads are indexed like the state (ZeRO-2's shard), not like params
    int zero_stage;      // the ZeRO stage and bucket length the ranges come from (0: the whole buffer),
    size_t zero_bucket_elems;  // recorded by checkpoints
    int t;               // steps taken
    OpSegTable *segs;    // the ranges' tensor pieces, one adamw_segs launch (built at the first step)
    const ParamTable *segs_tab;  // the table they were built from
} AdamW;

/* Defaults: lr 5e-4, warmup 4000, betas (0.9, 0.98), eps 1e-9 (Vaswani et
 * al.), weight decay 0.01, clip norm 1.0. */
OptimConfig optim_defaults(void);

/* State for the whole buffer of n_elems parameters. */
void adamw_init(AdamW *opt, Backend *be, const OptimConfig *cfg, size_t n_elems);
/* State for the pieces r[0..n_ranges) only (ZeRO): state_elems elements,
 * each range's state at its `at`. */
void adamw_init_sharded(AdamW *opt, Backend *be, const OptimConfig *cfg, size_t state_elems, const OptRange *r,
                        int n_ranges);
void adamw_free(AdamW *opt);

/* lr(step), step >= 1: peak * step / warmup during the warmup; then
 * LR_INV_SQRT: peak * sqrt(warmup / step) (warmup 0: constant peak);
 * LR_COSINE: peak * (1 + cos(pi * (step - warmup) / (decay_steps - warmup))) / 2,
 * 0 from decay_steps on. */
float lr_at(const OptimConfig *cfg, int step);
/* lr_at with a time horizon (--max-minutes): time_frac is the fraction of
 * the decay's time span used by the end of this step (>= 0; < 0: no
 * horizon). After the warmup, LR_COSINE follows whichever of the step
 * fraction (step - warmup) / (decay_steps - warmup) and time_frac is
 * further on, so it reaches 0 when either the steps or the time run out;
 * the warmup stays in steps and LR_INV_SQRT ignores the horizon. */
float lr_at_frac(const OptimConfig *cfg, int step, double time_frac);

/* "inv-sqrt" or "cosine" into *out; -1 for anything else. */
int lr_schedule_parse(const char *s, LrSchedule *out);
const char *lr_schedule_name(LrSchedule s);

/* On the device, into sc (4 device floats): the sums of squares of the
 * sharded tensors (summed over the tp group, which may be NULL) and of the
 * replicated ones (counted once) in sc[0], sc[1]; the global L2 norm in
 * sc[2]; the clipping factor min(1, max_norm / (norm + 1e-6)) in sc[3] (as
 * torch.nn.utils.clip_grad_norm_; max_norm <= 0: 1); grads scaled by it.
 * Nothing is read back. */
/* Pipeline stages: the sums also run over pp, and skip_embed leaves out
 * the tied embedding (a later stage's copy of the first stage's). NULL:
 * one stage. */
typedef struct {
    Comm *pp;
    bool skip_embed;
} GradNormPipe;
/* segs: grad_norm_segs(be, tab, false, NULL, 0, pipe), made once. */
void grad_clip(Backend *be, const ParamTable *tab, const OpSegTable *segs, float *grads, Comm *tp,
               const GradNormPipe *pipe, float max_norm, float *sc);

/* The segment table of the norm's one launch (kernels/ops.h,
 * op_sumsq_segs): each tensor's piece in r[0..n_ranges) (r NULL: the whole
 * buffer, each tensor), the gradients at the state's index when at_state,
 * summed into accumulator 0 (sharded) or 1 (replicated); pipe's
 * skip_embed leaves out the tied embedding. Uploaded (MEM_WORKSPACE: op metadata, not state); free
 * with op_segs_free. */
OpSegTable *grad_norm_segs(Backend *be, const ParamTable *tab, bool at_state, const OptRange *r, int n_ranges,
                           const GradNormPipe *pipe);

/* The norm alone, read back (a sync point): for tests and tools. */
float grad_global_norm(Backend *be, const ParamTable *tab, const float *grads, Comm *tp);
/* Scales grads by min(1, max_norm / (norm + 1e-6)) for a norm the caller
 * holds on the host (tests and tools; the trainer uses grad_clip). */
void clip_grads(Backend *be, float *grads, size_t n_elems, float norm, float max_norm);

/* One AdamW step at learning rate lr over the parameters the state covers:
 * for each range, params[lo, hi) with grads[lo, hi) (grads indexed like
 * params; grads_at_state: like the state, at `at`) and the state at `at`,
 * each tensor's piece with its decay: one op_adamw_segs launch over a table
 * built (and uploaded, MEM_WORKSPACE) at the first step for tab. */
void adamw_step(AdamW *opt, float *params, const float *grads, const ParamTable *tab, float lr);

/* grad_clip for a ZeRO shard: only the ranges hold reduced gradients, at
 * grads[lo, hi) (at_state: at grads[at, at + hi - lo)); their sums of
 * squares are summed over dp (then the sharded part over tp) before the
 * norm, and only they are scaled. sc as grad_clip; segs:
 * grad_norm_segs(be, tab, at_state, r, n_ranges, pipe), made once. */
void grad_clip_ranges(Backend *be, const OpSegTable *segs, float *grads, bool at_state, const OptRange *r,
                      int n_ranges, Comm *tp, Comm *dp, const GradNormPipe *pipe, float max_norm, float *sc);

#endif
