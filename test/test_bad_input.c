/* test_bad_input.c: bad configurations and damaged exports are refused with
 * one clear sentence naming the field or the file, never a crash and never a
 * silently wrong model. */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "testfs.h"
#include "transformer/export.h"
#include "transformer/model.h"

static char g_dir[64];

static void expect_config_refused(ModelConfig cfg, const char *phrase) {
    char err[256] = "";
    CHECK(config_validate(&cfg, err, sizeof err) != 0, "config accepted, expected '%s'", phrase);
    CHECK(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    Model m;
    err[0] = '\0';
    CHECK(model_create(&m, NULL, &cfg, NULL, 1, err, sizeof err) != 0, "model_create accepted a bad config ('%s')", phrase);
    CHECK(strstr(err, phrase) != NULL, "model_create message '%s' lacks '%s'", err, phrase);
}

static void test_configs(void) {
    ModelConfig base;
    char err[256];
    CHECK(config_preset("tiny", &base, err, sizeof err) == 0, "%s", err);
    CHECK(config_validate(&base, err, sizeof err) == 0, "tiny preset invalid: %s", err);
    const char *names[] = {"small", "base", "big"};
    for (int i = 0; i < 3; i++) {
        ModelConfig c;
        CHECK(config_preset(names[i], &c, err, sizeof err) == 0 && config_validate(&c, err, sizeof err) == 0,
              "preset %s: %s", names[i], err);
    }
    CHECK(config_preset("huge", &base, err, sizeof err) != 0 && strstr(err, "unknown preset 'huge'"),
          "unknown preset: '%s'", err);
    config_preset("tiny", &base, err, sizeof err);

    ModelConfig c = base;
    c.n_heads = 3; /* 32 % 3 != 0 */
    expect_config_refused(c, "n_heads (3) must divide d_model (32)");
    c = base;
    c.enc_layers = 0;
    expect_config_refused(c, "enc_layers must be >= 1, got 0");
    c = base;
    c.dec_layers = 0;
    expect_config_refused(c, "dec_layers must be >= 1, got 0");
    c = base;
    c.n_heads = 0;
    expect_config_refused(c, "n_heads must be >= 1");
    c = base;
    c.dropout = 1.0f;
    expect_config_refused(c, "dropout must be in [0, 1)");
    c = base;
    c.eos_id = c.pad_id;
    expect_config_refused(c, "must differ");
    c = base;
    c.bos_id = c.vocab_size;
    expect_config_refused(c, "bos_id");
    /* every dimension is bounded: nothing overflows, nothing absurd is built */
    c = base;
    c.vocab_size = 2147483647;
    expect_config_refused(c, "vocab_size must be at most 16777216, got 2147483647");
    c = base;
    c.d_model = 1 << 20;
    expect_config_refused(c, "d_model must be at most 65536");
    c = base;
    c.d_ff = 1 << 30;
    expect_config_refused(c, "d_ff must be at most 1048576");
    c = base;
    c.max_len = 1 << 30;
    expect_config_refused(c, "max_len must be at most 65536");
    c = base;
    c.n_heads = 2048;
    c.d_model = 4096;
    expect_config_refused(c, "n_heads must be at most 1024");
}

static void expect_load_refused(const char *dir, const char *phrase, const char *file, const char *what) {
    Model m;
    char err[512] = "";
    int rc = model_load(&m, dir, err, sizeof err);
    CHECK(rc != 0, "%s: damaged export was loaded", what);
    if (rc == 0) {
        model_free(&m);
        return;
    }
    CHECK(strstr(err, phrase) != NULL, "%s: message '%s' lacks '%s'", what, err, phrase);
    CHECK(strstr(err, file) != NULL, "%s: message '%s' does not name %s", what, err, file);
}

/* Writes `bytes` as dir/name after the good export has been restored. */
static void put(const char *dir, const char *name, const void *bytes, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(write_bytes(path, bytes, n), "cannot write %s", path);
}

/* out = text with the first `from` replaced by `to` (out may be text). */
static bool replace_once(char *out, size_t cap, const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    if (!at) return false;
    char buf[1024];
    int k = snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    if (k < 0 || (size_t)k >= sizeof buf || (size_t)k >= cap) return false;
    memcpy(out, buf, (size_t)k + 1);
    return true;
}

static void test_exports(void) {
    char err[512], dir[256];
    ModelConfig cfg;
    config_preset("tiny", &cfg, err, sizeof err);
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 42, err, sizeof err) == 0, "%s", err);
    snprintf(dir, sizeof dir, "%s/export", g_dir);
    CHECK(model_export(&m, dir, err, sizeof err) == 0, "export: %s", err);

    /* A good export round-trips bit for bit. */
    Model back;
    CHECK(model_load(&back, dir, err, sizeof err) == 0, "load: %s", err);
    CHECK(back.tab.n_elems == m.tab.n_elems &&
              memcmp(back.params, m.params, m.tab.n_elems * sizeof(float)) == 0,
          "reloaded parameters differ");
    CHECK(back.grads == NULL, "a model loaded for inference holds a gradient buffer");
    model_free(&back);

    char path[512];
    size_t n_st = 0, n_cfg = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint8_t *st = read_bytes(path, &n_st);
    snprintf(path, sizeof path, "%s/config.json", dir);
    uint8_t *cj = read_bytes(path, &n_cfg);
    CHECK(st && cj, "cannot read the export back");
    if (!st || !cj) return;

    /* model.safetensors damaged */
    put(dir, "model.safetensors", st, n_st / 2);
    expect_load_refused(dir, "truncated", "model.safetensors", "truncated in data");
    put(dir, "model.safetensors", st, 4);
    expect_load_refused(dir, "shorter than the 8-byte header", "model.safetensors", "truncated to 4 bytes");
    put(dir, "model.safetensors", st, 0);
    expect_load_refused(dir, "shorter than the 8-byte header", "model.safetensors", "empty");
    uint8_t *flip = malloc(n_st);
    memcpy(flip, st, n_st);
    flip[n_st - 100] ^= 0x10;
    put(dir, "model.safetensors", flip, n_st);
    expect_load_refused(dir, "checksum mismatch", "model.safetensors", "flipped data byte");
    memcpy(flip, st, n_st);
    flip[9] = '#';
    put(dir, "model.safetensors", flip, n_st);
    expect_load_refused(dir, "JSON", "model.safetensors", "broken header");
    free(flip);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    expect_load_refused(dir, "cannot open", "model.safetensors", "missing weights");
    put(dir, "model.safetensors", st, n_st);

    /* config.json damaged or not matching the weights */
    put(dir, "config.json", cj, n_cfg / 2);
    expect_load_refused(dir, "not a JSON object", "config.json", "truncated config");
    char *text = malloc(n_cfg + 64);
    memcpy(text, cj, n_cfg);
    text[n_cfg] = '\0';
    char *field = strstr(text, "\"d_model\"");
    CHECK(field != NULL, "config.json has no d_model");
    if (field) {
        memcpy(field, "\"d_mode_\"", 9);
        put(dir, "config.json", text, n_cfg);
        expect_load_refused(dir, "field 'd_model' is missing", "config.json", "missing field");
        memcpy(field, "\"d_model\"", 9);
    }
    char *heads = strstr(text, "\"n_heads\":\t4");
    CHECK(heads != NULL, "config.json has no n_heads 4 (%s)", text);
    if (heads) {
        heads[strlen("\"n_heads\":\t")] = '3';
        put(dir, "config.json", text, n_cfg);
        expect_load_refused(dir, "n_heads (3) must divide d_model (32)", "config.json", "bad heads");
        heads[strlen("\"n_heads\":\t")] = '4';
    }
    /* A config far larger than the tensors (a whole model of it would need
     * hundreds of GiB): refused from the shapes, before anything is built. */
    char big[1024];
    bool ok = replace_once(big, sizeof big, text, "\"d_model\":\t32,", "\"d_model\":\t65536,") &&
              replace_once(big, sizeof big, big, "\"d_ff\":\t64,", "\"d_ff\":\t1048576,") &&
              replace_once(big, sizeof big, big, "\"enc_layers\":\t2,", "\"enc_layers\":\t255,");
    CHECK(ok, "config.json lacks d_model 32, d_ff 64 or enc_layers 2 (%s)", text);
    if (ok) {
        put(dir, "config.json", big, strlen(big));
        expect_load_refused(dir, "config.json needs F32 [64, 65536]", "model.safetensors", "huge config");
        /* trailing bytes after the JSON object */
        snprintf(big, sizeof big, "%.*s garbage", (int)n_cfg, text);
        put(dir, "config.json", big, strlen(big));
        expect_load_refused(dir, "not a JSON object", "config.json", "trailing garbage");
    }
    char *ff = strstr(text, "\"d_ff\":\t64");
    CHECK(ff != NULL, "config.json has no d_ff 64");
    if (ff) {
        memcpy(ff, "\"d_ff\":\t96", 10);
        put(dir, "config.json", text, n_cfg);
        expect_load_refused(dir, "config.json needs F32 [96, 32]", "model.safetensors", "shape mismatch");
    }
    free(text);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    expect_load_refused(dir, "cannot open", "config.json", "missing config");
    put(dir, "config.json", cj, n_cfg);
    int rc = model_load(&back, dir, err, sizeof err);
    CHECK(rc == 0, "restored export: %s", err);
    if (rc == 0) model_free(&back);

    /* A batch with an out-of-vocabulary id or bad lengths is refused. */
    int32_t src[2] = {5, 64}, len1[1] = {2}, tin[2] = {2, 5}, tout[2] = {5, 3}, tlen[1] = {2};
    Batch b = {.B = 1, .S = 2, .T = 2, .src = src, .src_len = len1, .tgt_in = tin, .tgt_out = tout, .tgt_len = tlen};
    CHECK(model_check_batch(&m, &b, err, sizeof err) != 0 && strstr(err, "src[0][1] = 64 is outside"),
          "out-of-vocabulary id: '%s'", err);
    src[1] = 6;
    len1[0] = 3;
    CHECK(model_check_batch(&m, &b, err, sizeof err) != 0 && strstr(err, "outside [1, 2]"),
          "length past S: '%s'", err);
    len1[0] = 2;
    CHECK(model_check_batch(&m, &b, err, sizeof err) == 0, "good batch refused: %s", err);
    free(st);
    free(cj);
    model_free(&m);
}

/* The attention and activation dropouts in config.json: written and read
 * back; a file written before them (no such fields) reads as 0; a bad
 * value is refused with its field named. */
static void test_inner_dropouts_json(const ModelConfig *base) {
    char err[256];
    ModelConfig c = *base, back;
    c.attn_dropout = 0.25f;
    c.act_dropout = 0.125f;
    char *json = config_to_json(&c);
    CHECK(config_from_json(json, &back, err, sizeof err) == 0 && back.attn_dropout == 0.25f &&
              back.act_dropout == 0.125f, "attention / activation dropout round trip: %s (%g, %g)", err,
          (double)back.attn_dropout, (double)back.act_dropout);
    free(json);
    json = config_to_json(base);  // the fields cut out: an older file
    const char *keys[2] = {"\"attention_dropout\":", "\"activation_dropout\":"};
    for (int i = 0; i < 2; i++) {
        char *at = strstr(json, keys[i]), *end = at ? strchr(at, ',') : NULL;
        CHECK(at && end, "config.json lacks %s: %s", keys[i], json);
        if (at && end) memmove(at, end + 1, strlen(end + 1) + 1);
    }
    CHECK(!strstr(json, "attention_dropout") && !strstr(json, "activation_dropout"), "fields not cut: %s", json);
    back.attn_dropout = back.act_dropout = 0.5f;
    CHECK(config_from_json(json, &back, err, sizeof err) == 0 && back.attn_dropout == 0.0f &&
              back.act_dropout == 0.0f, "a config.json without the inner dropouts: %s (%g, %g)", err,
          (double)back.attn_dropout, (double)back.act_dropout);
    free(json);
    c = *base;
    c.attn_dropout = 0.5f;
    json = config_to_json(&c);
    char *at = strstr(json, "\"attention_dropout\":");
    if (at) memcpy(strchr(at, ':') + 1, " 7", 2);  // "0.5" becomes " 7" and its tail: a value out of range
    CHECK(config_from_json(json, &back, err, sizeof err) != 0 && strstr(err, "attention_dropout must be in [0, 1)"),
          "attention_dropout 7 from JSON: '%s'", err);
    free(json);
}

/* Every float field finite and bounded, the field named: an infinite
 * ln_eps would be written to config.json as null. */
static void test_float_fields(void) {
    ModelConfig base, c;
    char err[256];
    CHECK(config_preset("tiny", &base, err, sizeof err) == 0, "%s", err);
    c = base;
    c.ln_eps = INFINITY;
    expect_config_refused(c, "ln_eps must be a finite number in (0, 1], got inf");
    c.ln_eps = NAN;
    expect_config_refused(c, "ln_eps must be a finite number in (0, 1], got ");
    c.ln_eps = 2.0f;
    expect_config_refused(c, "ln_eps must be a finite number in (0, 1], got 2");
    c.ln_eps = 0.0f;
    expect_config_refused(c, "ln_eps must be a finite number in (0, 1], got 0");
    c.ln_eps = 1e-12f;
    CHECK(config_validate(&c, err, sizeof err) == 0, "ln_eps 1e-12 refused: %s", err);
    c = base;
    c.dropout = NAN;
    expect_config_refused(c, "dropout must be in [0, 1), got ");
    c.dropout = -0.1f;
    expect_config_refused(c, "dropout must be in [0, 1), got -0.1");
    c = base;
    c.attn_dropout = 1.0f;
    expect_config_refused(c, "attention_dropout must be in [0, 1), got 1");
    c.attn_dropout = NAN;
    expect_config_refused(c, "attention_dropout must be in [0, 1), got ");
    c = base;
    c.act_dropout = -0.5f;
    expect_config_refused(c, "activation_dropout must be in [0, 1), got -0.5");
    c = base;
    c.label_smoothing = INFINITY;
    expect_config_refused(c, "label_smoothing must be in [0, 1), got inf");
    c.label_smoothing = NAN;
    expect_config_refused(c, "label_smoothing must be in [0, 1), got ");
    c.label_smoothing = 1.0f;
    expect_config_refused(c, "label_smoothing must be in [0, 1), got 1");
    /* config.json: a float beyond a float's range is refused with its field,
     * not turned into inf; a round trip of a valid config is exact. */
    char *json = config_to_json(&base);
    ModelConfig back;
    CHECK(config_from_json(json, &back, err, sizeof err) == 0 && config_diff(&base, "the original", &back, "the copy", err, sizeof err) == NULL,
          "config.json round trip: %s", err);
    char *at = strstr(json, "\"ln_eps\":");
    CHECK(at != NULL, "config.json has no ln_eps: %s", json);
    if (at) {
        char *text = malloc(strlen(json) + 64);
        char *colon = strchr(at, ':') + 1, *rest = strpbrk(colon, ",}");
        const char *values[] = {"1e39", "1e999", "-1e39", "2", "0", "-1e-5"};
        const char *phrases[] = {"field 'ln_eps' is 1e+39, beyond the range of a 32-bit float",
                                 "field 'ln_eps' is inf, beyond the range of a 32-bit float",
                                 "field 'ln_eps' is -1e+39, beyond the range of a 32-bit float",
                                 "ln_eps must be a finite number in (0, 1], got 2",
                                 "ln_eps must be a finite number in (0, 1], got 0",
                                 "ln_eps must be a finite number in (0, 1], got -1e-05"};
        for (int i = 0; i < 6; i++) {
            sprintf(text, "%.*s %s%s", (int)(colon - json), json, values[i], rest);
            err[0] = 0;
            CHECK(config_from_json(text, &back, err, sizeof err) != 0, "ln_eps %s accepted from JSON", values[i]);
            CHECK(strstr(err, phrases[i]) != NULL, "ln_eps %s: message '%s' lacks '%s'", values[i], err, phrases[i]);
        }
        free(text);
    }
    free(json);
    test_inner_dropouts_json(&base);
}

int main(void) {
    if (!make_scratch_dir(g_dir, sizeof g_dir, "test_bad_input")) return 1;
    test_configs();
    test_float_fields();
    test_exports();
    remove_tree(g_dir);
    return check_report("test_bad_input");
}
