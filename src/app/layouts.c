/* layouts.c: the candidate layouts of --plan and --layout auto, the batch
 * shapes each would train on, and their ranking (see layouts.h). The shapes
 * are read from the run's own token files, with the run's batching, so the
 * planner sees the batches the run will see.
 */
#include "app/layouts.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/synthetic.h"
#include "err.h"

void plan_shapes_free(PlanShapes *ps) {
    free(ps->train);
    free(ps->eval);
    memset(ps, 0, sizeof *ps);
}

int plan_shapes(const TrainArgs *a, Source *src, int dp, int M, int btok, PlanShapes *ps, char *err, size_t err_len) {
    memset(ps, 0, sizeof *ps);
    if (a->synthetic) {
        if (a->batch_size < dp * M) {
            tp_error_set(err, err_len, "the copy task's %d sentences per step do not split into dp %d x %d micro-batches",
                         a->batch_size, dp, M);
            return -1;
        }
        const int total = run_steps(a, 0), n_steps = total < PLAN_MAX_STEPS ? total : PLAN_MAX_STEPS;
        ps->n_steps = n_steps;
        ps->train = TP_MALLOC((size_t)n_steps * dp * M * sizeof *ps->train);
        for (int g = 0; g < n_steps; g++) {
            OwnedBatch whole;
            synth_batch(&whole, a->task, config_tokens(src->cfg), a->batch_size, a->min_len, a->max_len, a->seed,
                        (uint64_t)g + 1);
            for (int r = 0; r < dp; r++)
                for (int i = 0; i < M; i++) {
                    OwnedBatch part;
                    owned_batch_rows(&whole, r + i * dp, dp * M, &part);
                    ps->train[((size_t)g * dp + r) * M + i] = (PlanShape){part.view.B, part.view.S, part.view.T};
                    owned_batch_free(&part);
                }
            owned_batch_free(&whole);
        }
        ps->n_eval = 4;
        ps->eval = TP_MALLOC(4 * sizeof *ps->eval);
        for (int i = 0; i < 4; i++) {
            OwnedBatch e;
            synth_batch(&e, a->task, config_tokens(src->cfg), a->batch_size, a->min_len, a->max_len,
                        a->seed ^ 0xE7A1ULL, (uint64_t)i);
            ps->eval[i] = (PlanShape){e.view.B, e.view.S, e.view.T};
            owned_batch_free(&e);
        }
        return 0;
    }
    const ModelConfig *cfg = src->cfg;
    char why[512];
    OwnedBatch *b = TP_MALLOC((size_t)M * sizeof *b);
    for (int r = 0; r < dp; r++) {
        Dataset ds;
        if (source_train_dataset(src, &ds, r, dp * M, btok, why, sizeof why)) {
            tp_error_set(err, err_len, "train split: %s", why);
            free(b);
            plan_shapes_free(ps);
            return -1;
        }
        if (r == 0) {
            const int total = run_steps(a, ds.n_batches);
            ps->n_steps = total < PLAN_MAX_STEPS ? total : PLAN_MAX_STEPS;
            ps->train = TP_MALLOC((size_t)ps->n_steps * dp * M * sizeof *ps->train);
        }
        for (int g = 0; g < ps->n_steps; g++) {
            dataset_next_micro(&ds, M, b, NULL);
            for (int i = 0; i < M; i++) {
                ps->train[((size_t)g * dp + r) * M + i] = (PlanShape){b[i].view.B, b[i].view.S, b[i].view.T};
                owned_batch_free(&b[i]);
            }
        }
        dataset_free(&ds);
    }
    free(b);
    Dataset dev;  // evaluation batches are cut with the same token budget
    if (dataset_init(&dev, &src->dev_tf, a->dir, cfg->max_len, btok, 0, 1, a->seed, cfg->pad_id, cfg->bos_id,
                     cfg->eos_id, why, sizeof why) ||
        dataset_set_length_bucket(&dev, a->length_bucket, why, sizeof why)) {
        tp_error_set(err, err_len, "dev split: %s", why);
        plan_shapes_free(ps);
        return -1;
    }
    ps->n_eval = dataset_eval_batches(&dev);
    ps->eval = TP_MALLOC((size_t)(ps->n_eval ? ps->n_eval : 1) * sizeof *ps->eval);
    int32_t *index = TP_MALLOC((size_t)(dev.n_usable ? dev.n_usable : 1) * sizeof(int32_t));
    int longest = 0;
    for (int i = 0; i < ps->n_eval; i++) {
        OwnedBatch e;
        dataset_eval_batch(&dev, i, &e, index);
        ps->eval[i] = (PlanShape){e.view.B, e.view.S, e.view.T};
        for (int row = 0; row < e.view.B; row++) longest = e.src_len[row] - 1 > longest ? e.src_len[row] - 1 : longest;
        owned_batch_free(&e);
    }
    free(index);
    /* evaluate() decodes every dev sentence, 64 at a time, longest first */
    ps->decode_n = dev.n_usable < 64 ? dev.n_usable : 64;
    ps->decode_S = (longest < cfg->max_len - 1 ? longest : cfg->max_len - 1) + 1;
    dataset_free(&dev);
    return 0;
}

void layout_text(const Layout *l, const TrainArgs *a, char *buf, size_t len) {
    char stages[400] = "", micro[64];
    if (l->pp > 1 && l->stages) {
        char st[380];
        model_stages_format(l->stages, l->pp, st, sizeof st);
        snprintf(stages, sizeof stages, ", stages %s", st);
    }
    if (a->synthetic) snprintf(micro, sizeof micro, "%d micro-batch%s", l->micro, l->micro > 1 ? "es" : "");
    else snprintf(micro, sizeof micro, "%d micro-batch%s of <= %d tokens", l->micro, l->micro > 1 ? "es" : "",
                  l->batch_tokens);
    snprintf(buf, len, "tp %d x dp %d x pp %d, %s, ZeRO %d, recompute %s%s%s", l->tp, l->dp, l->pp, micro, l->zero,
             model_recompute_name(l->rc), l->sp ? ", sequence parallel" : "", stages);
}

void layout_flags(const Layout *l, const TrainArgs *a, char *buf, size_t len) {
    char btok[48] = "";
    if (!a->synthetic) snprintf(btok, sizeof btok, " --batch-tokens %d", l->batch_tokens);
    snprintf(buf, len, "--tp %d --dp %d --pp %d --micro-batches %d --zero %d --recompute %s%s%s", l->tp, l->dp, l->pp,
             l->micro, l->zero, model_recompute_name(l->rc), l->sp ? " --sequence-parallel" : "", btok);
}

int by_step(const void *x, const void *y) {
    const Layout *a = *(Layout *const *)x, *b = *(Layout *const *)y;
    if (!!a->why[0] != !!b->why[0]) return a->why[0] ? 1 : -1;  // the layouts that stand first
    if (a->why[0]) return (a->peak > b->peak) - (a->peak < b->peak);
    if (a->step != b->step) return (a->step > b->step) - (a->step < b->step);
    return (a->peak > b->peak) - (a->peak < b->peak);  // as fast: the leaner
}

int layouts_enumerate(const TrainArgs *a, int W, Layout **out) {
    int n = 0, cap = 64;
    Layout *ls = TP_MALLOC((size_t)cap * sizeof *ls);
    const ModelRecompute rcs[3] = {MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL};
    for (int pp = 1; pp <= W; pp++) {
        if (W % pp) continue;
        for (int tp = 1; tp <= W / pp; tp++) {
            if ((W / pp) % tp) continue;
            const int dp = W / pp / tp;
            for (int M = 1; M <= 8; M *= 2)
                for (int zero = 0; zero <= (dp > 1 ? 2 : 0); zero++)
                    for (int sp = 0; sp <= (tp > 1); sp++)
                        for (int r = 0; r < 3; r++) {
                            if (n == cap) ls = realloc(ls, (size_t)(cap *= 2) * sizeof *ls);
                            TP_CHECK(ls, "out of memory");
                            ls[n++] = (Layout){.tp = tp, .dp = dp, .pp = pp, .micro = M, .zero = zero, .sp = sp,
                                               .rc = rcs[r], .batch_tokens = a->batch_tokens * W / (dp * M), .set = -1};
                        }
        }
    }
    *out = ls;
    return n;
}

int layout_pick(Layout **order, int n) {
    int pick = 0;
    for (int i = 1; i < n && !order[i]->why[0] && order[i]->step <= (1.0 + PLAN_TIE) * order[0]->step; i++)
        if (order[i]->comm + order[i]->bubble < order[pick]->comm + order[pick]->bubble - 1e-3 * order[0]->step)
            pick = i;
    return pick;
}

void print_ranking(Layout **order, int n, const TrainArgs *a, int W, int top, int pick) {
    int standing = 0;
    for (int i = 0; i < n; i++) standing += !order[i]->why[0];
    printf("train_mt: --layout auto: %d layouts of %d rank%s weighed (global batch %d %s per step), %d fit:\n", n, W,
           W > 1 ? "s" : "", a->synthetic ? a->batch_size : a->batch_tokens * W, a->synthetic ? "sentences" : "tokens",
           standing);
    printf("     # | step (s) compute    comm  bubble | peak MiB (rank) | layout\n");
    char text[600];
    for (int i = 0; i < standing && i < top; i++) {
        const Layout *l = order[i];
        layout_text(l, a, text, sizeof text);
        printf("  %c%3d | %8.3f %7.3f %7.3f %7.3f | %9.1f (%2d)  | %s\n", i == pick ? '*' : ' ', i + 1, l->step,
               l->compute, l->comm, l->bubble,
               l->peak / 1048576.0, l->worst, text);
    }
    if (standing > top) printf("  ... and %d more that fit, slower\n", standing - top);
    if (pick >= top && pick < standing) {
        const Layout *l = order[pick];
        layout_text(l, a, text, sizeof text);
        printf("  *%3d | %8.3f %7.3f %7.3f %7.3f | %9.1f (%2d)  | %s\n", pick + 1, l->step, l->compute, l->comm,
               l->bubble, l->peak / 1048576.0, l->worst, text);
    }
    if (pick < standing)
        printf("  (*: the choice: of the layouts within %.0f%% of the fastest, the least communication and bubble)\n",
               100.0 * PLAN_TIE);
    /* the dropped, each reason once with how many layouts it struck */
    int shown = 0;
    for (int i = standing; i < n; i++) {
        bool seen = false;
        for (int j = standing; j < i && !seen; j++) seen = strcmp(order[j]->why, order[i]->why) == 0;
        if (seen) continue;
        int count = 0;
        for (int j = i; j < n; j++) count += strcmp(order[j]->why, order[i]->why) == 0;
        if (shown++ == top) {
            printf("  ... more dropped\n");
            break;
        }
        layout_text(order[i], a, text, sizeof text);
        printf("  dropped %d like %s: %s\n", count, text, order[i]->why);
    }
}
