/* test_spm.c CORPUS_DIR SPM_IDS_PY: the real corpus through corpus_prepare
 * (vocab 8000, trained once per run into a scratch cache), then:
 *   - the counts of every split (the corpus is clean: all pairs kept);
 *   - decode(encode(line)) == line for every line of every split (identity
 *     normalization and byte fallback make this exact), with no <unk>;
 *   - spm_decode skips pad/bos/eos;
 *   - each token file equals direct encoding of its source lines;
 *   - the ids equal those of python3-sentencepiece on the same model, for
 *     every dev line;
 *   - a second call reuses the cache; in a copy of the corpus, touching a
 *     source does not rebuild and changing one does (that split only). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include "check.h"
#include "clock.h"
#include "data/corpus.h"
#include "data/spm.h"
#include "testfs.h"

#define VOCAB 8000
#define MAX_IDS 4096

static const char *SPLITS[3] = {"train", "dev", "test"};
static const long SPLIT_PAIRS[3] = {50000, 500, 500}; /* small_parallel_enja */

static char g_root[64];

/* A text file cut into NUL-terminated lines ('\n' only; no trailing empty line). */
typedef struct {
    uint8_t *buf;
    char **line;  // (n)
    int n;
} Lines;

static bool lines_read(Lines *l, const char *path) {
    size_t n_bytes = 0;
    memset(l, 0, sizeof *l);
    uint8_t *raw = read_bytes(path, &n_bytes);
    if (!raw) return false;
    l->buf = malloc(n_bytes + 1);
    memcpy(l->buf, raw, n_bytes);
    l->buf[n_bytes] = '\0';
    free(raw);
    int cap = 1;
    for (size_t i = 0; i < n_bytes; i++) cap += l->buf[i] == '\n';
    l->line = malloc((size_t)cap * sizeof *l->line);
    char *p = (char *)l->buf, *end = p + n_bytes;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl) *nl = '\0';
        l->line[l->n++] = p;
        p = nl ? nl + 1 : end;
    }
    return true;
}

static void lines_free(Lines *l) {
    free(l->buf);
    free(l->line);
    memset(l, 0, sizeof *l);
}

typedef struct {
    ino_t ino;
    struct timespec mtime;
} FileId;

static FileId file_id(const char *dir, const char *name) {
    char path[512];
    struct stat st;
    FileId id = {0};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &st) == 0) {
        id.ino = st.st_ino;
        id.mtime = st.st_mtim;
    }
    return id;
}

static bool same_file(FileId a, FileId b) {
    return a.ino != 0 && a.ino == b.ino && a.mtime.tv_sec == b.mtime.tv_sec && a.mtime.tv_nsec == b.mtime.tv_nsec;
}

static bool copy_file(const char *from, const char *to) {
    size_t n = 0;
    uint8_t *b = read_bytes(from, &n);
    bool ok = b && write_bytes(to, b, n);
    free(b);
    return ok;
}

static int prepare(const char *data, const char *cache, CorpusStats *st, char *err, size_t err_len) {
    CorpusConfig cfg = {.data_dir = data, .cache_dir = cache, .vocab_size = VOCAB, .strict = false, .verbose = true};
    return corpus_prepare(&cfg, SPLITS, 3, st, err, err_len);
}

/* Round trip over every line of path; returns the number of lines checked. */
static int check_round_trip(const Spm *spm, const char *path) {
    Lines l;
    CHECK(lines_read(&l, path), "cannot read %s", path);
    int32_t ids[MAX_IDS];
    int n_diff = 0, n_unk = 0;
    for (int i = 0; i < l.n; i++) {
        int n = spm_encode(spm, l.line[i], ids, MAX_IDS);
        CHECK(n >= 0 && n <= MAX_IDS, "%s:%d: encode returned %d", path, i + 1, n);
        if (n < 0 || n > MAX_IDS) continue;
        for (int k = 0; k < n; k++) n_unk += ids[k] == SPM_UNK_ID;
        char *text = spm_decode(spm, ids, n);
        if (!text || strcmp(text, l.line[i]) != 0) {
            if (n_diff < 3) fprintf(stderr, "%s:%d: '%s' -> '%s'\n", path, i + 1, l.line[i], text ? text : "(null)");
            n_diff++;
        }
        free(text);
    }
    CHECK(n_diff == 0, "%s: %d of %d lines do not round-trip", path, n_diff, l.n);
    CHECK(n_unk == 0, "%s: %d <unk> pieces (byte fallback should leave none)", path, n_unk);
    int n = l.n;
    lines_free(&l);
    return n;
}

/* Token file of split == direct encoding of the lines it names. */
static void check_token_file(const Spm *spm, const char *data, const char *cache, int s) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s.tok", cache, SPLITS[s]);
    TokenFile tf;
    CHECK(token_file_open(&tf, path, spm_vocab_size(spm), err, sizeof err) == 0, "%s", err);
    if (!tf.map) return;
    CHECK(tf.n_pairs == SPLIT_PAIRS[s], "%s: %d pairs, want %ld", path, tf.n_pairs, SPLIT_PAIRS[s]);
    int n_diff = 0;
    for (int side = 0; side < 2; side++) {
        Lines l;
        snprintf(path, sizeof path, "%s/%s.%s", data, SPLITS[s], side ? "ja" : "en");
        CHECK(lines_read(&l, path), "cannot read %s", path);
        const uint64_t *off = side ? tf.ja_off : tf.en_off;
        int32_t ids[MAX_IDS];
        for (int i = 0; i < tf.n_pairs; i++) {
            if (tf.line[i] < 1 || (int)tf.line[i] > l.n) {
                n_diff++;
                continue;
            }
            int n = spm_encode(spm, l.line[tf.line[i] - 1], ids, MAX_IDS);
            const int n_file = (int)(off[i + 1] - off[i]);
            if (n != n_file || memcmp(ids, tf.tokens + off[i], (size_t)n * sizeof *ids) != 0) n_diff++;
        }
        lines_free(&l);
    }
    CHECK(n_diff == 0, "%s.tok: %d sentences differ from direct encoding", SPLITS[s], n_diff);
    token_file_close(&tf);
}

/* Ids from python3-sentencepiece for every dev line, against the C API. */
static void check_python(const Spm *spm, const char *data, const char *model, const char *script) {
    char out[512], cmd[2048];
    snprintf(out, sizeof out, "%s/py_ids.txt", g_root);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s/dev.en' '%s/dev.ja' > '%s'", script, model, data, data,
             out);
    int rc = system(cmd);
    CHECK(rc == 0, "'%s' failed (%d): is python3-sentencepiece installed?", cmd, rc);
    if (rc != 0) return;
    Lines py;
    CHECK(lines_read(&py, out), "cannot read %s", out);
    int n_py = 0, n_diff = 0;
    for (int side = 0; side < 2; side++) {
        Lines l;
        char path[512];
        snprintf(path, sizeof path, "%s/dev.%s", data, side ? "ja" : "en");
        CHECK(lines_read(&l, path), "cannot read %s", path);
        for (int i = 0; i < l.n && n_py < py.n; i++, n_py++) {
            int32_t ids[MAX_IDS];
            int n = spm_encode(spm, l.line[i], ids, MAX_IDS);
            char *p = py.line[n_py], *end;
            int k = 0;
            bool same = true;
            for (;; k++) {
                long v = strtol(p, &end, 10);
                if (end == p) break;
                same = same && k < n && ids[k] == v;
                p = end;
            }
            if (!same || k != n) {
                if (n_diff < 3) fprintf(stderr, "dev.%s:%d: C and Python ids differ\n", side ? "ja" : "en", i + 1);
                n_diff++;
            }
        }
        lines_free(&l);
    }
    CHECK(n_py == 1000 && py.n == 1000, "python printed %d lines, compared %d, want 1000", py.n, n_py);
    CHECK(n_diff == 0, "%d dev sentences: C and python3-sentencepiece ids differ", n_diff);
    lines_free(&py);
}

static void check_stats(const CorpusStats *st) {
    for (int s = 0; s < 3; s++)
        CHECK(st[s].lines == SPLIT_PAIRS[s] && st[s].kept == SPLIT_PAIRS[s] && st[s].empty == 0 &&
                  st[s].bad_utf8 == 0 && st[s].crlf == 0,
              "%s: %ld read, %ld kept, %ld empty, %ld bad, %ld crlf", SPLITS[s], st[s].lines, st[s].kept,
              st[s].empty, st[s].bad_utf8, st[s].crlf);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_spm CORPUS_DIR SPM_IDS_PY\n");
        return 2;
    }
    const char *data = argv[1], *script = argv[2];
    if (!make_scratch_dir(g_root, sizeof g_root, "test_spm")) return 1;
    char cache[256], model[300], err[1024];
    snprintf(cache, sizeof cache, "%s/cache", g_root);
    snprintf(model, sizeof model, "%s/spm.model", cache);

    CorpusStats st[3];
    double t0 = tp_now_s();
    int rc = prepare(data, cache, st, err, sizeof err);
    CHECK(rc == 0, "corpus_prepare: %s", err);
    printf("test_spm: first corpus_prepare (train + encode) took %.2f s\n", tp_now_s() - t0);
    if (rc != 0) return check_report("test_spm");
    check_stats(st);

    Spm *spm = spm_load(model, err, sizeof err);
    CHECK(spm != NULL, "%s", err);
    if (!spm) return check_report("test_spm");
    CHECK(spm_vocab_size(spm) == VOCAB, "vocab size %d", spm_vocab_size(spm));
    const char *special[4] = {"<pad>", "<unk>", "<s>", "</s>"};
    for (int id = 0; id < 4; id++) {
        char piece[64];
        CHECK(strcmp(spm_id_to_piece(spm, id, piece, sizeof piece), special[id]) == 0, "id %d is '%s'", id, piece);
    }
    char piece[8];
    CHECK(spm_id_to_piece(spm, VOCAB, piece, sizeof piece)[0] == '\0', "out-of-range id has a piece");

    /* decode skips pad/bos/eos */
    int32_t ids[MAX_IDS + 3];
    int n = spm_encode(spm, "this is a pen .", ids + 1, MAX_IDS);
    CHECK(n > 0 && spm_encode(spm, "this is a pen .", NULL, 0) == n, "encode sizing: %d", n);
    ids[0] = SPM_BOS_ID;
    ids[n + 1] = SPM_EOS_ID;
    ids[n + 2] = SPM_PAD_ID;
    char *text = spm_decode(spm, ids, n + 3);
    CHECK(text && strcmp(text, "this is a pen .") == 0, "decode with bos/eos/pad: '%s'", text ? text : "(null)");
    free(text);
    int32_t out_of_range = VOCAB + 5;
    CHECK(spm_decode(spm, &out_of_range, 1) == NULL, "decode accepted an id beyond the vocabulary");

    t0 = tp_now_s();
    int n_lines = 0;
    for (int s = 0; s < 3; s++)
        for (int side = 0; side < 2; side++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.%s", data, SPLITS[s], side ? "ja" : "en");
            n_lines += check_round_trip(spm, path);
        }
    printf("test_spm: %d lines round-tripped in %.2f s\n", n_lines, tp_now_s() - t0);
    for (int s = 0; s < 3; s++) check_token_file(spm, data, cache, s);
    check_python(spm, data, model, script);

    /* a second call reuses everything */
    const char *names[4] = {"spm.model", "train.tok", "dev.tok", "test.tok"};
    FileId before[4];
    for (int i = 0; i < 4; i++) before[i] = file_id(cache, names[i]);
    t0 = tp_now_s();
    CHECK(prepare(data, cache, st, err, sizeof err) == 0, "second corpus_prepare: %s", err);
    printf("test_spm: second corpus_prepare (reuse) took %.2f s\n", tp_now_s() - t0);
    check_stats(st);
    for (int i = 0; i < 4; i++) CHECK(same_file(before[i], file_id(cache, names[i])), "%s was rebuilt", names[i]);

    /* a copy of corpus and cache: the key is over content, so the copy reuses;
     * touching a source changes nothing; editing dev.en rebuilds dev.tok only */
    char data2[256], cache2[256], from[512], to[512];
    snprintf(data2, sizeof data2, "%s/data", g_root);
    snprintf(cache2, sizeof cache2, "%s/cache2", g_root);
    mkdir(data2, 0777);
    mkdir(cache2, 0777);
    for (int s = 0; s < 3; s++)
        for (int side = 0; side < 2; side++) {
            snprintf(from, sizeof from, "%s/%s.%s", data, SPLITS[s], side ? "ja" : "en");
            snprintf(to, sizeof to, "%s/%s.%s", data2, SPLITS[s], side ? "ja" : "en");
            CHECK(copy_file(from, to), "cannot copy %s", from);
        }
    for (int i = 0; i < 4; i++) {
        snprintf(from, sizeof from, "%s/%s", cache, names[i]);
        snprintf(to, sizeof to, "%s/%s", cache2, names[i]);
        CHECK(copy_file(from, to), "cannot copy %s", from);
    }
    for (int i = 0; i < 4; i++) before[i] = file_id(cache2, names[i]);
    snprintf(to, sizeof to, "%s/dev.en", data2);
    CHECK(utimensat(AT_FDCWD, to, NULL, 0) == 0, "cannot touch %s", to);
    CHECK(prepare(data2, cache2, st, err, sizeof err) == 0, "copy: %s", err);
    for (int i = 0; i < 4; i++)
        CHECK(same_file(before[i], file_id(cache2, names[i])), "copy: %s rebuilt (content unchanged)", names[i]);

    Lines dev;
    CHECK(lines_read(&dev, to), "cannot read %s", to);
    FILE *fp = fopen(to, "wb");
    CHECK(fp != NULL, "cannot rewrite %s", to);
    const char *new_line = "the quick brown fox jumps over the lazy dog .";
    for (int i = 0; fp && i < dev.n; i++) fprintf(fp, "%s\n", i == 9 ? new_line : dev.line[i]);
    if (fp) fclose(fp);
    lines_free(&dev);
    CHECK(prepare(data2, cache2, st, err, sizeof err) == 0, "edited copy: %s", err);
    CHECK(same_file(before[0], file_id(cache2, "spm.model")), "editing dev.en retrained the tokenizer");
    CHECK(same_file(before[1], file_id(cache2, "train.tok")), "editing dev.en rebuilt train.tok");
    CHECK(same_file(before[3], file_id(cache2, "test.tok")), "editing dev.en rebuilt test.tok");
    CHECK(!same_file(before[2], file_id(cache2, "dev.tok")), "editing dev.en did not rebuild dev.tok");
    TokenFile tf;
    snprintf(to, sizeof to, "%s/dev.tok", cache2);
    CHECK(token_file_open(&tf, to, spm_vocab_size(spm), err, sizeof err) == 0, "%s", err);
    if (tf.map) {
        n = spm_encode(spm, new_line, ids, MAX_IDS);
        CHECK(tf.line[9] == 10 && n == (int)(tf.en_off[10] - tf.en_off[9]) &&
                  memcmp(ids, tf.tokens + tf.en_off[9], (size_t)n * sizeof *ids) == 0,
              "dev.tok pair 10 does not hold the edited line");
        token_file_close(&tf);
    }
    spm_free(spm);
    remove_tree(g_root);
    return check_report("test_spm");
}
