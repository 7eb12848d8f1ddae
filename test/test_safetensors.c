/* test_safetensors.c: CRC-32C vectors, safetensors round trip, and refusal of
 * damaged or malformed files with a message naming the file and the problem.
 * Malformed files are either cut from a good one or hand-written (header JSON
 * plus raw data), all inside a fresh mkdtemp directory removed at the end. */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "safetensors.h"
#include "testfs.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void path_in_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", g_dir, name);
}

static uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A file from header JSON (optionally space-padded to 8) and raw data. */
static bool write_raw(const char *path, const char *json, bool pad, const void *data,
                      size_t data_bytes) {
    size_t hlen = strlen(json);
    size_t padded = pad ? (hlen + 7) / 8 * 8 : hlen;
    size_t total = 8 + padded + data_bytes;
    uint8_t *buf = malloc(total);
    put_le64(buf, padded);
    memcpy(buf + 8, json, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    if (data_bytes) memcpy(buf + 8 + padded, data, data_bytes);
    bool ok = write_bytes(path, buf, total);
    free(buf);
    return ok;
}

/* st_read must refuse path with a message holding the path and phrase. */
static void expect_refused(const char *path, const char *phrase, const char *what) {
    StFile f;
    char err[512] = "";
    int rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == -1, "%s: st_read accepted the file", what);
    CHECK(strstr(err, phrase) != NULL, "%s: message lacks '%s': %s", what, phrase, err);
    CHECK(strstr(err, path) != NULL, "%s: message does not name the file: %s", what, err);
    CHECK(f.buffer == NULL && f.tensors == NULL && f.n_tensors == 0 && f.n_meta == 0,
          "%s: StFile not cleared after failure", what);
    st_free(&f); /* safe on a cleared StFile */
}

static void expect_raw_refused(const char *name, const char *json, size_t data_bytes,
                               const char *phrase) {
    char path[256];
    path_in_dir(path, sizeof path, name);
    uint8_t *data = calloc(data_bytes ? data_bytes : 1, 1);
    CHECK(write_raw(path, json, true, data, data_bytes), "%s: cannot write", name);
    free(data);
    expect_refused(path, phrase, name);
}

/* ---- CRC-32C ---------------------------------------------------------------- */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc32c(void) {
    const char *digits = "123456789";
    CHECK(crc32c(0, digits, 9) == 0xE3069283u, "check value: got %08x", crc32c(0, digits, 9));
    CHECK(crc32c(0, "", 0) == 0u, "empty input must give 0");

    /* RFC 3720 (iSCSI) appendix B.4 vectors */
    uint8_t v[32];
    memset(v, 0, sizeof v);
    CHECK(crc32c(0, v, 32) == 0x8A9136AAu, "32 zero bytes: got %08x", crc32c(0, v, 32));
    memset(v, 0xFF, sizeof v);
    CHECK(crc32c(0, v, 32) == 0x62A8AB43u, "32 0xFF bytes: got %08x", crc32c(0, v, 32));
    for (int i = 0; i < 32; i++) v[i] = (uint8_t)i;
    CHECK(crc32c(0, v, 32) == 0x46DD794Eu, "0..31: got %08x", crc32c(0, v, 32));

    /* every split of the check string composes */
    int bad_splits = 0;
    for (size_t k = 0; k <= 9; k++)
        if (crc32c(crc32c(0, digits, k), digits + k, 9 - k) != 0xE3069283u) bad_splits++;
    CHECK(bad_splits == 0, "%d splits of '123456789' do not compose", bad_splits);

    /* long buffer at odd alignments, in uneven chunks, against a bitwise reference */
    enum { N = 4099 };
    uint8_t *buf = malloc(N + 8);
    uint32_t s = 12345u;
    for (int i = 0; i < N + 8; i++) {
        s = s * 1664525u + 1013904223u;
        buf[i] = (uint8_t)(s >> 24);
    }
    int bad = 0;
    for (int off = 0; off < 8; off++) {
        const uint8_t *p = buf + off;
        uint32_t want = crc32c_bitwise(p, N);
        if (crc32c(0, p, N) != want) bad++;
        if (crc32c_portable(0, p, N) != want) bad++;
        uint32_t c = 0;
        size_t done = 0, step = 1;
        while (done < N) {
            size_t take = step < N - done ? step : N - done;
            c = crc32c(c, p + done, take);
            done += take;
            step = step * 3 + 1;
        }
        if (c != want) bad++;
    }
    CHECK(bad == 0, "%d long-buffer crc mismatches vs bitwise reference (processor instruction used: %s)", bad,
          crc32c_hardware() ? "yes" : "no");
    free(buf);
}

/* ---- round trip ------------------------------------------------------------- */

static void test_round_trip(void) {
    char path[256], tmp_path[300], err[512] = "";
    path_in_dir(path, sizeof path, "model.safetensors");
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);

    float w[3][4];
    for (int i = 0; i < 12; i++) w[i / 4][i % 4] = 0.25f * (float)i - 1.0f;
    int32_t ids[5] = {7, -1, 0, 2147483647, -2147483647 - 1};
    float scalar = 3.5f;
    int64_t counts[2] = {INT64_C(1) << 40, -5};
    uint16_t half[2][2] = {{0x3F80, 0xBF80}, {0x0000, 0x7F80}};
    uint8_t bytes[3] = {1, 2, 255};

    const int64_t shape_w[2] = {3, 4}, shape_ids[1] = {5}, shape_empty[2] = {0, 3};
    const int64_t shape_counts[1] = {2}, shape_half[2] = {2, 2}, shape_bytes[1] = {3};

    StWriter *wr = st_writer_new();
    st_writer_add(wr, "embed.weight", ST_F32, 2, shape_w, w);
    st_writer_add(wr, "ids", ST_I32, 1, shape_ids, ids);
    st_writer_add(wr, "scale", ST_F32, 0, NULL, &scalar);
    st_writer_add(wr, "empty", ST_F32, 2, shape_empty, NULL);
    st_writer_add(wr, "counts", ST_I64, 1, shape_counts, counts);
    st_writer_add(wr, "half", ST_BF16, 2, shape_half, half);
    st_writer_add(wr, "bytes", ST_U8, 1, shape_bytes, bytes);
    st_writer_meta(wr, "step", "42");
    st_writer_meta(wr, "note", "quote \" backslash \\ tab \t done");
    st_writer_meta(wr, "step", "43"); /* replaces */
    int rc = st_writer_write(wr, path, err, sizeof err);
    CHECK(rc == 0, "st_writer_write failed: %s", err);
    /* writing again over the existing file works too */
    rc = st_writer_write(wr, path, err, sizeof err);
    CHECK(rc == 0, "second st_writer_write failed: %s", err);
    st_writer_free(wr);

    struct stat sb;
    CHECK(stat(tmp_path, &sb) != 0 && errno == ENOENT, "%s left behind", tmp_path);

    /* raw layout: header length multiple of 8, padded with spaces */
    size_t n = 0;
    uint8_t *raw = read_bytes(path, &n);
    CHECK(raw != NULL, "cannot read back %s", path);
    if (!raw) return;
    uint64_t hlen = get_le64(raw);
    CHECK(hlen % 8 == 0, "header length %llu is not a multiple of 8", (unsigned long long)hlen);
    CHECK(8 + hlen <= n, "header length %llu beyond file of %zu bytes",
          (unsigned long long)hlen, n);
    CHECK(raw[8] == '{', "header does not start with '{'");
    size_t last = 8 + (size_t)hlen - 1;
    while (last > 8 && raw[last] == ' ') last--;
    CHECK(raw[last] == '}', "header is not JSON followed by spaces");
    size_t data_bytes = sizeof w + sizeof ids + sizeof scalar + sizeof counts + sizeof half +
                        sizeof bytes;
    CHECK(n == 8 + hlen + data_bytes, "file is %zu bytes, expected %zu", n,
          (size_t)(8 + hlen + data_bytes));
    free(raw);

    StFile f;
    rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "st_read failed: %s", err);
    if (rc != 0) return;
    CHECK(f.n_tensors == 7, "n_tensors %d", f.n_tensors);
    CHECK(f.data_bytes == data_bytes, "data_bytes %zu", f.data_bytes);
    CHECK(((uintptr_t)f.data_section - (uintptr_t)f.buffer) % 8 == 0,
          "data section not 8-byte aligned in the file");

    const char *order[7] = {"embed.weight", "ids", "scale", "empty", "counts", "half", "bytes"};
    if (f.n_tensors == 7) {
        /* file order = insertion order; "empty" and "scale" tie-break aside, offsets ascend */
        int pos[7];
        for (int i = 0; i < 7; i++) {
            pos[i] = -1;
            for (int j = 0; j < 7; j++)
                if (strcmp(f.tensors[j].name, order[i]) == 0) pos[i] = j;
        }
        for (int i = 0; i < 7; i++) CHECK(pos[i] >= 0, "tensor %s missing", order[i]);
        for (int j = 1; j < 7; j++)
            CHECK((const uint8_t *)f.tensors[j].data >= (const uint8_t *)f.tensors[j - 1].data,
                  "tensors not in data order at %d", j);
    }

    const StTensor *t = st_find(&f, "embed.weight");
    CHECK(t && t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 4 &&
              t->n_bytes == sizeof w && memcmp(t->data, w, sizeof w) == 0,
          "embed.weight differs");
    CHECK(t && (const uint8_t *)t->data == f.data_section, "embed.weight is not first");
    t = st_find(&f, "ids");
    CHECK(t && t->dtype == ST_I32 && t->ndim == 1 && t->shape[0] == 5 &&
              t->n_bytes == sizeof ids && memcmp(t->data, ids, sizeof ids) == 0,
          "ids differs");
    t = st_find(&f, "scale");
    CHECK(t && t->dtype == ST_F32 && t->ndim == 0 && t->n_bytes == 4 &&
              memcmp(t->data, &scalar, 4) == 0,
          "scalar differs");
    t = st_find(&f, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3 && t->n_bytes == 0,
          "empty tensor differs");
    t = st_find(&f, "counts");
    CHECK(t && t->dtype == ST_I64 && t->n_bytes == sizeof counts &&
              memcmp(t->data, counts, sizeof counts) == 0,
          "counts differs");
    t = st_find(&f, "half");
    CHECK(t && t->dtype == ST_BF16 && t->n_bytes == sizeof half &&
              memcmp(t->data, half, sizeof half) == 0,
          "half differs");
    t = st_find(&f, "bytes");
    CHECK(t && t->dtype == ST_U8 && t->n_bytes == 3 && memcmp(t->data, bytes, 3) == 0 &&
              (const uint8_t *)t->data + 3 == f.data_section + f.data_bytes,
          "bytes differs or is not last");
    CHECK(st_find(&f, "nope") == NULL, "st_find of a missing name");

    const char *step = st_meta(&f, "step");
    CHECK(step && strcmp(step, "43") == 0, "meta step = %s", step ? step : "(null)");
    const char *note = st_meta(&f, "note");
    CHECK(note && strcmp(note, "quote \" backslash \\ tab \t done") == 0, "meta note escaped wrong");
    const char *crc = st_meta(&f, "crc32c");
    char want_crc[9];
    snprintf(want_crc, sizeof want_crc, "%08x", crc32c(0, f.data_section, f.data_bytes));
    CHECK(crc && strcmp(crc, want_crc) == 0, "crc32c meta %s want %s", crc ? crc : "(null)",
          want_crc);
    CHECK(st_meta(&f, "absent") == NULL, "st_meta of a missing key");
    CHECK(f.n_meta == 3, "n_meta %d", f.n_meta);
    st_free(&f);
    CHECK(f.buffer == NULL && f.n_tensors == 0, "st_free did not clear");

    CHECK(st_dtype_size(ST_F32) == 4 && st_dtype_size(ST_BF16) == 2 && st_dtype_size(ST_I64) == 8 &&
              st_dtype_size(ST_U8) == 1,
          "dtype sizes");
    CHECK(strcmp(st_dtype_name(ST_F16), "F16") == 0 && strcmp(st_dtype_name(ST_I32), "I32") == 0,
          "dtype names");
}

/* ---- damaged files cut from a good one -------------------------------------- */

static void test_damaged(void) {
    char good[256], err[512] = "";
    path_in_dir(good, sizeof good, "good.safetensors");
    float a[16], b[8];
    for (int i = 0; i < 16; i++) a[i] = (float)i;
    for (int i = 0; i < 8; i++) b[i] = -(float)i;
    const int64_t sa[2] = {4, 4}, sb[1] = {8};
    StWriter *wr = st_writer_new();
    st_writer_add(wr, "a", ST_F32, 2, sa, a);
    st_writer_add(wr, "b", ST_F32, 1, sb, b);
    CHECK(st_writer_write(wr, good, err, sizeof err) == 0, "write good: %s", err);
    st_writer_free(wr);

    size_t n = 0;
    uint8_t *raw = read_bytes(good, &n);
    CHECK(raw != NULL, "read good");
    if (!raw) return;
    size_t hlen = (size_t)get_le64(raw);
    char path[256];

    path_in_dir(path, sizeof path, "cut_data.safetensors");
    CHECK(write_bytes(path, raw, n - 5), "write");
    expect_refused(path, "lies outside the data section", "cut in data section");
    expect_refused(path, "truncated", "cut in data section mentions truncation");

    path_in_dir(path, sizeof path, "cut_header.safetensors");
    CHECK(write_bytes(path, raw, 8 + hlen / 2), "write");
    expect_refused(path, "exceeds file size", "cut in header");

    path_in_dir(path, sizeof path, "tiny.safetensors");
    CHECK(write_bytes(path, raw, 5), "write");
    expect_refused(path, "file is 5 bytes, shorter than the 8-byte header length field",
                   "shorter than 8 bytes");

    path_in_dir(path, sizeof path, "empty.safetensors");
    CHECK(write_bytes(path, raw, 0), "write");
    expect_refused(path, "file is 0 bytes", "empty file");

    uint8_t *copy = malloc(n);
    memcpy(copy, raw, n);
    copy[n - 10] ^= 0x04;
    path_in_dir(path, sizeof path, "flip_data.safetensors");
    CHECK(write_bytes(path, copy, n), "write");
    expect_refused(path, "checksum mismatch", "flipped data byte");
    expect_refused(path, "file corrupted", "flipped data byte mentions corruption");

    memcpy(copy, raw, n);
    copy[8] ^= 0x01; /* '{' -> 'z' */
    path_in_dir(path, sizeof path, "flip_header.safetensors");
    CHECK(write_bytes(path, copy, n), "write");
    expect_refused(path, "header is not valid JSON", "flipped header byte");

    memcpy(copy, raw, n);
    put_le64(copy, (uint64_t)1 << 40);
    path_in_dir(path, sizeof path, "big_hlen.safetensors");
    CHECK(write_bytes(path, copy, n), "write");
    expect_refused(path, "header length 1099511627776", "header length beyond file");
    expect_refused(path, "exceeds file size", "header length beyond file");

    memcpy(copy, raw, n);
    put_le64(copy, UINT64_MAX);
    path_in_dir(path, sizeof path, "max_hlen.safetensors");
    CHECK(write_bytes(path, copy, n), "write");
    expect_refused(path, "exceeds file size", "header length 2^64-1");

    /* trailing garbage after the last tensor */
    uint8_t *longer = malloc(n + 4);
    memcpy(longer, raw, n);
    memset(longer + n, 0, 4);
    path_in_dir(path, sizeof path, "trailing.safetensors");
    CHECK(write_bytes(path, longer, n + 4), "write");
    expect_refused(path, "data section has 100 bytes but tensors cover 96", "trailing bytes");
    free(longer);

    free(copy);
    free(raw);
}

/* ---- hand-written headers ---------------------------------------------------- */

static void test_malformed_headers(void) {
    expect_raw_refused("overlap.safetensors",
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                       24, "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
    expect_raw_refused("same_range.safetensors",
                       "{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                       "\"a\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                       16, "overlap");
    expect_raw_refused("hole.safetensors",
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[32,48]}}",
                       48, "data section has 48 bytes but tensors cover 32");
    expect_raw_refused("dtype.safetensors",
                       "{\"embed.weight\":{\"dtype\":\"Q8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                       4, "tensor 'embed.weight' has dtype 'Q8' which is not supported");
    expect_raw_refused("mismatch.safetensors",
                       "{\"x\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,96]}}",
                       96,
                       "tensor 'x' data_offsets [0, 96) do not match shape [4, 8] of F32 (128 bytes)");
    expect_raw_refused("meta_type.safetensors",
                       "{\"__metadata__\":{\"k\":1},"
                       "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                       2, "__metadata__ value for 'k' is not a string");
    expect_raw_refused("meta_obj.safetensors", "{\"__metadata__\":[1]}", 0,
                       "__metadata__ is not a JSON object");
    expect_raw_refused("dims.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}",
                       1, "has 5 dims");
    expect_raw_refused("negdim.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,0]}}", 0,
                       "tensor 'x' shape dim 0 is not a non-negative integer");
    expect_raw_refused("fracdim.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}", 2,
                       "shape dim 0 is not a non-negative integer");
    expect_raw_refused("overflow.safetensors",
                       "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                       "\"data_offsets\":[0,4]}}",
                       4, "overflows");
    expect_raw_refused("offsets.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 2,
                       "\"data_offsets\"");
    expect_raw_refused("reversed.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,0]}}", 2,
                       "data_offsets [2, 0)");
    expect_raw_refused("noshape.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,2]}}", 2,
                       "tensor 'x' has no \"shape\" array");
    expect_raw_refused("nodtype.safetensors",
                       "{\"x\":{\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
                       "tensor 'x' has no \"dtype\" string");
    expect_raw_refused("notobj.safetensors", "{\"x\":3}", 0, "tensor 'x' is not a JSON object");
    expect_raw_refused("array.safetensors", "[1,2]", 0, "header is not a JSON object");
    expect_raw_refused("dup.safetensors",
                       "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                       "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                       4, "tensor name 'x' appears twice");
    expect_raw_refused("badcrc.safetensors",
                       "{\"__metadata__\":{\"crc32c\":\"xyz\"},"
                       "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                       2, "not 8 hex digits");
    expect_raw_refused("stray.safetensors", "{} x", 0, "header is not valid JSON");
    expect_raw_refused("blank.safetensors", "", 0, "header is not valid JSON");

    char path[256];
    path_in_dir(path, sizeof path, "does_not_exist.safetensors");
    expect_refused(path, "cannot open file", "missing file");
    expect_refused(g_dir, "not a regular file", "directory");
}

/* Files written elsewhere: no crc32c, unpadded header, no tensors at all. */
static void test_foreign_files(void) {
    char path[256], err[512] = "";
    float x[3] = {1.0f, 2.0f, 3.0f};
    int32_t y[2] = {-4, 5};
    uint8_t data[20];
    memcpy(data, y, sizeof y);   /* y first in the data section, x after */
    memcpy(data + 8, x, sizeof x);
    path_in_dir(path, sizeof path, "foreign.safetensors");
    /* header order differs from data order; no crc32c; header not padded */
    CHECK(write_raw(path,
                    "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[8,20]},"
                    "\"y\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}\n",
                    false, data, sizeof data),
          "write foreign");
    StFile f;
    int rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "foreign file refused: %s", err);
    if (rc == 0) {
        CHECK(f.n_tensors == 2 && strcmp(f.tensors[0].name, "y") == 0 &&
                  strcmp(f.tensors[1].name, "x") == 0,
              "tensors not sorted by data offset");
        const StTensor *tx = st_find(&f, "x");
        CHECK(tx && tx->n_bytes == sizeof x && memcmp(tx->data, x, sizeof x) == 0, "x differs");
        const StTensor *ty = st_find(&f, "y");
        CHECK(ty && ty->n_bytes == sizeof y && memcmp(ty->data, y, sizeof y) == 0, "y differs");
        CHECK(st_meta(&f, "crc32c") == NULL, "unexpected crc32c");
        const char *fmt = st_meta(&f, "format");
        CHECK(fmt && strcmp(fmt, "pt") == 0, "format meta");
        st_free(&f);
    }

    path_in_dir(path, sizeof path, "nothing.safetensors");
    CHECK(write_raw(path, "{}", true, NULL, 0), "write empty header");
    rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0 && f.n_tensors == 0 && f.data_bytes == 0, "empty header refused: %s", err);
    if (rc == 0) st_free(&f);
}

/* ---- writer failures ---------------------------------------------------------- */

static void test_writer_errors(void) {
    char path[256], tmp_path[300], err[512] = "";
    float v[2] = {1.0f, 2.0f};
    const int64_t shape[1] = {2};
    const int64_t too_many[5] = {1, 1, 1, 1, 2};

    snprintf(path, sizeof path, "%s/no/such/dir/model.safetensors", g_dir);
    StWriter *wr = st_writer_new();
    st_writer_add(wr, "v", ST_F32, 1, shape, v);
    int rc = st_writer_write(wr, path, err, sizeof err);
    CHECK(rc == -1, "write into a missing directory succeeded");
    CHECK(strstr(err, path) != NULL && strstr(err, "cannot create") != NULL,
          "missing-directory message: %s", err);
    st_writer_free(wr);

    path_in_dir(path, sizeof path, "bad_dims.safetensors");
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);
    wr = st_writer_new();
    st_writer_add(wr, "v", ST_F32, 1, shape, v);
    st_writer_add(wr, "w", ST_F32, 5, too_many, v);
    err[0] = '\0';
    rc = st_writer_write(wr, path, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "tensor 'w' has 5 dims") != NULL, "bad dims: %s", err);
    struct stat sb;
    CHECK(stat(path, &sb) != 0 && stat(tmp_path, &sb) != 0, "refused write left a file");
    st_writer_free(wr);

    path_in_dir(path, sizeof path, "dup.safetensors");
    wr = st_writer_new();
    st_writer_add(wr, "v", ST_F32, 1, shape, v);
    st_writer_add(wr, "v", ST_F32, 1, shape, v);
    rc = st_writer_write(wr, path, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "'v' was added twice") != NULL, "duplicate add: %s", err);
    st_writer_free(wr);

    /* a caller's crc32c is replaced by the real one; zero tensors is a valid file */
    path_in_dir(path, sizeof path, "no_tensors.safetensors");
    wr = st_writer_new();
    st_writer_meta(wr, "crc32c", "deadbeef");
    rc = st_writer_write(wr, path, err, sizeof err);
    CHECK(rc == 0, "zero-tensor write: %s", err);
    st_writer_free(wr);
    StFile f;
    rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0 && f.n_tensors == 0, "zero-tensor read: %s", err);
    if (rc == 0) {
        const char *crc = st_meta(&f, "crc32c");
        CHECK(crc && strcmp(crc, "00000000") == 0, "zero-tensor crc %s", crc ? crc : "(null)");
        st_free(&f);
    }
}

/* ---- alignment ---------------------------------------------------------------- */

/* A header whose length is not a multiple of 4 (other writers need not pad
 * it) and a tensor at an odd offset: every tensor must still be handed out
 * at an address aligned for its dtype, with its bytes intact, and the data
 * section (what checksums cover) left as read. */
static void test_misaligned_data(void) {
    char path[256], err[512] = "";
    float x[3] = {1.5f, -2.25f, 3.0f};
    uint8_t u[3] = {7, 8, 9};
    uint8_t data[15];
    memcpy(data, u, sizeof u); /* u at [0, 3), x at [3, 15): x starts at an odd offset */
    memcpy(data + 3, x, sizeof x);
    const char *json = "{\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                       "\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[3,15]}}";
    CHECK(strlen(json) % 4 != 0, "the header should have a length that is not a multiple of 4");
    path_in_dir(path, sizeof path, "misaligned.safetensors");
    CHECK(write_raw(path, json, false, data, sizeof data), "write misaligned");
    StFile f;
    int rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "misaligned file refused: %s", err);
    if (rc == 0) {
        const StTensor *tx = st_find(&f, "x"), *tu = st_find(&f, "u");
        CHECK(tx && (uintptr_t)tx->data % sizeof(float) == 0, "F32 tensor handed out at a misaligned address %p",
              tx ? tx->data : NULL);
        if (tx && (uintptr_t)tx->data % sizeof(float) == 0) {
            const float *p = tx->data; /* read as floats, as the loaders do */
            CHECK(p[0] == x[0] && p[1] == x[1] && p[2] == x[2], "x differs after alignment");
        }
        CHECK(tu && memcmp(tu->data, u, sizeof u) == 0, "u differs after alignment");
        CHECK(f.data_bytes == sizeof data && memcmp(f.data_section, data, sizeof data) == 0,
              "the data section was changed");
        st_free(&f);
    }
    /* only the header misaligned (one F32 tensor at offset 0) */
    const char *json1 = "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}} ";
    CHECK(write_raw(path, json1, false, x, sizeof x), "write misaligned header");
    rc = st_read(path, &f, err, sizeof err);
    CHECK(rc == 0, "file with a 3-mod-4 header refused: %s", err);
    if (rc == 0) {
        const StTensor *tx = st_find(&f, "x");
        CHECK(tx && (uintptr_t)tx->data % sizeof(float) == 0 && memcmp(tx->data, x, sizeof x) == 0,
              "F32 tensor behind a %zu-byte header is misaligned or changed", strlen(json1));
        st_free(&f);
    }
}

/* A named pipe in place of a file is refused at once, never waited on (a
 * reader that blocks is killed by the alarm: the test fails, not hangs). */
#define FIFO_HANG_LIMIT_S 20

static void test_fifo(void) {
    char path[256];
    path_in_dir(path, sizeof path, "pipe.safetensors");
    CHECK(mkfifo(path, 0600) == 0, "mkfifo %s: %s", path, strerror(errno));
    alarm(FIFO_HANG_LIMIT_S);
    expect_refused(path, "not a regular file (a named pipe)", "named pipe");
    alarm(0);
    unlink(path);
}

int main(void) {
    if (!make_scratch_dir(g_dir, sizeof g_dir, "test_safetensors")) return 1;
    test_crc32c();
    test_round_trip();
    test_damaged();
    test_malformed_headers();
    test_foreign_files();
    test_writer_errors();
    test_misaligned_data();
    test_fifo();
    remove_tree(g_dir);
    return check_report("test_safetensors");
}
