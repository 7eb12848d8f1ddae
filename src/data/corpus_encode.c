/* corpus_encode.c: a scanned split encoded on several threads into one
 * token file (see corpus_internal.h).
 *
 * The split's lines are cut into as many contiguous ranges as there are
 * workers, on the CORPUS_MARK_EVERY boundaries whose byte offsets the scan
 * kept, so each worker seeks straight to its first line. A worker encodes
 * the kept pairs of its range, appending each side's ids to a part file of
 * its own and each pair's lengths and line to the shared arrays at the
 * pair's own index; token_file_assemble then joins the parts in order. The
 * bytes are those one worker writes (test_corpus holds them to it).
 * SentencePiece's processor encodes from several threads at once (its
 * Encode is const). On a terminal, the progress is shown every second
 * once the encoding has taken more than two.
 */
#include "data/corpus_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "data/text_lines.h"
#include "err.h"

typedef struct {
    const SplitScan *s;
    const Spm *spm;
    long line0, line1;  // the range of lines [line0, line1)
    long k0;            // index of its first kept pair among the split's
    uint32_t *en_len, *ja_len, *line;
    char en_path[4096], ja_path[4096];
    long *lines_done;   // shared progress counter (atomic adds)
    int *finished;      // workers done (atomic adds)
    char err[2 * PATH_MAX + 300];
    int rc;
} Worker;

/* Encodes text, growing the scratch as needed; the id count or -1. */
static int encode_line(const Spm *spm, const char *text, int32_t **scratch, int *cap) {
    int got = spm_encode(spm, text, *scratch, *cap);
    if (got > *cap) {
        *cap = got;
        free(*scratch);
        *scratch = TP_MALLOC((size_t)*cap * sizeof **scratch);
        got = spm_encode(spm, text, *scratch, *cap);
    }
    return got;
}

static int worker_run(Worker *w, LineReader *en, LineReader *ja, FILE *out_en, FILE *out_ja) {
    int cap = 1024;
    int32_t *ids = TP_MALLOC((size_t)cap * sizeof *ids);
    const uint8_t *kept = w->s->kept;
    long k = w->k0, pending = 0;
    int rc = -1;
    for (long i = w->line0; i < w->line1; i++) {
        char *le, *lj;
        size_t ne, nj;
        if (line_reader_next(en, &le, &ne, w->err, sizeof w->err) != 1 ||
            line_reader_next(ja, &lj, &nj, w->err, sizeof w->err) != 1) {
            if (!w->err[0]) snprintf(w->err, sizeof w->err, "%s or %s ended before line %ld: changed since it was read",
                                     en->path, ja->path, i + 1);
            goto done;
        }
        if (++pending == 4096) {
            __atomic_add_fetch(w->lines_done, pending, __ATOMIC_RELAXED);
            pending = 0;
        }
        if (!(kept[i / 8] >> (i % 8) & 1)) continue;
        for (int side = 0; side < 2; side++) {
            const int got = encode_line(w->spm, side == 0 ? le : lj, &ids, &cap);
            if (got < 0) {
                snprintf(w->err, sizeof w->err, "%s:%ld: SentencePiece could not encode the line",
                         side == 0 ? en->path : ja->path, i + 1);
                goto done;
            }
            if (fwrite(ids, sizeof *ids, (size_t)got, side == 0 ? out_en : out_ja) != (size_t)got) {
                snprintf(w->err, sizeof w->err, "cannot write %s: %s", side == 0 ? w->en_path : w->ja_path,
                         strerror(errno));
                goto done;
            }
            (side == 0 ? w->en_len : w->ja_len)[k] = (uint32_t)got;
        }
        w->line[k++] = (uint32_t)(i + 1);
    }
    rc = 0;
done:
    __atomic_add_fetch(w->lines_done, pending, __ATOMIC_RELAXED);
    free(ids);
    return rc;
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    const long mark = w->line0 / CORPUS_MARK_EVERY;
    LineReader en, ja;
    FILE *out_en = NULL, *out_ja = NULL;
    memset(&ja, 0, sizeof ja);
    ja.fd = -1;
    w->rc = -1;
    memset(&en, 0, sizeof en);
    en.fd = -1;
    if (line_reader_open(&en, w->s->en.path, w->s->en_at[mark], w->err, sizeof w->err) == 0 &&
        line_reader_open(&ja, w->s->ja.path, w->s->ja_at[mark], w->err, sizeof w->err) == 0) {
        out_en = fopen(w->en_path, "wb");
        out_ja = fopen(w->ja_path, "wb");
        if (!out_en || !out_ja)
            snprintf(w->err, sizeof w->err, "cannot create %s: %s", !out_en ? w->en_path : w->ja_path,
                     strerror(errno));
        else
            w->rc = worker_run(w, &en, &ja, out_en, out_ja);
    }
    for (int side = 0; side < 2; side++) {
        FILE *fp = side == 0 ? out_en : out_ja;
        if (fp && fclose(fp) != 0 && w->rc == 0) {
            w->rc = -1;
            snprintf(w->err, sizeof w->err, "cannot write %s", side == 0 ? w->en_path : w->ja_path);
        }
    }
    line_reader_close(&en);
    line_reader_close(&ja);
    __atomic_add_fetch(w->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Shows the progress on a terminal until every worker is done. */
static void watch(const SplitScan *s, long *lines_done, int *finished, int n_started, bool show) {
    const double t0 = tp_now_s();
    const long total = s->stats.lines;
    bool shown = false;
    for (;;) {
        const long done = __atomic_load_n(lines_done, __ATOMIC_RELAXED);
        if (__atomic_load_n(finished, __ATOMIC_ACQUIRE) >= n_started) break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        const double dt = tp_now_s() - t0;
        if (!show || dt < 2.0 || (long)(dt * 10) % 10 != 0) continue;
        const double rate = done / dt;
        fprintf(stdout, "\rcorpus: %s: encoding %ld of %ld lines, %.0f lines/s, %.0f s left   ", part_label(s->part),
                done, total, rate, rate > 0 ? (total - done) / rate : 0.0);
        fflush(stdout);
        shown = true;
    }
    if (shown) fprintf(stdout, "\n");
}

int corpus_encode(const SplitScan *s, const Spm *spm, uint32_t key, const char *path, int workers, bool verbose,
                  char *err, size_t err_len) {
    const double t0 = tp_now_s();
    const long n_lines = s->stats.lines, n_pairs = s->stats.kept;
    const long n_chunks = s->n_marks > 0 ? s->n_marks : 1;
    int n_w = workers > 0 ? workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_w < 1) n_w = 1;
    if (n_w > n_chunks) n_w = (int)n_chunks;
    Worker *w = TP_CALLOC((size_t)n_w, sizeof *w);
    pthread_t *th = TP_CALLOC((size_t)n_w, sizeof *th);
    uint32_t *lens = TP_MALLOC((size_t)(3 * n_pairs + 1) * sizeof *lens);
    long lines_done = 0, k0 = 0;
    int rc = -1, started = 0, finished = 0;
    for (int i = 0; i < n_w; i++) {
        Worker *x = &w[i];
        x->s = s, x->spm = spm, x->lines_done = &lines_done, x->finished = &finished;
        x->en_len = lens, x->ja_len = lens + n_pairs, x->line = lens + 2 * n_pairs;
        x->line0 = (long)((int64_t)n_chunks * i / n_w) * CORPUS_MARK_EVERY;
        x->line1 = (long)((int64_t)n_chunks * (i + 1) / n_w) * CORPUS_MARK_EVERY;
        if (x->line0 > n_lines) x->line0 = n_lines;
        if (x->line1 > n_lines) x->line1 = n_lines;
        x->k0 = k0;
        for (long b = x->line0 / 8; b < (x->line1 + 7) / 8; b++) k0 += __builtin_popcount(s->kept[b]);
        snprintf(x->en_path, sizeof x->en_path, "%s.part%d.%ld.en", path, i, (long)getpid());
        snprintf(x->ja_path, sizeof x->ja_path, "%s.part%d.%ld.ja", path, i, (long)getpid());
    }
    TP_CHECK(k0 == n_pairs, "corpus_encode: %ld kept bits for %ld kept pairs", k0, n_pairs);
    for (; started < n_w; started++)
        if (pthread_create(&th[started], NULL, worker_main, &w[started]) != 0) {
            tp_error_set(err, err_len, "cannot start encoding thread %d: %s", started, strerror(errno));
            break;
        }
    watch(s, &lines_done, &finished, started, verbose && isatty(STDOUT_FILENO) && started == n_w);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (started == n_w) {
        rc = 0;
        for (int i = 0; i < n_w && rc == 0; i++)
            if (w[i].rc != 0) rc = -1, tp_error_set(err, err_len, "%s", w[i].err);
    }
    char(*en_paths)[4096] = TP_CALLOC((size_t)n_w, sizeof *en_paths);
    char(*ja_paths)[4096] = TP_CALLOC((size_t)n_w, sizeof *ja_paths);
    for (int i = 0; i < n_w; i++) {
        memcpy(en_paths[i], w[i].en_path, sizeof en_paths[i]);
        memcpy(ja_paths[i], w[i].ja_path, sizeof ja_paths[i]);
    }
    const TokenPieces pieces = {.n_parts = n_w, .en_path = en_paths, .ja_path = ja_paths, .n_pairs = n_pairs,
                                .en_len = lens, .ja_len = lens + n_pairs, .line = lens + 2 * n_pairs};
    if (rc == 0) rc = token_file_assemble(path, key, &pieces, err, err_len);
    for (int i = 0; i < n_w; i++) unlink(en_paths[i]), unlink(ja_paths[i]);
    if (rc == 0 && verbose) {
        uint64_t n_en = 0, n_ja = 0;
        for (long i = 0; i < n_pairs; i++) n_en += lens[i], n_ja += lens[n_pairs + i];
        printf("corpus: %s: encoded %ld pairs (%llu en + %llu ja pieces) into %s in %.2f s on %d thread%s\n",
               part_label(s->part), n_pairs, (unsigned long long)n_en, (unsigned long long)n_ja, path, tp_now_s() - t0,
               n_w, n_w == 1 ? "" : "s");
        fflush(stdout);
    }
    free(en_paths);
    free(ja_paths);
    free(lens);
    free(th);
    free(w);
    return rc;
}
