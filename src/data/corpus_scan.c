/* corpus_scan.c: a split read once, line by line (see corpus_internal.h):
 * every pair checked, the key's checksums and the text form counted on
 * the way, the kept pairs remembered as one bit each and every
 * CORPUS_MARK_EVERY-th line's byte offset kept for the encoding workers;
 * and the tokenizer's sample drawn from the scanned splits.
 *
 * Choices: "empty" also covers lines of only spaces and tabs (they encode
 * to no pieces); a NUL byte counts as invalid text (bad_utf8); the text
 * form counts cover every non-empty line, kept or not (textnorm_detect's
 * rule). The sample is Knuth's selection sampling (Algorithm S) over the
 * sentences in order with a fixed seed: exactly `sample` of them, each
 * equally likely, in one pass and constant memory.
 */
#include "data/corpus_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "data/splitmix.h"
#include "data/text_lines.h"
#include "err.h"

#define STAMP_SETTLE_NS 1000000000LL  // a change this recent may hide another in the same clock tick
#define SAMPLE_SEED 0x5EEDC0DE2024ull

/* ---- file identity -------------------------------------------------------------- */

static int64_t ns_of(struct timespec t) { return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec; }

int file_stamp(const char *path, FileStamp *out) {
    struct stat st;
    memset(out, 0, sizeof *out);
    if (stat(path, &st) != 0) return -1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    *out = (FileStamp){.dev = (uint64_t)st.st_dev, .ino = (uint64_t)st.st_ino, .size = (uint64_t)st.st_size,
                       .mtime_ns = ns_of(st.st_mtim), .ctime_ns = ns_of(st.st_ctim)};
    const int64_t changed = out->mtime_ns > out->ctime_ns ? out->mtime_ns : out->ctime_ns;
    out->trusted = changed + STAMP_SETTLE_NS <= ns_of(now);
    return 0;
}

bool file_stamp_same(const FileStamp *a, const FileStamp *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns &&
           a->ctime_ns == b->ctime_ns;
}

/* ---- one pass over a split ---------------------------------------------------- */

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t') return 0;
    return 1;
}

/* 0 when the line is usable; else fills why and returns 1 (empty) or 2 (bad text). */
static int check_line(const char *path, long i, const char *line, size_t len, char *why, size_t why_len) {
    size_t bad_at;
    const char *reason = utf8_invalid((const uint8_t *)line, len, &bad_at);
    if (reason) {
        snprintf(why, why_len, "%s:%ld: invalid UTF-8 at byte %zu (%s)", path, i + 1, bad_at + 1, reason);
        return 2;
    }
    if (is_blank(line, len)) {
        snprintf(why, why_len, "%s:%ld: empty line", path, i + 1);
        return 1;
    }
    return 0;
}

/* Counts the lines left in r (after `have` already read). */
static long count_rest(LineReader *r, long have, char *err, size_t err_len) {
    char *line;
    size_t len;
    int got;
    while ((got = line_reader_next(r, &line, &len, err, err_len)) == 1) have++;
    return got < 0 ? -1 : have;
}

static void mark_push(SplitScan *s, long *cap, uint64_t en_at, uint64_t ja_at) {
    if (s->n_marks == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        s->en_at = realloc(s->en_at, (size_t)*cap * sizeof *s->en_at);
        s->ja_at = realloc(s->ja_at, (size_t)*cap * sizeof *s->ja_at);
        TP_CHECK(s->en_at && s->ja_at, "out of memory keeping line offsets");
    }
    s->en_at[s->n_marks] = en_at;
    s->ja_at[s->n_marks++] = ja_at;
}

/* "reading": lines so far, their rate, and the time left from the bytes still to read. */
static void progress(const SplitScan *s, const LineReader *en, const LineReader *ja, long lines, double t0,
                     bool *shown) {
    const double dt = tp_now_s() - t0, done = (double)(en->n_read + ja->n_read);
    const double left = (double)(en->size + ja->size) - done;
    fprintf(stdout, "\rcorpus: %s: reading %s: %ld lines, %.0f lines/s, %.0f s left   ", part_label(s->part),
            s->part->data_dir, lines, lines / (dt > 0 ? dt : 1), done > 0 && left > 0 ? left * dt / done : 0.0);
    fflush(stdout);
    *shown = true;
}

/* The loop over the pairs of an opened split. */
static int scan_pairs(SplitScan *s, LineReader *en, LineReader *ja, bool strict, bool verbose, char *err,
                      size_t err_len) {
    const bool tty = verbose && isatty(STDOUT_FILENO);
    const double t0 = tp_now_s();
    double next_show = t0 + 2.0;
    bool shown = false;
    long cap_bits = 0, cap_marks = 0, i = 0;
    char why[PATH_MAX + 128];
    CorpusStats *st = &s->stats;
    for (;; i++) {
        if (i % CORPUS_MARK_EVERY == 0) mark_push(s, &cap_marks, line_reader_tell(en), line_reader_tell(ja));
        char *le, *lj;
        size_t ne, nj;
        const int ge = line_reader_next(en, &le, &ne, err, err_len);
        const int gj = ge < 0 ? -1 : line_reader_next(ja, &lj, &nj, err, err_len);
        if (ge < 0 || gj < 0) return -1;
        if (ge == 0 || gj == 0) {
            if (ge == gj) break;
            const long n_en = ge ? count_rest(en, i + 1, err, err_len) : i;
            const long n_ja = gj ? count_rest(ja, i + 1, err, err_len) : i;
            if (n_en < 0 || n_ja < 0) return -1;
            tp_error_set(err, err_len, "line counts differ: %s has %ld lines but %s has %ld", en->path, n_en,
                         ja->path, n_ja);
            return -1;
        }
        if (i / 8 >= cap_bits) {
            const long old = cap_bits;
            cap_bits = cap_bits ? 2 * cap_bits : 4096;
            s->kept = realloc(s->kept, (size_t)cap_bits);
            TP_CHECK(s->kept != NULL, "out of memory keeping the kept pairs of %s", en->path);
            memset(s->kept + old, 0, (size_t)(cap_bits - old));
        }
        if (ne) textnorm_count_line(le, ne, &s->en.form);
        if (nj) textnorm_count_line(lj, nj, &s->ja.form);
        int bad = check_line(en->path, i, le, ne, why, sizeof why);
        if (!bad) bad = check_line(ja->path, i, lj, nj, why, sizeof why);
        if (bad && strict) {
            tp_error_set(err, err_len, "%s", why);
            return -1;
        }
        if (bad == 1) st->empty++;
        else if (bad == 2) st->bad_utf8++;
        else s->kept[i / 8] |= (uint8_t)(1u << (i % 8)), st->kept++;
        if (tty && (i & 0xFFFF) == 0 && tp_now_s() > next_show) {
            progress(s, en, ja, i, t0, &shown);
            next_show = tp_now_s() + 1.0;
        }
    }
    if (shown) fprintf(stdout, "\n");
    st->lines = i;
    if (i >= (long)UINT32_MAX) {
        tp_error_set(err, err_len, "%s has too many lines (%ld)", en->path, i);
        return -1;
    }
    return 0;
}

int split_start(SplitScan *s, const CorpusPart *part, char *err, size_t err_len) {
    split_scan_free(s);
    memset(s, 0, sizeof *s);
    s->part = part;
    SideScan *side[2] = {&s->en, &s->ja};
    const char *lang[2] = {"en", "ja"};
    for (int k = 0; k < 2; k++)
        if (snprintf(side[k]->path, sizeof side[k]->path, "%s/%s.%s", part->data_dir, part->split, lang[k]) >=
            (int)sizeof side[k]->path) {
            tp_error_set(err, err_len, "path too long: %s/%s.%s", part->data_dir, part->split, lang[k]);
            return -1;
        }
    return 0;
}

int split_scan(SplitScan *s, const CorpusPart *part, bool strict, bool verbose, char *err, size_t err_len) {
    if (split_start(s, part, err, err_len) != 0) return -1;
    SideScan *side[2] = {&s->en, &s->ja};
    LineReader en, ja;
    memset(&ja, 0, sizeof ja);
    ja.fd = -1;
    if (line_reader_open(&en, s->en.path, 0, err, err_len) != 0) return -1;
    int rc = -1;
    if (line_reader_open(&ja, s->ja.path, 0, err, err_len) != 0) goto done;
    /* the identities before reading; compared again after, so a file changed meanwhile is caught */
    if (file_stamp(s->en.path, &s->en.stamp) || file_stamp(s->ja.path, &s->ja.stamp)) {
        tp_error_set(err, err_len, "cannot stat %s or %s: %s", s->en.path, s->ja.path, strerror(errno));
        goto done;
    }
    if (scan_pairs(s, &en, &ja, strict, verbose, err, err_len) != 0) goto done;
    for (int k = 0; k < 2; k++) {
        FileStamp after;
        if (file_stamp(side[k]->path, &after) != 0 || !file_stamp_same(&after, &side[k]->stamp)) {
            tp_error_set(err, err_len, "%s changed while it was read; prepare again once it is written",
                         side[k]->path);
            goto done;
        }
    }
    s->en.crc = line_reader_crc(&en);
    s->ja.crc = line_reader_crc(&ja);
    s->stats.crlf = en.n_crlf + ja.n_crlf;
    s->scanned = true;
    rc = 0;
    if (verbose) {
        const CorpusStats *st = &s->stats;
        const bool other = part->stem && strcmp(part->stem, part->split) != 0;  // a stem that does not say the folder
        printf("corpus: %s: %ld pairs read%s%s, %ld kept, %ld skipped empty, %ld skipped invalid UTF-8, %ld CRLF "
               "stripped\n",
               part_label(part), st->lines, other ? " from " : "", other ? part->data_dir : "", st->kept, st->empty,
               st->bad_utf8, st->crlf);
        fflush(stdout);
    }
done:
    line_reader_close(&en);
    line_reader_close(&ja);
    return rc;
}

void split_scan_free(SplitScan *s) {
    free(s->kept);
    free(s->en_at);
    free(s->ja_at);
    s->kept = NULL;
    s->en_at = s->ja_at = NULL;
    s->n_marks = 0;
}

/* ---- the tokenizer's sample ----------------------------------------------------- */

typedef struct {
    FILE *fp;
    uint64_t rng;
    long need, left;  // still to take / sentences still to see (need == left: take every one)
    long written;
} Sampler;

/* One side's kept lines through the sampler. */
static int sample_side(Sampler *sm, const SplitScan *s, const char *path, char *err, size_t err_len) {
    LineReader r;
    if (line_reader_open(&r, path, 0, err, err_len) != 0) return -1;
    char *line;
    size_t len;
    int got = 0;
    for (long i = 0; sm->need > 0 && (got = line_reader_next(&r, &line, &len, err, err_len)) == 1; i++) {
        if (i >= s->stats.lines || !(s->kept[i / 8] >> (i % 8) & 1)) continue;
        const bool take = sm->need == sm->left ||
                          (long)(((unsigned __int128)splitmix64(&sm->rng) * (uint64_t)sm->left) >> 64) < sm->need;
        sm->left--;
        if (!take) continue;
        sm->need--;
        sm->written++;
        if (fwrite(line, 1, len, sm->fp) != len || fputc('\n', sm->fp) == EOF) {
            tp_error_set(err, err_len, "cannot write the tokenizer's sample: %s", strerror(errno));
            line_reader_close(&r);
            return -1;
        }
    }
    line_reader_close(&r);
    return sm->need > 0 && got < 0 ? -1 : 0;
}

int corpus_write_sample(const SplitScan *const *scans, int n, long sample, const char *path, long *n_written,
                        char *err, size_t err_len) {
    long total = 0;
    for (int k = 0; k < n; k++) total += 2 * scans[k]->stats.kept;
    Sampler sm = {.rng = SAMPLE_SEED, .need = sample < total ? sample : total, .left = total};
    sm.fp = fopen(path, "wb");
    if (!sm.fp) {
        tp_error_set(err, err_len, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = TP_MALLOC(1 << 20);
    setvbuf(sm.fp, buf, _IOFBF, 1 << 20);
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        rc = sample_side(&sm, scans[k], scans[k]->en.path, err, err_len);
        if (rc == 0) rc = sample_side(&sm, scans[k], scans[k]->ja.path, err, err_len);
    }
    if (fclose(sm.fp) != 0 && rc == 0) {
        tp_error_set(err, err_len, "cannot write %s: %s", path, strerror(errno));
        rc = -1;
    }
    free(buf);
    if (rc != 0) unlink(path);
    *n_written = sm.written;
    return rc;
}
