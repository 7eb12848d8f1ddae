/* run.c: a training run (see run.h). main's 400 lines, cut at the seams a
 * reader looks for: set-up in the order the pieces depend on each other
 * (the backend decides the communicator, the data the vocabulary, the
 * model the optimizer), then one function per part of a step (train, log,
 * evaluate, save, stop), then the end of the run. Every message, metric
 * and exit status is the one the single function gave.
 */
#include "app/run.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/app.h"
#include "app/evaluate.h"
#include "clock.h"
#include "err.h"
#include "fileio.h"
#include "mt.h"
#include "profile.h"
#include "train/device.h"
#include "train/pipeline.h"
#include "train/preempt.h"
#include "transformer/export.h"

/* --cuda-graphs on: graphs kept at most (train/graphs.h), each one phase of one batch shape. */
#define RUN_MAX_GRAPHS 128

/* The backend, the stages and the ranks. The backend first: where the
 * model's buffers live decides the data groups' communicator (NCCL on its
 * stream, or shm staged through its page-locked buffers, or plain shm on
 * the CPU). 0 or 2. */
static int run_open_device(Run *r) {
    TrainArgs *a = r->a;
    char err[1024];
    if (!(r->be = app_backend_open(a))) return 2;
    startup_mark(r->boot, "device");
    /* The stages first: an impossible --pp or --pp-layout is refused before any rank meets. */
    if (model_stages_make(&a->cfg, a->pp, a->pp_layout, r->stages, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        backend_destroy(r->be);
        return 2;
    }
    model_stages_format(r->stages, a->pp, r->pp_layout, sizeof r->pp_layout);
    RuntimeOptions ro = {.tp = a->tp, .dp = a->dp, .pp = a->pp, .n_heads = a->cfg.n_heads, .d_ff = a->cfg.d_ff,
                         .timeout_s = a->comm_timeout, .comm = a->comm};
    if (app_runtime_open(r->be, &ro, &r->rt, "")) return 2;
    startup_mark(r->boot, "ranks");
    backend_note_library(r->be, runtime_library_bytes(&r->rt));  // NCCL's buffers (0 with shm)
    r->mesh = &r->rt.mesh;
    r->lead = r->mesh->rank == 0;
    r->pp = r->mesh->pp;
    if (r->mesh->world > 1) tp_set_log_rank(r->mesh->rank);
    if (a->dump_batches && (r->mesh->world > 1 || check_writable_path(a->dump_batches, err, sizeof err))) {
        if (r->lead && r->mesh->world > 1)  // each rank reads other batches: one file would hold one rank's
            fprintf(stderr, "train_mt: --dump-batches writes the batches of a one-rank run; this run has %d ranks\n",
                    r->mesh->world);
        else if (r->lead)  // refused now, not after the run
            fprintf(stderr, "train_mt: --dump-batches: %s\n", err);
        runtime_free(&r->rt);
        backend_destroy(r->be);
        return 2;
    }
    return 0;
}

/* The data source, and the --save folder's fit with this model. 0, 1 or 2. */
static int run_open_data(Run *r) {
    TrainArgs *a = r->a;
    char err[1024];
    if (source_open(&r->src, a, &a->cfg, &r->rt, r->boot, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        source_close(&r->src);
        runtime_free(&r->rt);  // before the backend: NCCL works on its stream
        backend_destroy(r->be);
        return 1;
    }
    /* A --save folder holding another model's checkpoints is refused now,
     * not at the first save (its `latest` would name the wrong model). */
    if (a->save_dir && ckpt_check_save_folder(a->save_dir, &a->cfg, !a->synthetic, r->src.spm_path, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        source_close(&r->src);
        runtime_free(&r->rt);
        backend_destroy(r->be);
        return 2;
    }
    if (a->save_dir) startup_mark(r->boot, "save_folder");
    return 0;
}

/* This rank's stage of the model, and the models evaluation needs. 0 or 2. */
static int run_build_model(Run *r) {
    const TrainArgs *a = r->a;
    const Mesh *mesh = r->mesh;
    char err[1024];
    TpGroup tpg = {.size = mesh->tp, .rank = mesh->tp_rank, .comm = r->rt.tp};
    if (model_create_stage(&r->m, r->be, &a->cfg, &tpg, &r->stages[mesh->pp_rank], a->seed,
                           a->grad.zero >= 2 ? MODEL_NO_GRAD_BUFFER : 0, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    startup_mark(r->boot, "model");  // allocation, initial values, compute weights
    model_set_recompute(&r->m, a->recompute);
    if (model_set_attention(&r->m, a->attention, err, sizeof err)) {
        fprintf(stderr, "train_mt: --attention flash: %s\n", err);
        return 2;
    }
    if (model_set_sequence_parallel(&r->m, a->seq_par, err, sizeof err)) {
        fprintf(stderr, "train_mt: --sequence-parallel: %s\n", err);
        return 2;
    }
    /* With stages, evaluation and export assemble the whole stack (tp
     * shards) on the first stage's ranks of dp rank 0. */
    r->stack_here = r->pp > 1 && mesh->pp_rank == 0 && mesh->dp_rank == 0;
    /* (neither is initialised: model_stage_collect and model_gather write every value before one is read) */
    if (r->stack_here && model_create_ex(&r->stack, r->be, &a->cfg, &tpg, a->seed, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT,
                                         err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    if (r->stack_here) startup_mark(r->boot, "stack_model");
    r->evm = r->pp > 1 ? (r->stack_here ? &r->stack : NULL) : &r->m;
    /* Dev BLEU decodes with the whole model on rank 0: the training model
     * itself when it is whole (tp 1, pp 1), else a copy assembled there (no
     * gradient buffer: it only decodes, and the memory table counts it);
     * nothing without evaluation (--eval-interval 0). */
    r->decode_here = r->lead && !a->synthetic && a->eval_interval > 0;
    r->whole_is_m = mesh->tp == 1 && r->pp == 1;
    r->whole_held = r->decode_here && !r->whole_is_m;
    if (r->whole_held &&
        model_create_ex(&r->whole, r->be, &a->cfg, NULL, a->seed, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    if (r->whole_held) startup_mark(r->boot, "decode_model");
    return 0;
}

/* --max-minutes: the schedule's horizon, going on from the clock a resumed
 * checkpoint carries; a budget it already spent leaves nothing to train. */
static void run_start_horizon(Run *r, const TrainState *clock) {
    const TrainArgs *a = r->a;
    horizon_start(&r->hz, a->max_minutes, a->opt.warmup, r->first_step, clock);
    if (r->hz.budget_s > 0.0 && r->hz.train_s >= r->hz.budget_s && r->first_step <= r->total) {
        if (r->lead)
            printf("train_mt: --max-minutes %g already spent (%.1f minutes trained up to step %d): nothing to train; "
                   "raise it to go on\n", a->max_minutes, r->hz.train_s / 60.0, r->first_step - 1);
        r->total = r->first_step - 1;
    }
}

/* The run's length, the gradient sync and AdamW, --resume, --metrics. 0, 1 or 2. */
static int run_build_optimizer(Run *r) {
    TrainArgs *a = r->a;
    char err[1024];
    r->total = run_steps(a, a->synthetic ? 0 : r->src.train.n_batches);
    a->opt.decay_steps = r->total;
    a->grad.staged = r->pp > 1;
    r->gsync = grad_sync_create(r->be, r->rt.dp, &r->m, &a->grad);
    grad_sync_adamw_init(r->gsync, &r->opt, r->be, &a->opt);
    startup_mark(r->boot, "optimizer");
    r->first_step = 1;
    TrainState clock = {.has_clock = 0};
    if (a->resume &&
        resume(a, &r->rt, &r->m, &r->opt, &r->src, r->total, &r->first_step, &clock, err, sizeof err)) {
        fprintf(stderr, "train_mt: --resume: %s\n", err);
        adamw_free(&r->opt);
        grad_sync_free(r->gsync);
        if (r->whole_held) model_free(&r->whole);
        model_free(&r->m);
        source_close(&r->src);
        runtime_free(&r->rt);  // before the backend: NCCL works on its stream
        backend_destroy(r->be);
        return 1;
    }
    if (a->resume) startup_mark(r->boot, "resume");
    run_start_horizon(r, &clock);
    if (a->metrics_path && r->lead) {
        r->metrics = fopen(a->metrics_path, r->first_step > 1 ? "a" : "w");
        if (!r->metrics) {
            fprintf(stderr, "train_mt: --metrics %s: %s\n", a->metrics_path, strerror(errno));
            return 2;
        }
    }
    if (r->lead && args_echo(a, stdout, r->first_step)) return 2;  // the effective configuration, from the flag table
    return 0;
}

/* Rank 0: the model, the data, the layout and the device of the run. */
static void run_banner(const Run *r) {
    const TrainArgs *a = r->a;
    const Mesh *mesh = r->mesh;
    if (!r->lead) return;
    printf("train_mt: preset %s, d_model %d, heads %d, ffn %d, layers %d+%d, vocab %d; %s; %d steps\n", a->preset,
           a->cfg.d_model, a->cfg.n_heads, a->cfg.d_ff, a->cfg.enc_layers, a->cfg.dec_layers, a->cfg.vocab_size,
           a->synthetic ? (a->task == SYNTH_COPY ? "synthetic copy task" : "synthetic reverse task")
                        : (a->dir == DIR_EN_JA ? "en->ja" : "ja->en"),
           r->total);
    printf("train_mt: %d rank%s: tp %d x dp %d x pp %d; %zu parameters per rank; device %s, %s; "
           "collectives %s; recompute %s%s%s\n", mesh->world, mesh->world > 1 ? "s" : "", mesh->tp, mesh->dp,
           mesh->pp, r->m.tab.n_elems, r->be->device_name, dtype_name(r->be->dtype),
           mesh->world == 1             ? "none (one rank)"
           : r->rt.comm == RUNTIME_COMM_NCCL ? "nccl"
           : r->rt.staged                  ? "shm (device buffers staged through page-locked host memory)"
                                           : "shm",
           model_recompute_name(a->recompute), r->m.seq_par ? "; sequence parallel" : "",
           r->m.attention == MODEL_ATTENTION_FLASH ? "; flash attention" : "");
    if (r->pp > 1) {
        char layout[512];
        model_stages_format(r->stages, r->pp, layout, sizeof layout);
        printf("train_mt: pipeline: %d stages %s, 1F1B over %d micro-batch%s; ideal bubble %.1f%%\n", r->pp, layout,
               a->micro_batches, a->micro_batches > 1 ? "es" : "", 100.0 * pipeline_bubble_theory(r->pp, a->micro_batches));
    }
    fflush(stdout);
}

int run_setup(Run *r, TrainArgs *a, Startup *boot) {
    memset(r, 0, sizeof *r);
    r->a = a;
    r->boot = boot;
    int rc = run_open_device(r);
    if (rc == 0) rc = run_open_data(r);
    if (rc == 0) rc = run_build_model(r);
    if (rc == 0) rc = run_build_optimizer(r);
    if (rc == 0) run_banner(r);
    return rc;
}

/* One step: this rank's micro-batches read and trained, the window's
 * padding and tokens and the clocks counted; 1 when the loss or the
 * gradient norm is not finite (the run stops there), else 0. */
static int run_step(Run *r, int step, float *lr, StepResult *sr) {
    const TrainArgs *a = r->a;
    OwnedBatch *b = TP_MALLOC((size_t)a->micro_batches * sizeof *b);
    Batch *views = TP_MALLOC((size_t)a->micro_batches * sizeof *views);
    long n_global = 0;
    source_next(&r->src, b, &n_global);
    for (int i = 0; i < a->micro_batches; i++) {
        views[i] = b[i].view;
        const double slots = (double)views[i].B * (views[i].S + views[i].T);
        r->pad_slots += batch_pad_fraction(&views[i]) * slots;
        r->all_slots += slots;
    }
    /* Masks differ across data-parallel ranks (other sentences), never across tp ranks. */
    DropoutKey key = {.seed = a->seed, .step = (uint32_t)step, .micro = (uint32_t)r->mesh->dp_rank};
    *lr = lr_at_frac(&a->opt, step, horizon_frac(&r->hz));
    const CommStats tp0 = r->rt.tp ? comm_stats(r->rt.tp) : (CommStats){0};
    if (step == r->first_step) {  // start-up ends here: metrics file, banner, trainer, the first batch
        startup_mark(r->boot, "first_batch");
        if (r->lead) {
            startup_print(r->boot, "train_mt", stdout);
            fflush(stdout);
        }
    }
    const double t_step = tp_now_s();
    backend_profile_step_begin(r->be);
    train_step(&r->trainer, views, a->micro_batches, n_global, key, *lr, sr);
    backend_profile_step_end(r->be, tp_now_s() - t_step);
    if (r->rt.tp) {  // the training steps' tp collectives (evaluation left out)
        const CommStats tp1 = comm_stats(r->rt.tp);
        r->clock.tp_steps.allreduce += tp1.allreduce - tp0.allreduce;
        r->clock.tp_steps.reduce_scatter += tp1.reduce_scatter - tp0.reduce_scatter;
        r->clock.tp_steps.allgather += tp1.allgather - tp0.allgather;
    }
    r->clock.t_pp_wait += sr->pp_wait_s;
    for (int i = 0; i < a->micro_batches; i++) {
        if (r->dump) batch_dump_take(r->dump, step, i, &b[i]);
        owned_batch_free(&b[i]);  // (emptied by the dump)
    }
    free(b);
    free(views);
    r->clock.t_comm += sr->comm_s;
    r->clock.t_exposed += sr->exposed_comm_s;
    const float loss = sr->loss, gnorm = sr->grad_norm;
    if (!isfinite(loss) || !isfinite(gnorm)) {
        fprintf(stderr, "%strain_mt: step %d: loss %g, gradient norm %g is not finite; stopping "
                        "(lower --lr or raise --warmup)\n", r->tty ? "\n" : "", step, loss, gnorm);
        return 1;
    }
    r->tok_window += n_global;
    return 0;
}

/* --max-minutes, after every step: rank 0's clock (train/horizon.h)
 * decides for every rank whether the run ends here (its last evaluation,
 * save and export as at --max-steps) and where the next step stands on the
 * schedule. A step past the budget would train at the floor: none is taken. */
static void run_check_minutes(Run *r, int step) {
    const TrainArgs *a = r->a;
    const int stop = horizon_tick(&r->hz, r->rt.ctrl, r->lead, step);  // also at the last step: its clock is saved
    comm_ok(stop < 0 ? -1 : 0, r->rt.ctrl);
    if (stop && step < r->total) {
        if (r->lead)
            printf("%strain_mt: --max-minutes %g reached at step %d of %d: ending the run here\n",
                   r->tty ? "\r\033[K" : "", a->max_minutes, step, r->total);
        r->total = step;
    }
}

/* The progress line on a terminal; at a log step the log line, its
 * metrics record and, when a peak grew, the memory table (collective). */
static void run_log(Run *r, int step, float loss, float lr, float gnorm) {
    const TrainArgs *a = r->a;
    double t = tp_now_s();
    if (r->tty) {
        double per_step = (t - r->clock.t_start - r->clock.t_eval - r->clock.t_save) / step;
        char eta[32];
        double left = per_step * (r->total - step);
        if (r->hz.budget_s > 0.0 && r->hz.budget_s - r->hz.train_s < left) left = r->hz.budget_s - r->hz.train_s;
        fmt_duration(eta, sizeof eta, left > 0.0 ? left : 0.0);
        printf("\r\033[K%d/%d | loss %.4f | %.0f tok/s | ETA %s", step, r->total, loss,
               r->tok_window / (t - r->t_window > 1e-9 ? t - r->t_window : 1e-9), eta);
        fflush(stdout);
    }
    if (!(step % a->log_interval == 0 || step == r->total || step == 1)) return;
    double tps = r->tok_window / (t - r->t_window > 1e-9 ? t - r->t_window : 1e-9);
    const double pad = r->all_slots > 0 ? r->pad_slots / r->all_slots : 0.0;  // this rank's batches in the window
    char *mem = memory_metrics(&r->rt, r->be, r->lead && r->metrics);
    char launch[64] = "", boot[1024] = "";
    if (step == r->first_step) {
        snprintf(launch, sizeof launch, ", \"since_launch_s\": %.3f", tp_process_age_s());
        startup_json(r->boot, boot, sizeof boot);
    }
    if (r->lead) {
        printf("%sstep %6d/%d | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | pad %.1f%%\n",
               r->tty ? "\r\033[K" : "", step, r->total, loss, lr, gnorm, tps, 100.0 * pad);
        if (r->metrics)
            metrics_line(r->metrics, a->metrics_path, "{\"step\": %d, \"loss\": %.9g, \"lr\": %.6e, "
                         "\"grad_norm\": %.9g, \"tokens_per_s\": %.1f, \"pad_frac\": %.4f, \"elapsed_s\": "
                         "%.3f%s%s%s}\n", step, loss, lr, gnorm, tps, pad, t - r->clock.t_start, launch, boot,
                         mem ? mem : "");
    }
    r->pad_slots = r->all_slots = 0.0;
    free(mem);
    if (step != r->total) {
        char when[64];
        snprintf(when, sizeof when, "step %d", step);
        memory_report_if_grown(&r->rt, r->be, r->lead ? r->metrics : NULL, a->metrics_path, step, &r->mem_last, when);
    }
    r->t_window = tp_now_s();
    r->tok_window = 0;
}

/* A checkpoint of this step (best: the --keep-best record the background
 * writer writes once it is published); its blocking time is kept apart. */
static void run_save(Run *r, int step, const CkptBestRecord *best) {
    r->clock.t_save += save(r->a, &r->rt, r->writer, &r->m, &r->opt, &r->src, r->pp_layout, &r->hz, step, best);
    r->saved_step = step;
}

/* Rank 0: an evaluation's line and metrics record, and the best single figure for --average-last. */
static void run_eval_line(Run *r, int step, const EvalResult *ev, double t0) {
    const TrainArgs *a = r->a;
    const double fig = ev->has_bleu ? ev->bleu : ev->loss;
    if (!r->top_step || (ev->has_bleu ? fig > r->top : fig < r->top)) r->top = fig, r->top_step = step;
    if (ev->has_bleu) {
        printf("%sstep %6d/%d | dev loss %.4f | dev BLEU %.2f\n", r->tty ? "\r\033[K" : "", step, r->total, ev->loss,
               ev->bleu);
        if (r->metrics)
            metrics_line(r->metrics, a->metrics_path, "{\"step\": %d, \"dev_loss\": %.9g, \"dev_bleu\": %.4f, "
                         "\"elapsed_s\": %.3f}\n", step, ev->loss, ev->bleu, t0 - r->clock.t_start);
    } else {
        printf("%sstep %6d/%d | held-out loss %.4f\n", r->tty ? "\r\033[K" : "", step, r->total, ev->loss);
        if (r->metrics)
            metrics_line(r->metrics, a->metrics_path, "{\"step\": %d, \"dev_loss\": %.9g, \"elapsed_s\": %.3f}\n", step,
                         ev->loss, t0 - r->clock.t_start);
    }
}

/* Every --eval-interval steps and at the end: one tp group evaluates (the
 * others wait at the barrier); with --keep-best, a better figure is saved
 * and kept, and --patience may end the run. Collective. */
static void run_evaluate(Run *r, int step) {
    const TrainArgs *a = r->a;
    const Mesh *mesh = r->mesh;
    if (!(a->eval_interval && (step % a->eval_interval == 0 || step == r->total))) return;
    double t0 = tp_now_s();
    if (mesh->dp_rank == 0 && r->pp > 1) model_stage_collect(&r->m, r->rt.pp, r->stages, r->pp, r->evm);
    EvalResult ev = {0};
    if (mesh->dp_rank == 0 && r->evm) {
        Model *whole = !r->decode_here ? NULL : r->whole_is_m ? &r->m : &r->whole;
        if (r->whole_held || (!a->synthetic && mesh->tp > 1)) model_gather(r->evm, whole);
        ev = evaluate(r->evm, whole, &r->src);
        if (r->lead) run_eval_line(r, step, &ev, t0);
    }
    comm_ok(comm_barrier(r->rt.ctrl), r->rt.ctrl);
    const double t_saved = r->clock.t_save;
    if (a->keep_best) {  // rank 0's figures decide for every rank
        int kept = r->lead ? best_update(a, &r->best, a->keep_best == KEEP_BLEU ? ev.bleu : ev.loss, step) : 0;
        comm_ok(comm_broadcast(r->rt.ctrl, &kept, sizeof kept, 0), r->rt.ctrl);
        /* with a background writer, the record follows the step's publication */
        const CkptBestRecord rec = {.metric = keep_name(a->keep_best), .value = r->best.value};
        const bool by_writer = kept == 1 && r->writer && r->saved_step != step;
        if (kept == 1 && r->saved_step != step) run_save(r, step, by_writer ? &rec : NULL);
        else if (kept == 1) r->clock.t_save += save_wait(a, &r->rt, r->writer);  // this step, published first
        if (kept == 1 && r->lead) best_publish(a, &r->best, r->metrics, !by_writer);
        r->early_stop = kept == 2 && step < r->total;
    }
    const double dt = tp_now_s() - t0, saving = r->clock.t_save - t_saved;
    r->clock.t_eval += dt - saving;  // the save it made is saving's
    r->t_window += dt;  // tokens/s counts training time only (the window keeps its tokens)
}

/* --cuda-graphs auto: on where graphs were measured faster on a GPU and are
 * bit for bit the same (docs/gpu-benchmark.md): one CUDA rank (tp, dp and pp
 * 1, also as --layout auto chose them), bucketed lengths so that shapes
 * repeat, no --profile (which times every op). */
static bool graphs_by_default(const Run *r) {
    const TrainArgs *a = r->a;
    const int tp = r->rt.tp ? comm_size(r->rt.tp) : 1, dp = r->rt.dp ? comm_size(r->rt.dp) : 1;
    const int pp = r->rt.pp ? comm_size(r->rt.pp) : 1;
    return r->be->kind == BACKEND_CUDA && !a->profile && a->length_bucket > 1 && tp == 1 && dp == 1 && pp == 1;
}

int run_train(Run *r) {
    const TrainArgs *a = r->a;
    if (a->profile) profile_start(r->be, &r->rt);
    trainer_init(&r->trainer, &r->m, &r->opt, r->rt.tp, r->rt.dp, r->gsync, a->opt.clip_norm);
    trainer_set_pipeline(&r->trainer, r->rt.pp);
    char err[256];
    if (a->cuda_graphs == GRAPHS_ON && trainer_use_graphs(&r->trainer, RUN_MAX_GRAPHS, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 1;
    }
    if (a->cuda_graphs == GRAPHS_AUTO && graphs_by_default(r))  // one rank: cannot be refused
        (void)trainer_use_graphs(&r->trainer, RUN_MAX_GRAPHS, err, sizeof err);
    r->tty = r->lead && isatty(STDOUT_FILENO);
    r->clock.t_start = r->t_window = tp_now_s();
    horizon_begin(&r->hz);
    r->saved_step = r->first_step - 1;
    if (a->save_dir && a->save_mode == SAVE_ASYNC) r->writer = ckpt_writer_new(a->comm_timeout, &r->m, &r->opt, r->mesh);
    best_restore(a, r->first_step, r->lead, &r->best);
    r->dump = a->dump_batches ? batch_dump_new(r->first_step, a->micro_batches) : NULL;
    /* From here a signal saves and stops at a step boundary (preempt.h);
     * before it, there is nothing new to save and a signal ends the job at once. */
    preempt_install();
    for (int step = r->first_step; step <= r->total; step++) {
        float lr;
        StepResult sr;
        if (run_step(r, step, &lr, &sr)) {  // a loss every rank found not finite: the write in flight kept
            save_wait(a, &r->rt, r->writer);
            return 1;
        }
        run_check_minutes(r, step);
        run_log(r, step, sr.loss, lr, sr.grad_norm);
        run_evaluate(r, step);
        if (a->save_dir && a->save_interval && step % a->save_interval == 0 && r->saved_step != step) {
            const double t0 = tp_now_s();
            run_save(r, step, NULL);
            r->t_window += tp_now_s() - t0;
        }
        if (r->lead && !r->tty) fflush(stdout);
        if (r->metrics) fflush(r->metrics);
        if (r->early_stop) {  // evaluated above; saved after the loop
            if (r->lead) early_stop_report(a, &r->best, step, r->total, r->metrics);
            r->total = step;
            break;
        }
        if (step < r->total && (r->stop_sig = preempt_agree(r->rt.ctrl)) != 0) {  // one small allreduce per step
            comm_ok(r->stop_sig < 0 ? -1 : 0, r->rt.ctrl);
            r->clock.t_save += stop_on_signal(a, &r->rt, r->writer, &r->m, &r->opt, &r->src, r->pp_layout, &r->hz,
                                              step, r->saved_step, r->stop_sig, r->total);
            r->saved_step = r->total = step;
            break;
        }
    }
    return 0;
}

int run_finish(Run *r) {
    const TrainArgs *a = r->a;
    if (a->save_dir && r->saved_step != r->total) run_save(r, r->total, NULL);
    r->clock.t_save += save_wait(a, &r->rt, r->writer);  // every checkpoint durable before the best, the average, the exit
    int rc = 0;
    if (r->lead && a->keep_best && r->best.have)
        printf("train_mt: best checkpoint: step %d, %s %.4f: %s/best\n", r->best.step, keep_label(a->keep_best),
               r->best.value, a->save_dir);
    if (a->average_last && !r->stop_sig) {
        if (r->lead) rc = average_report(a, r->be, &r->src, r->top, r->top_step, r->metrics);
        comm_ok(comm_barrier(r->rt.ctrl), r->rt.ctrl);
    }
    return rc;
}

void run_report(Run *r) {
    const TrainArgs *a = r->a;
    const Mesh *mesh = r->mesh;
    if (r->lead) report_summary(&r->rt, &r->clock, r->first_step, r->total, r->metrics, a->metrics_path);
    if (r->pp > 1 && mesh->tp_rank == 0 && mesh->dp_rank == 0)  // one line per stage
        report_pipeline_stage(&r->rt, r->stages, a->micro_batches, &r->clock, r->trainer.pp_sent,
                              r->trainer.pp_received, r->total - r->first_step + 1);
    if (a->profile && r->lead) report_profile(r->be, r->metrics, a->metrics_path, r->total);
    if (r->trainer.graphs && r->lead) report_graphs(step_graphs_stats(r->trainer.graphs), r->metrics, a->metrics_path,
                                                    r->total);
    memory_report_end(&r->rt, r->be, r->lead ? r->metrics : NULL, a->metrics_path, r->total);
    free(r->mem_last);
    r->mem_last = NULL;
}

/* --dump-batches: the run's batches written at the end. 0 or 1. */
static int run_write_dump(Run *r) {
    const TrainArgs *a = r->a;
    char err[1024];
    int rc = 0;
    char *json = config_to_json(&r->m.cfg);
    if (batch_dump_write(r->dump, a->dump_batches, json, err, sizeof err)) {
        fprintf(stderr, "train_mt: --dump-batches: %s\n", err);
        rc = 1;
    } else {
        printf("train_mt: %d steps' batches written to %s\n", r->total - r->first_step + 1, a->dump_batches);
    }
    free(json);
    batch_dump_free(r->dump);
    r->dump = NULL;
    return rc;
}

/* --export: the whole model gathered on rank 0 and written as one model
 * folder (skipped after a stop on a signal). Collective. 0 or 1. */
static int run_export(Run *r) {
    const TrainArgs *a = r->a;
    const Mesh *mesh = r->mesh;
    if (r->stop_sig) {
        if (r->lead) printf("train_mt: --export skipped: the run stopped on %s before its last step\n",
                            preempt_signal_name(r->stop_sig));
        return 0;
    }
    char err[1024];
    int rc = 0;
    Model full;
    bool writer = r->lead;
    if (mesh->dp_rank == 0 && r->pp > 1) model_stage_collect(&r->m, r->rt.pp, r->stages, r->pp, r->evm);
    if (mesh->dp_rank == 0 && r->evm) {
        Model *dst = r->whole_held ? &r->whole : NULL;
        const bool gather = !(writer && r->whole_is_m);  // a whole training model is written as it is
        if (!gather) dst = &r->m;
        if (writer && !dst) {
            /* model_gather writes every tensor */
            TP_CHECK(model_create_ex(&full, r->be, &r->m.cfg, NULL, a->seed, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, err,
                                     sizeof err) == 0,
                     "%s", err);
            dst = &full;
        }
        if (gather) model_gather(r->evm, dst);
        if (writer) {
            int s = a->synthetic ? model_export(dst, a->export_dir, err, sizeof err)
                                 : mt_save(dst, r->src.spm_path, a->export_dir, err, sizeof err);
            if (s) {
                fprintf(stderr, "train_mt: --export: %s\n", err);
                rc = 1;
            } else {
                printf("train_mt: model exported to %s\n", a->export_dir);
            }
            if (dst == &full) model_free(&full);
        }
    }
    comm_ok(comm_barrier(r->rt.ctrl), r->rt.ctrl);
    return rc;
}

int run_outputs(Run *r) {
    int rc = 0;
    if (r->dump && run_write_dump(r)) rc = 1;
    if (r->a->export_dir && run_export(r)) rc = 1;
    return rc;
}

int run_close(Run *r, int rc) {
    const TrainArgs *a = r->a;
    if (r->metrics && fclose(r->metrics) != 0) {
        fprintf(stderr, "train_mt: --metrics %s: writing the file failed (%s)\n", a->metrics_path, strerror(errno));
        rc = 1;
    }
    ckpt_writer_free(r->writer);  // joined already, but after a failed step
    r->writer = NULL;
    trainer_free(&r->trainer);
    adamw_free(&r->opt);
    grad_sync_free(r->gsync);
    if (r->whole_held) model_free(&r->whole);
    if (r->stack_here) model_free(&r->stack);
    model_free(&r->m);
    source_close(&r->src);
    runtime_free(&r->rt);  // before the backend: the groups' staging buffers and NCCL's stream are the backend's
    backend_destroy(r->be);
    if (rc == 0 && r->stop_sig) rc = a->save_dir ? TP_EXIT_SAVED_ON_SIGNAL : 128 + r->stop_sig;
    return rc;
}
