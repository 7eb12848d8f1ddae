/* report.h: what a run tells its user besides the step lines: the memory
 * of every rank by tag (a table when a peak grows, and records in
 * --metrics), the --metrics writer, --profile's table, and the closing
 * lines (time, tp collectives, each pipeline stage's waiting).
 *
 * Every memory report gathers every rank's figures over the control
 * communicator, so each is collective: every rank calls it, rank 0 prints.
 */
#ifndef TPTRAIN_APP_REPORT_H
#define TPTRAIN_APP_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "kernels/backend.h"
#include "tp/comm.h"
#include "tp/runtime.h"
#include "train/graphs.h"
#include "transformer/stage.h"

/* A run's clocks (tp_now_s) and the tp collectives of its training steps
 * (evaluation left out), for the closing lines. t_eval: evaluating (dev
 * loss, dev BLEU); t_save: the part of saving checkpoints the run waited
 * for (all of a synchronous save; an asynchronous one's snapshot and waits). */
typedef struct {
    double t_start, t_eval, t_save, t_comm, t_exposed, t_pp_wait;
    CommStats tp_steps;
} RunClock;

/* s seconds as "1h02m" or "3m05s". */
void fmt_duration(char *buf, size_t n, double s);

/* One JSON line of --metrics, written through at once: a failed write (a
 * full disk) ends the run naming the file instead of leaving it truncated. */
__attribute__((format(printf, 3, 4))) void metrics_line(FILE *f, const char *path, const char *fmt, ...);

/* At a log point: the table and the per-tag metrics record when a peak of
 * some rank grew since they were last given (the first time, always), so
 * the log shows every new peak without repeating an unchanged table. *last
 * (world x the figures, NULL at first; to free) keeps what was given. */
void memory_report_if_grown(const Runtime *rt, Backend *be, FILE *metrics, const char *path, int step,
                            double **last, const char *when);

/* At the end: the table and the metrics record (metrics: NULL but on rank 0). */
void memory_report_end(const Runtime *rt, Backend *be, FILE *metrics, const char *path, int step);

/* Every rank's allocator peak and peak RSS in the metrics record, in MiB:
 * keys "mem_peak_mib" and "mem_rss_mib", arrays indexed by rank, and on a
 * GPU "mem_device_used_mib" (null for a rank without a device; the key is
 * absent when no rank has one). The text (to free) only where want is true. */
char *memory_metrics(const Runtime *rt, Backend *be, bool want);

/* --profile: the backend's op timers on, and the data groups' collectives
 * counted as communication. */
void profile_start(Backend *be, Runtime *rt);
/* Rank 0's steps (each rank times its own): the table, and its record in --metrics. */
void report_profile(Backend *be, FILE *metrics, const char *path, int step);
/* --cuda-graphs on: one line of what the graphs did (captured, replayed,
 * run op by op, dropped as stale), and a "graphs" record in the metrics. */
void report_graphs(GraphStats g, FILE *metrics, const char *path, int step);

/* Rank 0: the run's time (training, data-parallel communication, and the
 * shares of the wall time spent evaluating and saving, also as a record
 * {"step", "time": {"wall_s", "train_s", "eval_s", "eval_frac", "save_s",
 * "save_frac"}} in metrics when given) and, with tp > 1, the tp collectives per
 * training step. Not collective. */
void report_summary(const Runtime *rt, const RunClock *c, int first_step, int total, FILE *metrics,
                    const char *path);

/* With stages, one line per stage (from its tp 0, dp 0 rank): the share of
 * training spent waiting in exchanges, and the messages sent and received. */
void report_pipeline_stage(const Runtime *rt, const ModelStage *stages, int micro_batches, const RunClock *c,
                           long sent, long received, int steps);

#endif
