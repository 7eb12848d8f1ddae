/* report.c: the memory report, the --metrics writer, --profile's table
 * and a run's closing lines (see report.h). Kept apart from the training
 * loop so the loop reads as steps and the figures' formats live in one
 * place.
 */
#include "app/report.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "clock.h"
#include "err.h"
#include "profile.h"
#include "train/pipeline.h"

void fmt_duration(char *buf, size_t n, double s) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* Memory of every rank by tag (kernels/backend.h), gathered over the host
 * control communicator: per rank the peak of each tag, the allocator's
 * total peak (what torch.cuda.max_memory_allocated reports), the library
 * overhead, the process's peak resident set and, on a GPU, the device's
 * used memory (cudaMemGetInfo, sampled here: the largest figure seen so
 * far; it counts every process on that GPU). */
enum { MEMF_TOTAL = MEM_N_TAGS, MEMF_RSS, MEMF_TP, MEMF_DP, MEMF_PP, MEMF_HAS_DEV, MEMF_DEV_USED, MEMF_N };

static double *memory_gather(const Runtime *rt, Backend *be) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mine[MEMF_N];
    for (int t = 0; t < MEM_N_TAGS; t++) mine[t] = (double)be->mem.peak[t];
    mine[MEMF_TOTAL] = (double)be->mem.total_peak;
    mine[MEMF_RSS] = (double)ru.ru_maxrss * 1024.0;
    mine[MEMF_HAS_DEV] = backend_device_used(be, NULL);
    mine[MEMF_DEV_USED] = (double)be->mem.device_used_peak;
    mine[MEMF_TP] = rt->mesh.tp_rank;
    mine[MEMF_DP] = rt->mesh.dp_rank;
    mine[MEMF_PP] = rt->mesh.pp_rank;
    /* an allgather copies bits, so the counts travel as 64-bit integers (two floats' worth each) */
    uint64_t enc[MEMF_N];
    for (int i = 0; i < MEMF_N; i++) enc[i] = (uint64_t)mine[i];
    const int W = rt->mesh.world;
    uint64_t *all = TP_MALLOC((size_t)W * MEMF_N * sizeof(uint64_t));
    TP_CHECK(comm_allgather(rt->ctrl, (const float *)enc, (float *)all, (size_t)MEMF_N * 2) == 0, "%s",
             comm_error(rt->ctrl));
    double *out = TP_MALLOC((size_t)W * MEMF_N * sizeof(double));
    for (int i = 0; i < W * MEMF_N; i++) out[i] = (double)all[i];
    free(all);
    return out;
}

void metrics_line(FILE *f, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vfprintf(f, fmt, ap);
    va_end(ap);
    if (k < 0 || fflush(f) != 0 || ferror(f)) {
        fprintf(stderr, "train_mt: --metrics %s: writing the file failed (%s)\n", path, strerror(errno));
        exit(1);
    }
}

/* The metrics record of every rank's peak bytes per tag (from memory_gather). */
static void memory_record(FILE *out, const char *path, const Runtime *rt, const double *all, int step) {
    if (out) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        TP_CHECK(f, "out of memory formatting the metrics record");
        fprintf(f, "{\"step\": %d, \"memory\": [", step);
        for (int r = 0; r < rt->mesh.world; r++) {
            const double *x = all + (size_t)r * MEMF_N;
            fprintf(f, "%s{\"rank\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d", r ? ", " : "", r, (int)x[MEMF_TP],
                    (int)x[MEMF_DP], (int)x[MEMF_PP]);
            for (int t = 0; t < MEM_N_TAGS; t++) fprintf(f, ", \"%s\": %.0f", mem_tag_name((MemTag)t), x[t]);
            fprintf(f, ", \"allocator_peak\": %.0f, \"peak_rss\": %.0f", x[MEMF_TOTAL], x[MEMF_RSS]);
            if (x[MEMF_HAS_DEV]) fprintf(f, ", \"device_used\": %.0f", x[MEMF_DEV_USED]);  // absent on the CPU
            fprintf(f, "}");
        }
        fprintf(f, "]}\n");
        TP_CHECK(fclose(f) == 0, "out of memory formatting the metrics record");
        metrics_line(out, path, "%s", text);
        free(text);
    }
}

static void memory_table(const Runtime *rt, const Backend *be, const double *all, const char *when) {
    if (rt->mesh.rank == 0) {
        const double mib = 1.0 / (1024.0 * 1024.0);
        printf("peak memory per rank (MiB, %s; device %s):\n", when, be->device_name);
        printf("  rank (tp,dp,pp) |");
        for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11s", mem_tag_name((MemTag)t));
        printf(" | allocator |  peak RSS | device used\n");
        for (int r = 0; r < rt->mesh.world; r++) {
            const double *x = all + (size_t)r * MEMF_N;
            printf("  %4d (%d,%d,%d)    |", r, (int)x[MEMF_TP], (int)x[MEMF_DP], (int)x[MEMF_PP]);
            for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11.2f", x[t] * mib);
            printf(" | %9.2f | %9.1f |", x[MEMF_TOTAL] * mib, x[MEMF_RSS] * mib);
            if (x[MEMF_HAS_DEV]) printf(" %11.2f\n", x[MEMF_DEV_USED] * mib);
            else printf(" %11s\n", "-");
        }
        fflush(stdout);
    }
}

void memory_report_if_grown(const Runtime *rt, Backend *be, FILE *metrics, const char *path, int step,
                            double **last, const char *when) {
    double *all = memory_gather(rt, be);
    const size_t n = (size_t)rt->mesh.world * MEMF_N;
    bool grown = *last == NULL;
    for (size_t i = 0; !grown && i < n; i++)  // the tags and the allocator total (not RSS: it creeps)
        grown = i % MEMF_N <= MEMF_TOTAL && all[i] > (*last)[i];
    if (grown) {
        memory_table(rt, be, all, when);
        memory_record(metrics, path, rt, all, step);
        free(*last);
        *last = all;
    } else {
        free(all);
    }
}

char *memory_metrics(const Runtime *rt, Backend *be, bool want) {
    double *all = memory_gather(rt, be);
    char *text = NULL;
    size_t len = 0;
    if (want) {
        FILE *f = open_memstream(&text, &len);
        TP_CHECK(f, "out of memory formatting the metrics record");
        const double mib = 1.0 / (1024.0 * 1024.0);
        for (int k = 0; k < 2; k++) {
            fprintf(f, "%s", k == 0 ? ", \"mem_peak_mib\": [" : ", \"mem_rss_mib\": [");
            for (int r = 0; r < rt->mesh.world; r++)
                fprintf(f, "%s%.2f", r ? ", " : "", all[(size_t)r * MEMF_N + (k == 0 ? MEMF_TOTAL : MEMF_RSS)] * mib);
            fprintf(f, "]");
        }
        bool any_dev = false;
        for (int r = 0; r < rt->mesh.world; r++) any_dev = any_dev || all[(size_t)r * MEMF_N + MEMF_HAS_DEV] != 0.0;
        if (any_dev) {
            fprintf(f, ", \"mem_device_used_mib\": [");
            for (int r = 0; r < rt->mesh.world; r++) {
                const double *x = all + (size_t)r * MEMF_N;
                if (x[MEMF_HAS_DEV]) fprintf(f, "%s%.2f", r ? ", " : "", x[MEMF_DEV_USED] * mib);
                else fprintf(f, "%snull", r ? ", " : "");
            }
            fprintf(f, "]");
        }
        TP_CHECK(fclose(f) == 0, "out of memory formatting the metrics record");
    }
    free(all);
    return text;
}

void memory_report_end(const Runtime *rt, Backend *be, FILE *metrics, const char *path, int step) {
    double *all = memory_gather(rt, be);
    memory_table(rt, be, all, "end of training");
    memory_record(metrics, path, rt, all, step);
    free(all);
}

static void prof_comm_begin(void *be) { backend_profile_region_begin(be, PROF_OP_collectives); }
static void prof_comm_end(void *be) { backend_profile_region_end(be); }
void profile_start(Backend *be, Runtime *rt) {
    backend_profile_enable(be);
    const CommTimer t = {.begin = prof_comm_begin, .end = prof_comm_end, .ctx = be};
    comm_set_timer(rt->tp, t);
    comm_set_timer(rt->dp, t);
    comm_set_timer(rt->pp, t);
}

void report_profile(Backend *be, FILE *metrics, const char *path, int step) {
    const ProfTotals pt = backend_profile_totals(be);
    prof_print_table(stdout, &pt, be->device_name);
    if (metrics) {
        char json[16384];  // the classes and up to every op: a few KiB
        metrics_line(metrics, path, "{\"step\": %d, \"profile\": %s}\n", step, prof_json(&pt, json, sizeof json));
    }
    fflush(stdout);
}

void report_graphs(GraphStats g, FILE *metrics, const char *path, int step) {
    printf("train_mt: graphs: %ld captured, %ld forward and backward phases replayed, %ld run op by op, %ld "
           "dropped as stale, %d kept%s\n",
           g.captured, g.replayed, g.eager, g.stale, g.kept, g.failed ? " (a capture was refused: graphs off)" : "");
    if (metrics)
        metrics_line(metrics, path,
                     "{\"step\": %d, \"graphs\": {\"captured\": %ld, \"replayed\": %ld, \"eager\": %ld, "
                     "\"stale\": %ld, \"kept\": %d, \"failed\": %s}}\n",
                     step, g.captured, g.replayed, g.eager, g.stale, g.kept, g.failed ? "true" : "false");
    fflush(stdout);
}

void report_summary(const Runtime *rt, const RunClock *c, int first_step, int total, FILE *metrics,
                    const char *path) {
    char took[32];
    const double wall = tp_now_s() - c->t_start, share = wall > 0.0 ? 100.0 / wall : 0.0;
    fmt_duration(took, sizeof took, wall);
    printf("train_mt: %d steps in %s (%.1f s training, with %.1f s data-parallel communication of which "
           "%.1f s exposed; %.1f s evaluation, %.1f%% of the wall time; %.1f s saving, %.1f%%)\n", total, took,
           wall - c->t_eval - c->t_save, c->t_comm, c->t_exposed, c->t_eval, c->t_eval * share, c->t_save,
           c->t_save * share);
    if (metrics)
        metrics_line(metrics, path, "{\"step\": %d, \"time\": {\"wall_s\": %.3f, \"train_s\": %.3f, "
                     "\"eval_s\": %.3f, \"eval_frac\": %.6f, \"save_s\": %.3f, \"save_frac\": %.6f}}\n", total, wall,
                     wall - c->t_eval - c->t_save, c->t_eval, c->t_eval * share / 100.0, c->t_save,
                     c->t_save * share / 100.0);
    CommStats ts = comm_stats(rt->tp);
    const double steps_run = total >= first_step ? total - first_step + 1 : 1;
    if (rt->mesh.tp > 1)
        printf("train_mt: tensor-parallel allreduces: %ld (%.1f MiB), %.1f s; per training step %.2f "
               "allreduces, %.2f reduce-scatters, %.2f allgathers\n", ts.allreduce,
               ts.allreduce_bytes / (1024.0 * 1024.0), ts.seconds, (double)c->tp_steps.allreduce / steps_run,
               (double)c->tp_steps.reduce_scatter / steps_run, (double)c->tp_steps.allgather / steps_run);
}

void report_pipeline_stage(const Runtime *rt, const ModelStage *stages, int micro_batches, const RunClock *c,
                           long sent, long received, int steps) {
    const Mesh *mesh = &rt->mesh;
    const int pp = mesh->pp;
    char layout[256];
    model_stages_format(&stages[mesh->pp_rank], 1, layout, sizeof layout);
    const double train_s = tp_now_s() - c->t_start - c->t_eval - c->t_save;
    printf("train_mt: pipeline stage %d (%s): %.1f%% of %.1f s training waiting in exchanges (measured bubble "
           "and transfers; ideal 1F1B bubble %.1f%%); %ld messages sent and %ld received in %d steps\n",
           mesh->pp_rank, layout, train_s > 0 ? 100.0 * c->t_pp_wait / train_s : 0.0, train_s,
           100.0 * pipeline_bubble_theory(pp, micro_batches), sent, received, steps);
    fflush(stdout);
}
