/* ckpt_async.c: the asynchronous save (ckpt_async.h), as Megatron's and
 * PyTorch DCP's async save: a snapshot at the step boundary, the writing
 * in a background thread while training goes on.
 *
 * Why it is shaped this way:
 * - The snapshot is taken on the training thread, at the step boundary,
 *   into one host buffer per rank (MEM_CKPT: page-locked on CUDA, so the
 *   copy from the GPU runs at full speed; tagged, so the memory report and
 *   the planner show it): the master weights (dp rank 0, the model shard's
 *   writer), the AdamW moments, and the manifest's fields (step, data
 *   cursor, RNG seed, clock, config, optimizer) as a cJSON object. The next
 *   step changes the model in place; the thread reads only the snapshot and
 *   the parameter table and optimizer layout, fixed for the run.
 * - The control communicator is the training thread's and not thread-safe:
 *   the thread makes no collective. Ranks meet through files instead:
 *   after its files are durable, every rank but 0 leaves a marker
 *   (.written-rank-R, written atomically: "ok", or the sentence of its
 *   failure) in the step's work folder; rank 0's thread waits for every
 *   marker (within --comm-timeout), removes them, then seals and publishes
 *   exactly as ckpt_save does: the manifest last, after re-reading every
 *   file for its size and CRC-32C, then the rename, `latest` replaced
 *   atomically, pruning, and (--keep-best) DIR/best. The folder must be
 *   shared by the ranks; it already is, as rank 0 reads every file.
 * - Sealing in the thread, not at the next save point, keeps a published
 *   checkpoint as fresh as a synchronous save's: a crash between saves
 *   loses no more steps than it would have.
 * - The training thread joins the writer (ckpt_writer_wait) before the next
 *   save, at the end, on a signal and before averaging, and the ranks agree
 *   on the outcome there with one collective. At most one write is in
 *   flight, so one snapshot buffer serves every save.
 * - A failure (a full disk, TPTRAIN_FAULT_FAIL) is never published: rank 0
 *   writes the manifest only when every file of every rank is durable, and
 *   a resume never reads a step_N.tmp. The run stops at the join with the
 *   sentence naming the file, exit status 1, as a failed synchronous save
 *   does (Megatron stops at its next synchronisation point the same way);
 *   the steps trained since the snapshot are not saved, as nothing more
 *   can be written where that write failed. A crash or SIGKILL while a
 *   write is in flight leaves the previous checkpoint as `latest`.
 */
#include "train/ckpt_async.h"
#include "train/ckpt_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "fileio.h"

/* How often rank 0's writer looks for the other ranks' markers: short
 * against a shard's write, long enough not to busy a core. */
#define MARKER_POLL_S 0.005

struct CkptWriter {
    double timeout_s;
    Backend *be;         // the snapshot's allocator: the model's backend
    float *snap;         // (n_params + 2 * n_opt) floats, MEM_CKPT
    size_t snap_elems;
    /* the write in flight (running) */
    pthread_t thread;
    bool running;
    int64_t step;
    char dir[4096], tmp[4096], spm_path[4096];
    bool has_spm, lead;
    int keep_last, world, rank;
    CkptShards shards;
    cJSON *manifest;  // rank 0: the fields but "files"
    bool has_best;
    char best_metric[16];
    double best_value;
    double start_s;  // ckpt_writer_save's checks and snapshot
    /* the thread's outcome */
    int rc;
    double write_s;
    char err[1024];
};

/* The snapshot's floats: the weights where the rank writes the model shard, both moments. */
static size_t snapshot_elems(const Model *m, const AdamW *opt, const Mesh *mesh, size_t *n_params) {
    *n_params = mesh->dp_rank == 0 ? m->tab.n_elems : 0;
    return *n_params + 2 * opt->n_elems;
}

CkptWriter *ckpt_writer_new(double timeout_s, const Model *m, const AdamW *opt, const Mesh *mesh) {
    CkptWriter *w = TP_CALLOC(1, sizeof *w);
    w->timeout_s = timeout_s;
    w->step = -1;
    size_t n_params;
    w->snap_elems = snapshot_elems(m, opt, mesh, &n_params);
    w->be = m->be;
    w->snap = backend_alloc_host(m->be, w->snap_elems * sizeof(float), MEM_CKPT);  // zero-filled: its pages are in
    return w;
}

int64_t ckpt_writer_pending(const CkptWriter *w) { return w->running ? w->step : -1; }

static void marker_path(char *out, size_t n, const char *tmp, int rank) {
    pathf(out, n, "%s/.written-rank-%d", tmp, rank);
}

/* Rank 0's thread: every other rank's marker, read and removed. 0, or -1 +
 * err (a rank's own failure, or a rank that did not finish in time). */
static int wait_markers(CkptWriter *w) {
    const double t0 = tp_now_s();
    for (int r = 1; r < w->world; r++) {
        char path[4096], why[1024];
        marker_path(path, sizeof path, w->tmp, r);
        while (access(path, F_OK) != 0) {
            if (tp_now_s() - t0 > w->timeout_s) {
                tp_error_set(w->err, sizeof w->err, "rank %d did not write its part of checkpoint step %lld within "
                             "%.0f s (--comm-timeout)", r, (long long)w->step, w->timeout_s);
                return -1;
            }
            const struct timespec ts = {0, (long)(MARKER_POLL_S * 1e9)};
            nanosleep(&ts, NULL);
        }
        size_t n = 0;
        char *text = read_file_bytes(path, &n, why, sizeof why);
        if (!text) {
            tp_error_set(w->err, sizeof w->err, "%s", why);
            return -1;
        }
        const bool ok = n == 3 && memcmp(text, "ok\n", 3) == 0;
        if (!ok) tp_error_set(w->err, sizeof w->err, "rank %d: %.*s", r, (int)(n < 900 ? n : 900), text);
        free(text);
        if (!ok) return -1;
        unlink(path);
    }
    return 0;
}

/* Test hook, as the fault hook (checkpoint.h): TPTRAIN_FAULT_WRITE_DELAY_S=S
 * holds the writer S seconds before it writes, so that a test finds a
 * write in flight (a signal, the end of the run, training going on). */
static void fault_delay(void) {
    const char *s = getenv("TPTRAIN_FAULT_WRITE_DELAY_S");
    const double d = s ? atof(s) : 0.0;
    if (!(d > 0.0)) return;
    const struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The thread: this rank's files, then (rank 0) the seal, the publication
 * and the best record; the other ranks leave their marker. */
static void *writer_main(void *arg) {
    CkptWriter *w = arg;
    const double t0 = tp_now_s();
    fault_delay();
    int rc = write_shards(w->tmp, &w->shards, w->err, sizeof w->err);
    if (rc == 0 && w->lead && w->has_spm) rc = save_tokenizer(w->tmp, w->spm_path, w->err, sizeof w->err);
    if (!w->lead) {
        char path[4096], why[1024];
        marker_path(path, sizeof path, w->tmp, w->rank);
        const char *text = rc == 0 ? "ok\n" : w->err;
        if (write_file_atomic(path, text, strlen(text), why, sizeof why) != 0 && rc == 0) {
            tp_error_set(w->err, sizeof w->err, "%s", why);
            rc = -1;
        }
    } else if (rc == 0) {
        rc = wait_markers(w);
        if (rc == 0) rc = manifest_finish(w->tmp, w->manifest, &w->shards.mesh, w->has_spm, w->err, sizeof w->err);
        if (rc == 0) rc = publish(w->dir, w->tmp, w->step, w->keep_last, w->err, sizeof w->err);
        if (rc == 0 && w->has_best)
            rc = ckpt_best_write(w->dir, w->step, w->best_metric, w->best_value, w->err, sizeof w->err);
    }
    w->write_s = tp_now_s() - t0;
    w->rc = rc;
    return NULL;
}

int ckpt_writer_wait(CkptWriter *w, const Runtime *rt, CkptWriteTimes *times, char *err, size_t err_len) {
    if (times) *times = (CkptWriteTimes){.step = w->running ? w->step : -1};
    int ok = 1;
    if (w->running) {
        pthread_join(w->thread, NULL);
        w->running = false;
        cJSON_Delete(w->manifest);
        w->manifest = NULL;
        free(w->shards.meta);
        w->shards.meta = NULL;
        if (times) times->start_s = w->start_s, times->write_s = w->write_s;
        if (w->rc != 0) {
            tp_error_set(err, err_len, "writing checkpoint step %lld in the background: %s (nothing of it was "
                         "published)", (long long)w->step, w->err);
            ok = 0;
        }
    }
    return agree(rt, ok, err, err_len);
}

/* This rank's part of the state into the snapshot buffer: the master
 * weights where this rank writes the model shard, then both moments. The
 * copies wait for the step's queued work. */
static void snapshot(CkptWriter *w, const Model *m, const AdamW *opt, const Mesh *mesh) {
    size_t n_params;
    const size_t n_opt = opt->n_elems;
    TP_CHECK(snapshot_elems(m, opt, mesh, &n_params) == w->snap_elems && m->be == w->be,
             "ckpt_writer_save: the writer was made for another model");
    float *p = w->snap, *mv = w->snap + n_params;
    if (n_params) backend_download(m->be, p, m->params, n_params * sizeof(float));
    backend_download(opt->be, mv, opt->m, n_opt * sizeof(float));
    backend_download(opt->be, mv + n_opt, opt->v, n_opt * sizeof(float));
    w->shards = (CkptShards){.mesh = *mesh, .tab = &m->tab, .opt = opt, .meta = shard_meta_json(&m->tab),
                             .params = n_params ? p : NULL, .om = mv, .ov = mv + n_opt};
}

int ckpt_writer_save(CkptWriter *w, const char *dir, const Runtime *rt, const Model *m, const AdamW *opt,
                     const TrainState *st, const char *spm_path, int keep_last, const CkptBestRecord *best,
                     char *err, size_t err_len) {
    if (ckpt_writer_wait(w, rt, NULL, err, err_len)) return -1;
    const double t0 = tp_now_s();
    if (save_prepare(dir, rt, st, w->tmp, sizeof w->tmp, err, err_len)) return -1;
    w->lead = rt->mesh.rank == 0;
    w->rank = rt->mesh.rank;
    w->world = rt->mesh.world;
    w->step = st->step;
    w->keep_last = keep_last;
    w->has_spm = spm_path != NULL;
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    snprintf(w->spm_path, sizeof w->spm_path, "%s", spm_path ? spm_path : "");
    w->has_best = w->lead && best && best->metric;
    if (w->has_best) {
        snprintf(w->best_metric, sizeof w->best_metric, "%s", best->metric);
        w->best_value = best->value;
    }
    snapshot(w, m, opt, &rt->mesh);
    w->manifest = w->lead ? manifest_start(rt, m, opt, st) : NULL;
    w->rc = 0;
    w->err[0] = '\0';
    const int e = pthread_create(&w->thread, NULL, writer_main, w);
    const int ok = e == 0;
    if (!ok) {
        tp_error_set(err, err_len, "cannot start the checkpoint writer thread (%s)", strerror(e));
        cJSON_Delete(w->manifest);
        w->manifest = NULL;
        free(w->shards.meta);
        w->shards.meta = NULL;
    }
    w->running = ok;
    w->start_s = tp_now_s() - t0;
    return agree(rt, ok, err, err_len);
}

void ckpt_writer_free(CkptWriter *w) {
    if (!w) return;
    if (w->running) pthread_join(w->thread, NULL);
    cJSON_Delete(w->manifest);
    free(w->shards.meta);
    if (w->snap) backend_free(w->be, w->snap);
    free(w);
}
