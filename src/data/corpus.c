/* corpus.c: corpus folders -> validated pairs -> SentencePiece -> token
 * files, in order (see corpus.h); the passes themselves are corpus_scan.c
 * (reading and sampling), corpus_encode.c (encoding), corpus_meta.c (the
 * record beside each token file) and tokfile.c (the format).
 *
 * Every split is read (or found unchanged) before anything is written, so
 * a bad corpus never leaves a half-built cache. Token files are written
 * under a temporary name, fsynced and renamed, so a crash or a concurrent
 * rank never exposes a torn file.
 *
 * Choices the header leaves open:
 *   - the key is crc32c over (format version, c(.en), c(.ja), c(spm.model)),
 *     where c(f) = crc32c(length of f as uint64, bytes of f): a changed
 *     byte changes it, and so do bytes moved from one file to the next.
 *     Only content counts: touching a file makes the next start read it
 *     again, and it does not rebuild;
 *   - an existing spm.model with another size is refused rather than
 *     silently used (callers give each size its own folder:
 *     corpus_cache_dir); so is a missing tokenizer with no training text.
 */
#include "data/corpus.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "data/corpus_internal.h"
#include "data/spm.h"
#include "err.h"
#include "fileio.h"
#include "safetensors.h" /* crc32c */

#define TOK_KEY_VERSION 2u  // the token format's version, part of every key

/* ---- small file helpers ----------------------------------------------------- */

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* mkdir -p; 0 or -1 + err. */
static int make_dirs(const char *dir, char *err, size_t err_len) {
    char path[PATH_MAX];
    if (dir[0] == '\0') {
        tp_error_set(err, err_len, "cache folder name is empty");
        return -1;
    }
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        tp_error_set(err, err_len, "cache folder name too long: %s", dir);
        return -1;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            tp_error_set(err, err_len, "cannot create folder %s: %s", path, strerror(errno));
            return -1;
        }
        *p = c;
        if (c == '\0') break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        tp_error_set(err, err_len, "cache folder %s is not a folder", dir);
        return -1;
    }
    return 0;
}

/* ---- the cache root: one folder per tokenizer configuration -------------------- */

static const char *const CORPUS_CACHED_FILES[] = {"spm.model", "spm.vocab", "train.tok", "dev.tok", "test.tok"};

int corpus_cache_dir(const char *cache_root, int vocab_size, long spm_sample, char *out, size_t out_len, char *err,
                     size_t err_len) {
    const int v = vocab_size > 0 ? vocab_size : CORPUS_DEFAULT_VOCAB;
    const long s = spm_sample > 0 ? spm_sample : CORPUS_DEFAULT_SPM_SAMPLE;
    if (snprintf(out, out_len, "%s/spm-unigram-v%d-s%ld", cache_root, v, s) >= (int)out_len) {
        tp_error_set(err, err_len, "cache folder name too long: %s", cache_root);
        return -1;
    }
    return 0;
}

int corpus_adopt_old_layout(const char *cache_root, int vocab_size, bool verbose, char *err, size_t err_len) {
    const int v = vocab_size > 0 ? vocab_size : CORPUS_DEFAULT_VOCAB;
    char old_model[PATH_MAX + 16], dir[PATH_MAX], from[PATH_MAX + 16], to[PATH_MAX + 16];
    snprintf(old_model, sizeof old_model, "%s/spm.model", cache_root);
    if (!file_exists(old_model)) return 0;
    if (corpus_cache_dir(cache_root, v, 0, dir, sizeof dir, err, err_len)) return -1;
    char why[PATH_MAX + 200];
    Spm *spm = spm_load(old_model, why, sizeof why);
    const int pieces = spm ? spm_vocab_size(spm) : -1;
    spm_free(spm);
    snprintf(to, sizeof to, "%s/spm.model", dir);
    if (pieces != v || file_exists(to)) {
        if (verbose) {
            printf("corpus: %s (%s) is from the older one-tokenizer cache layout; left in place, unused: this run's "
                   "tokenizer is in %s\n", old_model, pieces > 0 ? "another vocabulary size" : "unreadable", dir);
            fflush(stdout);
        }
        return 0;
    }
    if (make_dirs(dir, err, err_len) != 0) return -1;
    /* the model last: until it moves, the old layout is still whole */
    for (int i = (int)(sizeof CORPUS_CACHED_FILES / sizeof *CORPUS_CACHED_FILES) - 1; i >= 0; i--) {
        snprintf(from, sizeof from, "%s/%s", cache_root, CORPUS_CACHED_FILES[i]);
        snprintf(to, sizeof to, "%s/%s", dir, CORPUS_CACHED_FILES[i]);
        if (!file_exists(from) || file_exists(to)) continue;
        if (rename(from, to) != 0) {
            tp_error_set(err, err_len, "cannot move %s to %s: %s", from, to, strerror(errno));
            return -1;
        }
    }
    if (verbose) {
        printf("corpus: moved the tokenizer of the older cache layout (%d pieces) and its token files into %s\n", v,
               dir);
        fflush(stdout);
    }
    return 1;
}

/* ---- corpus_prepare ------------------------------------------------------------ */

static uint32_t split_key(const SplitScan *s, uint32_t model_crc) {
    const uint32_t parts[4] = {TOK_KEY_VERSION, s->en.crc, s->ja.crc, model_crc};
    return crc32c(0, parts, sizeof parts);
}

/* Trains cache_dir/spm.model on the sample of the tokenizer scans. */
static int train_tokenizer(const SplitScan *const *scans, int n, const CorpusConfig *cfg, int vocab_size,
                           long sample, char *err, size_t err_len) {
    char txt[PATH_MAX], prefix[PATH_MAX];
    snprintf(txt, sizeof txt, "%s/spm_train.%ld.txt", cfg->cache_dir, (long)getpid());
    snprintf(prefix, sizeof prefix, "%s/spm", cfg->cache_dir);
    long total = 0, n_written = 0;
    for (int k = 0; k < n; k++) total += 2 * scans[k]->stats.kept;
    if (corpus_write_sample(scans, n, sample, txt, &n_written, err, err_len) != 0) return -1;
    if (cfg->verbose) {
        printf("corpus: training SentencePiece (unigram, %d pieces) on %ld of the %ld sentences of the kept training "
               "pairs%s\n", vocab_size, n_written, total, n_written < total ? " (a uniform sample)" : "");
        fflush(stdout);
    }
    const double t0 = tp_now_s();
    const char *inputs[1] = {txt};
    int rc = spm_train(inputs, 1, prefix, vocab_size, err, err_len);
    unlink(txt);
    if (rc == 0 && cfg->verbose) {
        printf("corpus: wrote %s.model in %.1f s\n", prefix, tp_now_s() - t0);
        fflush(stdout);
    }
    return rc;
}

/* Finds each part unchanged (its record) or reads it; a part that trains
 * the tokenizer is read when the tokenizer is still to be trained. A
 * record that is there but not trusted is said so in one line. */
static int scan_parts(const CorpusConfig *cfg, SplitScan *scans, int n, bool need_tokenizer,
                      char *err, size_t err_len) {
    for (int i = 0; i < n; i++) {
        const CorpusPart *part = scans[i].part;
        if (!part->stem && !need_tokenizer) continue;  // read for the tokenizer only, which is there
        char why[PATH_MAX + 512] = "";
        if (part->stem && !(need_tokenizer && part->tokenizer) &&
            split_meta_reuse(cfg->cache_dir, &scans[i], cfg->strict, why, sizeof why)) {
            if (cfg->verbose) {
                printf("corpus: %s: %s and %s unchanged since they were read (%ld pairs, %ld kept): not read "
                       "again\n", part_label(part), scans[i].en.path, scans[i].ja.path, scans[i].stats.lines,
                       scans[i].stats.kept);
                fflush(stdout);
            }
            continue;
        }
        if (why[0] && cfg->verbose) {
            printf("corpus: %s: reading the text again: %s\n", part_label(part), why);
            fflush(stdout);
        }
        if (split_scan(&scans[i], part, cfg->strict, cfg->verbose, err, err_len) != 0) return -1;
    }
    return 0;
}

/* The tokenizer: trained when missing, loaded, its size checked, its crc. */
static Spm *tokenizer_ready(const CorpusConfig *cfg, SplitScan *scans, int n, int vocab_size, uint32_t *model_crc,
                            char *err, size_t err_len) {
    char model_path[PATH_MAX];
    if (snprintf(model_path, sizeof model_path, "%s/spm.model", cfg->cache_dir) >= (int)sizeof model_path) {
        tp_error_set(err, err_len, "cache folder name too long: %s", cfg->cache_dir);
        return NULL;
    }
    if (!file_exists(model_path)) {
        const SplitScan **tok = TP_CALLOC((size_t)n + 1, sizeof *tok);
        int n_tok = 0;
        for (int i = 0; i < n; i++)
            if (scans[i].part->tokenizer) tok[n_tok++] = &scans[i];
        const long sample = cfg->spm_sample > 0 ? cfg->spm_sample : CORPUS_DEFAULT_SPM_SAMPLE;
        int rc = -1;
        if (n_tok == 0)
            tp_error_set(err, err_len, "%s is missing and no training text was given to make it", model_path);
        else
            rc = train_tokenizer(tok, n_tok, cfg, vocab_size, sample, err, err_len);
        free(tok);
        if (rc != 0) return NULL;
    } else if (cfg->verbose) {
        printf("corpus: reusing %s\n", model_path);
        fflush(stdout);
    }
    Spm *spm = spm_load(model_path, err, err_len);
    if (!spm) return NULL;
    if (spm_vocab_size(spm) != vocab_size) {
        tp_error_set(err, err_len,
                     "%s has %d pieces but the vocabulary size asked for is %d: remove it or use another cache "
                     "folder",
                     model_path, spm_vocab_size(spm), vocab_size);
        spm_free(spm);
        return NULL;
    }
    size_t model_bytes = 0;
    char *model = read_file_bytes(model_path, &model_bytes, err, err_len);
    if (!model) {
        spm_free(spm);
        return NULL;
    }
    const uint64_t model_n64 = model_bytes;
    *model_crc = crc32c(crc32c(0, &model_n64, sizeof model_n64), model, model_bytes);
    free(model);
    return spm;
}

/* The key in the header of the token file at path when it opens and
 * checks whole: 1; 0 with why when it is missing or unusable. */
static int existing_key(const char *path, const Spm *spm, uint32_t *key, char *why, size_t why_len) {
    if (!file_exists(path)) {
        snprintf(why, why_len, "not built yet");
        return 0;
    }
    TokenFile tf;
    char open_err[PATH_MAX + 200];
    if (token_file_open(&tf, path, spm_vocab_size(spm), open_err, sizeof open_err) != 0) {
        snprintf(why, why_len, "the existing file is unusable: %s", open_err);
        return 0;
    }
    *key = tf.key;
    token_file_close(&tf);
    return 1;
}

/* Reuses the part's token file when its key matches and it checks out, else
 * (reading the text when it was not read) builds it; records the part. The
 * key a file is built or kept under is always the one of the text as read
 * (a record's checksums stand for the text only while they match the file). */
static int part_ready(const CorpusConfig *cfg, SplitScan *s, const Spm *spm,
                      uint32_t model_crc, char *err, size_t err_len) {
    const CorpusPart *part = s->part;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s.tok", cfg->cache_dir, part->stem) >= (int)sizeof path) {
        tp_error_set(err, err_len, "cache folder name too long: %s", cfg->cache_dir);
        return -1;
    }
    uint32_t key = split_key(s, model_crc), old_key = 0, n_pairs;
    char why[PATH_MAX + 256], ignored[PATH_MAX + 128];
    FileStamp now;
    /* unchanged since it was last checked whole (and its record unchanged): the header is enough */
    if (!s->scanned && s->tok_known && s->tok.trusted && file_stamp(path, &now) == 0 &&
        file_stamp_same(&now, &s->tok) && token_file_header(path, &old_key, &n_pairs, ignored, sizeof ignored) == 0 &&
        old_key == key) {
        if (cfg->verbose) {
            printf("corpus: %s: reusing %s (key %08x; unchanged since it was checked)\n", part_label(part), path, key);
            fflush(stdout);
        }
        return 0;
    }
    const int have = existing_key(path, spm, &old_key, why, sizeof why);
    if (have && old_key != key && !s->scanned) {  // the record's checksums may be wrong: the text decides
        if (split_scan(s, part, cfg->strict, cfg->verbose, err, err_len) != 0) return -1;
        key = split_key(s, model_crc);
    }
    if (have && old_key == key) {
        if (cfg->verbose) {
            printf("corpus: %s: reusing %s (key %08x)\n", part_label(part), path, key);
            fflush(stdout);
        }
        s->tok_known = file_stamp(path, &s->tok) == 0;
        return split_meta_write(cfg->cache_dir, s, key, err, err_len);
    }
    if (have)
        snprintf(why, sizeof why, "key %08x != %08x: the source text, the tokenizer or the format changed", old_key,
                 key);
    if (!s->scanned) {
        if (split_scan(s, part, cfg->strict, cfg->verbose, err, err_len) != 0) return -1;
        key = split_key(s, model_crc);
    }
    if (cfg->verbose) {
        printf("corpus: %s: building %s (%s)\n", part_label(part), path, why);
        fflush(stdout);
    }
    if (corpus_encode(s, spm, key, path, cfg->workers, cfg->verbose, err, err_len) != 0) return -1;
    s->tok_known = file_stamp(path, &s->tok) == 0;  // written and checked as it was written
    return split_meta_write(cfg->cache_dir, s, key, err, err_len);
}

int corpus_prepare_parts(const CorpusConfig *cfg, const CorpusPart *parts, int n_parts, CorpusStats *stats,
                         char *err, size_t err_len) {
    if (!cfg || !cfg->cache_dir || n_parts < 0 || (n_parts > 0 && !parts)) {
        tp_error_set(err, err_len, "corpus_prepare: missing cache folder or parts");
        return -1;
    }
    if (stats) memset(stats, 0, (size_t)n_parts * sizeof *stats);
    const int vocab_size = cfg->vocab_size > 0 ? cfg->vocab_size : CORPUS_DEFAULT_VOCAB;
    if (make_dirs(cfg->cache_dir, err, err_len) != 0) return -1;
    corpus_remove_leftovers(cfg->cache_dir, cfg->verbose);
    char model_path[PATH_MAX];
    snprintf(model_path, sizeof model_path, "%s/spm.model", cfg->cache_dir);
    const bool need_tokenizer = !file_exists(model_path);

    int rc = -1;
    Spm *spm = NULL;
    uint32_t model_crc = 0;
    SplitScan *scans = TP_CALLOC((size_t)(n_parts > 0 ? n_parts : 1), sizeof *scans);
    for (int i = 0; i < n_parts; i++) scans[i].part = &parts[i];
    if (scan_parts(cfg, scans, n_parts, need_tokenizer, err, err_len) != 0) goto done;
    spm = tokenizer_ready(cfg, scans, n_parts, vocab_size, &model_crc, err, err_len);
    if (!spm) goto done;
    for (int i = 0; i < n_parts; i++) {
        if (!parts[i].stem) continue;  // read for the tokenizer only
        if (part_ready(cfg, &scans[i], spm, model_crc, err, err_len) != 0) goto done;
        split_scan_free(&scans[i]);
    }
    if (n_parts > 0) fsync_path(cfg->cache_dir);  // best effort: some file systems refuse fsync on folders
    if (stats)
        for (int i = 0; i < n_parts; i++) stats[i] = scans[i].stats, stats[i].not_read = !scans[i].scanned;
    rc = 0;
done:
    for (int i = 0; i < n_parts; i++) split_scan_free(&scans[i]);
    free(scans);
    spm_free(spm);
    return rc;
}

int corpus_prepare(const CorpusConfig *cfg, const char *const *splits, int n_splits, CorpusStats *stats,
                   char *err, size_t err_len) {
    if (!cfg || !cfg->data_dir || n_splits < 0 || (n_splits > 0 && !splits)) {
        tp_error_set(err, err_len, "corpus_prepare: missing data folder, cache folder or split names");
        return -1;
    }
    /* one part a split; "train" trains the tokenizer, and is read for it alone when not asked for */
    CorpusPart *parts = TP_CALLOC((size_t)n_splits + 1, sizeof *parts);
    bool has_train = false;
    for (int i = 0; i < n_splits; i++) {
        parts[i] = (CorpusPart){.data_dir = cfg->data_dir, .split = splits[i], .stem = splits[i],
                                .tokenizer = strcmp(splits[i], "train") == 0};
        has_train |= parts[i].tokenizer;
    }
    int n = n_splits;
    if (!has_train) parts[n++] = (CorpusPart){.data_dir = cfg->data_dir, .split = "train", .tokenizer = true};
    CorpusStats *st = TP_CALLOC((size_t)n, sizeof *st);
    const int rc = corpus_prepare_parts(cfg, parts, n, st, err, err_len);
    if (rc == 0 && stats) memcpy(stats, st, (size_t)n_splits * sizeof *stats);
    free(st);
    free(parts);
    return rc;
}
