/* optim.c: the optimizer step over the table of tensors. One op call per
 * tensor keeps weight decay per tensor; a fused multi-tensor kernel can
 * replace the loop on GPUs without changing this interface. */
#include "transformer/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "err.h"
#include "kernels/ops.h"

#define TP_PI 3.14159265358979323846

OptimConfig optim_defaults(void) {
    return (OptimConfig){.lr = 5e-4f, .warmup = 4000, .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-9f,
                         .weight_decay = 0.01f, .clip_norm = 1.0f};
}

void adamw_init_sharded(AdamW *opt, Backend *be, const OptimConfig *cfg, size_t state_elems, const OptRange *r,
                        int n_ranges) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->be = be;
    opt->n_elems = state_elems;
    opt->n_ranges = n_ranges;
    opt->ranges = TP_MALLOC((size_t)(n_ranges > 0 ? n_ranges : 1) * sizeof *opt->ranges);
    for (int i = 0; i < n_ranges; i++) {
        TP_CHECK(r[i].lo <= r[i].hi && r[i].at + (r[i].hi - r[i].lo) <= state_elems && (i == 0 || r[i].lo >= r[i - 1].hi),
                 "optimizer range %d [%zu, %zu) at %zu does not fit %zu state elements in order", i, r[i].lo, r[i].hi,
                 r[i].at, state_elems);
        opt->ranges[i] = r[i];
    }
    opt->sharded = true;
    opt->m = backend_alloc(be, state_elems * sizeof(float), MEM_OPTIM);
    opt->v = backend_alloc(be, state_elems * sizeof(float), MEM_OPTIM);
}

void adamw_init(AdamW *opt, Backend *be, const OptimConfig *cfg, size_t n_elems) {
    const OptRange whole = {0, n_elems, 0};
    adamw_init_sharded(opt, be, cfg, n_elems, &whole, 1);
    opt->sharded = false;
}

void adamw_free(AdamW *opt) {
    if (opt->be) {
        backend_free(opt->be, opt->m);
        backend_free(opt->be, opt->v);
    }
    free(opt->ranges);
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
/* Whether tensor p counts towards the norm on this pipeline stage: the
 * tied embedding's copies on later stages of the embedding group hold the
 * same summed gradient as the first stage's, which alone counts it. */
static bool counts(const ParamInfo *p, const GradNormPipe *pipe) {
    return !pipe || !pipe->skip_embed || strcmp(p->name, "embed.weight") != 0;
}

/* Sums over the pipeline stages (both parts: each stage holds other tensors). */
static void sum_over_stages(const GradNormPipe *pipe, float *sc) {
    if (pipe && pipe->pp && comm_size(pipe->pp) > 1)
        TP_CHECK(comm_allreduce(pipe->pp, sc, 2, COMM_SUM) == 0, "%s", comm_error(pipe->pp));
}

static void grad_sumsq(Backend *be, const ParamTable *tab, const float *grads, Comm *tp, const GradNormPipe *pipe,
                       float *sc) {
    op_zero(be, sc, 2);
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        if (counts(p, pipe)) op_sumsq_acc(be, p->split == SPLIT_REPL ? sc + 1 : sc, grads + p->offset, p->n_elems);
    }
    if (tp && comm_size(tp) > 1) TP_CHECK(comm_allreduce(tp, sc, 1, COMM_SUM) == 0, "%s", comm_error(tp));
    sum_over_stages(pipe, sc);
}

void grad_clip(Backend *be, const ParamTable *tab, float *grads, Comm *tp, const GradNormPipe *pipe, float max_norm,
               float *sc) {
    grad_sumsq(be, tab, grads, tp, pipe, sc);
    op_clip_coef(be, sc + 2, sc, 2, max_norm);
    if (max_norm > 0.0f) op_scale_by(be, grads, sc + 3, tab->n_elems);
}

float grad_global_norm(Backend *be, const ParamTable *tab, const float *grads, Comm *tp) {
    float *sc = backend_alloc(be, 4 * sizeof(float), MEM_WORKSPACE);
    grad_sumsq(be, tab, grads, tp, NULL, sc);
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
    TP_CHECK(opt->sharded || tab->n_elems == opt->n_elems, "optimizer state has %zu elements, parameters %zu",
             opt->n_elems, tab->n_elems);
    opt->t++;
    for (int k = 0; k < opt->n_ranges; k++) {
        const OptRange *r = &opt->ranges[k];
        TP_CHECK(r->hi <= tab->n_elems, "optimizer range [%zu, %zu) beyond the %zu parameters", r->lo, r->hi,
                 tab->n_elems);
        for (int i = param_table_index_at(tab, r->lo); i >= 0 && i < tab->n && tab->t[i].offset < r->hi; i++) {
            const ParamInfo *p = &tab->t[i];
            const size_t x0 = p->offset > r->lo ? p->offset : r->lo;
            const size_t x1 = p->offset + p->n_elems < r->hi ? p->offset + p->n_elems : r->hi;
            if (x1 <= x0) continue;
            const size_t s = r->at + (x0 - r->lo);
            op_adamw(opt->be, params + x0, grads + (opt->grads_at_state ? s : x0), opt->m + s, opt->v + s, x1 - x0, lr,
                     c->beta1, c->beta2, c->eps,
                     p->decay ? c->weight_decay : 0.0f, opt->t);
        }
    }
}

void grad_clip_ranges(Backend *be, const ParamTable *tab, float *grads, bool at_state, const OptRange *r,
                      int n_ranges, Comm *tp, Comm *dp, const GradNormPipe *pipe, float max_norm, float *sc) {
    op_zero(be, sc, 2);
    for (int k = 0; k < n_ranges; k++) {
        for (int i = param_table_index_at(tab, r[k].lo); i >= 0 && i < tab->n && tab->t[i].offset < r[k].hi; i++) {
            const ParamInfo *p = &tab->t[i];
            const size_t x0 = p->offset > r[k].lo ? p->offset : r[k].lo;
            const size_t x1 = p->offset + p->n_elems < r[k].hi ? p->offset + p->n_elems : r[k].hi;
            const size_t at = at_state ? r[k].at + (x0 - r[k].lo) : x0;
            if (x1 > x0 && counts(p, pipe)) op_sumsq_acc(be, p->split == SPLIT_REPL ? sc + 1 : sc, grads + at, x1 - x0);
        }
    }
    if (dp && comm_size(dp) > 1) TP_CHECK(comm_allreduce(dp, sc, 2, COMM_SUM) == 0, "%s", comm_error(dp));
    if (tp && comm_size(tp) > 1) TP_CHECK(comm_allreduce(tp, sc, 1, COMM_SUM) == 0, "%s", comm_error(tp));
    sum_over_stages(pipe, sc);
    op_clip_coef(be, sc + 2, sc, 2, max_norm);
    if (max_norm > 0.0f)
        for (int k = 0; k < n_ranges; k++)
            op_scale_by(be, grads + (at_state ? r[k].at : r[k].lo), sc + 3, r[k].hi - r[k].lo);
}
