/* safetensors.c: reader and writer for the safetensors layout.
 *
 * The reader loads the whole file into one buffer so that tensors are plain
 * views into it, and checks every field before handing out a pointer: a bad
 * file is an input error, reported as one sentence and -1, never a crash.
 * JSON integers arrive as doubles (cJSON), so offsets and dims are accepted
 * only when they are exact integers up to 2^53.
 *
 * The writer lays tensors out in insertion order with no gaps, pads the JSON
 * header with spaces to a multiple of 8 bytes (as the Python library does,
 * which keeps the data section 8-byte aligned) and adds "crc32c" metadata.
 * It writes "<path>.tmp", fsyncs, renames (fileio.h's AtomicFile) and fsyncs the
 * directory.
 * Tensor data is stored in host order; only little-endian hosts are built.
 */
#define _POSIX_C_SOURCE 200809L

#include "safetensors.h"
#include "err.h"
#include "fileio.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdbool.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c stores tensor data in host order and needs a little-endian host"
#endif

#define ST_HEADER_ALIGN 8
#define ST_JSON_INT_MAX 9007199254740992.0 /* 2^53: larger JSON numbers lose digits */
#define ST_META_KEY "__metadata__"
#define ST_CRC_KEY "crc32c"

static const struct {
    const char *name;
    size_t n_bytes;
} k_dtypes[] = {
    [ST_F32] = {"F32", 4}, [ST_I32] = {"I32", 4}, [ST_I64] = {"I64", 8},
    [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_U8] = {"U8", 1},
};
#define ST_N_DTYPES ((int)(sizeof k_dtypes / sizeof k_dtypes[0]))

size_t st_dtype_size(StDtype d) {
    return ((int)d >= 0 && (int)d < ST_N_DTYPES) ? k_dtypes[d].n_bytes : 0;
}

const char *st_dtype_name(StDtype d) {
    return ((int)d >= 0 && (int)d < ST_N_DTYPES) ? k_dtypes[d].name : "?";
}

static bool dtype_from_name(const char *s, StDtype *out) {
    for (int i = 0; i < ST_N_DTYPES; i++) {
        if (strcmp(s, k_dtypes[i].name) == 0) {
            *out = (StDtype)i;
            return true;
        }
    }
    return false;
}

static char *dup_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = TP_MALLOC(n);
    memcpy(p, s, n);
    return p;
}

/* "[4, 8]" for messages; truncated to fit. */
static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t used = 0;
    int k = snprintf(buf, n, "[");
    used = k > 0 ? (size_t)k : 0;
    for (int i = 0; i < ndim && used < n; i++) {
        k = snprintf(buf + used, n - used, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (k > 0) used += (size_t)k;
    }
    if (used < n) snprintf(buf + used, n - used, "]");
}

/* Element count times element size, 0 when the product overflows. */
static bool shape_bytes(int ndim, const int64_t *shape, size_t elem_bytes,
                        uint64_t *n_bytes) {
    uint64_t n = elem_bytes;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return false;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return false;
    }
    if (n > SIZE_MAX) return false;
    *n_bytes = n;
    return true;
}

/* ---- reader ----------------------------------------------------------------- */

typedef struct {
    StTensor t;
    uint64_t begin, end; /* data_offsets, relative to the data section */
} PendingTensor;

/* A JSON number that is an exact integer in [0, 2^53]. */
static bool json_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(d >= 0.0) || d > ST_JSON_INT_MAX) return false;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return false;
    *out = u;
    return true;
}

static int parse_tensor(const char *path, const cJSON *item, size_t data_bytes,
                        PendingTensor *out, char *err, size_t err_len) {
    const char *name = item->string;
    if (!cJSON_IsObject(item)) {
        tp_error_set(err, err_len, "%s: tensor '%s' is not a JSON object", path, name);
        return -1;
    }
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(jd)) {
        tp_error_set(err, err_len, "%s: tensor '%s' has no \"dtype\" string", path, name);
        return -1;
    }
    StDtype dtype;
    if (!dtype_from_name(jd->valuestring, &dtype)) {
        tp_error_set(err, err_len, "%s: tensor '%s' has dtype '%s' which is not supported",
                     path, name, jd->valuestring);
        return -1;
    }

    const cJSON *js = cJSON_GetObjectItemCaseSensitive(item, "shape");
    if (!cJSON_IsArray(js)) {
        tp_error_set(err, err_len, "%s: tensor '%s' has no \"shape\" array", path, name);
        return -1;
    }
    int ndim = cJSON_GetArraySize(js);
    if (ndim > ST_MAX_DIMS) {
        tp_error_set(err, err_len, "%s: tensor '%s' has %d dims, more than the %d supported",
                     path, name, ndim, ST_MAX_DIMS);
        return -1;
    }
    int64_t shape[ST_MAX_DIMS] = {0};
    int i = 0;
    const cJSON *jdim;
    cJSON_ArrayForEach(jdim, js) {
        uint64_t v;
        if (!json_uint(jdim, &v)) {
            tp_error_set(err, err_len,
                         "%s: tensor '%s' shape dim %d is not a non-negative integer",
                         path, name, i);
            return -1;
        }
        shape[i++] = (int64_t)v;
    }
    char shape_text[96];
    format_shape(shape_text, sizeof shape_text, ndim, shape);
    uint64_t n_bytes;
    if (!shape_bytes(ndim, shape, k_dtypes[dtype].n_bytes, &n_bytes)) {
        tp_error_set(err, err_len, "%s: tensor '%s' shape %s of %s overflows the byte count",
                     path, name, shape_text, k_dtypes[dtype].name);
        return -1;
    }

    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    uint64_t begin, end;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 ||
        !json_uint(cJSON_GetArrayItem(jo, 0), &begin) ||
        !json_uint(cJSON_GetArrayItem(jo, 1), &end)) {
        tp_error_set(err, err_len,
                     "%s: tensor '%s' has no \"data_offsets\" pair of non-negative integers",
                     path, name);
        return -1;
    }
    if (begin > end) {
        tp_error_set(err, err_len,
                     "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") end before they begin",
                     path, name, begin, end);
        return -1;
    }
    if (end - begin != n_bytes) {
        tp_error_set(err, err_len,
                     "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                     ") do not match shape %s of %s (%" PRIu64 " bytes)",
                     path, name, begin, end, shape_text, k_dtypes[dtype].name, n_bytes);
        return -1;
    }
    if (end > data_bytes) {
        tp_error_set(err, err_len,
                     "%s: tensor '%s' data [%" PRIu64 ", %" PRIu64
                     ") lies outside the data section of %zu bytes (file truncated?)",
                     path, name, begin, end, data_bytes);
        return -1;
    }

    out->t.name = dup_string(name);
    out->t.dtype = dtype;
    out->t.ndim = ndim;
    memcpy(out->t.shape, shape, sizeof shape);
    out->t.n_bytes = (size_t)n_bytes;
    out->t.data = NULL; /* set once the data section is known to be sound */
    out->begin = begin;
    out->end = end;
    return 0;
}

static int parse_metadata(const char *path, const cJSON *item, StFile *f,
                          char *err, size_t err_len) {
    if (!cJSON_IsObject(item)) {
        tp_error_set(err, err_len, "%s: " ST_META_KEY " is not a JSON object", path);
        return -1;
    }
    int n = cJSON_GetArraySize(item);
    f->meta_keys = TP_CALLOC((size_t)n, sizeof(char *));
    f->meta_values = TP_CALLOC((size_t)n, sizeof(char *));
    const cJSON *kv;
    cJSON_ArrayForEach(kv, item) {
        if (!cJSON_IsString(kv)) {
            tp_error_set(err, err_len, "%s: " ST_META_KEY " value for '%s' is not a string",
                         path, kv->string);
            return -1;
        }
        for (int i = 0; i < f->n_meta; i++) {
            if (strcmp(f->meta_keys[i], kv->string) == 0) {
                tp_error_set(err, err_len, "%s: " ST_META_KEY " key '%s' appears twice",
                             path, kv->string);
                return -1;
            }
        }
        f->meta_keys[f->n_meta] = dup_string(kv->string);
        f->meta_values[f->n_meta] = dup_string(kv->valuestring);
        f->n_meta++;
    }
    return 0;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_pending(const void *a, const void *b) {
    const PendingTensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

static bool parse_hex32(const char *s, uint32_t *out) {
    uint32_t v = 0;
    int i = 0;
    for (; s[i] && i < 9; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        v = (v << 4) | (uint32_t)d;
    }
    if (i != 8 || s[8] != '\0') return false;
    *out = v;
    return true;
}

/* The length field and the JSON header of f->buffer: sets f's data section
 * and returns the header object (caller frees), or NULL + err. */
static cJSON *parse_header(const char *path, StFile *f, char *err, size_t err_len) {
    const uint8_t *b = f->buffer;
    size_t size = f->file_bytes;
    if (size < 8) {
        tp_error_set(err, err_len,
                     "%s: file is %zu bytes, shorter than the 8-byte header length field",
                     path, size);
        return NULL;
    }
    uint64_t header_bytes = 0;
    for (int i = 0; i < 8; i++) header_bytes |= (uint64_t)b[i] << (8 * i);
    if (header_bytes > (uint64_t)(size - 8)) {
        tp_error_set(err, err_len,
                     "%s: header length %" PRIu64
                     " plus the 8-byte length field exceeds file size %zu (file truncated?)",
                     path, header_bytes, size);
        return NULL;
    }
    const char *hdr = (const char *)b + 8;
    size_t hlen = (size_t)header_bytes;
    f->data_section = b + 8 + hlen;
    f->data_bytes = size - 8 - hlen;

    const char *parse_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &parse_end, 0);
    if (!root) {
        size_t at = (parse_end >= hdr && parse_end <= hdr + hlen) ? (size_t)(parse_end - hdr) : 0;
        tp_error_set(err, err_len,
                     "%s: header is not valid JSON (parse error near byte %zu of %zu)",
                     path, at, hlen);
        return NULL;
    }
    for (const char *p = parse_end; p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            tp_error_set(err, err_len,
                         "%s: header is not valid JSON (stray bytes after the object at byte %zu)",
                         path, (size_t)(p - hdr));
            cJSON_Delete(root);
            return NULL;
        }
    }
    if (!cJSON_IsObject(root)) {
        tp_error_set(err, err_len, "%s: header is not a JSON object", path);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* Every tensor name appears once. */
static int check_names_unique(const char *path, const PendingTensor *pend, int n_pend, char *err,
                              size_t err_len) {
    char **names = TP_CALLOC((size_t)n_pend, sizeof *names);
    for (int i = 0; i < n_pend; i++) names[i] = pend[i].t.name;
    qsort(names, (size_t)n_pend, sizeof *names, cmp_name_ptr);
    int rc = 0;
    for (int i = 1; i < n_pend && rc == 0; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            tp_error_set(err, err_len, "%s: tensor name '%s' appears twice in the header",
                         path, names[i]);
            rc = -1;
        }
    }
    free(names);
    return rc;
}

/* Ranges: no overlap, and together exactly the data section (sorts pend by range). */
static int check_ranges(const char *path, PendingTensor *pend, int n_pend, size_t data_bytes, char *err,
                        size_t err_len) {
    qsort(pend, (size_t)n_pend, sizeof *pend, cmp_pending);
    uint64_t covered = 0, max_end = 0;
    int max_i = -1;
    for (int i = 0; i < n_pend; i++) {
        if (max_i >= 0 && pend[i].begin < max_end) {
            const PendingTensor *a = &pend[max_i], *c = &pend[i];
            tp_error_set(err, err_len,
                         "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                         ", %" PRIu64 ") overlap",
                         path, a->t.name, a->begin, a->end, c->t.name, c->begin, c->end);
            return -1;
        }
        covered += pend[i].end - pend[i].begin;
        if (max_i < 0 || pend[i].end >= max_end) {
            max_end = pend[i].end;
            max_i = i;
        }
    }
    if (covered != data_bytes) {
        tp_error_set(err, err_len,
                     "%s: data section has %zu bytes but tensors cover %" PRIu64
                     " (holes and trailing bytes are not allowed)",
                     path, data_bytes, covered);
        return -1;
    }
    return 0;
}

/* The data section's CRC-32C against the header's, where it has one. */
static int check_crc(const char *path, const StFile *f, char *err, size_t err_len) {
    const char *crc_text = st_meta(f, ST_CRC_KEY);
    if (!crc_text) return 0;
    uint32_t want;
    if (!parse_hex32(crc_text, &want)) {
        tp_error_set(err, err_len,
                     "%s: " ST_META_KEY " value for '" ST_CRC_KEY "' is '%s', not 8 hex digits",
                     path, crc_text);
        return -1;
    }
    uint32_t got = crc32c(0, f->data_section, f->data_bytes);
    if (got != want) {
        tp_error_set(err, err_len,
                     "%s: checksum mismatch: data section crc32c is %08" PRIx32
                     ", header says %s (file corrupted)",
                     path, got, crc_text);
        return -1;
    }
    return 0;
}

/* Validates f->buffer (f->file_bytes long) and fills the rest of f. */
static int parse_file(const char *path, StFile *f, char *err, size_t err_len) {
    cJSON *root = parse_header(path, f, err, err_len);
    if (!root) return -1;
    int rc = -1;
    int n_pend = 0;
    PendingTensor *pend = TP_CALLOC((size_t)cJSON_GetArraySize(root), sizeof *pend);
    bool seen_meta = false;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, ST_META_KEY) == 0) {
            if (seen_meta) {
                tp_error_set(err, err_len, "%s: header has two " ST_META_KEY " entries", path);
                goto done;
            }
            seen_meta = true;
            if (parse_metadata(path, item, f, err, err_len) != 0) goto done;
            continue;
        }
        if (parse_tensor(path, item, f->data_bytes, &pend[n_pend], err, err_len) != 0)
            goto done;
        n_pend++;
    }
    if (check_names_unique(path, pend, n_pend, err, err_len) ||
        check_ranges(path, pend, n_pend, f->data_bytes, err, err_len) || check_crc(path, f, err, err_len))
        goto done;

    f->tensors = TP_CALLOC((size_t)n_pend, sizeof *f->tensors);
    for (int i = 0; i < n_pend; i++) {
        f->tensors[i] = pend[i].t;
        f->tensors[i].data = f->data_section + pend[i].begin;
        pend[i].t.name = NULL; /* now owned by f */
    }
    f->n_tensors = n_pend;
    rc = 0;

done:
    for (int i = 0; i < n_pend; i++) free(pend[i].t.name);
    free(pend);
    cJSON_Delete(root);
    return rc;
}

/* Tensor data must be readable through a pointer of its element type. A
 * file whose header length is not a multiple of 8 (the writer pads it; other
 * writers need not) or whose tensors start at odd offsets puts the data at a
 * misaligned address: then every tensor is copied into one buffer of its
 * own, each at an 8-byte aligned offset. The data section itself (what the
 * checksums cover) stays as it was read. */
static void align_tensors(StFile *f) {
    bool aligned = true;
    for (int i = 0; i < f->n_tensors && aligned; i++) {
        const size_t elem = k_dtypes[f->tensors[i].dtype].n_bytes;
        aligned = (uintptr_t)f->tensors[i].data % elem == 0;
    }
    if (aligned) return;
    size_t total = 0;
    for (int i = 0; i < f->n_tensors; i++) total += (f->tensors[i].n_bytes + 7) & ~(size_t)7;
    uint8_t *copy = TP_MALLOC(total); /* malloc's alignment is at least 8 */
    size_t at = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        StTensor *t = &f->tensors[i];
        if (t->n_bytes) memcpy(copy + at, t->data, t->n_bytes);
        t->data = copy + at;
        at += (t->n_bytes + 7) & ~(size_t)7;
    }
    f->aligned_copy = copy;
}

int st_read(const char *path, StFile *f, char *err, size_t err_len) {
    memset(f, 0, sizeof *f);
    size_t size = 0;
    uint8_t *buf = read_file_bytes(path, &size, err, err_len);
    if (!buf) return -1;
    f->buffer = buf;
    f->file_bytes = size;
    if (parse_file(path, f, err, err_len) != 0) {
        st_free(f);
        return -1;
    }
    align_tensors(f);
    return 0;
}

void st_free(StFile *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->buffer);
    free(f->aligned_copy);
    memset(f, 0, sizeof *f);
}

const StTensor *st_find(const StFile *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* ---- writer ----------------------------------------------------------------- */

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* borrowed */
    size_t n_bytes;
} WriterTensor;

struct StWriter {
    WriterTensor *tensors;
    int n_tensors, cap_tensors;
    char **meta_keys, **meta_values;
    int n_meta, cap_meta;
    char err[512]; /* first bad add/meta call, reported by st_writer_write */
};

StWriter *st_writer_new(void) { return TP_CALLOC(1, sizeof(StWriter)); }

void st_writer_free(StWriter *w) {
    if (!w) return;
    for (int i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

#define WRITER_FAIL(w, ...)                                              \
    do {                                                                 \
        if (!(w)->err[0]) tp_error_set((w)->err, sizeof (w)->err, __VA_ARGS__); \
        return;                                                          \
    } while (0)

void st_writer_add(StWriter *w, const char *name, StDtype dtype, int ndim,
                   const int64_t *shape, const void *data) {
    if (!w) return;
    if (!name) WRITER_FAIL(w, "a tensor was added without a name");
    if (strcmp(name, ST_META_KEY) == 0)
        WRITER_FAIL(w, "tensor name '%s' is reserved for metadata", name);
    if ((int)dtype < 0 || (int)dtype >= ST_N_DTYPES)
        WRITER_FAIL(w, "tensor '%s' has unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        WRITER_FAIL(w, "tensor '%s' has %d dims, outside 0..%d", name, ndim, ST_MAX_DIMS);
    if (ndim > 0 && !shape) WRITER_FAIL(w, "tensor '%s' has %d dims but no shape", name, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            WRITER_FAIL(w, "tensor '%s' shape dim %d is negative (%" PRId64 ")", name, i, shape[i]);
    uint64_t n_bytes;
    if (!shape_bytes(ndim, shape, k_dtypes[dtype].n_bytes, &n_bytes))
        WRITER_FAIL(w, "tensor '%s' shape overflows the byte count", name);
    if (n_bytes > 0 && !data) WRITER_FAIL(w, "tensor '%s' has %" PRIu64 " bytes but no data", name, n_bytes);
    for (int i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            WRITER_FAIL(w, "tensor '%s' was added twice", name);

    if (w->n_tensors == w->cap_tensors) {
        int cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        WriterTensor *t = realloc(w->tensors, (size_t)cap * sizeof *t);
        TP_CHECK(t, "out of memory growing the tensor list to %d entries", cap);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    WriterTensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = dup_string(name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->n_bytes = (size_t)n_bytes;
}

/* A later value for the same key replaces the earlier one; a caller's
 * "crc32c" is replaced by the checksum the writer computes. */
void st_writer_meta(StWriter *w, const char *key, const char *value) {
    if (!w) return;
    if (!key || !value) WRITER_FAIL(w, "a metadata entry was added without a key or value");
    if (strcmp(key, ST_CRC_KEY) == 0) return;
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta_keys[i], key) == 0) {
            free(w->meta_values[i]);
            w->meta_values[i] = dup_string(value);
            return;
        }
    }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **k = realloc(w->meta_keys, (size_t)cap * sizeof *k);
        TP_CHECK(k, "out of memory growing the metadata list to %d entries", cap);
        w->meta_keys = k;
        char **v = realloc(w->meta_values, (size_t)cap * sizeof *v);
        TP_CHECK(v, "out of memory growing the metadata list to %d entries", cap);
        w->meta_values = v;
        w->cap_meta = cap;
    }
    w->meta_keys[w->n_meta] = dup_string(key);
    w->meta_values[w->n_meta] = dup_string(value);
    w->n_meta++;
}

#undef WRITER_FAIL

/* Header JSON padded with spaces to a multiple of ST_HEADER_ALIGN; NULL on OOM. */
static char *build_header(const StWriter *w, uint32_t crc, size_t *out_bytes) {
    bool ok = true;
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_CreateObject();
    ok &= cJSON_AddItemToObject(root, ST_META_KEY, meta) != 0;
    for (int i = 0; i < w->n_meta; i++)
        ok &= cJSON_AddStringToObject(meta, w->meta_keys[i], w->meta_values[i]) != NULL;
    char crc_text[9];
    snprintf(crc_text, sizeof crc_text, "%08" PRIx32, crc);
    ok &= cJSON_AddStringToObject(meta, ST_CRC_KEY, crc_text) != NULL;

    uint64_t offset = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        const WriterTensor *t = &w->tensors[i];
        cJSON *jt = cJSON_CreateObject();
        ok &= cJSON_AddItemToObject(root, t->name, jt) != 0;
        ok &= cJSON_AddStringToObject(jt, "dtype", k_dtypes[t->dtype].name) != NULL;
        cJSON *js = cJSON_AddArrayToObject(jt, "shape");
        ok &= js != NULL;
        for (int d = 0; d < t->ndim; d++)
            ok &= cJSON_AddItemToArray(js, cJSON_CreateNumber((double)t->shape[d])) != 0;
        cJSON *jo = cJSON_AddArrayToObject(jt, "data_offsets");
        ok &= jo != NULL;
        ok &= cJSON_AddItemToArray(jo, cJSON_CreateNumber((double)offset)) != 0;
        offset += t->n_bytes;
        ok &= cJSON_AddItemToArray(jo, cJSON_CreateNumber((double)offset)) != 0;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return NULL;

    size_t n = strlen(json);
    size_t padded = (n + ST_HEADER_ALIGN - 1) / ST_HEADER_ALIGN * ST_HEADER_ALIGN;
    char *out = TP_MALLOC(padded);
    memcpy(out, json, n);
    memset(out + n, ' ', padded - n);
    cJSON_free(json);
    *out_bytes = padded;
    return out;
}

int st_writer_write(StWriter *w, const char *path, char *err, size_t err_len) {
    if (!w || !path) {
        tp_error_set(err, err_len, "st_writer_write called without a writer or path");
        return -1;
    }
    if (w->err[0]) {
        tp_error_set(err, err_len, "%s: not written: %s", path, w->err);
        return -1;
    }
    uint32_t crc = 0;
    uint64_t total = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        crc = crc32c(crc, w->tensors[i].data, w->tensors[i].n_bytes);
        total += w->tensors[i].n_bytes;
    }
    if ((double)total > ST_JSON_INT_MAX) {
        tp_error_set(err, err_len, "%s: not written: %" PRIu64 " bytes of tensors exceed 2^53",
                     path, total);
        return -1;
    }
    size_t header_bytes = 0;
    char *header = build_header(w, crc, &header_bytes);
    if (!header) {
        tp_error_set(err, err_len, "%s: not written: out of memory building the header", path);
        return -1;
    }

    AtomicFile af;
    uint8_t len_field[8];
    for (int i = 0; i < 8; i++) len_field[i] = (uint8_t)((uint64_t)header_bytes >> (8 * i));
    int rc = atomic_file_open(&af, path, false, err, err_len);
    if (rc == 0) rc = atomic_file_write(&af, len_field, sizeof len_field, err, err_len);
    if (rc == 0) rc = atomic_file_write(&af, header, header_bytes, err, err_len);
    for (int i = 0; rc == 0 && i < w->n_tensors; i++)
        rc = atomic_file_write(&af, w->tensors[i].data, w->tensors[i].n_bytes, err, err_len);
    if (rc == 0) rc = atomic_file_commit(&af, err, err_len);
    if (rc == 0 && fsync_parent_dir(path) != 0) {
        tp_error_set(err, err_len, "%s: written, but fsync of its directory failed (%s)", path, strerror(errno));
        rc = -1;
    }
    free(header);
    return rc;
}
