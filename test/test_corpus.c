/* test_corpus.c: corpus validation and token files on small synthetic
 * corpora (a few hundred generated pairs, an 80-piece tokenizer, so each
 * training takes milliseconds): mismatched line counts, empty and invalid
 * UTF-8 lines (skipped and counted, or file:line errors under strict), CRLF,
 * a final line without '\n', cache reuse and rebuild, and token files that
 * are truncated, flipped or foreign; the streaming preparation's own
 * promises: the same bytes from one encoding worker or several, a
 * deterministic tokenizer sample, a warm start that reads no text, and the
 * text form kept with the token files equal to the one measured on the
 * files. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <time.h>
#include <unistd.h>

#include "check.h"
#include "data/corpus.h"
#include "data/textnorm.h"
#include "data/spm.h"
#include "safetensors.h" /* crc32c, to forge a consistent header */
#include "testfs.h"
#include "proc.h"

#define N_TRAIN 400
#define N_DEV 40
#define N_TEST 40
#define SMALL_VOCAB 80

static char g_root[64];
static int g_case;

typedef struct {
    char data[256], cache[256];
} Case;

/* ---- synthetic text ------------------------------------------------------- */

static const char *EN_WORDS[] = {"the",  "cat",   "dog",  "sat",  "on",   "mat",    "a",    "big",   "small",
                                 "red",  "house", "tree", "i",    "you",  "like",   "see",  "run",   "eat",
                                 "fish", "bird",  "water", "book", "read", "we",    "they", "go",    "to",
                                 "school", "is",  "was",  "green", "old", "new",    "friend", "river", "city"};
static const char *JA_WORDS[] = {"猫",   "犬", "が",   "を",   "に",   "は",   "座っ", "た",   "大きい",
                                 "小さい", "赤い", "家", "木",   "私",   "あなた", "好き", "見る", "走る",
                                 "食べる", "魚", "鳥", "水",   "本",   "読む", "学校", "行く", "です",
                                 "古い", "新しい", "友達", "川", "町",   "緑",   "ます", "の"};
#define N_EN_WORDS (int)(sizeof EN_WORDS / sizeof EN_WORDS[0])
#define N_JA_WORDS (int)(sizeof JA_WORDS / sizeof JA_WORDS[0])

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Sentence i of a language: 4..10 words, then " ." or " 。". */
static void sentence(char *buf, size_t cap, int lang_ja, int i) {
    uint32_t s = 0x9e3779b9u ^ (uint32_t)(i * 7919 + lang_ja);
    int n_words = 4 + (int)(lcg(&s) % 7);
    buf[0] = '\0';
    for (int w = 0; w < n_words; w++) {
        const char *word = lang_ja ? JA_WORDS[lcg(&s) % N_JA_WORDS] : EN_WORDS[lcg(&s) % N_EN_WORDS];
        if (w) strncat(buf, " ", cap - strlen(buf) - 1);
        strncat(buf, word, cap - strlen(buf) - 1);
    }
    strncat(buf, lang_ja ? " 。" : " .", cap - strlen(buf) - 1);
}

/* A file of generated lines; override[i] (if non-NULL) replaces line i
 * (0-based) with raw bytes; eol ends every line but the last, which ends in
 * last_eol. */
typedef struct {
    int i;
    const char *bytes;
} Override;

static void write_text(const char *path, int lang_ja, int first, int n, const Override *ov, int n_ov,
                       const char *eol, const char *last_eol) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL, "cannot create %s", path);
    if (!fp) return;
    char buf[512];
    for (int i = 0; i < n; i++) {
        const char *line = NULL;
        for (int k = 0; k < n_ov; k++)
            if (ov[k].i == i) line = ov[k].bytes;
        if (!line) {
            sentence(buf, sizeof buf, lang_ja, first + i);
            line = buf;
        }
        fputs(line, fp);
        fputs(i + 1 < n ? eol : last_eol, fp);
    }
    fclose(fp);
}

static void case_new(Case *c) {
    g_case++;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/c%d", g_root, g_case);
    mkdir(dir, 0777);
    snprintf(c->data, sizeof c->data, "%s/data", dir);
    snprintf(c->cache, sizeof c->cache, "%s/cache", dir);
    mkdir(c->data, 0777);
}

static void write_split(const Case *c, const char *split, int first, int n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.en", c->data, split);
    write_text(path, 0, first, n, NULL, 0, "\n", "\n");
    snprintf(path, sizeof path, "%s/%s.ja", c->data, split);
    write_text(path, 1, first, n, NULL, 0, "\n", "\n");
}

/* A clean corpus: train 400, dev 40, test 40 pairs. */
static void write_clean(const Case *c) {
    write_split(c, "train", 0, N_TRAIN);
    write_split(c, "dev", 100000, N_DEV);
    write_split(c, "test", 200000, N_TEST);
}

static int prepare(const Case *c, bool strict, const char *split, CorpusStats *st, char *err, size_t err_len) {
    CorpusConfig cfg = {.data_dir = c->data, .cache_dir = c->cache, .vocab_size = SMALL_VOCAB, .strict = strict,
                        .verbose = false};
    const char *splits[3] = {"train", "dev", "test"};
    if (split) splits[0] = split;
    err[0] = '\0';
    return corpus_prepare(&cfg, splits, split ? 1 : 3, st, err, err_len);
}

static void path_of(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* A new case holding a clean corpus (write_clean). */
static Case clean_case(void) {
    Case c;
    case_new(&c);
    write_clean(&c);
    return c;
}

/* The corpus file name of case c written again as write_text does; its path
 * in path (512 bytes). */
static void rewrite_file(const Case *c, char *path, const char *name, int lang_ja, int first, int n, const Override *ov,
                         int n_ov, const char *eol, const char *last_eol) {
    path_of(path, 512, c->data, name);
    write_text(path, lang_ja, first, n, ov, n_ov, eol, last_eol);
}

static bool file_exists_dir(const char *dir, const char *name) {
    char path[512];
    struct stat st;
    path_of(path, sizeof path, dir, name);
    return stat(path, &st) == 0;
}

static ino_t inode_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* The next prepare of case c rebuilds the token file tok (a new file that
 * opens); what names the failure. */
static void expect_rebuilt(const Case *c, const char *tok, CorpusStats *st, char *err, size_t err_len, const char *what) {
    const ino_t before = inode_of(tok);
    CHECK(prepare(c, false, NULL, st, err, err_len) == 0, "%s", err);
    TokenFile tf = {0};
    CHECK(inode_of(tok) != before && token_file_open(&tf, tok, SMALL_VOCAB, err, err_len) == 0, "%s: %s", what, err);
    token_file_close(&tf);
}

/* One bit of a token file's last token id flipped in place (header and key intact). */
static void flip_last_token(const char *tok) {
    size_t n_bytes = 0;
    uint8_t *bytes = read_bytes(tok, &n_bytes);
    CHECK(bytes != NULL && n_bytes > 64, "cannot read %s", tok);
    if (bytes) {
        bytes[n_bytes - 4] ^= 0x01;
        write_bytes(tok, bytes, n_bytes);
    }
    free(bytes);
}

/* Ids of text under the case's tokenizer; n returned, ids in out. */
static int encode(const Case *c, const char *text, int32_t *out, int cap) {
    char model[512], err[512];
    path_of(model, sizeof model, c->cache, "spm.model");
    Spm *s = spm_load(model, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) return -1;
    int n = spm_encode(s, text, out, cap);
    spm_free(s);
    return n;
}

static bool same_ids(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* ---- cases ------------------------------------------------------------------ */

static void test_clean_and_deterministic(void) {
    Case a, b;
    case_new(&a);
    write_clean(&a);
    case_new(&b);
    write_clean(&b);
    CorpusStats st[3] = {{0}};
    char err[1024];
    CHECK(prepare(&a, true, NULL, st, err, sizeof err) == 0, "clean corpus: %s", err);
    const long want[3] = {N_TRAIN, N_DEV, N_TEST};
    for (int i = 0; i < 3; i++) {
        CHECK(st[i].lines == want[i] && st[i].kept == want[i], "split %d: %ld read, %ld kept, want %ld", i,
              st[i].lines, st[i].kept, want[i]);
        CHECK(st[i].empty == 0 && st[i].bad_utf8 == 0 && st[i].crlf == 0, "split %d: unexpected skips", i);
    }
    /* a second corpus in another folder gets the same tokenizer, byte for byte */
    CHECK(prepare(&b, false, NULL, st, err, sizeof err) == 0, "clean corpus b: %s", err);
    char pa[512], pb[512];
    size_t na = 0, nb = 0;
    path_of(pa, sizeof pa, a.cache, "spm.model");
    path_of(pb, sizeof pb, b.cache, "spm.model");
    uint8_t *ma = read_bytes(pa, &na), *mb = read_bytes(pb, &nb);
    CHECK(ma && mb && na == nb && memcmp(ma, mb, na) == 0, "two trainings on the same text differ (%zu vs %zu bytes)",
          na, nb);
    free(ma);
    free(mb);
    path_of(pa, sizeof pa, a.cache, "train.tok");
    path_of(pb, sizeof pb, b.cache, "train.tok");
    ma = read_bytes(pa, &na);
    mb = read_bytes(pb, &nb);
    CHECK(ma && mb && na == nb && memcmp(ma, mb, na) == 0, "token files of the same corpus differ");
    free(ma);
    free(mb);
    /* no temporary file left behind: spm.model, spm.vocab, three .tok and their three .source.json */
    DIR *d = opendir(a.cache);
    int n_files = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') {
            n_files++;
            CHECK(strstr(e->d_name, "tmp") == NULL && strstr(e->d_name, ".txt") == NULL &&
                      strstr(e->d_name, ".part") == NULL, "leftover file %s",
                  e->d_name);
        }
    if (d) closedir(d);
    CHECK(n_files == 8, "cache holds %d files, want 8", n_files);

    /* token file contents: every pair, by its source line */
    TokenFile tf;
    path_of(pa, sizeof pa, a.cache, "dev.tok");
    if (token_file_open(&tf, pa, SMALL_VOCAB, err, sizeof err) != 0) {
        CHECK(false, "%s", err);
        return;
    }
    CHECK(tf.n_pairs == N_DEV, "dev.tok has %d pairs", tf.n_pairs);
    int bad = 0;
    for (int i = 0; i < tf.n_pairs; i++) {
        char text[512];
        int32_t ids[256];
        sentence(text, sizeof text, 0, 100000 + (int)tf.line[i] - 1);
        int n = encode(&a, text, ids, 256);
        bad += !same_ids(ids, n, tf.tokens + tf.en_off[i], (int)(tf.en_off[i + 1] - tf.en_off[i]));
        sentence(text, sizeof text, 1, 100000 + (int)tf.line[i] - 1);
        n = encode(&a, text, ids, 256);
        bad += !same_ids(ids, n, tf.tokens + tf.ja_off[i], (int)(tf.ja_off[i + 1] - tf.ja_off[i]));
        CHECK(tf.line[i] == (uint32_t)i + 1, "pair %d has source line %u", i, tf.line[i]);
    }
    CHECK(bad == 0, "%d dev sentences differ from direct encoding", bad);
    token_file_close(&tf);
}

static void test_line_count_mismatch(void) {
    Case c = clean_case();
    char path[512], err[1024];
    rewrite_file(&c, path, "dev.ja", 1, 100000, N_DEV - 1, NULL, 0, "\n", "\n");
    CorpusStats st = {0};
    CHECK(prepare(&c, false, "dev", &st, err, sizeof err) != 0, "mismatched dev accepted");
    char en_path[512], want_en[64], want_ja[64];
    path_of(en_path, sizeof en_path, c.data, "dev.en");
    snprintf(want_en, sizeof want_en, "%d lines", N_DEV);
    snprintf(want_ja, sizeof want_ja, "%d", N_DEV - 1);
    CHECK(strstr(err, en_path) && strstr(err, path) && strstr(err, want_en) && strstr(err, want_ja),
          "message '%s' should name both files and both counts", err);
    CHECK(!file_exists_dir(c.cache, "dev.tok"), "a token file was written for a bad split");
}

/* Empty (and blank) lines: skipped and counted, or an error naming file:line. */
static void test_empty_lines(void) {
    Case c = clean_case();
    char path[512], err[1024];
    const Override en_ov[] = {{4, ""}};         /* train.en line 5 empty */
    const Override ja_ov[] = {{9, " \t "}};     /* train.ja line 10 blank */
    path_of(path, sizeof path, c.data, "train.en");
    write_text(path, 0, 0, N_TRAIN, en_ov, 1, "\n", "\n");
    path_of(path, sizeof path, c.data, "train.ja");
    write_text(path, 1, 0, N_TRAIN, ja_ov, 1, "\n", "\n");
    CorpusStats st[3] = {{0}};
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(st[0].lines == N_TRAIN && st[0].empty == 2 && st[0].kept == N_TRAIN - 2 && st[0].bad_utf8 == 0,
          "train: %ld read, %ld empty, %ld kept", st[0].lines, st[0].empty, st[0].kept);
    TokenFile tf;
    path_of(path, sizeof path, c.cache, "train.tok");
    if (token_file_open(&tf, path, SMALL_VOCAB, err, sizeof err) != 0) {
        CHECK(false, "%s", err);
        return;
    }
    CHECK(tf.n_pairs == N_TRAIN - 2, "train.tok has %d pairs", tf.n_pairs);
    bool skipped = true;
    for (int i = 0; i < tf.n_pairs; i++) skipped = skipped && tf.line[i] != 5 && tf.line[i] != 10;
    CHECK(skipped, "lines 5 and 10 should not be in train.tok");
    CHECK(tf.n_pairs > 5 && tf.line[4] == 6 && tf.line[8] == 11, "line numbers after the gaps: %u %u", tf.line[4],
          tf.line[8]);
    token_file_close(&tf);

    remove_tree(c.cache);
    CHECK(prepare(&c, true, NULL, st, err, sizeof err) != 0, "strict accepted an empty line");
    char want[600];
    snprintf(want, sizeof want, "%s/train.en:5: empty line", c.data);
    CHECK(strstr(err, want) != NULL, "strict message '%s' lacks '%s'", err, want);
    CHECK(!file_exists_dir(c.cache, "spm.model"), "strict failure still trained a tokenizer");
}

/* Invalid UTF-8, one kind per line; the valid edge cases beside them are kept. */
static void test_invalid_utf8(void) {
    static const struct {
        const char *bytes, *why;
    } bad[] = {
        {"abc \xC0\xAF def", "overlong encoding"},        /* 2-byte overlong '/' */
        {"abc \xE0\x80\xAF def", "overlong encoding"},    /* 3-byte overlong */
        {"abc \xF0\x8F\xBF\xBF def", "overlong encoding"}, /* 4-byte overlong U+FFFF */
        {"abc \xED\xA0\x80 def", "UTF-16 surrogate"},     /* U+D800 */
        {"abc \xED\xBF\xBF def", "UTF-16 surrogate"},     /* U+DFFF */
        {"abc \xF4\x90\x80\x80 def", "above U+10FFFF"},   /* U+110000 */
        {"abc \xF5\x80\x80\x80 def", "above U+10FFFF"},
        {"abc \xE3\x81", "truncated sequence"},            /* cut at the end of the line */
        {"abc \xE3\x81 def", "truncated sequence"},        /* cut before a space */
        {"abc \x80 def", "continuation byte"},
        {"abc \xFF def", "never occurs"},
    };
    static const char *good[] = {
        "edge \xC2\x80 \xDF\xBF",           /* U+0080, U+07FF */
        "edge \xE0\xA0\x80 \xED\x9F\xBF",   /* U+0800, U+D7FF */
        "edge \xEE\x80\x80 \xEF\xBF\xBF",   /* U+E000, U+FFFF */
        "edge \xF0\x90\x80\x80 \xF4\x8F\xBF\xBF", /* U+10000, U+10FFFF */
    };
    const int n_bad = (int)(sizeof bad / sizeof bad[0]), n_good = (int)(sizeof good / sizeof good[0]);
    Override ov[32];
    for (int k = 0; k < n_bad; k++) ov[k] = (Override){2 * k + 1, bad[k].bytes};
    for (int k = 0; k < n_good; k++) ov[n_bad + k] = (Override){2 * n_bad + 1 + k, good[k]};
    Case c = clean_case();
    char path[512], err[1024];
    rewrite_file(&c, path, "dev.ja", 1, 100000, N_DEV, ov, n_bad + n_good, "\n", "\n");
    CorpusStats st = {0};
    CHECK(prepare(&c, false, "dev", &st, err, sizeof err) == 0, "%s", err);
    CHECK(st.lines == N_DEV && st.bad_utf8 == n_bad && st.kept == N_DEV - n_bad && st.empty == 0,
          "dev: %ld read, %ld bad, %ld kept (want %d bad)", st.lines, st.bad_utf8, st.kept, n_bad);
    /* the model was trained from train only: the tokenizer was built */
    CHECK(file_exists_dir(c.cache, "spm.model") && file_exists_dir(c.cache, "dev.tok") &&
              !file_exists_dir(c.cache, "train.tok"),
          "dev only: expected spm.model and dev.tok, no train.tok");

    /* strict: each kind named with file:line, one corpus per kind */
    for (int k = 0; k < n_bad; k++) {
        const Override one = {4, bad[k].bytes};
        write_text(path, 1, 100000, N_DEV, &one, 1, "\n", "\n");
        CHECK(prepare(&c, true, "dev", &st, err, sizeof err) != 0, "strict accepted bad line %d", k);
        char want[600];
        snprintf(want, sizeof want, "%s:5: invalid UTF-8", path);
        CHECK(strstr(err, want) && strstr(err, bad[k].why), "bad line %d: '%s' should contain '%s' and '%s'", k,
              err, want, bad[k].why);
    }
    /* strict with only the valid edge cases passes */
    write_text(path, 1, 100000, N_DEV, ov + n_bad, n_good, "\n", "\n");
    CHECK(prepare(&c, true, "dev", &st, err, sizeof err) == 0 && st.kept == N_DEV, "valid edge cases refused: %s",
          err);
}

/* CRLF endings are stripped and counted; a final line may lack '\n'. */
static void test_crlf_and_final_line(void) {
    Case c = clean_case();
    char path[512], err[1024];
    /* dev: every line CRLF, the last one too */
    rewrite_file(&c, path, "dev.en", 0, 100000, N_DEV, NULL, 0, "\r\n", "\r\n");
    rewrite_file(&c, path, "dev.ja", 1, 100000, N_DEV, NULL, 0, "\r\n", "\r\n");
    /* test: no newline after the last line of either file */
    rewrite_file(&c, path, "test.en", 0, 200000, N_TEST, NULL, 0, "\n", "");
    rewrite_file(&c, path, "test.ja", 1, 200000, N_TEST, NULL, 0, "\n", "");
    CorpusStats st[3] = {{0}};
    CHECK(prepare(&c, true, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(st[1].crlf == 2 * N_DEV && st[1].kept == N_DEV, "dev: %ld CRLF, %ld kept", st[1].crlf, st[1].kept);
    CHECK(st[2].lines == N_TEST && st[2].kept == N_TEST && st[2].crlf == 0, "test: %ld read, %ld kept",
          st[2].lines, st[2].kept);

    const struct {
        const char *tok;
        int first, n;
    } files[2] = {{"dev.tok", 100000, N_DEV}, {"test.tok", 200000, N_TEST}};
    for (int f = 0; f < 2; f++) {
        TokenFile tf;
        path_of(path, sizeof path, c.cache, files[f].tok);
        if (token_file_open(&tf, path, SMALL_VOCAB, err, sizeof err) != 0) {
            CHECK(false, "%s", err);
            continue;
        }
        CHECK(tf.n_pairs == files[f].n, "%s: %d pairs", files[f].tok, tf.n_pairs);
        int bad = 0;
        for (int i = 0; i < tf.n_pairs; i++) {
            char text[512];
            int32_t ids[256];
            for (int ja = 0; ja < 2; ja++) {
                sentence(text, sizeof text, ja, files[f].first + i);
                int n = encode(&c, text, ids, 256);
                const uint64_t *off = ja ? tf.ja_off : tf.en_off;
                bad += !same_ids(ids, n, tf.tokens + off[i], (int)(off[i + 1] - off[i]));
            }
        }
        CHECK(bad == 0, "%s: %d sentences differ from the same text without CR / with a newline", files[f].tok,
              bad);
        token_file_close(&tf);
    }
    /* a lone trailing newline adds no line; a file of only "\n" is one empty line */
    path_of(path, sizeof path, c.data, "test.en");
    write_bytes(path, "a b\n", 4);
    path_of(path, sizeof path, c.data, "test.ja");
    write_bytes(path, "\n", 1);
    CHECK(prepare(&c, false, "test", st, err, sizeof err) == 0 && st[0].lines == 1 && st[0].empty == 1 &&
              st[0].kept == 0,
          "one-line files: %s (%ld read, %ld empty)", err, st[0].lines, st[0].empty);
    write_bytes(path, "", 0);
    CHECK(prepare(&c, false, "test", st, err, sizeof err) != 0 && strstr(err, "has 1 lines but") &&
              strstr(err, "has 0"),
          "1 vs 0 lines: '%s'", err);
}

/* A second call reuses; changing text or tokenizer rebuilds; touching does not. */
static void test_reuse_and_rebuild(void) {
    Case c = clean_case();
    char err[1024], dev_tok[512], train_tok[512], model[512], path[600];
    CorpusStats st[3] = {{0}};
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    path_of(dev_tok, sizeof dev_tok, c.cache, "dev.tok");
    path_of(train_tok, sizeof train_tok, c.cache, "train.tok");
    path_of(model, sizeof model, c.cache, "spm.model");
    ino_t dev0 = inode_of(dev_tok), train0 = inode_of(train_tok), model0 = inode_of(model);

    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(inode_of(dev_tok) == dev0 && inode_of(train_tok) == train0, "second call rebuilt a token file");
    CHECK(st[0].kept == N_TRAIN && st[1].kept == N_DEV, "stats not filled on reuse");

    /* touching a source changes nothing: the key is over content */
    path_of(path, sizeof path, c.data, "dev.en");
    utimensat(AT_FDCWD, path, NULL, 0);
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0 && inode_of(dev_tok) == dev0,
          "touching dev.en rebuilt dev.tok");

    /* one changed line rebuilds dev only */
    const Override ov = {6, "the river is old ."};
    write_text(path, 0, 100000, N_DEV, &ov, 1, "\n", "\n");
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(inode_of(dev_tok) != dev0, "changed dev.en did not rebuild dev.tok");
    CHECK(inode_of(train_tok) == train0 && inode_of(model) == model0, "changed dev.en rebuilt train or the model");
    TokenFile tf;
    CHECK(token_file_open(&tf, dev_tok, SMALL_VOCAB, err, sizeof err) == 0, "%s", err);
    int32_t ids[64];
    int n = encode(&c, "the river is old .", ids, 64);
    CHECK(tf.n_pairs == N_DEV && tf.map && same_ids(ids, n, tf.tokens + tf.en_off[6], (int)(tf.en_off[7] - tf.en_off[6])),
          "dev.tok pair 7 is not the new line");
    token_file_close(&tf);

    /* a damaged token file in the cache is rebuilt, not trusted and not fatal */
    size_t n_bytes = 0;
    uint8_t *bytes = read_bytes(dev_tok, &n_bytes);
    CHECK(bytes != NULL, "cannot read %s", dev_tok);
    if (bytes) write_bytes(dev_tok, bytes, n_bytes / 2);
    free(bytes);
    expect_rebuilt(&c, dev_tok, st, err, sizeof err, "truncated dev.tok not rebuilt");

    /* a damaged body (one token id changed, header and key intact) is not
     * reused either: the body checksum finds it and the file is rebuilt */
    flip_last_token(dev_tok);
    expect_rebuilt(&c, dev_tok, st, err, sizeof err, "dev.tok with a damaged body was reused, not rebuilt");

    /* another tokenizer (same size, other text) rebuilds every split */
    char txt[512], prefix[512];
    snprintf(txt, sizeof txt, "%s/other.txt", c.data);
    snprintf(prefix, sizeof prefix, "%s/other", c.data);
    write_text(txt, 0, 5000, 300, NULL, 0, "\n", "\n");
    FILE *fp = fopen(txt, "ab");
    for (int i = 0; fp && i < 300; i++) {
        char line[512];
        sentence(line, sizeof line, 1, 9000 + i);
        fprintf(fp, "%s\n", line);
    }
    if (fp) fclose(fp);
    const char *inputs[1] = {txt};
    CHECK(spm_train(inputs, 1, prefix, SMALL_VOCAB, err, sizeof err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s.model", prefix);
    bytes = read_bytes(path, &n_bytes);
    CHECK(bytes && write_bytes(model, bytes, n_bytes), "cannot replace spm.model");
    free(bytes);
    dev0 = inode_of(dev_tok);
    train0 = inode_of(train_tok);
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(inode_of(dev_tok) != dev0 && inode_of(train_tok) != train0, "a new tokenizer did not rebuild the splits");

    /* a tokenizer of another size is refused, naming the file */
    CorpusConfig cfg = {.data_dir = c.data, .cache_dir = c.cache, .vocab_size = 2 * SMALL_VOCAB};
    const char *splits[1] = {"dev"};
    CHECK(corpus_prepare(&cfg, splits, 1, st, err, sizeof err) != 0 && strstr(err, model) &&
              strstr(err, "80 pieces"),
          "vocab size mismatch: '%s'", err);

    /* a missing source is named */
    CHECK(prepare(&c, false, "nosuch", st, err, sizeof err) != 0 && strstr(err, "nosuch.en"),
          "missing split: '%s'", err);
}

/* ---- token_file_open on damaged files ------------------------------------------- */

static void expect_refused(const char *path, const uint8_t *bytes, size_t n, const char *phrase, const char *what) {
    CHECK(write_bytes(path, bytes, n), "cannot write %s", path);
    TokenFile tf;
    char err[1024] = "";
    int rc = token_file_open(&tf, path, SMALL_VOCAB, err, sizeof err);
    CHECK(rc != 0, "%s: damaged token file accepted", what);
    if (rc == 0) {
        token_file_close(&tf);
        return;
    }
    CHECK(strstr(err, phrase) != NULL, "%s: message '%s' lacks '%s'", what, err, phrase);
    CHECK(strstr(err, path) != NULL, "%s: message '%s' does not name the file", what, err);
}

/* Recomputes the body crc (every byte after the 40-byte header) and then
 * the header crc, so that a structural check is reached behind them. */
static void reseal(uint8_t *b, size_t n) {
    uint32_t body = crc32c(0, b + 40, n - 40);
    memcpy(b + 28, &body, 4);
    uint32_t crc = crc32c(0, b, 36);
    memcpy(b + 36, &crc, 4);
}

static void test_damaged_token_files(void) {
    Case c = clean_case();
    char err[1024], good[512], path[512];
    CHECK(prepare(&c, false, "dev", NULL, err, sizeof err) == 0, "%s", err);
    path_of(good, sizeof good, c.cache, "dev.tok");
    path_of(path, sizeof path, c.cache, "bad.tok");
    size_t n = 0;
    uint8_t *orig = read_bytes(good, &n);
    CHECK(orig != NULL && n > 64, "cannot read %s", good);
    if (!orig) return;
    uint8_t *b = malloc(n);
    uint32_t n_pairs;
    memcpy(&n_pairs, orig + 12, 4);
    const size_t en_off_at = 40, line_at = 40 + 16 * ((size_t)n_pairs + 1);
    const size_t tokens_at = line_at + 4 * (size_t)n_pairs;

    expect_refused(path, orig, n - 4, "implies", "truncated by one token");
    expect_refused(path, orig, 20, "truncated", "truncated inside the header");
    expect_refused(path, orig, 0, "truncated", "empty file");
    memcpy(b, orig, n);
    b[13] ^= 0x01; /* n_pairs */
    expect_refused(path, b, n, "checksum", "flipped n_pairs byte");
    memcpy(b, orig, n);
    b[24] ^= 0x80; /* key */
    expect_refused(path, b, n, "checksum", "flipped key byte");
    memcpy(b, orig, n);
    b[0] = 'X';
    expect_refused(path, b, n, "bad magic", "bad magic");
    static const char foreign[] = "PK\x03\x04 this is a zip file, not a token file at all.";
    expect_refused(path, (const uint8_t *)foreign, sizeof foreign - 1, "bad magic", "foreign file");
    memcpy(b, orig, n);
    b[8] = 3;
    reseal(b, n);
    expect_refused(path, b, n, "version 3", "future version");
    /* the body: a changed token id (still inside the vocabulary) or line
     * number is caught by the body checksum, whatever the key says */
    memcpy(b, orig, n);
    int32_t id;
    memcpy(&id, b + tokens_at + 8, 4);
    id = id == 5 ? 6 : 5;
    memcpy(b + tokens_at + 8, &id, 4);
    expect_refused(path, b, n, "damaged body", "changed token id");
    memcpy(b, orig, n);
    b[line_at + 8] ^= 0x02;
    expect_refused(path, b, n, "damaged body", "flipped line number");
    memcpy(b, orig, n);
    uint64_t v = 1u << 30;
    memcpy(b + en_off_at + 8 * 3, &v, 8); /* en_off[3] far beyond its neighbours */
    reseal(b, n);
    expect_refused(path, b, n, "not monotone", "offset out of order");
    memcpy(b, orig, n);
    memcpy(b + en_off_at, &v, 8); /* en_off[0] != 0 */
    reseal(b, n);
    expect_refused(path, b, n, "inconsistent offsets", "offset start");
    memcpy(b, orig, n);
    uint32_t zero = 0;
    memcpy(b + line_at + 4, &zero, 4);
    reseal(b, n);
    expect_refused(path, b, n, "line numbers", "line number 0");
    memcpy(b, orig, n);
    int32_t neg = -5;
    memcpy(b + tokens_at + 4, &neg, 4);
    reseal(b, n);
    expect_refused(path, b, n, "negative id", "negative token");
    /* an id past the vocabulary, checksums consistent: refused on opening */
    memcpy(b, orig, n);
    int32_t big = SMALL_VOCAB;
    memcpy(b + tokens_at + 12, &big, 4);
    reseal(b, n);
    expect_refused(path, b, n, "has id 80, outside the vocabulary of 80 pieces", "id past the vocabulary");
    /* a header claiming a huge token count must not overflow the size check */
    memcpy(b, orig, n);
    uint64_t huge = UINT64_MAX / 2;
    memcpy(b + 16, &huge, 8);
    reseal(b, n);
    expect_refused(path, b, n, "implies", "huge n_tokens");
    TokenFile tf;
    CHECK(token_file_open(&tf, "/nonexistent/x.tok", SMALL_VOCAB, err, sizeof err) != 0 && strstr(err, "/nonexistent/x.tok"),
          "missing file: '%s'", err);
    CHECK(token_file_open(&tf, good, SMALL_VOCAB, err, sizeof err) == 0, "the original is still good: %s", err);
    token_file_close(&tf);
    free(b);
    free(orig);
}

/* One tokenizer per configuration under one cache root: two sizes side by
 * side, each reused; a tokenizer of the older layout (straight in the
 * root) is moved into its folder with its token files when its size is
 * asked for, and left alone otherwise. */
static void test_tokenizer_per_config(void) {
    Case c = clean_case();
    char err[1024], dir_a[200], dir_b[200], path[300];
    CorpusStats st[3];
    CHECK(corpus_cache_dir(c.cache, SMALL_VOCAB, 0, dir_a, sizeof dir_a, err, sizeof err) == 0, "%s", err);
    CHECK(corpus_cache_dir(c.cache, SMALL_VOCAB + 16, 0, dir_b, sizeof dir_b, err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(dir_a, dir_b) != 0, "two vocabulary sizes share the folder %s", dir_a);
    int sizes[2] = {SMALL_VOCAB, SMALL_VOCAB + 16};
    const char *dirs[2] = {dir_a, dir_b};
    for (int round = 0; round < 2; round++)  // the second round switches back and forth on the same root
        for (int k = 0; k < 2; k++) {
            CorpusConfig cfg = {.data_dir = c.data, .cache_dir = dirs[k], .vocab_size = sizes[k]};
            const char *splits[1] = {"train"};
            CHECK(corpus_prepare(&cfg, splits, 1, st, err, sizeof err) == 0, "vocab %d, round %d: %s", sizes[k],
                  round, err);
            path_of(path, sizeof path, dirs[k], "spm.model");
            Spm *spm = spm_load(path, err, sizeof err);
            CHECK(spm && spm_vocab_size(spm) == sizes[k], "%s: %d pieces, want %d", path, spm ? spm_vocab_size(spm) : -1,
                  sizes[k]);
            spm_free(spm);
        }

    /* the older layout: a tokenizer and token files straight in the root */
    Case old;
    case_new(&old);
    write_clean(&old);
    CHECK(prepare(&old, false, NULL, st, err, sizeof err) == 0, "%s", err);
    path_of(path, sizeof path, old.cache, "spm.model");
    const ino_t model_ino = inode_of(path);
    CHECK(corpus_adopt_old_layout(old.cache, SMALL_VOCAB + 16, false, err, sizeof err) == 0,
          "a tokenizer of another size was moved: %s", err);
    CHECK(inode_of(path) == model_ino, "the older tokenizer of another size did not stay where it was");
    CHECK(corpus_adopt_old_layout(old.cache, SMALL_VOCAB, false, err, sizeof err) == 1, "not moved: %s", err);
    char moved_dir[200], moved[300];
    CHECK(corpus_cache_dir(old.cache, SMALL_VOCAB, 0, moved_dir, sizeof moved_dir, err, sizeof err) == 0, "%s", err);
    path_of(moved, sizeof moved, moved_dir, "spm.model");
    CHECK(!file_exists_dir(old.cache, "spm.model") && inode_of(moved) == model_ino,
          "the older tokenizer was not moved into %s", moved_dir);
    CHECK(file_exists_dir(moved_dir, "train.tok") && file_exists_dir(moved_dir, "dev.tok") &&
              file_exists_dir(moved_dir, "test.tok") && !file_exists_dir(old.cache, "train.tok"),
          "the older token files did not move with their tokenizer");
    path_of(path, sizeof path, moved_dir, "train.tok");
    const ino_t tok_ino = inode_of(path);
    Case in_dir = old;
    snprintf(in_dir.cache, sizeof in_dir.cache, "%s", moved_dir);
    CHECK(prepare(&in_dir, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(inode_of(moved) == model_ino && inode_of(path) == tok_ino, "the moved cache was rebuilt, not reused");
}

/* ---- the streaming preparation -------------------------------------------- */

static void prepare_with(const Case *c, const char *cache, int workers, long sample, CorpusStats *st, char *err,
                         size_t err_len) {
    CorpusConfig cfg = {.data_dir = c->data, .cache_dir = cache, .vocab_size = SMALL_VOCAB, .workers = workers,
                        .spm_sample = sample};
    const char *splits[2] = {"train", "dev"};
    err[0] = '\0';
    CHECK(corpus_prepare(&cfg, splits, 2, st, err, err_len) == 0, "%s (workers %d, sample %ld)", err, workers, sample);
}

static bool same_file(const char *dir_a, const char *dir_b, const char *name) {
    char a[1400], b[1400];
    size_t na = 0, nb = 0;
    path_of(a, sizeof a, dir_a, name);
    path_of(b, sizeof b, dir_b, name);
    uint8_t *ma = read_bytes(a, &na), *mb = read_bytes(b, &nb);
    const bool same = ma && mb && na == nb && memcmp(ma, mb, na) == 0;
    free(ma);
    free(mb);
    return same;
}

/* Several workers write the bytes one writes: a training split of more
 * than three ranges of lines (with skipped pairs inside them), encoded by
 * 1, 3 and 7 workers with the same tokenizer. */
static void test_workers_same_bytes(void) {
    Case c;
    case_new(&c);
    const int n = 3 * 8192 + 517;
    const Override bad[] = {{5, ""}, {8192, "\xff bad"}, {16390, "   "}, {n - 1, ""}};
    char path[512], cache[3][300], err[1024];
    snprintf(path, sizeof path, "%s/train.en", c.data);
    write_text(path, 0, 0, n, bad, 4, "\n", "\n");
    snprintf(path, sizeof path, "%s/train.ja", c.data);
    write_text(path, 1, 0, n, NULL, 0, "\r\n", "");
    write_split(&c, "dev", 100000, N_DEV);
    const int workers[3] = {1, 3, 7};  // 7: more than the four ranges there are
    CorpusStats st[2];
    for (int k = 0; k < 3; k++) {
        snprintf(cache[k], sizeof cache[k], "%s.w%d", c.cache, workers[k]);
        if (k > 0) {  // the same tokenizer: only the encoding differs
            mkdir(cache[k], 0777);
            char from[1400], to[1400];
            path_of(from, sizeof from, cache[0], "spm.model");
            path_of(to, sizeof to, cache[k], "spm.model");
            size_t nb = 0;
            uint8_t *m = read_bytes(from, &nb);
            CHECK(m && write_bytes(to, m, nb), "cannot copy %s", from);
            free(m);
        }
        prepare_with(&c, cache[k], workers[k], 0, st, err, sizeof err);
        CHECK(st[0].lines == n && st[0].kept == n - 4 && st[0].empty == 3 && st[0].bad_utf8 == 1 &&
                  st[0].crlf == n - 1,
              "%d workers: %ld read, %ld kept, %ld empty, %ld bad, %ld CRLF", workers[k], st[0].lines, st[0].kept,
              st[0].empty, st[0].bad_utf8, st[0].crlf);
        if (k > 0)
            CHECK(same_file(cache[0], cache[k], "train.tok") && same_file(cache[0], cache[k], "dev.tok"),
                  "%d workers wrote other token files than one", workers[k]);
    }
    TokenFile tf;
    path_of(path, sizeof path, cache[2], "train.tok");
    CHECK(token_file_open(&tf, path, SMALL_VOCAB, err, sizeof err) == 0, "%s", err);
    CHECK(tf.n_pairs == n - 4 && tf.line[4] == 5 && tf.line[5] == 7 && tf.line[tf.n_pairs - 1] == (uint32_t)n - 1,
          "line numbers across the gaps: %u %u %u", tf.line[4], tf.line[5], tf.line[tf.n_pairs - 1]);
    token_file_close(&tf);
}

/* The tokenizer's sample: deterministic, its size part of the folder's
 * name, and a sample as large as the text gives the whole text's model. */
static void test_spm_sample(void) {
    Case c = clean_case();
    char a[300], b[300], d[300], full[300], err[1024];
    CorpusStats st[2];
    snprintf(a, sizeof a, "%s.a", c.cache);
    snprintf(b, sizeof b, "%s.b", c.cache);
    snprintf(d, sizeof d, "%s.d", c.cache);
    snprintf(full, sizeof full, "%s.full", c.cache);
    prepare_with(&c, a, 0, 300, st, err, sizeof err);
    prepare_with(&c, b, 1, 300, st, err, sizeof err);
    prepare_with(&c, d, 0, 500, st, err, sizeof err);
    prepare_with(&c, full, 0, 2 * N_TRAIN, st, err, sizeof err);
    CHECK(same_file(a, b, "spm.model") && same_file(a, b, "train.tok"), "two samples of 300 sentences differ");
    CHECK(!same_file(a, d, "spm.model"), "samples of 300 and 500 sentences trained the same tokenizer");
    Case whole = c;
    snprintf(whole.cache, sizeof whole.cache, "%.240s.whole", c.cache);
    CHECK(prepare(&whole, false, NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(same_file(full, whole.cache, "spm.model"), "a sample of every sentence is not the whole text's tokenizer");
    char x[200], y[200];
    CHECK(corpus_cache_dir("r", 8000, 0, x, sizeof x, err, sizeof err) == 0 &&
              strcmp(x, "r/spm-unigram-v8000-s2000000") == 0 &&
              corpus_cache_dir("r", 8000, 300, y, sizeof y, err, sizeof err) == 0 &&
              strcmp(y, "r/spm-unigram-v8000-s300") == 0,
          "cache folder names: %s, %s", x, y);
}

/* A warm start: sources unchanged since their record (and old enough for
 * it to be trusted) are not read; a touched one is read again and its
 * token file kept; the record's text form is textnorm_detect's. */
static void test_warm_start(void) {
    Case c = clean_case();
    struct timespec settle = {1, 200 * 1000 * 1000};  // past the record's one-second settling time
    nanosleep(&settle, NULL);
    char err[1024], dev_tok[512], path[512];
    CorpusStats st[3];
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(!st[0].not_read && !st[1].not_read, "a first preparation claims it read nothing");
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(st[0].not_read && st[1].not_read && st[2].not_read && st[0].kept == N_TRAIN && st[1].kept == N_DEV,
          "unchanged text was read again (%d %d %d) or its counts were lost (%ld %ld)", st[0].not_read,
          st[1].not_read, st[2].not_read, st[0].kept, st[1].kept);
    path_of(dev_tok, sizeof dev_tok, c.cache, "dev.tok");
    const ino_t dev0 = inode_of(dev_tok);
    path_of(path, sizeof path, c.data, "dev.ja");
    utimensat(AT_FDCWD, path, NULL, 0);
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(st[0].not_read && !st[1].not_read && inode_of(dev_tok) == dev0,
          "touching dev.ja: train read %d, dev read %d, dev.tok rebuilt %d", !st[0].not_read, !st[1].not_read,
          inode_of(dev_tok) != dev0);

    /* token files old enough for their check to be recorded trusted; then a
     * damaged body (written in place: its identity changes) is still found */
    nanosleep(&settle, NULL);
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0 && prepare(&c, false, NULL, st, err, sizeof err) == 0,
          "%s", err);
    flip_last_token(dev_tok);
    expect_rebuilt(&c, dev_tok, st, err, sizeof err, "a damaged dev.tok behind a trusted record was not rebuilt");

    CorpusSplitInfo info;
    CHECK(corpus_split_info(c.cache, "train", &info, err, sizeof err) == 0, "%s", err);
    char en[512], ja[512];
    path_of(en, sizeof en, c.data, "train.en");
    path_of(ja, sizeof ja, c.data, "train.ja");
    for (int dir = 0; dir < 2; dir++) {
        TextNorm want, got;
        CHECK(textnorm_detect(dir ? ja : en, dir ? en : ja, dir ? TEXT_LANG_JA : TEXT_LANG_EN,
                              dir ? TEXT_LANG_EN : TEXT_LANG_JA, &want, err, sizeof err) == 0, "%s", err);
        got = textnorm_from_counts(dir ? &info.form_ja : &info.form_en, dir ? &info.form_en : &info.form_ja,
                                   dir ? TEXT_LANG_JA : TEXT_LANG_EN, dir ? TEXT_LANG_EN : TEXT_LANG_JA);
        CHECK(memcmp(&want, &got, sizeof want) == 0 && info.form_en.lines == N_TRAIN && info.stats.kept == N_TRAIN,
              "direction %d: the recorded text form differs from the measured one", dir);
    }
    CHECK(corpus_split_info(c.cache, "nosuch", &info, err, sizeof err) != 0 && strstr(err, "nosuch.source.json"),
          "a missing record: '%s'", err);
}

/* Jobs sharing a cache prepare it at once (train_mt runs side by side, as
 * scripts/sweep_recipe.sh starts them): every one succeeds, cold and warm,
 * and the cache is whole after. Each writes its own temporaries. */
static void test_concurrent_prepare(void) {
    Case c = clean_case();
    enum { JOBS = 3 };
    for (int round = 0; round < 2; round++) {  // cold (every file built at once), then warm (records rewritten)
        pid_t pid[JOBS];
        for (int j = 0; j < JOBS; j++) {
            pid[j] = fork();
            if (pid[j] == 0) {
                char err[1024];
                _exit(prepare(&c, false, NULL, NULL, err, sizeof err) == 0 ? 0 : (fprintf(stderr, "%s\n", err), 1));
            }
        }
        int failed = 0;
        for (int j = 0; j < JOBS; j++) {
            int status = 0;
            waitpid(pid[j], &status, 0);
            failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
        CHECK(failed == 0, "round %d: %d of %d jobs preparing one cache at once failed", round, failed, JOBS);
    }
    char err[1024];
    CorpusStats st[3];
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0 && st[0].kept == N_TRAIN, "after the jobs: %s", err);
    CorpusSplitInfo info;
    CHECK(corpus_split_info(c.cache, "dev", &info, err, sizeof err) == 0 && info.stats.kept == N_DEV, "%s", err);
}

/* ---- the record a warm start reads (<stem>.source.json) ---------------------------- */

#define RECORD_SEAL_HEAD "{\n\t\"record_crc32c\":\t\""
#define RECORD_SEAL_LINE (sizeof RECORD_SEAL_HEAD - 1 + 8 + 3)

/* Replaces the first `from` in the record at path by `to`; reseal: its
 * checksum line recomputed (a record written wrong, not damaged after). */
static void edit_record(const char *path, const char *from, const char *to, bool reseal) {
    size_t n = 0;
    char *t = (char *)read_bytes(path, &n);
    CHECK(t != NULL, "cannot read %s", path);
    if (!t) return;
    char *at = memmem(t, n, from, strlen(from));
    CHECK(at != NULL, "%s holds no '%s'", path, from);
    if (!at) {
        free(t);
        return;
    }
    const size_t n_out = n - strlen(from) + strlen(to);
    char *out = malloc(n_out + 1);
    memcpy(out, t, (size_t)(at - t));
    memcpy(out + (at - t), to, strlen(to));
    memcpy(out + (at - t) + strlen(to), at + strlen(from), n - (size_t)(at - t) - strlen(from));
    if (reseal) {
        CHECK(strncmp(out, RECORD_SEAL_HEAD, sizeof RECORD_SEAL_HEAD - 1) == 0, "%s has no seal line", path);
        char hex[9];
        snprintf(hex, sizeof hex, "%08x", crc32c(0, out + RECORD_SEAL_LINE, n_out - RECORD_SEAL_LINE));
        memcpy(out + sizeof RECORD_SEAL_HEAD - 1, hex, 8);
    }
    CHECK(write_bytes(path, out, n_out), "cannot write %s", path);
    free(out);
    free(t);
}

/* A warm cache of a clean case, old enough for its records to be trusted. */
static Case warm_case(char *record, size_t cap) {
    Case c = clean_case();
    struct timespec settle = {1, 200 * 1000 * 1000};
    nanosleep(&settle, NULL);
    char err[1024];
    CorpusStats st[3];
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0 && st[0].not_read, "a warm start read the text: %s", err);
    path_of(record, cap, c.cache, "train.source.json");
    return c;
}

/* Damaged, wrong, duplicated or disagreeing records are not trusted: the
 * text is read again (and the record rewritten), and corpus_split_info
 * refuses them; a wrong checksum of the text costs no rebuild. */
static void test_record_verified(void) {
    static const struct {
        const char *from, *to, *what;
        bool reseal;
    } cases[] = {
        {"\"spaced_lines\":\t", "\"spaced_lines\":\t9", "a changed byte (no reseal)", false},
        {"\"kept\":\t400", "\"kept\":\t900", "kept > lines (resealed)", true},
        {"\"upper\":\t", "\"upper\":\t9000000000000", "upper > letters (resealed)", true},
        {"\"passes_strict\":\ttrue,\n\t\"stats\":\t{\n\t\t\"lines\":\t400,\n\t\t\"kept\":\t400,\n\t\t\"empty\":\t0",
         "\"passes_strict\":\tfalse,\n\t\"stats\":\t{\n\t\t\"lines\":\t400,\n\t\t\"kept\":\t399,\n\t\t\"empty\":\t1",
         "kept disagreeing with train.tok (resealed)", true},
        {"\"stats\":\t{\n", "\"stats\":\t{\n\t\t\"crlf\":\t5,\n", "a duplicate key, the first in range (resealed)", true},
        {"\"format\":\t2,", "\"format\":\t1,", "an older format (resealed)", true},
    };
    char record[512], tok[512], err[1024];
    CorpusStats st[3];
    Case c = warm_case(record, sizeof record);  // each rewritten record is trusted again: one case serves all
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        edit_record(record, cases[k].from, cases[k].to, cases[k].reseal);
        CorpusSplitInfo info;
        CHECK(corpus_split_info(c.cache, "train", &info, err, sizeof err) != 0 && strstr(err, "train.source.json"),
              "%s: corpus_split_info took the record", cases[k].what);
        CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s: %s", cases[k].what, err);
        CHECK(!st[0].not_read && st[1].not_read && st[0].kept == N_TRAIN && st[0].lines == N_TRAIN,
              "%s: trusted (train read %d, kept %ld)", cases[k].what, !st[0].not_read, st[0].kept);
        CHECK(corpus_split_info(c.cache, "train", &info, err, sizeof err) == 0 && info.stats.kept == N_TRAIN,
              "%s: the record was not rewritten: %s", cases[k].what, err);
    }
    /* the text's checksum recorded wrong (and resealed): the text, read again, decides the key: no rebuild */
    path_of(tok, sizeof tok, c.cache, "train.tok");
    const ino_t tok0 = inode_of(tok);
    CorpusSplitInfo info;
    CHECK(corpus_split_info(c.cache, "train", &info, err, sizeof err) == 0, "%s", err);
    size_t n = 0;
    char *t = (char *)read_bytes(record, &n);
    char *at = t ? strstr(t, "\"crc32c\":\t\"") : NULL;  // sources.en's
    if (at) at[11] = at[11] == '0' ? '1' : '0';
    CHECK(at && write_bytes(record, t, n), "cannot edit the text's checksum in %s", record);
    free(t);
    edit_record(record, "\"format\"", "\"format\"", true);
    for (int round = 0; round < 2; round++) {
        CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
        CHECK(inode_of(tok) == tok0, "round %d: a wrong recorded checksum rebuilt train.tok", round);
    }
    CHECK(st[0].not_read, "the record was not repaired: a third start read the text");
    CorpusSplitInfo after;
    CHECK(corpus_split_info(c.cache, "train", &after, err, sizeof err) == 0 && after.key == info.key,
          "the repaired record's key %08x is not the file's %08x", after.key, info.key);
    /* a record of text that passed --strict's checks serves a warm --strict start */
    CHECK(prepare(&c, true, NULL, st, err, sizeof err) == 0 && st[0].not_read && st[1].not_read,
          "a warm --strict start read clean text again (%s)", err);
}

/* --strict on a warm cache: a record of text with a pair skipped is not
 * enough, the text is read and refused naming file:line; a clean record is. */
static void test_strict_warm(void) {
    Case c;
    case_new(&c);
    write_clean(&c);
    char path[512], err[1024];
    Override ov[] = {{4, ""}};
    rewrite_file(&c, path, "train.en", 0, 0, N_TRAIN, ov, 1, "\n", "\n");
    struct timespec settle = {1, 200 * 1000 * 1000};
    nanosleep(&settle, NULL);
    CorpusStats st[3];
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0 && st[0].empty == 1, "%s", err);
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0 && st[0].not_read, "not warm: %s", err);
    CHECK(prepare(&c, true, NULL, st, err, sizeof err) != 0 && strstr(err, "train.en:5: empty line"),
          "a warm --strict start accepted an empty line at train.en:5 ('%s')", err);
}

/* A start removes the temporaries of preparations whose process is gone,
 * and only those. */
static void test_leftovers(void) {
    Case c = clean_case();
    mkdir(c.cache, 0777);
    const pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);  // a pid with no process (reaped)
    char dead[64], live[64];
    snprintf(dead, sizeof dead, "%d", (int)child);
    snprintf(live, sizeof live, "%d", (int)getppid());  // started before the files (this process's own names are its preparation's)
    const char *gone_fmt[] = {"spm_train.%s.txt", "train.tok.part0.%s.en", "dev.tok.part12.%s.ja",
                              "train.source.json.tmp.%s", "train.tok.tmp.%s", "spm.model.tmp.%s"};
    const char *kept_fmt[] = {"notes.%s.txt", "train.tok.part0.%s.de", "train.tmp.%sx", "mine.part0.%s.en"};
    char name[128], path[600];
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < 6; i++) {
            snprintf(name, sizeof name, gone_fmt[i], pass ? live : dead);
            path_of(path, sizeof path, c.cache, name);
            CHECK(write_bytes(path, "x", 1), "cannot write %s", path);
        }
    for (size_t i = 0; i < 4; i++) {
        snprintf(name, sizeof name, kept_fmt[i], dead);
        path_of(path, sizeof path, c.cache, name);
        CHECK(write_bytes(path, "x", 1), "cannot write %s", path);
    }
    char err[1024];
    CorpusStats st[3];
    CHECK(prepare(&c, false, NULL, st, err, sizeof err) == 0, "%s", err);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < 6; i++) {
            snprintf(name, sizeof name, gone_fmt[i], pass ? live : dead);
            CHECK(file_exists_dir(c.cache, name) == (pass == 1), "%s: %s", name,
                  pass ? "a live process's temporary was removed" : "a dead preparation's leftover stayed");
        }
    for (size_t i = 0; i < 4; i++) {
        snprintf(name, sizeof name, kept_fmt[i], dead);
        CHECK(file_exists_dir(c.cache, name), "%s is no temporary of a preparation but was removed", name);
    }
    /* a live pid is not the maker of a file that changed before the process started */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    const int64_t now_ns = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
    CHECK(!proc_gone(getpid(), 0, now_ns) && proc_gone(getpid(), 0, now_ns - 3600LL * 1000000000LL) &&
          proc_gone((int)child, 0, 0),
          "proc_gone: this process judged gone now, or alive as the maker of an hour-old file, or the reaped "
          "child alive");
}

int main(void) {
    if (!make_scratch_dir(g_root, sizeof g_root, "test_corpus")) return 1;
    test_clean_and_deterministic();
    test_line_count_mismatch();
    test_empty_lines();
    test_invalid_utf8();
    test_crlf_and_final_line();
    test_reuse_and_rebuild();
    test_damaged_token_files();
    test_tokenizer_per_config();
    test_workers_same_bytes();
    test_spm_sample();
    test_warm_start();
    test_concurrent_prepare();
    test_record_verified();
    test_strict_warm();
    test_leftovers();
    remove_tree(g_root);
    return check_report("test_corpus");
}
