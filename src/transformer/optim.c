/* optim.c: the optimizer step over the table of tensors. One op call per
 * tensor keeps weight decay per tensor; a fused multi-tensor kernel can
 * replace the loop on GPUs without changing this interface. */
#include "transformer/optim.h"

#include <math.h>
#include <string.h>
#include "err.h"
#include "kernels/ops.h"

#define TP_PI 3.14159265358979323846

OptimConfig optim_defaults(void) {
    return (OptimConfig){.lr = 5e-4f, .warmup = 4000, .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-9f,
                         .weight_decay = 0.01f, .clip_norm = 1.0f};
}

void adamw_init(AdamW *opt, Backend *be, const OptimConfig *cfg, size_t n_elems) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->be = be;
    opt->n_elems = n_elems;
    opt->m = backend_alloc(be, n_elems * sizeof(float), MEM_OPTIM);
    opt->v = backend_alloc(be, n_elems * sizeof(float), MEM_OPTIM);
}

void adamw_free(AdamW *opt) {
    if (opt->be) {
        backend_free(opt->be, opt->m);
        backend_free(opt->be, opt->v);
    }
    memset(opt, 0, sizeof *opt);
}

float lr_at(const OptimConfig *cfg, int step) {
    if (step < 1) step = 1;
    const double s = step, w = cfg->warmup;
    if (s < w) return (float)(cfg->lr * s / w);
    if (cfg->schedule == LR_COSINE) {
        const double span = (double)cfg->decay_steps - w;
        if (span <= 0.0) return cfg->lr;
        if (s >= (double)cfg->decay_steps) return 0.0f;
        return (float)(cfg->lr * 0.5 * (1.0 + cos(TP_PI * (s - w) / span)));
    }
    if (cfg->warmup <= 0) return cfg->lr;
    return (float)(cfg->lr * sqrt(w / s));
}

int lr_schedule_parse(const char *s, LrSchedule *out) {
    if (strcmp(s, "inv-sqrt") == 0) *out = LR_INV_SQRT;
    else if (strcmp(s, "cosine") == 0) *out = LR_COSINE;
    else return -1;
    return 0;
}

const char *lr_schedule_name(LrSchedule s) { return s == LR_COSINE ? "cosine" : "inv-sqrt"; }

/* sumsq of the sharded tensors into sc[0] (then summed over tp), of the
 * replicated ones into sc[1]. */
static void grad_sumsq(Backend *be, const ParamTable *tab, const float *grads, Comm *tp, float *sc) {
    op_zero(be, sc, 2);
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        op_sumsq_acc(be, p->split == SPLIT_REPL ? sc + 1 : sc, grads + p->offset, p->n_elems);
    }
    if (tp && comm_size(tp) > 1) TP_CHECK(comm_allreduce(tp, sc, 1, COMM_SUM) == 0, "%s", comm_error(tp));
}

void grad_clip(Backend *be, const ParamTable *tab, float *grads, Comm *tp, float max_norm, float *sc) {
    grad_sumsq(be, tab, grads, tp, sc);
    op_clip_coef(be, sc + 2, sc, 2, max_norm);
    if (max_norm > 0.0f) op_scale_by(be, grads, sc + 3, tab->n_elems);
}

float grad_global_norm(Backend *be, const ParamTable *tab, const float *grads, Comm *tp) {
    float *sc = backend_alloc(be, 4 * sizeof(float), MEM_WORKSPACE);
    grad_sumsq(be, tab, grads, tp, sc);
    op_clip_coef(be, sc + 2, sc, 2, 0.0f);
    float norm = 0.0f;
    backend_download(be, &norm, sc + 2, sizeof norm);
    backend_free(be, sc);
    return norm;
}

void clip_grads(Backend *be, float *grads, size_t n_elems, float norm, float max_norm) {
    if (max_norm <= 0.0f) return;
    float coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) op_scale(be, grads, coef, n_elems);
}

void adamw_step(AdamW *opt, float *params, const float *grads, const ParamTable *tab, float lr) {
    const OptimConfig *c = &opt->cfg;
    TP_CHECK(tab->n_elems == opt->n_elems, "optimizer state has %zu elements, parameters %zu",
             opt->n_elems, tab->n_elems);
    opt->t++;
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        op_adamw(opt->be, params + p->offset, grads + p->offset, opt->m + p->offset, opt->v + p->offset, p->n_elems, lr,
                 c->beta1, c->beta2, c->eps, p->decay ? c->weight_decay : 0.0f, opt->t);
    }
}
