/* resample.c: an epoch's subword samples on worker threads (see
 * resample.h).
 *
 * A corpus's pairs are cut into as many contiguous ranges as workers. A
 * worker samples the two sides of each pair of its range into a buffer of
 * its own and writes their lengths at the pair's index; the offsets are
 * then a prefix sum, and each worker copies its buffer into the epoch's
 * one token array (all English first, then all Japanese, the token file's
 * layout), so the result does not depend on the number of workers. The
 * next epoch is built by a background thread that runs the same workers.
 */
#include "data/resample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "data/splitmix.h"
#include "err.h"

uint64_t resample_seed(uint64_t seed, int64_t epoch, int corpus, int64_t pair, int side) {
    uint64_t s = seed ^ 0x243F6A8885A308D3ull;
    s = splitmix64(&s) ^ (uint64_t)epoch;
    s = splitmix64(&s) ^ ((uint64_t)corpus << 1 | (uint64_t)side);
    s = splitmix64(&s) ^ (uint64_t)pair;
    return splitmix64(&s);
}

typedef struct {
    const Resampler *r;
    const TokenFile *base;
    int corpus;
    int64_t epoch;
    int64_t p0, p1;            // pairs [p0, p1)
    uint32_t *en_len, *ja_len; // (n_pairs) shared, written at the pair's index
    int32_t *buf;              // this range's ids, pair by pair, English then Japanese
    size_t n_buf, cap_buf;
    TokenFile *out;            // phase 2: where buf goes
    int rc;
    char err[256];
} Job;

/* Room for n more ids in j's buffer. */
static void reserve(Job *j, size_t n) {
    if (j->n_buf + n <= j->cap_buf) return;
    j->cap_buf = 2 * j->cap_buf + n;
    j->buf = TP_REALLOC(j->buf, j->cap_buf * sizeof *j->buf);
}

/* Appends one side's sample: the best ids themselves when they are already
 * longer than a batch takes (never batched) or the sample is. 0, or -1
 * when the tokenizer refuses them. */
static int sample_side(Job *j, const int32_t *best, int n_best, uint64_t seed, uint32_t *len) {
    const Resampler *r = j->r;
    const size_t room = (size_t)(r->max_pieces > n_best ? r->max_pieces : n_best) + 1;
    reserve(j, room);
    int got = n_best;
    if (n_best <= r->max_pieces) {
        got = spm_sample_ids(r->spm, best, n_best, r->nbest, r->alpha, seed, j->buf + j->n_buf, (int)room);
        if (got < 0) return -1;
    }
    if (got > r->max_pieces) {
        memcpy(j->buf + j->n_buf, best, (size_t)n_best * sizeof *best);
        got = n_best;
    }
    j->n_buf += (size_t)got;
    *len = (uint32_t)got;
    return 0;
}

static void *job_sample(void *arg) {
    Job *j = arg;
    const TokenFile *tf = j->base;
    j->rc = 0;
    for (int64_t i = j->p0; i < j->p1; i++)
        for (int side = 0; side < 2; side++) {
            const uint64_t *off = side == 0 ? tf->en_off : tf->ja_off;
            if (sample_side(j, tf->tokens + off[i], (int)(off[i + 1] - off[i]),
                            resample_seed(j->r->seed, j->epoch, j->corpus, i, side),
                            side == 0 ? &j->en_len[i] : &j->ja_len[i]) != 0) {
                snprintf(j->err, sizeof j->err, "subword sampling: the tokenizer refused pair %lld (%s side) of "
                         "training corpus %d", (long long)i, side == 0 ? "English" : "Japanese", j->corpus + 1);
                j->rc = -1;
                return NULL;
            }
        }
    return NULL;
}

static void *job_copy(void *arg) {
    Job *j = arg;
    int32_t *tokens = (int32_t *)j->out->tokens;
    size_t at = 0;
    for (int64_t i = j->p0; i < j->p1; i++) {
        const size_t ne = j->en_len[i], nj = j->ja_len[i];
        memcpy(tokens + j->out->en_off[i], j->buf + at, ne * sizeof *tokens);
        memcpy(tokens + j->out->ja_off[i], j->buf + at + ne, nj * sizeof *tokens);
        at += ne + nj;
    }
    return NULL;
}

/* Runs fn over the jobs on threads (the first on this one). */
static void run_jobs(Job *jobs, int n, void *(*fn)(void *)) {
    pthread_t *th = TP_CALLOC((size_t)n, sizeof *th);
    bool *started = TP_CALLOC((size_t)n, sizeof *started);
    for (int i = 1; i < n; i++) started[i] = pthread_create(&th[i], NULL, fn, &jobs[i]) == 0;
    fn(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else fn(&jobs[i]);  // no thread to be had: done here
    }
    free(started);
    free(th);
}

static void slot_clear(ResampleEpoch *s) {
    for (int k = 0; k < RESAMPLE_MAX_CORPORA; k++) {
        free((void *)s->tf[k].en_off);
        free((void *)s->tf[k].ja_off);
        free((void *)s->tf[k].tokens);
        memset(&s->tf[k], 0, sizeof s->tf[k]);
    }
    s->epoch = -1;
}

/* One corpus of the epoch into out. 0, or -1 + err. */
static int build_corpus(const Resampler *r, int k, int64_t epoch, TokenFile *out, char *err, size_t err_len) {
    const TokenFile *tf = r->base[k];
    const int64_t n = tf->n_pairs;
    int n_w = r->workers;
    if (n_w > n) n_w = n > 0 ? (int)n : 1;
    uint32_t *lens = TP_MALLOC((size_t)(2 * n + 1) * sizeof *lens);
    Job *jobs = TP_CALLOC((size_t)n_w, sizeof *jobs);
    for (int w = 0; w < n_w; w++)
        jobs[w] = (Job){.r = r, .base = tf, .corpus = k, .epoch = epoch, .p0 = n * w / n_w, .p1 = n * (w + 1) / n_w,
                        .en_len = lens, .ja_len = lens + n, .out = out};
    run_jobs(jobs, n_w, job_sample);
    int rc = 0;
    for (int w = 0; w < n_w && rc == 0; w++)
        if (jobs[w].rc != 0) rc = -1, tp_error_set(err, err_len, "%s", jobs[w].err);
    if (rc == 0) {
        uint64_t *en_off = TP_MALLOC((size_t)(n + 1) * sizeof *en_off);
        uint64_t *ja_off = TP_MALLOC((size_t)(n + 1) * sizeof *ja_off);
        en_off[0] = 0;
        for (int64_t i = 0; i < n; i++) en_off[i + 1] = en_off[i] + lens[i];
        ja_off[0] = en_off[n];
        for (int64_t i = 0; i < n; i++) ja_off[i + 1] = ja_off[i] + lens[n + i];
        *out = (TokenFile){.n_pairs = tf->n_pairs, .en_off = en_off, .ja_off = ja_off, .line = tf->line,
                           .n_tokens = ja_off[n], .key = tf->key,
                           .tokens = TP_MALLOC((size_t)(ja_off[n] > 0 ? ja_off[n] : 1) * sizeof(int32_t))};
        run_jobs(jobs, n_w, job_copy);
    }
    for (int w = 0; w < n_w; w++) free(jobs[w].buf);
    free(jobs);
    free(lens);
    return rc;
}

static int build_epoch(const Resampler *r, ResampleEpoch *s, int64_t epoch, char *err, size_t err_len) {
    const double t0 = tp_now_s();
    slot_clear(s);
    for (int k = 0; k < r->n_tf; k++) {
        if (build_corpus(r, k, epoch, &s->tf[k], err, err_len) != 0) return -1;
        s->tfp[k] = &s->tf[k];
    }
    s->epoch = epoch;
    s->seconds = tp_now_s() - t0;
    return 0;
}

typedef struct {
    Resampler *r;
    int slot;
    int64_t epoch;
} Background;

static void *background_main(void *arg) {
    Background *b = arg;
    Resampler *r = b->r;
    r->bg_rc = build_epoch(r, &r->slot[b->slot], b->epoch, r->err, sizeof r->err);
    free(b);
    return NULL;
}

int resampler_init(Resampler *r, const Spm *spm, const TokenFile *const *tfs, int n_tf, float alpha, int nbest,
                   uint64_t seed, int max_pieces, int workers, char *err, size_t err_len) {
    memset(r, 0, sizeof *r);
    r->slot[0].epoch = r->slot[1].epoch = -1;
    if (!spm || n_tf < 1 || n_tf > RESAMPLE_MAX_CORPORA || !(alpha > 0.0f) || (nbest != -1 && nbest < 2) ||
        max_pieces < 1) {
        tp_error_set(err, err_len, "subword sampling: alpha %g must be positive, nbest %d -1 or at least 2, and "
                     "1 to %d corpora (%d given)", (double)alpha, nbest, RESAMPLE_MAX_CORPORA, n_tf);
        return -1;
    }
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    *r = (Resampler){.spm = spm, .alpha = alpha, .nbest = nbest, .seed = seed, .max_pieces = max_pieces,
                     .workers = workers > 0 ? workers : (int)(cores > 0 ? cores : 1), .n_tf = n_tf};
    r->slot[0].epoch = r->slot[1].epoch = -1;
    for (int k = 0; k < n_tf; k++) r->base[k] = tfs[k];
    return 0;
}

const TokenFile *const *resampler_epoch(Resampler *r, int64_t epoch) {
    if (r->bg_running) {
        pthread_join(r->bg, NULL);
        r->bg_running = false;
        TP_CHECK(r->bg_rc == 0, "%s", r->err);
    }
    int s = r->slot[0].epoch == epoch ? 0 : r->slot[1].epoch == epoch ? 1 : -1;
    if (s < 0) {
        s = 0;
        TP_CHECK(build_epoch(r, &r->slot[s], epoch, r->err, sizeof r->err) == 0, "%s", r->err);
    }
    r->cur = s;
    if (r->slot[1 - s].epoch != epoch + 1) {
        Background *b = TP_MALLOC(sizeof *b);
        *b = (Background){.r = r, .slot = 1 - s, .epoch = epoch + 1};
        r->slot[1 - s].epoch = -1;
        r->bg_running = pthread_create(&r->bg, NULL, background_main, b) == 0;
        if (!r->bg_running) free(b);  // built when it is asked for
    }
    return r->slot[s].tfp;
}

const TokenFile *const *resampler_epoch_files(void *ctx, int64_t epoch) { return resampler_epoch(ctx, epoch); }

void resampler_free(Resampler *r) {
    if (r->bg_running) pthread_join(r->bg, NULL);
    slot_clear(&r->slot[0]);
    slot_clear(&r->slot[1]);
    memset(r, 0, sizeof *r);
}
