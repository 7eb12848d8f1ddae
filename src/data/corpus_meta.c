/* corpus_meta.c: <stem>.source.json, what a scan of a split learned, kept
 * beside its token file (see corpus_internal.h): the key, the counts, each
 * side's text form counts and each source file's identity, and the token
 * file's identity when it was last checked whole (token_file_checked). 64-bit values
 * are written as decimal strings (JSON numbers lose them past 2^53). A file
 * that cannot be read or does not match is no error here: the split is
 * read again. */
#include "data/corpus_internal.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "fileio.h"

static void add_u64(cJSON *o, const char *name, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON_AddStringToObject(o, name, buf);
}

static bool get_u64(const cJSON *o, const char *name, uint64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(x) || !x->valuestring[0]) return false;
    char *end;
    *v = strtoull(x->valuestring, &end, 10);
    return *end == '\0';
}

static bool get_long(const cJSON *o, const char *name, long *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15) return false;
    *v = (long)x->valuedouble;
    return (double)*v == x->valuedouble;
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

static void add_stamp(cJSON *o, const FileStamp *st) {
    add_u64(o, "bytes", st->size);
    add_u64(o, "device", st->dev);
    add_u64(o, "inode", st->ino);
    add_u64(o, "mtime_ns", (uint64_t)st->mtime_ns);
    add_u64(o, "ctime_ns", (uint64_t)st->ctime_ns);
    cJSON_AddBoolToObject(o, "trusted", st->trusted);
}

static bool get_stamp(const cJSON *o, FileStamp *st) {
    const cJSON *trusted = cJSON_GetObjectItemCaseSensitive(o, "trusted");
    uint64_t mt, ct;
    if (!cJSON_IsBool(trusted) || !get_u64(o, "bytes", &st->size) || !get_u64(o, "device", &st->dev) ||
        !get_u64(o, "inode", &st->ino) || !get_u64(o, "mtime_ns", &mt) || !get_u64(o, "ctime_ns", &ct))
        return false;
    st->mtime_ns = (int64_t)mt;
    st->ctime_ns = (int64_t)ct;
    st->trusted = cJSON_IsTrue(trusted);
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
    cJSON *stats = cJSON_AddObjectToObject(root, "stats");
    CorpusStats st = s->stats;
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(stats, STAT_NAMES[i], (double)*stat_field(&st, i));
    cJSON *sources = cJSON_AddObjectToObject(root, "sources");
    cJSON_AddItemToObject(sources, "en", side_json(&s->en));
    cJSON_AddItemToObject(sources, "ja", side_json(&s->ja));
    if (s->tok_known) add_stamp(cJSON_AddObjectToObject(root, "token_file_checked"), &s->tok);
    char *text = cJSON_Print(root);
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

/* One side back from JSON; false when a field is missing or malformed. */
static bool side_read(const cJSON *o, SideScan *side, bool match_path) {
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(o, "path");
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(o, "crc32c");
    const cJSON *form = cJSON_GetObjectItemCaseSensitive(o, "form");
    if (cJSON_IsString(path) && !match_path) snprintf(side->path, sizeof side->path, "%s", path->valuestring);
    if (!cJSON_IsString(path) || strcmp(path->valuestring, side->path) != 0 || !cJSON_IsString(crc) ||
        strlen(crc->valuestring) != 8 || !cJSON_IsObject(form) || !get_stamp(o, &side->stamp))
        return false;
    char *end;
    side->crc = (uint32_t)strtoul(crc->valuestring, &end, 16);
    if (*end) return false;
    for (int i = 0; i < 6; i++)
        if (!get_long(form, FORM_NAMES[i], form_field(&side->form, i))) return false;
    return true;
}

/* Parses the file into s's recorded fields; false when it does not hold
 * them (or, match_paths, when its sources are not s's). */
static bool meta_read(const char *path, SplitScan *s, uint32_t *key, bool match_paths) {
    char why[256];
    char *text = read_text_file(path, why, sizeof why);
    if (!text) return false;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *hex = cJSON_GetObjectItemCaseSensitive(root, "key");
    const cJSON *stats = cJSON_GetObjectItemCaseSensitive(root, "stats");
    const cJSON *sources = cJSON_GetObjectItemCaseSensitive(root, "sources");
    bool ok = cJSON_IsNumber(fmt) && fmt->valuedouble == CORPUS_FORMAT && cJSON_IsString(hex) &&
              strlen(hex->valuestring) == 8 && cJSON_IsObject(stats) && cJSON_IsObject(sources) &&
              side_read(cJSON_GetObjectItemCaseSensitive(sources, "en"), &s->en, match_paths) &&
              side_read(cJSON_GetObjectItemCaseSensitive(sources, "ja"), &s->ja, match_paths);
    for (int i = 0; ok && i < 5; i++) ok = get_long(stats, STAT_NAMES[i], stat_field(&s->stats, i));
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "token_file_checked");
    s->tok_known = ok && tok && get_stamp(tok, &s->tok);  // optional: absent, the token file is checked whole
    if (ok) {
        char *end;
        *key = (uint32_t)strtoul(hex->valuestring, &end, 16);
        ok = *end == '\0';
    }
    cJSON_Delete(root);
    return ok;
}

int split_meta_reuse(const char *cache_dir, SplitScan *s) {
    char path[PATH_MAX + 64];
    meta_path(path, sizeof path, cache_dir, s->part->stem);
    char why[256];
    if (split_start(s, s->part, why, sizeof why) != 0) return 0;  // the scan will say why
    SplitScan rec = *s;
    FileStamp now_en, now_ja;
    uint32_t key;
    if (!meta_read(path, &rec, &key, true) || !rec.en.stamp.trusted || !rec.ja.stamp.trusted ||
        file_stamp(s->en.path, &now_en) != 0 || file_stamp(s->ja.path, &now_ja) != 0 ||
        !file_stamp_same(&now_en, &rec.en.stamp) || !file_stamp_same(&now_ja, &rec.ja.stamp))
        return 0;
    *s = rec;
    s->scanned = false;
    return 1;
}

int corpus_split_info(const char *cache_dir, const char *stem, CorpusSplitInfo *out, char *err, size_t err_len) {
    char path[PATH_MAX + 64];
    meta_path(path, sizeof path, cache_dir, stem);
    SplitScan s;
    memset(&s, 0, sizeof s);
    uint32_t key = 0;
    if (!meta_read(path, &s, &key, false)) {
        tp_error_set(err, err_len, "%s is missing or damaged: the corpus cache must be prepared again", path);
        return -1;
    }
    *out = (CorpusSplitInfo){.stats = s.stats, .form_en = s.en.form, .form_ja = s.ja.form, .key = key};
    return 0;
}
