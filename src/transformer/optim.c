/* optim.c: the optimizer step over the table of tensors. One op call per
 * tensor keeps weight decay per tensor; a fused multi-tensor kernel can
 * replace the loop on GPUs without changing this interface. */
#include "transformer/optim.h"

#include <math.h>
#include <string.h>
#include "err.h"
#include "kernels/ops.h"

OptimConfig optim_defaults(void) {
    return (OptimConfig){.lr = 5e-4f, .warmup = 4000, .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-9f,
                         .weight_decay = 0.01f, .clip_norm = 1.0f};
}

void adamw_init(AdamW *opt, const OptimConfig *cfg, size_t n_elems) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->n_elems = n_elems;
    opt->m = TP_CALLOC(n_elems, sizeof(float));
    opt->v = TP_CALLOC(n_elems, sizeof(float));
}

void adamw_free(AdamW *opt) {
    free(opt->m);
    free(opt->v);
    memset(opt, 0, sizeof *opt);
}

float lr_at(const OptimConfig *cfg, int step) {
    if (step < 1) step = 1;
    if (cfg->warmup <= 0) return cfg->lr;
    double s = step, w = cfg->warmup;
    double f = s < w ? s / w : sqrt(w / s);
    return (float)(cfg->lr * f);
}

float grad_global_norm(const ParamTable *tab, const float *grads, Comm *tp) {
    double shard = 0.0, repl = 0.0;
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        double s = op_sumsq(grads + p->offset, p->n_elems);
        if (p->split == SPLIT_REPL) repl += s;
        else shard += s;
    }
    if (tp && comm_size(tp) > 1) {
        float v = (float)shard;
        TP_CHECK(comm_allreduce(tp, &v, 1, COMM_SUM) == 0, "%s", comm_error(tp));
        shard = v;
    }
    return (float)sqrt(shard + repl);
}

void clip_grads(float *grads, size_t n_elems, float norm, float max_norm) {
    if (max_norm <= 0.0f) return;
    float coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) op_scale(grads, coef, n_elems);
}

void adamw_step(AdamW *opt, float *params, const float *grads, const ParamTable *tab, float lr) {
    const OptimConfig *c = &opt->cfg;
    TP_CHECK(tab->n_elems == opt->n_elems, "optimizer state has %zu elements, parameters %zu",
             opt->n_elems, tab->n_elems);
    opt->t++;
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        op_adamw(params + p->offset, grads + p->offset, opt->m + p->offset, opt->v + p->offset, p->n_elems, lr,
                 c->beta1, c->beta2, c->eps, p->decay ? c->weight_decay : 0.0f, opt->t);
    }
}
