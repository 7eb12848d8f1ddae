/* step.c: the training step (see step.h). Everything between the batch
 * upload and the final read stays on the backend's device: the loss sum,
 * the norm and the clipping factor are device scalars, so a GPU step never
 * waits on the host until its end. */
#include "train/step.h"

#include <time.h>
#include "err.h"
#include "kernels/ops.h"

enum { SC_LOSS = 0, SC_CLIP = 1, SC_N = 5 };  // SC_CLIP..+3: grad_clip's sumsq parts, norm, factor

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void comm_ok(int rc, const Comm *c) { TP_CHECK(rc == 0, "%s", comm_error(c)); }

void trainer_init(Trainer *t, Model *m, AdamW *opt, Comm *tp, Comm *dp, float clip_norm) {
    *t = (Trainer){.m = m, .opt = opt, .be = m->be, .tp = tp, .dp = dp, .clip_norm = clip_norm};
    t->sc = backend_alloc(t->be, SC_N * sizeof(float), MEM_WORKSPACE);
}

void trainer_free(Trainer *t) {
    if (t->be) backend_free(t->be, t->sc);
    *t = (Trainer){0};
}

void train_step(Trainer *t, const Batch *b, long n_global, DropoutKey key, float lr, StepResult *out) {
    Model *m = t->m;
    Backend *be = t->be;
    model_zero_grad(m);
    op_zero(be, t->sc, SC_N);
    if (b->B > 0) {
        model_forward_step(m, b, true, key, t->sc + SC_LOSS);
        model_backward(m, b, true, key, n_global > 0 ? 1.0f / (float)n_global : 0.0f);
    }
    double t0 = wall_s();
    if (t->dp && comm_size(t->dp) > 1) {
        comm_ok(comm_allreduce(t->dp, m->grads, m->tab.n_elems, COMM_SUM), t->dp);
        comm_ok(comm_allreduce(t->dp, t->sc + SC_LOSS, 1, COMM_SUM), t->dp);  // the global loss sum
    }
    out->comm_s = wall_s() - t0;
    grad_clip(be, &m->tab, m->grads, t->tp, t->clip_norm, t->sc + SC_CLIP);
    adamw_step(t->opt, m->params, m->grads, &m->tab, lr);
    backend_recast_weights(be);
    float host[SC_N];
    backend_download(be, host, t->sc, sizeof host);  // the step's one read
    out->loss = n_global > 0 ? host[SC_LOSS] / (float)n_global : 0.0f;
    out->grad_norm = host[SC_CLIP + 2];
    out->lr = lr;
}
