/* ckpt_average.c: one checkpoint whose weights are the mean of N saved ones.
 *
 * Each input is loaded whole through ckpt_load, so inputs saved with any
 * tp / dp / pp layout (or a mix of them) are reassembled by the same code a
 * resume uses. Weights are summed in double, in the order given, divided by
 * N and rounded once to fp32: the result is the exact mean up to that one
 * rounding. The optimizer state, step, data cursor and tokenizer are the
 * newest input's, so the output resumes like it and loads in translate_mt
 * and ckpt export. It is written as one rank (tp 1 x dp 1 x pp 1).
 */
#include "train/ckpt_average.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "tp/comm_shm.h"

/* The bound on every wait of the one-rank control group the save agrees over. */
#define AVG_COMM_TIMEOUT_S 60.0

/* Every input's config and kind must be the first's; *newest receives the
 * index of the highest step. 0 or -1 + err. */
static int check_inputs(const char *const *in, int n, ModelConfig *cfg, OptimConfig *oc, TrainState *st,
                        int *newest, char *err, size_t err_len) {
    int64_t top = -1;
    for (int i = 0; i < n; i++) {
        ModelConfig c;
        OptimConfig o;
        TrainState s;
        if (ckpt_read_manifest(in[i], &c, NULL, NULL, &o, NULL, &s, err, err_len)) return -1;
        char why[512], spm[4096];
        if (i > 0 && config_diff(cfg, in[0], &c, in[i], why, sizeof why)) {
            tp_error_set(err, err_len, "cannot average checkpoints of different models: %s", why);
            return -1;
        }
        if (i > 0 && s.corpus != st->corpus) {
            tp_error_set(err, err_len, "cannot average %s (a %s run) with %s (a %s run)", in[i],
                         s.corpus ? "corpus" : "synthetic-task", in[0], st->corpus ? "corpus" : "synthetic-task");
            return -1;
        }
        if (i > 0 && s.task[0] && st->task[0] && strcmp(s.task, st->task) != 0) {
            tp_error_set(err, err_len, "cannot average %s (the %s task) with %s (the %s task)", in[i], s.task, in[0],
                         st->task);
            return -1;
        }
        pathf(spm, sizeof spm, "%s/spm.model", in[0]);
        if (i > 0 && s.corpus && ckpt_check_tokenizer(in[i], spm, why, sizeof why)) {
            tp_error_set(err, err_len, "cannot average checkpoints with different tokenizers: %s", why);
            return -1;
        }
        if (i == 0) *cfg = c, *st = s;
        if (s.step > top) top = s.step, *newest = i, *oc = o;
    }
    return 0;
}

/* A one-rank runtime whose only group is the control group a save agrees over. */
static int solo_runtime(Runtime *rt, char *err, size_t err_len) {
    memset(rt, 0, sizeof *rt);
    if (mesh_init(&rt->mesh, 1, 0, 1, 1, 1, err, err_len)) return -1;
    snprintf(rt->job_id, sizeof rt->job_id, "ckpt-average-%ld", (long)getpid());
    rt->ctrl = comm_shm_create(rt->job_id, "world", 0, 1, AVG_COMM_TIMEOUT_S, err, err_len);
    return rt->ctrl ? 0 : -1;
}

/* Loads every input into m and sums its weights into acc (double). */
static int sum_inputs(const char *const *in, int n, Model *m, double *acc, char *err, size_t err_len) {
    const size_t ne = m->tab.n_elems;
    for (int i = 0; i < n; i++) {
        if (ckpt_load(in[i], m, NULL, err, err_len)) return -1;
        const float *w = backend_host_view(m->be, m->params, ne);
        for (size_t j = 0; j < ne; j++) acc[j] += (double)w[j];
        backend_host_view_free(w, m->params);
    }
    return 0;
}

int ckpt_average(const char *const *in, int n, const char *out, bool replace, char *err, size_t err_len) {
    TP_CHECK(n >= 1, "ckpt_average needs at least one input");
    ModelConfig cfg;
    OptimConfig oc;
    TrainState st;
    int newest = 0;
    if (check_inputs(in, n, &cfg, &oc, &st, &newest, err, err_len)) return -1;
    Model m;
    /* no gradients, no initial values: every input is loaded whole */
    if (model_create_ex(&m, NULL, &cfg, NULL, 0, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, err, err_len)) return -1;
    AdamW opt;
    adamw_init(&opt, m.be, &oc, m.tab.n_elems);
    const size_t ne = m.tab.n_elems;
    double *acc = TP_CALLOC(ne, sizeof *acc);
    Runtime rt = {0};
    TrainState ns = {0};
    int rc = sum_inputs(in, n, &m, acc, err, err_len);
    /* the newest input's optimizer state and train state go with the mean */
    if (rc == 0) rc = ckpt_load(in[newest], &m, &opt, err, err_len);
    if (rc == 0) rc = ckpt_read_manifest(in[newest], &cfg, NULL, NULL, NULL, NULL, &ns, err, err_len);
    if (rc == 0) {
        float *w = backend_host_stage(m.be, m.params, ne);
        for (size_t j = 0; j < ne; j++) w[j] = (float)(acc[j] / n);
        backend_host_commit(m.be, m.params, w, ne);
        ns.pp = 1;
        ns.pp_layout[0] = '\0';
        char spm[4096];
        pathf(spm, sizeof spm, "%s/spm.model", in[newest]);
        rc = solo_runtime(&rt, err, err_len);
        if (rc == 0) rc = ckpt_save_as(out, replace, &rt, &m, &opt, &ns, ns.corpus ? spm : NULL, err, err_len);
        if (rt.ctrl) comm_free(rt.ctrl);
    }
    free(acc);
    adamw_free(&opt);
    model_free(&m);
    return rc;
}
