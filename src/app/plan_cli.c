/* plan_cli.c: the front end of the planner (train/planner.h) for --plan
 * and --layout auto (see plan_cli.h): the machine's calibration (measured
 * by every rank at once, as the run would contend, and cached), each
 * candidate layout's prediction against the memory limit, and the verdict.
 *
 * plan_main reads as its steps: open the device and the ranks, list the
 * layouts, make their stages, read their batch shapes, calibrate, then
 * rank 0 decides and every rank learns the choice. The Plan struct carries
 * what the steps share; plan_close frees it whatever step stopped.
 */
#include "app/plan_cli.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/app.h"
#include "app/layouts.h"
#include "app/source.h"
#include "err.h"
#include "tp/comm_shm.h"
#include "tp/threads.h"
#include "train/device.h"
#include "train/planner.h"

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Ranks that compute at once without slowing each other: the GPUs, or
 * the cores over each rank's threads. */
static int plan_slots(bool gpu, int threads) {
    int n_gpus = 0;
    if (gpu) backend_cuda_available(&n_gpus);
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return gpu ? n_gpus : (cores / threads > 1 ? cores / threads : 1);
}

static PlanInput plan_input(const TrainArgs *a, const Layout *l, bool gpu, int threads, const PlanShapes *ps) {
    GradSyncConfig grad = a->grad;
    grad.zero = l->zero;
    PlanInput in = {.cfg = a->cfg, .tp = l->tp, .dp = l->dp, .pp = l->pp, .micro = l->micro, .stages = l->stages,
                    .recompute = l->rc, .seq_par = l->sp && l->tp > 1, .grad = grad, .gpu = gpu, .dtype = a->dtype,
                    .flash = a->attention == MODEL_ATTENTION_FLASH,
                    .slots = plan_slots(gpu, threads), .train = ps->train, .n_steps = ps->n_steps, .eval = ps->eval,
                    .n_eval = a->eval_interval > 0 ? ps->n_eval : 0, .beam = a->beam,
                    .ckpt_snapshot = a->save_dir && a->save_mode == SAVE_ASYNC};
    /* ranks sharing a GPU stage their groups' buffers through host memory
     * (the run's runtime_choose_comm, for one node of W ranks) */
    const int W = l->tp * l->dp * l->pp;
    RuntimeComm comm = RUNTIME_COMM_SHM;
    char why[256];
    in.staged = gpu && W > 1 &&
                (runtime_choose_comm(a->comm, runtime_have_nccl(), true, W, W, in.slots, &comm, why, sizeof why) != 0 ||
                 comm == RUNTIME_COMM_SHM);
    in.nccl = gpu && W > 1 && !in.staged;  // a GPU per rank: NCCL communicators
    /* evaluation (--eval-interval > 0) on a corpus: rank 0 decodes dev BLEU with
     * the whole model, its own when tp and pp are 1 (nothing to gather), else
     * a copy gathered there (the tp group gathers with it) */
    const bool evaluates = a->eval_interval > 0;
    in.gather_at_eval = !a->synthetic && evaluates && !(l->tp == 1 && l->pp == 1);
    in.decode = !a->synthetic && evaluates;
    in.decode_n = ps->decode_n;
    in.decode_S = ps->decode_S;
    return in;
}

/* Threads per rank: what OpenBLAS is told (OMP_NUM_THREADS; tprun sets it
 * to cores / ranks), else every core. */
static int env_threads(void) { return (int)tp_threads_here(); }

static void calib_key(const Backend *be, int threads, char *key, size_t len) {
    char host[128] = "host";
    gethostname(host, sizeof host - 1);
    char cpu[128] = "cpu";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                const char *v = strchr(line, ':');
                if (v) snprintf(cpu, sizeof cpu, "%s", v + 2);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    snprintf(key, len, "%s | %s | %s %s | %ld cores | %d threads per rank", host, cpu, be->device_name,
             dtype_name(be->dtype), sysconf(_SC_NPROCESSORS_ONLN), be->host_visible ? threads : 1);
}

/* The rates were measured with c->ranks ranks computing at once; in the
 * run `world` ranks share the machine. A rank's share: on CPU 1 / ranks
 * (tprun gives each rank cores / ranks threads, so the ranks fill the
 * cores), on GPUs a whole device while there are as many as ranks. */
static double rank_share(bool gpu, int slots, int n) {
    n = n > 0 ? n : 1;
    return gpu ? (slots >= n ? 1.0 : (double)(slots > 0 ? slots : 1) / n) : 1.0 / n;
}

/* What a rank may use when --memory-limit is not given: on a GPU its
 * device's memory, shared by the ranks on it (ranks go to the visible GPUs
 * by LOCAL_RANK modulo their count, so ceil(W / GPUs) share the fullest);
 * on a CPU the machine's RAM over its ranks. */
static double default_memory_limit(const Backend *be, int W) {
    if (!be->host_visible && be->device_total_bytes > 0) {
        int n_gpus = 0;
        if (!backend_cuda_available(&n_gpus) || n_gpus < 1) n_gpus = 1;
        return (double)be->device_total_bytes / ((W + n_gpus - 1) / n_gpus);
    }
    return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / W;
}

static PlanCalib calib_for_run(const PlanCalib *c, int world, bool gpu, int slots) {
    PlanCalib k = *c;
    const double s = rank_share(gpu, slots, world) / rank_share(gpu, slots, c->ranks);
    for (int i = 0; i < k.n_gemm; i++) k.gemm[i].flops_per_s *= s;
    k.mem_bw *= s;
    k.attn_flops_per_s *= s;
    for (int i = 0; i < k.n_elem; i++) k.elem[i].per_float /= s, k.elem[i].fixed_per_layer /= s;
    return k;
}

/* Every rank's plan of layout l: the largest peak and the slowest step into
 * l; the per-rank table printed when print, and written to json. */
static void plan_layout(const TrainArgs *a, const PlanInput *in, const PlanCalib *c, Layout *l, bool print,
                        const char *text, double limit, FILE *json) {
    const int W = in->tp * in->dp * in->pp;
    const double mib = 1.0 / (1024.0 * 1024.0);
    if (print) {
        printf("predicted peak memory per rank (MiB; limit %.0f MiB per rank) and step time (s), %s:\n", limit * mib,
               text);
        printf("  rank (tp,dp,pp) |");
        for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11s", mem_tag_name((MemTag)t));
        printf(" | allocator |  step  compute    comm  bubble\n");
    }
    l->peak = l->step = 0.0, l->worst = 0;
    if (json) {
        char flags[256];
        layout_flags(l, a, flags, sizeof flags);
        fprintf(json, "{\"plan\": \"%s\", \"flags\": \"%s\", \"limit\": %.0f, \"ranks\": [", text, flags, limit);
    }
    PlanRank *ranks = TP_MALLOC((size_t)W * sizeof *ranks);
    for (int r = 0; r < W; r++) planner_memory(in, r, &ranks[r]);
    planner_time(in, c, ranks);
    for (int r = 0; r < W; r++) {
        PlanRank pr = ranks[r];
        pr.tag[MEM_LIBRARY] += c->library_bytes;  // NCCL's buffers (planned) and the measured context
        if (print) {
            printf("  %4d (%d,%d,%d)    |", r, pr.tp, pr.dp, pr.pp);  // the run's memory table, predicted
            for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11.2f", pr.tag[t] * mib);
            printf(" | %9.2f | %6.3f %7.3f %7.3f %7.3f\n", pr.allocator_peak * mib, pr.t_step, pr.t_compute, pr.t_comm,
                   pr.t_bubble);
        }
        if (json) {
            fprintf(json, "%s{\"rank\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d", r ? ", " : "", r, pr.tp, pr.dp, pr.pp);
            for (int t = 0; t < MEM_N_TAGS; t++) fprintf(json, ", \"%s\": %.0f", mem_tag_name((MemTag)t), pr.tag[t]);
            fprintf(json, ", \"allocator_peak\": %.0f, \"step_s\": %.6f, \"compute_s\": %.6f, \"comm_s\": %.6f, "
                    "\"bubble_s\": %.6f}", pr.allocator_peak, pr.t_step, pr.t_compute, pr.t_comm, pr.t_bubble);
        }
        if (pr.allocator_peak + pr.tag[MEM_LIBRARY] > l->peak) l->peak = pr.allocator_peak + pr.tag[MEM_LIBRARY], l->worst = r;
        if (pr.t_step >= l->step) l->step = pr.t_step, l->compute = pr.t_compute, l->comm = pr.t_comm, l->bubble = pr.t_bubble;
    }
    free(ranks);
    if (json) fprintf(json, "]");
    if (print) fflush(stdout);
}

typedef struct {
    TrainArgs *a;
    bool choose, lead, gpu, had;
    Backend *be;
    Runtime rt;
    int world, local_world, W;  // W: the ranks planned (the world, or alone the layout's size)
    Layout *ls;
    int n;
    StageSet *stage_sets;
    int n_stage_sets;
    ShapeSet *sets;
    int n_sets;
    Source src;
    int t_run;          // the run's threads per rank
    const char *cache;  // the calibration file
    PlanCalib cal;
    int32_t choice[9];  // ok, tp, dp, pp, micro, zero, sp, recompute, batch tokens
} Plan;

/* The backend and the ranks: through tprun the ranks meet to measure the
 * collectives; alone, the layout's size is planned. 0 or 2. */
static int plan_open(Plan *p) {
    TrainArgs *a = p->a;
    if (!(p->be = app_backend_open(a))) return 2;
    p->world = env_int("WORLD_SIZE", 1), p->local_world = env_int("LOCAL_WORLD_SIZE", p->world);
    RuntimeOptions ro = {.tp = 1, .dp = 0, .pp = 1, .n_heads = a->cfg.n_heads, .d_ff = a->cfg.d_ff,
                         .timeout_s = a->comm_timeout, .comm = RUNTIME_COMM_SHM};
    if (app_runtime_open(p->be, &ro, &p->rt, "--plan: ")) return 2;
    p->lead = p->rt.mesh.rank == 0;
    return 0;
}

/* The layouts to plan: --layout auto's candidates, or the one the flags
 * give (tp and dp filled in as the run would). 0, or 2 with the ranks and
 * the backend freed. */
static int plan_layouts(Plan *p) {
    const TrainArgs *a = p->a;
    p->W = p->world;
    if (a->layout_auto) {
        p->n = layouts_enumerate(a, p->W, &p->ls);
        return 0;
    }
    int tp = a->tp, dp = a->dp;
    const int pp = a->pp, world = p->world;
    const int W = p->W = world > 1 ? world : (tp ? tp : 1) * (dp ? dp : 1) * pp;
    if (W % pp) {
        fprintf(stderr, "train_mt: --plan: --pp %d does not divide the world size %d\n", pp, W);
        runtime_free(&p->rt);
        backend_destroy(p->be);
        return 2;
    }
    if (!tp && !dp) tp = runtime_auto_tp(W / pp, world > 1 ? p->local_world : W, a->cfg.n_heads, a->cfg.d_ff);
    if (!tp) tp = W / pp / dp;
    if (!dp) dp = W / pp / tp;
    if (tp * dp * pp != W || a->cfg.n_heads % tp || a->cfg.d_ff % tp) {
        fprintf(stderr, "train_mt: --plan: tp %d x dp %d x pp %d does not fit %d ranks and the model (heads %d, "
                        "ffn %d)\n", tp, dp, pp, W, a->cfg.n_heads, a->cfg.d_ff);
        runtime_free(&p->rt);
        backend_destroy(p->be);
        return 2;
    }
    p->n = 1;
    p->ls = TP_MALLOC(sizeof *p->ls);
    p->ls[0] = (Layout){.tp = tp, .dp = dp, .pp = pp, .micro = a->micro_batches, .zero = a->grad.zero,
                        .sp = a->seq_par && tp > 1, .rc = a->recompute, .batch_tokens = a->batch_tokens, .set = -1};
    return 0;
}

/* The stages of each pp (balanced by cost, or --pp-layout), made once; a
 * layout whose tp or stages cannot be made is dropped with the reason. */
static void plan_stage_sets(Plan *p) {
    const TrainArgs *a = p->a;
    p->stage_sets = TP_CALLOC((size_t)p->n, sizeof *p->stage_sets);
    for (int i = 0; i < p->n; i++) {
        Layout *l = &p->ls[i];
        if (a->cfg.n_heads % l->tp || a->cfg.d_ff % l->tp) {
            snprintf(l->why, sizeof l->why, "tp %d does not divide the heads (%d) and the ffn (%d)", l->tp,
                     a->cfg.n_heads, a->cfg.d_ff);
            continue;
        }
        int k = 0;
        while (k < p->n_stage_sets && p->stage_sets[k].pp != l->pp) k++;
        if (k == p->n_stage_sets) {
            StageSet *s = &p->stage_sets[p->n_stage_sets++];
            s->pp = l->pp;
            s->st = TP_MALLOC((size_t)l->pp * sizeof *s->st);
            if (model_stages_make(&a->cfg, l->pp, a->layout_auto ? NULL : a->pp_layout, s->st, s->err, sizeof s->err) &&
                !s->err[0])
                snprintf(s->err, sizeof s->err, "%d stages cannot be made", l->pp);
        }
        if (p->stage_sets[k].err[0]) snprintf(l->why, sizeof l->why, "%s", p->stage_sets[k].err);
        l->stages = p->stage_sets[k].st;
    }
}

/* The data source, and the batch shapes read once per (dp, micro-batches,
 * tokens). 0 with the source open; 2 (the one layout asked for cannot be
 * made) or 1 (the data cannot be read) with it closed. */
static int plan_read_shapes(Plan *p) {
    TrainArgs *a = p->a;
    char err[1024];
    p->sets = TP_CALLOC((size_t)p->n, sizeof *p->sets);
    if (!a->layout_auto && p->ls[0].why[0]) {
        fprintf(stderr, "train_mt: %s\n", p->ls[0].why);
        return 2;
    }
    if (source_open(&p->src, a, &a->cfg, &p->rt, NULL, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        source_close(&p->src);
        return 1;
    }
    for (int i = 0; i < p->n; i++) {
        Layout *l = &p->ls[i];
        if (l->why[0]) continue;
        ShapeSet *sets = p->sets;
        int k = 0;
        while (k < p->n_sets &&
               !(sets[k].dp == l->dp && sets[k].micro == l->micro && sets[k].batch_tokens == l->batch_tokens))
            k++;
        if (k == p->n_sets) {
            sets[k] = (ShapeSet){.dp = l->dp, .micro = l->micro, .batch_tokens = l->batch_tokens};
            if (plan_shapes(a, &p->src, l->dp, l->micro, l->batch_tokens, &sets[k].ps, sets[k].err, sizeof sets[k].err) &&
                !sets[k].err[0])
                snprintf(sets[k].err, sizeof sets[k].err, "its batches cannot be read");
            p->n_sets++;
        }
        l->set = k;
        if (sets[k].err[0]) snprintf(l->why, sizeof l->why, "%s", sets[k].err);
    }
    if (!a->layout_auto && p->ls[0].why[0]) {
        fprintf(stderr, "train_mt: %s\n", p->ls[0].why);
        source_close(&p->src);
        return 1;
    }
    return 0;
}

/* The calibration: every rank measures the rates the layouts need at
 * once, in step (the contention of the run; rank 0's figures count),
 * then the collectives; the cache keeps what was measured on this
 * machine with this many ranks. */
static void plan_calibrate(Plan *p) {
    const TrainArgs *a = p->a;
    Backend *be = p->be;
    const int world = p->world, W = p->W;
    p->gpu = !be->host_visible;
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int t_cal = env_threads();
    /* the run's threads per rank: this process's (through tprun, or OMP_NUM_THREADS given), else tprun's share */
    p->t_run = world > 1 || getenv("OMP_NUM_THREADS") ? t_cal : (W > 1 ? (int)tp_threads_per_worker(W) : cores);
    p->cache = a->plan_cache ? a->plan_cache : "cache/plan_calibration.json";
    PlanCalib cal;
    memset(&cal, 0, sizeof cal);
    calib_key(be, t_cal, cal.key, sizeof cal.key);
    p->had = planner_calib_load(p->cache, &cal) == 0;
    if (p->had && cal.ranks != world) {  // other contention: the compute rates again, the collectives kept
        PlanCalib keep = cal;
        memset(&cal, 0, sizeof cal);
        memcpy(cal.key, keep.key, sizeof cal.key);
        memcpy(cal.ar_lat, keep.ar_lat, sizeof cal.ar_lat), memcpy(cal.ar_bw, keep.ar_bw, sizeof cal.ar_bw);
        memcpy(cal.ar_loaded, keep.ar_loaded, sizeof cal.ar_loaded);
        cal.p2p_lat = keep.p2p_lat, cal.p2p_bw = keep.p2p_bw;
    }
    cal.ranks = world;
    for (int i = 0; i < p->n; i++)
        if (!p->ls[i].why[0]) {
            const PlanInput in = plan_input(a, &p->ls[i], p->gpu, p->t_run, &p->sets[p->ls[i].set].ps);
            planner_calibrate_compute(be, &in, &cal, world > 1 ? p->rt.ctrl : NULL);
        }
    if (world > 1) {
        char err[1024];
        const Runtime *rt = &p->rt;
        comm_ok(comm_barrier(rt->ctrl), rt->ctrl);
        for (int g = 2; g <= world && g <= PLAN_MAX_GROUP; g++) {  // groups of g consecutive ranks, all at once
            if (world % g || cal.ar_bw[g] > 0.0) continue;  // measured once per machine (every rank read the same cache)
            char name[64];
            snprintf(name, sizeof name, "plan.g%d.k%d", g, rt->mesh.rank / g);
            Comm *c = comm_shm_create(rt->job_id, name, rt->mesh.rank % g, g, a->comm_timeout, err, sizeof err);
            TP_CHECK(c, "%s", err);
            planner_calibrate_comm(be, c, &cal);
            comm_free(c);
        }
    }
    if (backend_device_used(be, NULL)) cal.library_bytes = (double)be->mem.cur[MEM_LIBRARY];
    p->cal = cal;
}

/* Rank 0: the calibration saved, the plan's heading, and every layout
 * that stands planned against the memory limit (*limit); the rates for
 * this run's ranks returned. */
static PlanCalib plan_fit(Plan *p, double *limit) {
    const TrainArgs *a = p->a;
    const PlanCalib *cal = &p->cal;
    const int W = p->W, world = p->world, t_run = p->t_run;
    char why[512];
    mkdir("cache", 0755);
    if (planner_calib_save(p->cache, cal, why, sizeof why))
        fprintf(stderr, "train_mt: --plan: the calibration was not saved: %s\n", why);
    const PlanCalib run = calib_for_run(cal, W, p->gpu, plan_slots(p->gpu, t_run));
    *limit = a->memory_limit;
    if (*limit <= 0.0) *limit = default_memory_limit(p->be, W);
    printf("train_mt: plan for preset %s (%d+%d layers, d_model %d, vocab %d) on %s, %d rank%s of %d thread%s; "
           "calibration %s%s%s\n", a->preset, a->cfg.enc_layers, a->cfg.dec_layers, a->cfg.d_model,
           a->cfg.vocab_size, p->be->device_name, W, W > 1 ? "s" : "", t_run, t_run > 1 ? "s" : "", p->cache,
           p->had ? " (completed)" : " (new)",
           world == 1 && W > 1 ? (cal->ar_bw[2] > 0 ? "; collectives from an earlier run through tprun"
                                                    : "; collectives not measured: run --plan through tprun once")
                               : "");
    if (p->gpu)
        printf("train_mt: --plan: not counted: the CUDA context and libraries, about %.0f MiB measured on %s at "
               "start (in use once they exist, less the allocator's; in the library column, beyond the planner's "
               "control; every process on a GPU has its own); modelled: cuBLASLt's %zu MiB workspace and the ops' "
               "scratch arena (workspace), %zu MiB of page-locked staging per group with peers for ranks sharing a "
               "GPU (comm), NCCL's buffers with a GPU per rank (library: %zu MiB x %d channels per ring peer per "
               "communicator, NCCL's documented sizes; the channel count assumed unless NCCL_MAX_NCHANNELS is set)\n",
               cal->library_bytes / 1048576.0, p->be->device_name, backend_gemm_workspace_bytes(BACKEND_CUDA) >> 20,
               comm_shm_stage_bytes(2) >> 20, planner_nccl_buffsize() >> 20, planner_nccl_channels());
    else
        printf("train_mt: --plan: not counted: a GPU's CUDA context and libraries (not measured on the CPU)\n");
    fflush(stdout);
    for (int i = 0; i < p->n; i++) {
        Layout *l = &p->ls[i];
        if (l->why[0]) continue;
        const PlanInput in = plan_input(a, l, p->gpu, t_run, &p->sets[l->set].ps);
        plan_layout(a, &in, &run, l, false, NULL, *limit, NULL);
        if (l->peak > *limit)
            snprintf(l->why, sizeof l->why, "does not fit: rank %d needs %.1f MiB, the limit is %.1f MiB", l->worst,
                     l->peak / 1048576.0, *limit / 1048576.0);
    }
    return run;
}

/* --metrics with --plan: the ranking of --layout auto appended to the
 * chosen layout's record, and the file closed. 0, or 1 if writing failed. */
static int plan_json_close(const Plan *p, FILE *json, Layout **order, int pick, const Layout *best) {
    const TrainArgs *a = p->a;
    if (a->layout_auto) {
        fprintf(json, "%s\"candidates\": [", best->why[0] ? "{" : ", ");
        for (int i = 0; i < p->n; i++) {
            char flags[256], desc[600];
            layout_text(order[i], a, desc, sizeof desc);
            layout_flags(order[i], a, flags, sizeof flags);
            fprintf(json, "%s{\"layout\": \"%s\", \"flags\": \"%s\", \"tp\": %d, \"dp\": %d, \"pp\": %d, "
                    "\"micro\": %d, \"zero\": %d, \"sp\": %s, \"recompute\": \"%s\", \"batch_tokens\": %d, "
                    "\"fits\": %s, \"chosen\": %s, \"why\": \"%s\", \"step_s\": %.6f, \"comm_s\": %.6f, "
                    "\"bubble_s\": %.6f, \"peak\": %.0f}", i ? ", " : "", desc, flags,
                    order[i]->tp, order[i]->dp, order[i]->pp, order[i]->micro, order[i]->zero,
                    order[i]->sp ? "true" : "false", model_recompute_name(order[i]->rc), order[i]->batch_tokens,
                    order[i]->why[0] ? "false" : "true", i == pick && !best->why[0] ? "true" : "false",
                    order[i]->why, order[i]->step, order[i]->comm, order[i]->bubble, order[i]->peak);
        }
        fprintf(json, "]");
    }
    fprintf(json, "}\n");
    if (fclose(json) != 0) {
        fprintf(stderr, "train_mt: --metrics %s: writing the file failed\n", a->metrics_path);
        return 1;
    }
    return 0;
}

/* Rank 0: the verdict on the chosen (or the only) layout: 3 if it does not
 * fit, else 0 with the choice recorded for the other ranks. */
static int plan_verdict(Plan *p, const Layout *best, const char *text, double limit) {
    const TrainArgs *a = p->a;
    if (best->why[0]) {
        if (a->layout_auto) printf("train_mt: no layout of %d ranks fits: the smallest, %s, %s\n", p->W, text, best->why);
        else printf("train_mt: %s\n", best->why);
        return 3;
    }
    printf("train_mt: fits: the largest rank (%d) needs %.1f MiB of %.1f MiB; predicted step %.3f s\n", best->worst,
           best->peak / 1048576.0, limit / 1048576.0, best->step);
    if (a->layout_auto) {
        char flags[256];
        layout_flags(best, a, flags, sizeof flags);
        printf("train_mt: --layout auto: %s %s (%s)\n", p->choose ? "training" : "would train", text, flags);
    }
    int32_t *choice = p->choice;
    choice[0] = 1, choice[1] = best->tp, choice[2] = best->dp, choice[3] = best->pp, choice[4] = best->micro;
    choice[5] = best->zero, choice[6] = best->sp, choice[7] = (int32_t)best->rc, choice[8] = best->batch_tokens;
    return 0;
}

/* Rank 0: every layout planned, ranked (--layout auto), the chosen one's
 * table (and --metrics record) and the verdict. The exit status. */
static int plan_decide(Plan *p) {
    const TrainArgs *a = p->a;
    const int n = p->n;
    int rc = 0;
    double limit;
    const PlanCalib run = plan_fit(p, &limit);
    Layout **order = TP_MALLOC((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = &p->ls[i];
    qsort(order, (size_t)n, sizeof *order, by_step);
    const int pick = layout_pick(order, n);
    if (a->layout_auto) print_ranking(order, n, a, p->W, p->choose ? 5 : PLAN_TOP, pick);
    /* the chosen (or the only) layout: its table and verdict */
    Layout *best = order[pick];
    char text[600];
    layout_text(best, a, text, sizeof text);
    FILE *json = NULL;
    if (!p->choose && a->metrics_path && !(json = fopen(a->metrics_path, "w"))) {
        fprintf(stderr, "train_mt: --metrics %s: %s\n", a->metrics_path, strerror(errno));
        rc = 2;
    }
    if (rc == 0 && (!best->why[0] || !a->layout_auto)) {
        const PlanInput in = plan_input(a, best, p->gpu, p->t_run, &p->sets[best->set].ps);
        plan_layout(a, &in, &run, best, true, text, limit, json);
    }
    if (json) rc = plan_json_close(p, json, order, pick, best);
    if (rc == 0) rc = plan_verdict(p, best, text, limit);
    fflush(stdout);
    free(order);
    return rc;
}

/* --layout auto: every rank trains what rank 0 chose. */
static int plan_share_choice(Plan *p, int rc) {
    TrainArgs *a = p->a;
    const int32_t *choice = p->choice;
    comm_ok(comm_broadcast(p->rt.ctrl, p->choice, sizeof p->choice, 0), p->rt.ctrl);
    if (choice[0]) {
        a->tp = choice[1], a->dp = choice[2], a->pp = choice[3], a->micro_batches = choice[4], a->grad.zero = choice[5];
        a->seq_par = choice[6], a->recompute = (ModelRecompute)choice[7], a->batch_tokens = choice[8];
        return 0;
    }
    return rc == 0 ? 3 : rc;
}

static void plan_close(Plan *p) {
    for (int k = 0; k < p->n_sets; k++) plan_shapes_free(&p->sets[k].ps);
    free(p->sets);
    for (int k = 0; k < p->n_stage_sets; k++) free(p->stage_sets[k].st);
    free(p->stage_sets);
    free(p->ls);
    runtime_free(&p->rt);
    backend_destroy(p->be);
}

int plan_main(TrainArgs *a, bool choose) {
    Plan p = {.a = a, .choose = choose};
    int rc = plan_open(&p);
    if (rc || (rc = plan_layouts(&p)) != 0) return rc;
    plan_stage_sets(&p);
    rc = plan_read_shapes(&p);
    if (rc == 0) {
        plan_calibrate(&p);
        if (p.lead) rc = plan_decide(&p);
        if (choose) rc = plan_share_choice(&p, rc);
        source_close(&p.src);
    }
    plan_close(&p);
    return rc;
}
