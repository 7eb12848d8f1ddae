/* persist.c: resume, save, keep-best, patience, average, the save on a
 * signal (see persist.h). Each refusal names the checkpoint folder and
 * the setting that disagrees, and nothing is saved over a run that cannot
 * go on: a user's checkpoints are never lost to a mistaken flag.
 */
#include "app/persist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "app/evaluate.h"
#include "app/report.h"
#include "clock.h"
#include "err.h"
#include "fileio.h"
#include "train/checkpoint.h"
#include "train/ckpt_average.h"
#include "train/preempt.h"

int resume(const TrainArgs *a, const Runtime *rt, Model *m, AdamW *opt, Source *src, int total, int *first_step,
           TrainState *clock, char *err, size_t err_len) {
    const bool is_auto = strcmp(a->resume, "auto") == 0;
    const char *where = is_auto ? a->save_dir : a->resume;
    char dir[4096];
    int found = ckpt_resolve(where, dir, sizeof dir, err, err_len);
    if (found < 0) return -1;
    if (found == 0) {
        if (!is_auto) {
            tp_error_set(err, err_len, "%s holds no complete checkpoint", where);
            return -1;
        }
        if (rt->mesh.rank == 0) printf("train_mt: no checkpoint in %s yet: starting from step 1\n", where);
        return 0;
    }
    double t0 = tp_now_s();
    ModelConfig cfg;
    TrainState st;
    int old_tp, old_dp;
    if (ckpt_read_manifest(dir, &cfg, &old_tp, &old_dp, NULL, NULL, &st, err, err_len)) return -1;
    if (st.seed != a->seed) {
        tp_error_set(err, err_len, "%s was saved with --seed %llu, this run has --seed %llu (the data order and the "
                     "dropout masks follow the seed)", dir, (unsigned long long)st.seed, a->seed);
        return -1;
    }
    if (st.corpus != !a->synthetic) {
        tp_error_set(err, err_len, "%s was saved from a %s run, this run trains on a %s", dir,
                     st.corpus ? "corpus" : "synthetic-task", a->synthetic ? "synthetic task" : "corpus");
        return -1;
    }
    if (st.corpus && (st.spm_alpha != a->spm_alpha || (a->spm_alpha > 0 && st.spm_nbest != a->spm_nbest))) {
        tp_error_set(err, err_len, "%s was saved with --spm-alpha %g --spm-nbest %d, this run has --spm-alpha %g "
                     "--spm-nbest %d (each epoch's subword samples follow them): give the saved values to continue "
                     "that run; nothing was trained", dir, st.spm_alpha, st.spm_nbest, a->spm_alpha, a->spm_nbest);
        return -1;
    }
    if (a->synthetic && st.task[0] && strcmp(st.task, synth_task_name(a->task)) != 0) {
        tp_error_set(err, err_len, "%s was saved from a run of the %s task, this run has --task %s; nothing was "
                     "trained", dir, st.task, synth_task_name(a->task));
        return -1;
    }
    /* Nothing of a run that ends before the checkpoint's step may be saved:
     * it would file step-N weights under a smaller step number. */
    if (st.step > total) {
        tp_error_set(err, err_len, "%s is at step %lld, past this run's last step %d (--max-steps / --epochs): raise "
                     "it to continue that run; nothing was trained or saved", dir, (long long)st.step, total);
        return -1;
    }
    if (st.corpus && ckpt_check_tokenizer(dir, src->spm_path, err, err_len)) return -1;
    if (ckpt_load(dir, m, opt, err, err_len)) return -1;
    if (st.step == total && rt->mesh.rank == 0)
        printf("train_mt: %s is already at step %d, this run's last step: nothing to train\n", dir, total);
    if (st.corpus) {
        char why[512];
        if (dataset_seek(&src->train, st.cursor, why, sizeof why)) {
            tp_error_set(err, err_len, "%s: data cursor: %s", dir, why);
            return -1;
        }
    } else {
        src->synth_index = st.synth_index;
    }
    *first_step = (int)st.step + 1;
    clock->has_clock = st.has_clock;
    clock->train_s = st.train_s;
    clock->step_s = st.step_s;
    clock->warmup_end_s = st.warmup_end_s;
    if (rt->mesh.rank == 0)
        printf("train_mt: resumed from %s: step %lld, saved as tp %d x dp %d x pp %d, loaded as tp %d x dp %d x pp %d "
               "in %.2f s\n", dir, (long long)st.step, old_tp, old_dp, st.pp, rt->mesh.tp, rt->mesh.dp, rt->mesh.pp,
               tp_now_s() - t0);
    return 0;
}

double save(const TrainArgs *a, const Runtime *rt, CkptWriter *w, const Model *m, const AdamW *opt, Source *src,
            const char *pp_layout, const Horizon *hz, int step, const CkptBestRecord *best) {
    TrainState st = {.step = step, .seed = a->seed, .corpus = !a->synthetic, .synth_index = src->synth_index,
                     .spm_alpha = a->spm_alpha, .spm_nbest = a->spm_nbest};
    if (a->synthetic) snprintf(st.task, sizeof st.task, "%s", synth_task_name(a->task));
    horizon_save(hz, &st);
    snprintf(st.pp_layout, sizeof st.pp_layout, "%s", pp_layout);
    if (!a->synthetic) st.cursor = dataset_cursor(&src->train);
    char err[1024];
    const char *spm = a->synthetic ? NULL : src->spm_path;
    double t0 = tp_now_s();
    save_wait(a, rt, w);  // the write in flight first, with its line (at most one at a time)
    if (w ? ckpt_writer_save(w, a->save_dir, rt, m, opt, &st, spm, a->keep_last, best, err, sizeof err)
          : ckpt_save(a->save_dir, rt, m, opt, &st, spm, a->keep_last, err, sizeof err)) {
        fprintf(stderr, "train_mt: saving step %d: %s\n", step, err);
        exit(1);
    }
    const double dt = tp_now_s() - t0;
    if (rt->mesh.rank == 0 && !w) printf("train_mt: checkpoint step %d saved to %s in %.3f s\n", step, a->save_dir, dt);
    return dt;
}

double save_wait(const TrainArgs *a, const Runtime *rt, CkptWriter *w) {
    if (!w) return 0.0;
    char err[1024];
    CkptWriteTimes t;
    double t0 = tp_now_s();
    if (ckpt_writer_wait(w, rt, &t, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        exit(1);
    }
    const double dt = tp_now_s() - t0;
    if (rt->mesh.rank == 0 && t.step >= 0)
        printf("train_mt: checkpoint step %lld saved to %s in %.2f s in the background; the run waited %.3f s for "
               "its snapshot and %.3f s for the write\n", (long long)t.step, a->save_dir, t.write_s, t.start_s, dt);
    return dt;
}

const char *keep_name(int keep) { return keep == KEEP_BLEU ? "bleu" : "loss"; }
const char *keep_label(int keep) { return keep == KEEP_BLEU ? "dev BLEU" : "dev loss"; }

void best_restore(const TrainArgs *a, int first_step, bool lead, Best *b) {
    if (!a->keep_best || first_step <= 1) return;
    int64_t step;
    char metric[16], err[1024];
    double v;
    const int r = ckpt_best_read(a->save_dir, &step, metric, sizeof metric, &v, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "train_mt: --keep-best: %s\n", err);
        exit(1);
    }
    if (r == 0) return;
    if (strcmp(metric, keep_name(a->keep_best)) != 0) {
        if (lead)
            printf("train_mt: %s/best keeps the best %s; this run keeps the best %s: its record starts afresh\n",
                   a->save_dir, metric, keep_name(a->keep_best));
        return;
    }
    const int since = (first_step - 1) / a->eval_interval - (int)(step / a->eval_interval);
    *b = (Best){.have = true, .value = v, .step = (int)step, .bad_evals = since > 0 ? since : 0};
    if (lead)
        printf("train_mt: best so far: %s %.4f at step %d (%d evaluation%s since)\n", keep_label(a->keep_best), v,
               b->step, b->bad_evals, b->bad_evals == 1 ? "" : "s");
}

int best_update(const TrainArgs *a, Best *b, double v, int step) {
    if (!b->have || (a->keep_best == KEEP_BLEU ? v > b->value : v < b->value)) {
        *b = (Best){.have = true, .value = v, .step = step, .bad_evals = 0};
        return 1;
    }
    b->bad_evals++;
    return a->patience && b->bad_evals >= a->patience ? 2 : 0;
}

void best_publish(const TrainArgs *a, const Best *b, FILE *metrics, bool record) {
    char err[1024];
    if (record && ckpt_best_write(a->save_dir, b->step, keep_name(a->keep_best), b->value, err, sizeof err)) {
        fprintf(stderr, "train_mt: --keep-best: %s\n", err);
        exit(1);
    }
    printf("train_mt: best %s so far, %.4f at step %d: kept as %s/best\n", keep_label(a->keep_best), b->value,
           b->step, a->save_dir);
    if (metrics)
        metrics_line(metrics, a->metrics_path, "{\"step\": %d, \"best\": \"%s\", \"best_value\": %.9g}\n", b->step,
                     keep_name(a->keep_best), b->value);
}

void early_stop_report(const TrainArgs *a, const Best *b, int step, int total, FILE *metrics) {
    printf("train_mt: early stop at step %d of %d: %s has not improved for %d evaluations (--patience %d); best "
           "%.4f at step %d, kept as %s/best\n", step, total, keep_label(a->keep_best), b->bad_evals, a->patience,
           b->value, b->step, a->save_dir);
    if (metrics)
        metrics_line(metrics, a->metrics_path, "{\"step\": %d, \"early_stop\": true, \"reason\": \"patience\", "
                     "\"patience\": %d, \"metric\": \"%s\", \"best_step\": %d, \"best_value\": %.9g}\n", step,
                     a->patience, keep_name(a->keep_best), b->step, b->value);
}

int average_report(const TrainArgs *a, Backend *be, Source *src, double top, int top_step, FILE *metrics) {
    int64_t *steps;
    const int have = ckpt_list_complete(a->save_dir, &steps);
    const int n = have < a->average_last ? have : a->average_last;
    char (*dirs)[4096] = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof *dirs), out[4096], err[1024];
    const char **in = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof *in);
    for (int i = 0; i < n; i++) {  // oldest first: the order of the sum
        pathf(dirs[i], sizeof dirs[i], "%s/step_%08lld", a->save_dir, (long long)steps[n - 1 - i]);
        in[i] = dirs[i];
    }
    pathf(out, sizeof out, "%s/averaged", a->save_dir);
    int rc = 0;
    if (n < a->average_last)
        printf("train_mt: --average-last %d: %s holds %d checkpoint%s; averaging those\n", a->average_last,
               a->save_dir, n, n == 1 ? "" : "s");
    if (n < 1 || ckpt_average(in, n, out, true, err, sizeof err)) {
        fprintf(stderr, "train_mt: --average-last: %s\n", n < 1 ? "no checkpoint to average" : err);
        rc = 1;
    }
    Model avg;
    if (rc == 0 && (model_create_ex(&avg, be, &src->args->cfg, NULL, a->seed, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, err,
                                    sizeof err) ||  // ckpt_load writes every tensor
                    ckpt_load(out, &avg, NULL, err, sizeof err))) {
        fprintf(stderr, "train_mt: --average-last: %s\n", err);
        rc = 1;
    } else if (rc == 0) {
        const EvalResult ev = evaluate(&avg, a->synthetic ? NULL : &avg, src);
        const double fig = ev.has_bleu ? ev.bleu : ev.loss;
        const char *what = ev.has_bleu ? "dev BLEU" : "held-out loss";
        printf("train_mt: averaged the newest %d checkpoints (steps %lld to %lld) into %s: %s %.4f; best single "
               "checkpoint: %s %.4f at step %d\n", n, (long long)steps[n - 1], (long long)steps[0], out, what, fig,
               what, top, top_step);
        char bleu[64] = "";
        if (ev.has_bleu) snprintf(bleu, sizeof bleu, ", \"dev_bleu\": %.4f", ev.bleu);
        if (metrics)
            metrics_line(metrics, a->metrics_path, "{\"averaged\": %d, \"first_step\": %lld, \"last_step\": %lld, "
                         "\"dev_loss\": %.9g%s, \"best_single_%s\": %.9g, \"best_single_step\": %d}\n", n,
                         (long long)steps[n - 1], (long long)steps[0], ev.loss, bleu,
                         ev.has_bleu ? "dev_bleu" : "dev_loss", top, top_step);
        model_free(&avg);
    }
    free(steps);
    free(dirs);
    free(in);
    return rc;
}

double stop_on_signal(const TrainArgs *a, const Runtime *rt, CkptWriter *w, const Model *m, const AdamW *opt,
                      Source *src, const char *pp_layout, const Horizon *hz, int step, int saved_step, int sig,
                      int total) {
    const bool lead = rt->mesh.rank == 0;
    if (!a->save_dir) {
        if (lead)
            fprintf(stderr, "train_mt: %s received: stopping after step %d of %d; no --save DIR was given, so "
                    "nothing is saved (exit status %d)\n", preempt_signal_name(sig), step, total, 128 + sig);
        return 0.0;
    }
    if (lead) {
        printf("train_mt: %s received: stopping after step %d of %d and saving it\n", preempt_signal_name(sig), step,
               total);
        fflush(stdout);
    }
    double blocked = saved_step != step ? save(a, rt, w, m, opt, src, pp_layout, hz, step, NULL) : 0.0;
    blocked += save_wait(a, rt, w);  // this step's write, or the one still in flight, durable before the exit
    if (lead) {
        printf("train_mt: saved on %s: %s/step_%08d; continue with --resume auto --save %s (exit status %d)\n",
               preempt_signal_name(sig), a->save_dir, step, a->save_dir, TP_EXIT_SAVED_ON_SIGNAL);
        fflush(stdout);
    }
    return blocked;
}
