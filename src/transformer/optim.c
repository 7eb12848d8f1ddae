/* optim.c: the optimizer step over the table of tensors. The tensors (or
 * their pieces in a ZeRO shard) become segment tables (kernels/segs.c),
 * uploaded once, so the gradient norm and the AdamW update are one launch
 * each however many tensors the model has; each segment keeps its tensor's
 * weight decay and its part of the norm. */
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
        op_segs_free(opt->be, opt->segs);
    }
    free(opt->ranges);
    memset(opt, 0, sizeof *opt);
}

float lr_at(const OptimConfig *cfg, int step) { return lr_at_frac(cfg, step, -1.0); }

float lr_at_frac(const OptimConfig *cfg, int step, double time_frac) {
    if (step < 1) step = 1;
    const double s = step, w = cfg->warmup;
    if (s < w) return (float)(cfg->lr * s / w);
    if (cfg->schedule == LR_COSINE) {
        const double span = (double)cfg->decay_steps - w;
        if (time_frac >= 0.0 && (span <= 0.0 || time_frac > (s - w) / span)) {  // the clock ends first
            if (time_frac >= 1.0) return 0.0f;
            return (float)(cfg->lr * 0.5 * (1.0 + cos(TP_PI * time_frac)));
        }
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

/* Appends to segs the pieces of the tensors in range r, one per tensor
 * piece: the gradients at the state's index when at_state, else at the
 * parameters'; x is the parameters (AdamW), or the gradients for the norm. */
static int range_segs(const ParamTable *tab, const OptRange *r, bool at_state, bool norm, const GradNormPipe *pipe,
                      OpSeg *segs, int n) {
    for (int i = param_table_index_at(tab, r->lo); i >= 0 && i < tab->n && tab->t[i].offset < r->hi; i++) {
        const ParamInfo *p = &tab->t[i];
        const size_t x0 = p->offset > r->lo ? p->offset : r->lo;
        const size_t x1 = p->offset + p->n_elems < r->hi ? p->offset + p->n_elems : r->hi;
        if (x1 <= x0 || !counts(p, pipe)) continue;
        const size_t at = r->at + (x0 - r->lo);
        const size_t g = at_state ? at : x0;
        segs[n++] = (OpSeg){.x_at = norm ? g : x0, .g_at = g, .s_at = at, .n = x1 - x0,
                            .acc = p->split == SPLIT_REPL ? 1 : 0, .decay = p->decay};
    }
    return n;
}

/* The segments of r[0..n_ranges): pieces of at most one tensor each, in order. */
static OpSegTable *ranges_segs(Backend *be, const ParamTable *tab, bool at_state, bool norm, const OptRange *r,
                               int n_ranges, const GradNormPipe *pipe) {
    size_t cap = 0;  // a range cuts at most its tensors
    for (int k = 0; k < n_ranges; k++) cap += (size_t)tab->n + 1;
    OpSeg *segs = TP_MALLOC((cap > 0 ? cap : 1) * sizeof *segs);
    int n = 0;
    for (int k = 0; k < n_ranges; k++) n = range_segs(tab, &r[k], at_state, norm, pipe, segs, n);
    OpSegTable *t = op_segs_create(be, segs, n, MEM_WORKSPACE);
    free(segs);
    return t;
}

OpSegTable *grad_norm_segs(Backend *be, const ParamTable *tab, bool at_state, const OptRange *r, int n_ranges,
                           const GradNormPipe *pipe) {
    const OptRange whole = {0, tab->n_elems, 0};
    return r ? ranges_segs(be, tab, at_state, true, r, n_ranges, pipe) : ranges_segs(be, tab, false, true, &whole, 1, pipe);
}

/* sumsq of the sharded tensors into sc[0] (then summed over tp), of the
 * replicated ones into sc[1]: one launch over the table. */
static void grad_sumsq(Backend *be, const OpSegTable *segs, const float *grads, Comm *tp, const GradNormPipe *pipe,
                       float *sc) {
    op_zero(be, sc, 2);
    op_sumsq_segs(be, sc, grads, segs);
    if (tp && comm_size(tp) > 1) TP_CHECK(comm_allreduce(tp, sc, 1, COMM_SUM) == 0, "%s", comm_error(tp));
    sum_over_stages(pipe, sc);
}

void grad_clip(Backend *be, const ParamTable *tab, const OpSegTable *segs, float *grads, Comm *tp,
               const GradNormPipe *pipe, float max_norm, float *sc) {
    grad_sumsq(be, segs, grads, tp, pipe, sc);
    op_clip_coef(be, sc + 2, sc, 2, max_norm);
    if (max_norm > 0.0f) op_scale_by(be, grads, sc + 3, tab->n_elems);
}

float grad_global_norm(Backend *be, const ParamTable *tab, const float *grads, Comm *tp) {
    float *sc = backend_alloc(be, 4 * sizeof(float), MEM_WORKSPACE);
    OpSegTable *segs = grad_norm_segs(be, tab, false, NULL, 0, NULL);
    grad_sumsq(be, segs, grads, tp, NULL, sc);
    op_clip_coef(be, sc + 2, sc, 2, 0.0f);
    float norm = 0.0f;
    backend_download(be, &norm, sc + 2, sizeof norm);
    op_segs_free(be, segs);
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
    for (int k = 0; k < opt->n_ranges; k++)
        TP_CHECK(opt->ranges[k].hi <= tab->n_elems, "optimizer range [%zu, %zu) beyond the %zu parameters",
                 opt->ranges[k].lo, opt->ranges[k].hi, tab->n_elems);
    if (opt->segs && opt->segs_tab != tab) {  // built for another table: build again
        op_segs_free(opt->be, opt->segs);
        opt->segs = NULL;
    }
    if (!opt->segs) {  // every tensor piece counts here (the norm's pipe rule does not apply)
        opt->segs = ranges_segs(opt->be, tab, opt->grads_at_state, false, opt->ranges, opt->n_ranges, NULL);
        opt->segs_tab = tab;
    }
    opt->t++;
    op_adamw_segs(opt->be, params, grads, opt->m, opt->v, opt->segs, lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                  opt->t);
}

void grad_clip_ranges(Backend *be, const OpSegTable *segs, float *grads, bool at_state, const OptRange *r,
                      int n_ranges, Comm *tp, Comm *dp, const GradNormPipe *pipe, float max_norm, float *sc) {
    op_zero(be, sc, 2);
    op_sumsq_segs(be, sc, grads, segs);
    if (dp && comm_size(dp) > 1) TP_CHECK(comm_allreduce(dp, sc, 2, COMM_SUM) == 0, "%s", comm_error(dp));
    if (tp && comm_size(tp) > 1) TP_CHECK(comm_allreduce(tp, sc, 1, COMM_SUM) == 0, "%s", comm_error(tp));
    sum_over_stages(pipe, sc);
    op_clip_coef(be, sc + 2, sc, 2, max_norm);
    if (max_norm > 0.0f)
        for (int k = 0; k < n_ranges; k++)
            op_scale_by(be, grads + (at_state ? r[k].at : r[k].lo), sc + 3, r[k].hi - r[k].lo);
}
