/* optim.h: AdamW over the contiguous parameter buffer, the learning-rate
 * schedule (linear warmup, then inverse square root) and global-norm
 * gradient clipping. The optimizer state (m, v) uses the parameter table's
 * offsets, so it is two more buffers of the same size. */
#ifndef TPTRAIN_OPTIM_H
#define TPTRAIN_OPTIM_H

#include <stddef.h>
#include "tp/comm.h"
#include "transformer/params.h"

typedef struct {
    float lr;            // peak learning rate
    int warmup;          // steps of linear warmup (0: constant lr)
    float beta1, beta2, eps;
    float weight_decay;  // applied to tensors with decay = true
    float clip_norm;     // global gradient norm limit (<= 0: no clipping)
} OptimConfig;

typedef struct {
    OptimConfig cfg;
    float *m, *v;        // (n_elems) first and second moments
    size_t n_elems;
    int t;               // steps taken
} AdamW;

/* Defaults: lr 5e-4, warmup 4000, betas (0.9, 0.98), eps 1e-9 (Vaswani et
 * al.), weight decay 0.01, clip norm 1.0. */
OptimConfig optim_defaults(void);

void adamw_init(AdamW *opt, const OptimConfig *cfg, size_t n_elems);
void adamw_free(AdamW *opt);

/* lr(step) = peak * min(step / warmup, sqrt(warmup / step)), step >= 1. */
float lr_at(const OptimConfig *cfg, int step);

/* Global L2 norm of the whole model's gradient: sharded tensors summed over
 * the tp group (tp may be NULL), replicated ones counted once. */
float grad_global_norm(const ParamTable *tab, const float *grads, Comm *tp);

/* Scales grads so their global norm is at most max_norm, as
 * torch.nn.utils.clip_grad_norm_ does (factor max_norm / (norm + 1e-6)).
 * norm is the value grad_global_norm returned. */
void clip_grads(float *grads, size_t n_elems, float norm, float max_norm);

/* One AdamW step at learning rate lr over every tensor of tab. */
void adamw_step(AdamW *opt, float *params, const float *grads, const ParamTable *tab, float lr);

#endif
