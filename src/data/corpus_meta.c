/* corpus_meta.c: <stem>.source.json, what a scan of a split learned, kept
 * beside its token file (see corpus_internal.h): the key, the counts,
 * whether the text passed --strict's checks, each side's text form counts
 * and each source file's identity, and the token file's identity when it
 * was last checked whole (token_file_checked).
 *
 * A warm start decides from this record what the text is (its form, its
 * counts) without reading it, so the record is checked like every other
 * file before anything in it is used: the CRC-32C of its own bytes
 * (common/json_seal.h), no key twice (common/json_keys.h), every field
 * present and well-formed, every value in range and agreeing with the
 * others (record_check: the one place a new field's bounds go), and the
 * pair count and key agreeing with the token file's header. A record that
 * fails is no error here: the split is read again, and the caller says
 * why. 64-bit values are written as decimal strings (JSON numbers lose
 * them past 2^53).
 *
 * To add a field: write it in split_meta_write, read it in meta_fields,
 * bound it in record_check (and raise CORPUS_FORMAT when old records must
 * not be read). */
#include "data/corpus_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "err.h"
#include "fileio.h"
#include "json_keys.h"
#include "json_seal.h"

#define RECORD_CRC_FIELD "record_crc32c"
#define RECORD_MAX_LINES ((long)UINT32_MAX - 1)  // split_scan refuses a split of more lines

/* The first field a record lacks or holds malformed ("sources.en.inode"). */
typedef struct {
    char bad[96];
} FieldErr;

static bool field_bad(FieldErr *fe, const char *where, const char *name) {
    if (!fe->bad[0]) snprintf(fe->bad, sizeof fe->bad, "%s%s%s", where, where[0] ? "." : "", name);
    return false;
}

static void add_u64(cJSON *o, const char *name, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON_AddStringToObject(o, name, buf);
}

static bool get_u64(FieldErr *fe, const cJSON *o, const char *where, const char *name, uint64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(x) || strspn(x->valuestring, "0123456789") != strlen(x->valuestring) ||
        !x->valuestring[0] || strlen(x->valuestring) > 20)
        return field_bad(fe, where, name);
    errno = 0;
    *v = strtoull(x->valuestring, NULL, 10);
    return errno == 0 || field_bad(fe, where, name);
}

static bool get_long(FieldErr *fe, const cJSON *o, const char *where, const char *name, long *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15) return field_bad(fe, where, name);
    *v = (long)x->valuedouble;
    return (double)*v == x->valuedouble || field_bad(fe, where, name);
}

/* 8 lowercase hex digits. */
static bool get_hex32(FieldErr *fe, const cJSON *o, const char *where, const char *name, uint32_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(x) || strlen(x->valuestring) != 8 || strspn(x->valuestring, "0123456789abcdef") != 8)
        return field_bad(fe, where, name);
    *v = (uint32_t)strtoul(x->valuestring, NULL, 16);
    return true;
}

static bool get_bool(FieldErr *fe, const cJSON *o, const char *where, const char *name, bool *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsBool(x)) return field_bad(fe, where, name);
    *v = cJSON_IsTrue(x);
    return true;
}

static const char *const FORM_NAMES[6] = {"upper", "letters", "marks", "alone", "lines", "spaced_lines"};

static long *form_field(TextFormCount *f, int i) {
    long *const fields[6] = {&f->upper, &f->letters, &f->marks, &f->alone, &f->lines, &f->spaced_lines};
    return fields[i];
}

static const char *const STAT_NAMES[5] = {"lines", "kept", "empty", "bad_utf8", "crlf"};

static long *stat_field(CorpusStats *s, int i) {
    long *const fields[5] = {&s->lines, &s->kept, &s->empty, &s->bad_utf8, &s->crlf};
    return fields[i];
}

/* Whether the text passed --strict's checks: no pair was skipped. */
static bool passes_strict(const CorpusStats *st) { return st->empty == 0 && st->bad_utf8 == 0; }

static void add_stamp(cJSON *o, const FileStamp *st) {
    add_u64(o, "bytes", st->size);
    add_u64(o, "device", st->dev);
    add_u64(o, "inode", st->ino);
    add_u64(o, "mtime_ns", (uint64_t)st->mtime_ns);
    add_u64(o, "ctime_ns", (uint64_t)st->ctime_ns);
    cJSON_AddBoolToObject(o, "trusted", st->trusted);
}

static bool get_stamp(FieldErr *fe, const cJSON *o, const char *where, FileStamp *st) {
    uint64_t mt, ct;
    if (!cJSON_IsObject(o)) return field_bad(fe, where, "");
    if (!get_bool(fe, o, where, "trusted", &st->trusted) || !get_u64(fe, o, where, "bytes", &st->size) ||
        !get_u64(fe, o, where, "device", &st->dev) || !get_u64(fe, o, where, "inode", &st->ino) ||
        !get_u64(fe, o, where, "mtime_ns", &mt) || !get_u64(fe, o, where, "ctime_ns", &ct))
        return false;
    st->mtime_ns = (int64_t)mt;
    st->ctime_ns = (int64_t)ct;
    return true;
}

static cJSON *side_json(const SideScan *side) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", side->path);
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", side->crc);
    cJSON_AddStringToObject(o, "crc32c", crc);
    add_stamp(o, &side->stamp);
    cJSON *form = cJSON_AddObjectToObject(o, "form");
    TextFormCount f = side->form;
    for (int i = 0; i < 6; i++) cJSON_AddNumberToObject(form, FORM_NAMES[i], (double)*form_field(&f, i));
    return o;
}

static void meta_path(char *out, size_t n, const char *cache_dir, const char *stem) {
    snprintf(out, n, "%s/%s.source.json", cache_dir, stem);
}

int split_meta_write(const char *cache_dir, const SplitScan *s, uint32_t key, char *err, size_t err_len) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "format", CORPUS_FORMAT);
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", key);
    cJSON_AddStringToObject(root, "key", hex);
    cJSON_AddStringToObject(root, "split", s->part->split);
    cJSON_AddBoolToObject(root, "passes_strict", passes_strict(&s->stats));
    cJSON *stats = cJSON_AddObjectToObject(root, "stats");
    CorpusStats st = s->stats;
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(stats, STAT_NAMES[i], (double)*stat_field(&st, i));
    cJSON *sources = cJSON_AddObjectToObject(root, "sources");
    cJSON_AddItemToObject(sources, "en", side_json(&s->en));
    cJSON_AddItemToObject(sources, "ja", side_json(&s->ja));
    if (s->tok_known) add_stamp(cJSON_AddObjectToObject(root, "token_file_checked"), &s->tok);
    char *text = json_seal_print(root, RECORD_CRC_FIELD);
    cJSON_Delete(root);
    char path[PATH_MAX + 64];
    meta_path(path, sizeof path, cache_dir, s->part->stem);
    /* jobs sharing a cache may record the same split at once: each writes its own temporary */
    AtomicFile af;
    int rc = atomic_file_open(&af, path, true, err, err_len);
    if (rc == 0) rc = atomic_file_write(&af, text, strlen(text), err, err_len);
    if (rc == 0) rc = atomic_file_commit(&af, err, err_len);
    free(text);
    return rc;
}

/* One side back from JSON (its path into side->path); false at the first
 * missing or malformed field. */
static bool side_read(FieldErr *fe, const cJSON *o, const char *where, SideScan *side) {
    if (!cJSON_IsObject(o)) return field_bad(fe, where, "");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(o, "path");
    const cJSON *form = cJSON_GetObjectItemCaseSensitive(o, "form");
    if (!cJSON_IsString(path) || strlen(path->valuestring) >= sizeof side->path) return field_bad(fe, where, "path");
    snprintf(side->path, sizeof side->path, "%s", path->valuestring);
    if (!get_hex32(fe, o, where, "crc32c", &side->crc) || !get_stamp(fe, o, where, &side->stamp)) return false;
    char sub[32];
    snprintf(sub, sizeof sub, "%s.form", where);
    if (!cJSON_IsObject(form)) return field_bad(fe, where, "form");
    for (int i = 0; i < 6; i++)
        if (!get_long(fe, form, sub, FORM_NAMES[i], form_field(&side->form, i))) return false;
    return true;
}

/* Every field of a parsed record into s, *key and *strict_ok; false with
 * fe naming the first one missing or malformed. */
static bool meta_fields(FieldErr *fe, const cJSON *root, SplitScan *s, uint32_t *key, bool *strict_ok) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *stats = cJSON_GetObjectItemCaseSensitive(root, "stats");
    const cJSON *sources = cJSON_GetObjectItemCaseSensitive(root, "sources");
    if (!cJSON_IsNumber(fmt) || fmt->valuedouble != CORPUS_FORMAT) return field_bad(fe, "", "format");
    if (!get_hex32(fe, root, "", "key", key) || !get_bool(fe, root, "", "passes_strict", strict_ok)) return false;
    if (!cJSON_IsObject(stats)) return field_bad(fe, "", "stats");
    for (int i = 0; i < 5; i++)
        if (!get_long(fe, stats, "stats", STAT_NAMES[i], stat_field(&s->stats, i))) return false;
    if (!cJSON_IsObject(sources) ||
        !side_read(fe, cJSON_GetObjectItemCaseSensitive(sources, "en"), "sources.en", &s->en) ||
        !side_read(fe, cJSON_GetObjectItemCaseSensitive(sources, "ja"), "sources.ja", &s->ja))
        return field_bad(fe, "", "sources");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "token_file_checked");
    s->tok_known = tok != NULL;  // optional: absent, the token file is checked whole
    return !tok || get_stamp(fe, tok, "token_file_checked", &s->tok);
}

/* The bounds every recorded value keeps, and how the values agree with
 * each other: 0, or -1 + why naming the first that does not. */
static int record_check(const SplitScan *s, bool strict_ok, char *why, size_t why_len) {
    const CorpusStats *st = &s->stats;
    if (st->lines > RECORD_MAX_LINES || st->kept + st->empty + st->bad_utf8 != st->lines) {
        snprintf(why, why_len, "stats: %ld pairs read, but %ld kept + %ld empty + %ld invalid", st->lines, st->kept,
                 st->empty, st->bad_utf8);
        return -1;
    }
    if (st->crlf > 2 * st->lines) {
        snprintf(why, why_len, "stats.crlf %ld: more than the %ld lines of the two files", st->crlf, 2 * st->lines);
        return -1;
    }
    if (strict_ok != passes_strict(st)) {
        snprintf(why, why_len, "passes_strict is %s with %ld pairs skipped", strict_ok ? "true" : "false",
                 st->empty + st->bad_utf8);
        return -1;
    }
    const SideScan *side[2] = {&s->en, &s->ja};
    for (int k = 0; k < 2; k++) {
        const TextFormCount *f = &side[k]->form;
        const long bytes = side[k]->stamp.size > (uint64_t)9e15 ? (long)9e15 : (long)side[k]->stamp.size;
        const char *what = k ? "sources.ja" : "sources.en";
        if (st->lines > bytes || f->lines > st->lines || f->spaced_lines > f->lines) {
            snprintf(why, why_len, "%s: %ld non-empty lines (%ld spaced) of %ld pairs in %ld bytes", what, f->lines,
                     f->spaced_lines, st->lines, bytes);
            return -1;
        }
        if (f->upper > f->letters || f->alone > f->marks || f->letters + f->marks > bytes) {
            snprintf(why, why_len, "%s.form: %ld upper of %ld letters, %ld alone of %ld marks, in %ld bytes", what,
                     f->upper, f->letters, f->alone, f->marks, bytes);
            return -1;
        }
    }
    return 0;
}

/* Reads and verifies the record at path into s (paths included), *key.
 * 0; 1 when there is none; -1 + why (a sentence naming the file) when it
 * is there but not to be trusted. */
static int meta_read(const char *path, SplitScan *s, uint32_t *key, char *why, size_t why_len) {
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return 1;
    size_t n = 0;
    char *text = read_file_bytes(path, &n, why, why_len);
    if (!text) return -1;
    char found[9], have[9];
    const int seal = json_seal_check(text, n, RECORD_CRC_FIELD, found, have);
    cJSON *root = seal == 0 ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    FieldErr fe = {{0}};
    bool strict_ok = false;
    int rc = -1;
    char sub[256];
    if (seal == 1)
        snprintf(why, why_len, "%s does not begin with its " RECORD_CRC_FIELD " line (written by an older version, "
                 "or edited)", path);
    else if (seal == 2)
        snprintf(why, why_len, "%s is damaged: " RECORD_CRC_FIELD " is %s but its content has %s", path, found, have);
    else if (!root)
        snprintf(why, why_len, "%s is not valid JSON", path);
    else if (json_refuse_duplicate_keys(root, path, why, why_len) != 0)
        ;
    else if (!meta_fields(&fe, root, s, key, &strict_ok))
        snprintf(why, why_len, "%s: field '%s' is missing or malformed", path, fe.bad);
    else if (record_check(s, strict_ok, sub, sizeof sub) != 0)
        snprintf(why, why_len, "%s: %s", path, sub);
    else
        rc = 0;
    cJSON_Delete(root);
    return rc;
}

/* The record's key and kept pairs against its token file's header: 0 when
 * they agree or the header holds another key (the file is then rebuilt,
 * and the text read for it), -1 + why when the same key holds another
 * count. A missing or unreadable token file is rebuilt: 0. */
static int meta_against_tokens(const char *cache_dir, const SplitScan *s, uint32_t key, char *why, size_t why_len) {
    char tok[PATH_MAX + 64], ignored[PATH_MAX + 128];
    snprintf(tok, sizeof tok, "%s/%s.tok", cache_dir, s->part->stem);
    uint32_t tok_key, tok_pairs;
    if (token_file_header(tok, &tok_key, &tok_pairs, ignored, sizeof ignored) != 0 || tok_key != key ||
        (long)tok_pairs == s->stats.kept)
        return 0;
    snprintf(why, why_len, "%s/%s.source.json records %ld pairs kept but %s holds %u under the same key", cache_dir,
             s->part->stem, s->stats.kept, tok, tok_pairs);
    return -1;
}

int split_meta_reuse(const char *cache_dir, SplitScan *s, bool strict, char *why, size_t why_len) {
    why[0] = '\0';
    char path[PATH_MAX + 64];
    meta_path(path, sizeof path, cache_dir, s->part->stem);
    if (split_start(s, s->part, why, why_len) != 0) {
        why[0] = '\0';  // the scan will say why
        return 0;
    }
    SplitScan rec = *s;
    FileStamp now_en, now_ja;
    uint32_t key;
    if (meta_read(path, &rec, &key, why, why_len) != 0) return 0;
    /* sources elsewhere, changed, or recorded too soon after a change: read again, as usual */
    if (strcmp(rec.en.path, s->en.path) != 0 || strcmp(rec.ja.path, s->ja.path) != 0 || !rec.en.stamp.trusted ||
        !rec.ja.stamp.trusted || file_stamp(s->en.path, &now_en) != 0 || file_stamp(s->ja.path, &now_ja) != 0 ||
        !file_stamp_same(&now_en, &rec.en.stamp) || !file_stamp_same(&now_ja, &rec.ja.stamp))
        return 0;
    if (meta_against_tokens(cache_dir, &rec, key, why, why_len) != 0) return 0;
    if (strict && !passes_strict(&rec.stats)) {
        snprintf(why, why_len, "%s records %ld pairs skipped (empty or invalid UTF-8) and --strict refuses them",
                 path, rec.stats.empty + rec.stats.bad_utf8);
        return 0;
    }
    *s = rec;
    s->scanned = false;
    return 1;
}

int corpus_split_info(const char *cache_dir, const char *stem, CorpusSplitInfo *out, char *err, size_t err_len) {
    char path[PATH_MAX + 64], why[PATH_MAX + 512];
    meta_path(path, sizeof path, cache_dir, stem);
    SplitScan s;
    memset(&s, 0, sizeof s);
    const CorpusPart part = {.stem = stem, .split = stem};
    s.part = &part;
    uint32_t key = 0;
    const int got = meta_read(path, &s, &key, why, sizeof why);
    if (got == 0 && meta_against_tokens(cache_dir, &s, key, why, sizeof why) == 0) {
        *out = (CorpusSplitInfo){.stats = s.stats, .form_en = s.en.form, .form_ja = s.ja.form, .key = key};
        return 0;
    }
    if (got == 1) snprintf(why, sizeof why, "%s is missing", path);
    tp_error_set(err, err_len, "%s: the corpus cache must be prepared again", why);
    return -1;
}
