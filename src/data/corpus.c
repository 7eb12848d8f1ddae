/* corpus.c: parallel text -> validated pairs -> SentencePiece -> token files.
 *
 * Each source file is read whole (the largest is a few MB): its bytes feed
 * the cache key and are then cut into NUL-terminated lines in place. A split
 * is validated completely before anything is written, so a bad corpus never
 * leaves a half-built cache. Token files are written under a temporary name,
 * fsynced and renamed, so a crash or a concurrent rank never exposes a torn
 * file; readers map them read-only and check every structural invariant
 * before handing out pointers.
 *
 * Choices the header leaves open:
 *   - "empty" also covers lines of only spaces and tabs (they encode to no
 *     pieces); a NUL byte counts as invalid text (bad_utf8);
 *   - a '\r' ending any line is stripped and counted, the last line included;
 *   - the header crc covers the 36 header bytes before it; the body crc
 *     covers every byte after the header (offset and line tables, tokens),
 *     so a damaged body is found when the file is opened, not trusted
 *     because its key still matches; on top of the checksum, every token id
 *     is checked against the vocabulary the caller names;
 *   - the key is crc32c over (format version, c(.en), c(.ja), c(spm.model)),
 *     where c(f) = crc32c(length of f as uint64, bytes of f): a changed
 *     byte changes it, and so do bytes moved from one file to the next.
 *     Only content counts: touching a file does not rebuild;
 *   - vocab_size <= 0 means the default 8000; an existing spm.model with
 *     another size is refused rather than silently used (callers give each
 *     size its own folder: corpus_cache_dir).
 */
#include "data/corpus.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "data/spm.h"
#include "err.h"
#include "fileio.h"
#include "safetensors.h" /* crc32c */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian and mapped as is: a big-endian host needs byte swapping here"
#endif

#define TOK_VERSION 2u
#define TOK_HEADER_BYTES 40
#define TOK_BODY_CRC_AT 28
#define TOK_HEADER_CRC_AT 36
#define CORPUS_DEFAULT_VOCAB 8000
static const char TOK_MAGIC[8] = {'T', 'P', 'T', 'O', 'K', 0, 0, 1};

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

/* ---- UTF-8 ------------------------------------------------------------------ */

/* Strict UTF-8 (Unicode Table 3-7): NULL when s[0..n) is valid, else the
 * reason, with *bad_at the 0-based offset of the offending sequence. NUL
 * bytes are refused too: lines travel as C strings. */
static const char *utf8_invalid(const uint8_t *s, size_t n, size_t *bad_at) {
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        *bad_at = i;
        if (c < 0x80) {
            if (c == 0) return "NUL byte";
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min_cp;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2, cp = c & 0x1Fu, min_cp = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0Fu, min_cp = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4, cp = c & 0x07u, min_cp = 0x10000;
        } else if (c == 0xC0 || c == 0xC1) {
            return "overlong encoding";
        } else if (c < 0xC0) {
            return "continuation byte without a lead byte";
        } else if (c <= 0xF7) {
            return "code point above U+10FFFF";
        } else {
            return "byte that never occurs in UTF-8";
        }
        for (size_t k = 1; k < len; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return "truncated sequence";
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if (cp < min_cp) return "overlong encoding";
        if (cp >= 0xD800 && cp <= 0xDFFF) return "UTF-16 surrogate";
        if (cp > 0x10FFFF) return "code point above U+10FFFF";
        i += len;
    }
    return NULL;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t') return 0;
    return 1;
}

/* ---- one side of a split: a file cut into lines ------------------------------ */

typedef struct {
    char path[PATH_MAX];
    char *buf;        // (n_bytes + 1) file bytes, cut into NUL-terminated lines
    size_t n_bytes;
    long n_lines;
    char **line;      // (n_lines) start of each line inside buf
    size_t *len;      // (n_lines) length after stripping '\n' and '\r'
    long n_crlf;
    uint32_t crc;     // crc32c(len as uint64, bytes) before cutting
} TextSide;

typedef struct {
    const char *name;
    TextSide en, ja;
    long n_kept;
    uint32_t *kept;   // (n_kept) 0-based line index of each kept pair
    CorpusStats stats;
} SplitText;

static void text_side_free(TextSide *t) {
    free(t->buf);
    free(t->line);
    free(t->len);
    memset(t, 0, sizeof *t);
}

static void split_free(SplitText *s) {
    text_side_free(&s->en);
    text_side_free(&s->ja);
    free(s->kept);
    s->kept = NULL;
}

/* Reads and cuts path into lines: '\n' ends a line, a final line may lack it,
 * a '\r' before the end of a line is stripped and counted. */
static int text_side_read(TextSide *t, const char *dir, const char *split, const char *lang, char *err,
                          size_t err_len) {
    memset(t, 0, sizeof *t);
    if (snprintf(t->path, sizeof t->path, "%s/%s.%s", dir, split, lang) >= (int)sizeof t->path) {
        tp_error_set(err, err_len, "path too long: %s/%s.%s", dir, split, lang);
        return -1;
    }
    t->buf = read_file_bytes(t->path, &t->n_bytes, err, err_len);
    if (!t->buf) return -1;
    uint64_t n64 = t->n_bytes;
    t->crc = crc32c(crc32c(0, &n64, sizeof n64), t->buf, t->n_bytes);

    long n_lines = 0;
    for (size_t i = 0; i < t->n_bytes; i++) n_lines += (t->buf[i] == '\n');
    if (t->n_bytes > 0 && t->buf[t->n_bytes - 1] != '\n') n_lines++;
    if (n_lines >= (long)UINT32_MAX) {
        tp_error_set(err, err_len, "%s has too many lines (%ld)", t->path, n_lines);
        return -1;
    }
    t->n_lines = n_lines;
    t->line = TP_MALLOC((size_t)n_lines * sizeof *t->line);
    t->len = TP_MALLOC((size_t)n_lines * sizeof *t->len);
    char *p = t->buf, *end = t->buf + t->n_bytes;
    for (long i = 0; i < n_lines; i++) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        if (stop > p && stop[-1] == '\r') {
            stop--;
            t->n_crlf++;
        }
        *stop = '\0';
        t->line[i] = p;
        t->len[i] = (size_t)(stop - p);
        p = nl ? nl + 1 : end;
    }
    return 0;
}

/* 0 when the line is usable; else fills why and returns 1 (empty) or 2 (bad text). */
static int check_line(const TextSide *t, long i, char *why, size_t why_len) {
    size_t bad_at;
    const char *reason = utf8_invalid((const uint8_t *)t->line[i], t->len[i], &bad_at);
    if (reason) {
        snprintf(why, why_len, "%s:%ld: invalid UTF-8 at byte %zu (%s)", t->path, i + 1, bad_at + 1, reason);
        return 2;
    }
    if (is_blank(t->line[i], t->len[i])) {
        snprintf(why, why_len, "%s:%ld: empty line", t->path, i + 1);
        return 1;
    }
    return 0;
}

/* Reads and validates one split; fills s->kept and s->stats. */
static int split_load(SplitText *s, const CorpusConfig *cfg, const char *name, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    s->name = name;
    if (text_side_read(&s->en, cfg->data_dir, name, "en", err, err_len) != 0 ||
        text_side_read(&s->ja, cfg->data_dir, name, "ja", err, err_len) != 0)
        return -1;
    if (s->en.n_lines != s->ja.n_lines) {
        tp_error_set(err, err_len, "line counts differ: %s has %ld lines but %s has %ld", s->en.path,
                     s->en.n_lines, s->ja.path, s->ja.n_lines);
        return -1;
    }
    const long n = s->en.n_lines;
    s->kept = TP_MALLOC((size_t)(n > 0 ? n : 1) * sizeof *s->kept);
    CorpusStats *st = &s->stats;
    st->lines = n;
    st->crlf = s->en.n_crlf + s->ja.n_crlf;
    char why[PATH_MAX + 128];
    for (long i = 0; i < n; i++) {
        int bad = check_line(&s->en, i, why, sizeof why);
        if (!bad) bad = check_line(&s->ja, i, why, sizeof why);
        if (bad && cfg->strict) {
            tp_error_set(err, err_len, "%s", why);
            return -1;
        }
        if (bad == 1) st->empty++;
        else if (bad == 2) st->bad_utf8++;
        else s->kept[s->n_kept++] = (uint32_t)i;
    }
    st->kept = s->n_kept;
    if (cfg->verbose) {
        printf("corpus: %s: %ld pairs read, %ld kept, %ld skipped empty, %ld skipped invalid UTF-8, %ld CRLF "
               "stripped\n",
               name, st->lines, st->kept, st->empty, st->bad_utf8, st->crlf);
        fflush(stdout);
    }
    return 0;
}

/* ---- tokenizer ---------------------------------------------------------------- */

/* Trains cache_dir/spm.model on the kept pairs of train (en lines, then ja). */
static int train_tokenizer(const SplitText *train, const CorpusConfig *cfg, int vocab_size, char *err,
                           size_t err_len) {
    char txt[PATH_MAX], prefix[PATH_MAX];
    snprintf(txt, sizeof txt, "%s/spm_train.%ld.txt", cfg->cache_dir, (long)getpid());
    snprintf(prefix, sizeof prefix, "%s/spm", cfg->cache_dir);
    FILE *fp = fopen(txt, "wb");
    if (!fp) {
        tp_error_set(err, err_len, "cannot create %s: %s", txt, strerror(errno));
        return -1;
    }
    int ok = 1;
    for (int side = 0; side < 2; side++) {
        const TextSide *t = side == 0 ? &train->en : &train->ja;
        for (long k = 0; k < train->n_kept && ok; k++) {
            const uint32_t i = train->kept[k];
            ok = fwrite(t->line[i], 1, t->len[i], fp) == t->len[i] && fputc('\n', fp) != EOF;
        }
    }
    ok = (fclose(fp) == 0) && ok;
    if (!ok) {
        tp_error_set(err, err_len, "cannot write %s: %s", txt, strerror(errno));
        unlink(txt);
        return -1;
    }
    if (cfg->verbose) {
        printf("corpus: training SentencePiece (unigram, %d pieces) on %ld %s pairs\n", vocab_size, train->n_kept,
               train->name);
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

/* ---- token files -------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

typedef struct {
    int32_t *ids;     // (cap)
    uint64_t n, cap;
} IdVec;

static void idvec_push(IdVec *v, const int32_t *ids, int n) {
    if (v->n + (uint64_t)n > v->cap) {
        uint64_t cap = v->cap ? v->cap : 1024;
        while (cap < v->n + (uint64_t)n) cap *= 2;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        TP_CHECK(p != NULL, "out of memory growing a token array to %llu ids", (unsigned long long)cap);
        v->ids = p;
        v->cap = cap;
    }
    memcpy(v->ids + v->n, ids, (size_t)n * sizeof *ids);
    v->n += (uint64_t)n;
}

/* Encodes every kept pair of s and writes path atomically. */
static int write_token_file(const SplitText *s, const Spm *spm, uint32_t key, const char *path, int verbose,
                            char *err, size_t err_len) {
    const double t0 = tp_now_s();
    const long n = s->n_kept;
    uint64_t *en_off = TP_MALLOC((size_t)(n + 1) * sizeof *en_off);  // (n + 1)
    uint64_t *ja_off = TP_MALLOC((size_t)(n + 1) * sizeof *ja_off);  // (n + 1)
    uint32_t *line = TP_MALLOC((size_t)(n > 0 ? n : 1) * sizeof *line);  // (n)
    IdVec en = {0}, ja = {0};
    int cap = 1024;
    int32_t *scratch = TP_MALLOC((size_t)cap * sizeof *scratch);
    int rc = -1;

    for (int side = 0; side < 2; side++) {
        const TextSide *t = side == 0 ? &s->en : &s->ja;
        IdVec *v = side == 0 ? &en : &ja;
        uint64_t *off = side == 0 ? en_off : ja_off;
        off[0] = 0;
        for (long k = 0; k < n; k++) {
            const uint32_t i = s->kept[k];
            int got = spm_encode(spm, t->line[i], scratch, cap);
            if (got > cap) {
                cap = got;
                free(scratch);
                scratch = TP_MALLOC((size_t)cap * sizeof *scratch);
                got = spm_encode(spm, t->line[i], scratch, cap);
            }
            if (got < 0) {
                tp_error_set(err, err_len, "%s:%u: SentencePiece could not encode the line", t->path, i + 1);
                goto done;
            }
            idvec_push(v, scratch, got);
            off[k + 1] = v->n;
            line[k] = i + 1;
        }
    }
    /* Japanese follows English in one token array. */
    for (long k = 0; k <= n; k++) ja_off[k] += en.n;
    const uint64_t n_tokens = en.n + ja.n;

    uint32_t body_crc = crc32c(0, en_off, ((size_t)n + 1) * sizeof *en_off);
    body_crc = crc32c(body_crc, ja_off, ((size_t)n + 1) * sizeof *ja_off);
    body_crc = crc32c(body_crc, line, (size_t)n * sizeof *line);
    body_crc = crc32c(body_crc, en.ids, (size_t)en.n * sizeof *en.ids);
    body_crc = crc32c(body_crc, ja.ids, (size_t)ja.n * sizeof *ja.ids);
    uint8_t hdr[TOK_HEADER_BYTES];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, TOK_MAGIC, 8);
    put_u32(hdr + 8, TOK_VERSION);
    put_u32(hdr + 12, (uint32_t)n);
    put_u64(hdr + 16, n_tokens);
    put_u32(hdr + 24, key);
    put_u32(hdr + TOK_BODY_CRC_AT, body_crc);
    put_u32(hdr + TOK_HEADER_CRC_AT, crc32c(0, hdr, TOK_HEADER_CRC_AT));

    /* several ranks may build the same file at once: each writes its own temporary */
    AtomicFile af;
    const struct { const void *p; size_t n; } parts[] = {
        {hdr, sizeof hdr}, {en_off, ((size_t)n + 1) * sizeof *en_off}, {ja_off, ((size_t)n + 1) * sizeof *ja_off},
        {line, (size_t)n * sizeof *line}, {en.ids, (size_t)en.n * sizeof *en.ids}, {ja.ids, (size_t)ja.n * sizeof *ja.ids}};
    if (atomic_file_open(&af, path, true, err, err_len) != 0) goto done;
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        if (atomic_file_write(&af, parts[k].p, parts[k].n, err, err_len) != 0) goto done;
    if (atomic_file_commit(&af, err, err_len) != 0) goto done;
    rc = 0;
    if (verbose) {
        printf("corpus: %s: encoded %ld pairs (%llu en + %llu ja pieces) into %s in %.2f s\n", s->name, n,
               (unsigned long long)en.n, (unsigned long long)ja.n, path, tp_now_s() - t0);
        fflush(stdout);
    }
done:
    free(en_off);
    free(ja_off);
    free(line);
    free(en.ids);
    free(ja.ids);
    free(scratch);
    return rc;
}

int token_file_open(TokenFile *tf, const char *path, int vocab_size, char *err, size_t err_len) {
    memset(tf, 0, sizeof *tf);
    uint64_t file_bytes = 0;
    char why[PATH_MAX + 128];
    int fd = tp_open_regular(path, &file_bytes, why, sizeof why);
    if (fd < 0) {
        tp_error_set(err, err_len, "token file %s", why);
        return -1;
    }
    if (file_bytes < TOK_HEADER_BYTES) {
        tp_error_set(err, err_len, "token file %s is truncated: %llu bytes, shorter than its %d-byte header", path,
                     (unsigned long long)file_bytes, TOK_HEADER_BYTES);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        tp_error_set(err, err_len, "cannot map token file %s: %s", path, strerror(errno));
        return -1;
    }
    const uint8_t *b = map;
#define TOK_FAIL(...)                                   \
    do {                                                \
        tp_error_set(err, err_len, __VA_ARGS__);        \
        munmap(map, (size_t)file_bytes);                \
        return -1;                                      \
    } while (0)
    if (memcmp(b, TOK_MAGIC, 8) != 0) TOK_FAIL("%s is not a token file (bad magic)", path);
    const uint32_t version = get_u32(b + 8);
    if (version != TOK_VERSION)
        TOK_FAIL("token file %s has format version %u, this build reads version %u", path, version, TOK_VERSION);
    if (get_u32(b + TOK_HEADER_CRC_AT) != crc32c(0, b, TOK_HEADER_CRC_AT))
        TOK_FAIL("token file %s has a damaged header (checksum mismatch)", path);
    const uint64_t n_pairs = get_u32(b + 12);
    const uint64_t n_tokens = get_u64(b + 16);
    if (n_pairs > (uint64_t)INT_MAX)
        TOK_FAIL("token file %s claims %llu pairs, too many", path, (unsigned long long)n_pairs);
    const uint64_t table_bytes = TOK_HEADER_BYTES + 16 * (n_pairs + 1) + 4 * n_pairs;
    if (n_tokens > file_bytes / 4 || table_bytes + 4 * n_tokens != file_bytes)
        TOK_FAIL("token file %s is %llu bytes but its header (%llu pairs, %llu tokens) implies %s%llu", path,
                 (unsigned long long)file_bytes, (unsigned long long)n_pairs, (unsigned long long)n_tokens,
                 n_tokens > file_bytes / 4 ? "more than " : "",
                 (unsigned long long)(n_tokens > file_bytes / 4 ? file_bytes : table_bytes + 4 * n_tokens));
    const uint32_t body_crc = crc32c(0, b + TOK_HEADER_BYTES, (size_t)file_bytes - TOK_HEADER_BYTES);
    if (body_crc != get_u32(b + TOK_BODY_CRC_AT))
        TOK_FAIL("token file %s has a damaged body (checksum %08x, the header says %08x)", path, body_crc,
                 get_u32(b + TOK_BODY_CRC_AT));
    const uint64_t *en_off = (const uint64_t *)(b + TOK_HEADER_BYTES);
    const uint64_t *ja_off = en_off + n_pairs + 1;
    const uint32_t *line = (const uint32_t *)(ja_off + n_pairs + 1);
    const int32_t *tokens = (const int32_t *)(line + n_pairs);
    if (en_off[0] != 0 || ja_off[0] != en_off[n_pairs] || ja_off[n_pairs] != n_tokens)
        TOK_FAIL("token file %s has inconsistent offsets (en %llu..%llu, ja %llu..%llu, %llu tokens)", path,
                 (unsigned long long)en_off[0], (unsigned long long)en_off[n_pairs],
                 (unsigned long long)ja_off[0], (unsigned long long)ja_off[n_pairs],
                 (unsigned long long)n_tokens);
    for (uint64_t i = 0; i < n_pairs; i++) {
        if (en_off[i + 1] < en_off[i] || ja_off[i + 1] < ja_off[i])
            TOK_FAIL("token file %s: offsets of pair %llu are not monotone", path, (unsigned long long)i);
        if (line[i] == 0 || (i > 0 && line[i] <= line[i - 1]))
            TOK_FAIL("token file %s: source line numbers are not increasing at pair %llu", path,
                     (unsigned long long)i);
    }
    for (uint64_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0)
            TOK_FAIL("token file %s: token %llu has negative id %d", path, (unsigned long long)i, tokens[i]);
        if (tokens[i] >= vocab_size)
            TOK_FAIL("token file %s: token %llu has id %d, outside the vocabulary of %d pieces", path,
                     (unsigned long long)i, tokens[i], vocab_size);
    }
#undef TOK_FAIL
    *tf = (TokenFile){.n_pairs = (int)n_pairs, .en_off = en_off, .ja_off = ja_off, .line = line, .tokens = tokens,
                      .n_tokens = n_tokens, .map = map, .map_bytes = (size_t)file_bytes};
    return 0;
}

void token_file_close(TokenFile *tf) {
    if (tf->map) munmap(tf->map, tf->map_bytes);
    memset(tf, 0, sizeof *tf);
}

/* ---- the cache root: one folder per tokenizer configuration -------------------- */

static const char *const CORPUS_CACHED_FILES[] = {"spm.model", "spm.vocab", "train.tok", "dev.tok", "test.tok"};

int corpus_cache_dir(const char *cache_root, int vocab_size, char *out, size_t out_len, char *err, size_t err_len) {
    const int v = vocab_size > 0 ? vocab_size : CORPUS_DEFAULT_VOCAB;
    if (snprintf(out, out_len, "%s/spm-unigram-v%d", cache_root, v) >= (int)out_len) {
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
    if (corpus_cache_dir(cache_root, v, dir, sizeof dir, err, err_len)) return -1;
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

static uint32_t split_key(const SplitText *s, uint32_t model_crc) {
    const uint32_t parts[4] = {TOK_VERSION, s->en.crc, s->ja.crc, model_crc};
    return crc32c(0, parts, sizeof parts);
}

int corpus_prepare(const CorpusConfig *cfg, const char *const *splits, int n_splits, CorpusStats *stats,
                   char *err, size_t err_len) {
    if (!cfg || !cfg->data_dir || !cfg->cache_dir || n_splits < 0 || (n_splits > 0 && !splits)) {
        tp_error_set(err, err_len, "corpus_prepare: missing data folder, cache folder or split names");
        return -1;
    }
    if (stats) memset(stats, 0, (size_t)n_splits * sizeof *stats);
    const int vocab_size = cfg->vocab_size > 0 ? cfg->vocab_size : CORPUS_DEFAULT_VOCAB;
    if (make_dirs(cfg->cache_dir, err, err_len) != 0) return -1;

    int rc = -1;
    Spm *spm = NULL;
    char *model = NULL;
    SplitText train_extra;
    memset(&train_extra, 0, sizeof train_extra);
    SplitText *text = TP_CALLOC((size_t)(n_splits > 0 ? n_splits : 1), sizeof *text);
    for (int i = 0; i < n_splits; i++)
        if (split_load(&text[i], cfg, splits[i], err, err_len) != 0) goto done;

    char model_path[PATH_MAX];
    if (snprintf(model_path, sizeof model_path, "%s/spm.model", cfg->cache_dir) >= (int)sizeof model_path) {
        tp_error_set(err, err_len, "cache folder name too long: %s", cfg->cache_dir);
        goto done;
    }
    if (!file_exists(model_path)) {
        const SplitText *train = NULL;
        for (int i = 0; i < n_splits; i++)
            if (strcmp(splits[i], "train") == 0) train = &text[i];
        if (!train) {
            if (split_load(&train_extra, cfg, "train", err, err_len) != 0) goto done;
            train = &train_extra;
        }
        if (train_tokenizer(train, cfg, vocab_size, err, err_len) != 0) goto done;
    } else if (cfg->verbose) {
        printf("corpus: reusing %s\n", model_path);
        fflush(stdout);
    }
    spm = spm_load(model_path, err, err_len);
    if (!spm) goto done;
    if (spm_vocab_size(spm) != vocab_size) {
        tp_error_set(err, err_len,
                     "%s has %d pieces but the vocabulary size asked for is %d: remove it or use another cache "
                     "folder",
                     model_path, spm_vocab_size(spm), vocab_size);
        goto done;
    }
    size_t model_bytes = 0;
    model = read_file_bytes(model_path, &model_bytes, err, err_len);
    if (!model) goto done;
    const uint64_t model_n64 = model_bytes;
    const uint32_t model_crc = crc32c(crc32c(0, &model_n64, sizeof model_n64), model, model_bytes);

    for (int i = 0; i < n_splits; i++) {
        const uint32_t key = split_key(&text[i], model_crc);
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s.tok", cfg->cache_dir, splits[i]) >= (int)sizeof path) {
            tp_error_set(err, err_len, "cache folder name too long: %s", cfg->cache_dir);
            goto done;
        }
        char why[PATH_MAX + 256];
        snprintf(why, sizeof why, "not built yet");
        if (file_exists(path)) {
            TokenFile tf;
            char open_err[PATH_MAX + 200];
            if (token_file_open(&tf, path, spm_vocab_size(spm), open_err, sizeof open_err) != 0) {
                snprintf(why, sizeof why, "the existing file is unusable: %s", open_err);
            } else {
                const uint32_t old_key = get_u32((const uint8_t *)tf.map + 24);
                token_file_close(&tf);
                if (old_key == key) {
                    if (cfg->verbose) {
                        printf("corpus: %s: reusing %s (key %08x)\n", splits[i], path, key);
                        fflush(stdout);
                    }
                    continue;
                }
                snprintf(why, sizeof why, "key %08x != %08x: the source text, the tokenizer or the format changed",
                         old_key, key);
            }
        }
        if (cfg->verbose) {
            printf("corpus: %s: building %s (%s)\n", splits[i], path, why);
            fflush(stdout);
        }
        if (write_token_file(&text[i], spm, key, path, cfg->verbose, err, err_len) != 0) goto done;
    }
    if (n_splits > 0) fsync_path(cfg->cache_dir);  // best effort: some file systems refuse fsync on folders
    if (stats)
        for (int i = 0; i < n_splits; i++) stats[i] = text[i].stats;
    rc = 0;
done:
    for (int i = 0; i < n_splits; i++) split_free(&text[i]);
    free(text);
    split_free(&train_extra);
    free(model);
    spm_free(spm);
    return rc;
}
