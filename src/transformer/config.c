/* config.c: presets, validation and the config.json form of ModelConfig.
 * Validation returns one sentence naming the field, so every front end
 * (flags, config.json, checkpoints) reports bad input the same way. Every
 * dimension has an upper bound (config.h), so no product of two of them
 * overflows and a damaged file cannot ask for an absurd model. */
#include "json_keys.h"
#include "transformer/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <float.h>
#include <stdio.h>
#include <string.h>
#include "err.h"

typedef struct {
    const char *name;
    int d_model, n_heads, d_ff, enc_layers, dec_layers, vocab_size, max_len;
    float dropout;
} Preset;

/* tiny: unit tests on CPU. cpu: the most BLEU a 2-core machine trains in
 * about 5 minutes (chosen by measurement: docs/cpu-default.md). small: a
 * CPU run that learns in minutes. base: the textbook configuration (Vaswani
 * et al. base) with the dropout measured best for 50k pairs on a GPU (0.3,
 * docs/quality.md: at 0.1 it overfits within two minutes). big: a larger
 * GPU one. */
static const Preset PRESETS[] = {
    {"tiny", 32, 4, 64, 2, 2, 64, 64, 0.0f},
    {"cpu", 128, 4, 512, 2, 2, 4000, 64, 0.0f},
    {"small", 256, 4, 1024, 3, 3, 8000, 128, 0.1f},
    {"base", 512, 8, 2048, 6, 6, 8000, 256, 0.3f},
    {"big", 1024, 16, 4096, 6, 6, 8000, 256, 0.3f},
};

int config_preset(const char *name, ModelConfig *cfg, char *err, size_t err_len) {
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) {
        const Preset *p = &PRESETS[i];
        if (strcmp(p->name, name) != 0) continue;
        memset(cfg, 0, sizeof *cfg);
        cfg->d_model = p->d_model;
        cfg->n_heads = p->n_heads;
        cfg->d_ff = p->d_ff;
        cfg->enc_layers = p->enc_layers;
        cfg->dec_layers = p->dec_layers;
        cfg->vocab_size = p->vocab_size;
        cfg->max_len = p->max_len;
        cfg->dropout = p->dropout;
        cfg->label_smoothing = 0.1f;
        cfg->act = ACT_RELU;
        cfg->ln_eps = 1e-5f;
        cfg->pad_id = 0;
        cfg->unk_id = 1;
        cfg->bos_id = 2;
        cfg->eos_id = 3;
        cfg->text = textnorm_none();  // ids, not text, until a corpus says otherwise (train_mt)
        return 0;
    }
    tp_error_set(err, err_len, "unknown preset '%s' (known: tiny, cpu, small, base, big)", name);
    return -1;
}

int config_validate(const ModelConfig *c, char *err, size_t err_len) {
#define BAD(...) do { tp_error_set(err, err_len, __VA_ARGS__); return -1; } while (0)
    if (c->d_model < 2 || c->d_model % 2) BAD("d_model must be an even number >= 2, got %d", c->d_model);
    if (c->d_model > CONFIG_MAX_D_MODEL) BAD("d_model must be at most %d, got %d", CONFIG_MAX_D_MODEL, c->d_model);
    if (c->n_heads < 1) BAD("n_heads must be >= 1, got %d", c->n_heads);
    if (c->n_heads > CONFIG_MAX_HEADS) BAD("n_heads must be at most %d, got %d", CONFIG_MAX_HEADS, c->n_heads);
    if (c->d_model % c->n_heads)
        BAD("n_heads (%d) must divide d_model (%d)", c->n_heads, c->d_model);
    if (c->d_ff < 1) BAD("d_ff must be >= 1, got %d", c->d_ff);
    if (c->d_ff > CONFIG_MAX_D_FF) BAD("d_ff must be at most %d, got %d", CONFIG_MAX_D_FF, c->d_ff);
    if (c->enc_layers < 1) BAD("enc_layers must be >= 1, got %d", c->enc_layers);
    if (c->dec_layers < 1) BAD("dec_layers must be >= 1, got %d", c->dec_layers);
    if (c->enc_layers > 255 || c->dec_layers > 255)
        BAD("at most 255 encoder and 255 decoder layers are supported, got %d and %d",
            c->enc_layers, c->dec_layers);
    if (c->vocab_size < 4) BAD("vocab_size must be >= 4 (pad, unk, bos, eos), got %d", c->vocab_size);
    if (c->vocab_size > CONFIG_MAX_VOCAB) BAD("vocab_size must be at most %d, got %d", CONFIG_MAX_VOCAB, c->vocab_size);
    if (c->max_len < 2) BAD("max_len must be >= 2, got %d", c->max_len);
    if (c->max_len > CONFIG_MAX_LEN) BAD("max_len must be at most %d, got %d", CONFIG_MAX_LEN, c->max_len);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f)) BAD("dropout must be in [0, 1), got %g", c->dropout);
    if (!(c->attn_dropout >= 0.0f && c->attn_dropout < 1.0f))
        BAD("attention_dropout must be in [0, 1), got %g", c->attn_dropout);
    if (!(c->act_dropout >= 0.0f && c->act_dropout < 1.0f))
        BAD("activation_dropout must be in [0, 1), got %g", c->act_dropout);
    if (!(c->label_smoothing >= 0.0f && c->label_smoothing < 1.0f))
        BAD("label_smoothing must be in [0, 1), got %g", c->label_smoothing);
    if (c->act != ACT_RELU && c->act != ACT_GELU) BAD("activation must be relu or gelu");
    /* Finite and bounded, written so that NaN fails (no comparison with it
     * is true): an infinite ln_eps would pass `> 0` and come back from
     * config.json as null. 1e-5 to 1e-12 in practice. */
    if (!(c->ln_eps > 0.0f && c->ln_eps <= 1.0f))
        BAD("ln_eps must be a finite number in (0, 1], got %g", (double)c->ln_eps);
    const int ids[4] = {c->pad_id, c->unk_id, c->bos_id, c->eos_id};
    const char *names[4] = {"pad_id", "unk_id", "bos_id", "eos_id"};
    for (int i = 0; i < 4; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            BAD("%s (%d) must be in [0, vocab_size=%d)", names[i], ids[i], c->vocab_size);
        for (int j = 0; j < i; j++)
            if (ids[i] == ids[j]) BAD("%s and %s must differ, both are %d", names[j], names[i], ids[i]);
    }
    return 0;
#undef BAD
}

const char *activation_name(Activation act) { return act == ACT_GELU ? "gelu" : "relu"; }

int activation_parse(const char *s, Activation *act) {
    if (strcmp(s, "relu") == 0) { *act = ACT_RELU; return 0; }
    if (strcmp(s, "gelu") == 0) { *act = ACT_GELU; return 0; }
    return -1;
}

char *config_to_json(const ModelConfig *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "tptrain-model");
    cJSON_AddNumberToObject(o, "format_version", 1);
    cJSON_AddNumberToObject(o, "d_model", c->d_model);
    cJSON_AddNumberToObject(o, "n_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "d_ff", c->d_ff);
    cJSON_AddNumberToObject(o, "enc_layers", c->enc_layers);
    cJSON_AddNumberToObject(o, "dec_layers", c->dec_layers);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "max_len", c->max_len);
    cJSON_AddNumberToObject(o, "dropout", c->dropout);
    cJSON_AddNumberToObject(o, "attention_dropout", c->attn_dropout);
    cJSON_AddNumberToObject(o, "activation_dropout", c->act_dropout);
    cJSON_AddNumberToObject(o, "label_smoothing", c->label_smoothing);
    cJSON_AddStringToObject(o, "activation", activation_name(c->act));
    cJSON_AddNumberToObject(o, "ln_eps", c->ln_eps);
    cJSON_AddNumberToObject(o, "pad_id", c->pad_id);
    cJSON_AddNumberToObject(o, "bos_id", c->bos_id);
    cJSON_AddNumberToObject(o, "eos_id", c->eos_id);
    cJSON_AddNumberToObject(o, "unk_id", c->unk_id);
    if (c->text.recorded) {  // a model loaded without the record is saved without it: nothing is invented
        cJSON *t = cJSON_AddObjectToObject(o, "text");
        cJSON_AddStringToObject(t, "source", text_lang_name(c->text.source));
        cJSON_AddStringToObject(t, "target", text_lang_name(c->text.target));
        cJSON_AddBoolToObject(t, "lowercase", c->text.lowercase);
        cJSON_AddBoolToObject(t, "split_punct", c->text.split_punct);
        cJSON_AddBoolToObject(t, "target_spaced", c->text.target_spaced);
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    TP_CHECK(s, "cJSON_Print failed");
    return s;
}

/* Reads one number field into *d; -1 with a sentence when missing or not a number. */
static int get_number(const cJSON *o, const char *key, double *d, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) {
        tp_error_set(err, err_len, "field '%s' is missing or not a number", key);
        return -1;
    }
    *d = v->valuedouble;
    return 0;
}

/* Reads one integer field; -1 with a sentence when missing or not integral. */
static int get_int(const cJSON *o, const char *key, int *out, char *err, size_t err_len) {
    double d;
    if (get_number(o, key, &d, err, err_len)) return -1;
    if (d != floor(d) || d < -2147483647.0 || d > 2147483647.0) {
        tp_error_set(err, err_len, "field '%s' must be an integer, got %g", key, d);
        return -1;
    }
    *out = (int)d;
    return 0;
}

/* Reads one float field; -1 with a sentence when missing, or beyond a
 * float (1e39 would become inf, and the conversion of an out-of-range
 * double is undefined). The field's own range is config_validate's. */
static int get_float(const cJSON *o, const char *key, float *out, char *err, size_t err_len) {
    double d;
    if (get_number(o, key, &d, err, err_len)) return -1;
    if (!(d >= -FLT_MAX && d <= FLT_MAX)) {
        tp_error_set(err, err_len, "field '%s' is %g, beyond the range of a 32-bit float", key, d);
        return -1;
    }
    *out = (float)d;
    return 0;
}

/* The optional "text" object: absent, the assumed form; present, whole. */
static int get_text(const cJSON *o, TextNorm *t, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "text");
    if (!v) {
        *t = textnorm_assumed();
        return 0;
    }
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(v, "source"), *tgt = cJSON_GetObjectItemCaseSensitive(v, "target");
    const cJSON *lc = cJSON_GetObjectItemCaseSensitive(v, "lowercase");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(v, "split_punct");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(v, "target_spaced");
    *t = (TextNorm){.recorded = true};
    if (!cJSON_IsObject(v) || !cJSON_IsString(src) || text_lang_parse(src->valuestring, &t->source) ||
        !cJSON_IsString(tgt) || text_lang_parse(tgt->valuestring, &t->target) || !cJSON_IsBool(lc) ||
        !cJSON_IsBool(sp) || !cJSON_IsBool(ts)) {
        tp_error_set(err, err_len, "field 'text' must hold source and target (\"en\", \"ja\" or \"none\") and "
                     "the booleans lowercase, split_punct and target_spaced");
        return -1;
    }
    t->lowercase = cJSON_IsTrue(lc);
    t->split_punct = cJSON_IsTrue(sp);
    t->target_spaced = cJSON_IsTrue(ts);
    return 0;
}

/* An optional number: absent leaves *out as it is (0 in a fresh config). */
static int get_float_opt(const cJSON *o, const char *key, float *out, char *err, size_t err_len) {
    return cJSON_GetObjectItemCaseSensitive(o, key) ? get_float(o, key, out, err, err_len) : 0;
}

int config_from_json(const char *text, ModelConfig *c, char *err, size_t err_len) {
    cJSON *o = cJSON_ParseWithOpts(text, NULL, 1); /* 1: nothing but whitespace may follow the object */
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        tp_error_set(err, err_len, "not a JSON object");
        return -1;
    }
    if (json_refuse_duplicate_keys(o, "", err, err_len)) {
        cJSON_Delete(o);
        return -1;
    }
    int rc = -1, version = 0;
    memset(c, 0, sizeof *c);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tptrain-model") != 0) {
        tp_error_set(err, err_len, "field 'format' must be \"tptrain-model\"");
        goto done;
    }
    if (get_int(o, "format_version", &version, err, err_len)) goto done;
    if (version != 1) {
        tp_error_set(err, err_len, "field 'format_version' is %d, this build reads version 1", version);
        goto done;
    }
    if (get_int(o, "d_model", &c->d_model, err, err_len) ||
        get_int(o, "n_heads", &c->n_heads, err, err_len) ||
        get_int(o, "d_ff", &c->d_ff, err, err_len) ||
        get_int(o, "enc_layers", &c->enc_layers, err, err_len) ||
        get_int(o, "dec_layers", &c->dec_layers, err, err_len) ||
        get_int(o, "vocab_size", &c->vocab_size, err, err_len) ||
        get_int(o, "max_len", &c->max_len, err, err_len) ||
        get_float(o, "dropout", &c->dropout, err, err_len) ||
        get_float_opt(o, "attention_dropout", &c->attn_dropout, err, err_len) ||
        get_float_opt(o, "activation_dropout", &c->act_dropout, err, err_len) ||
        get_float(o, "label_smoothing", &c->label_smoothing, err, err_len) ||
        get_float(o, "ln_eps", &c->ln_eps, err, err_len) ||
        get_int(o, "pad_id", &c->pad_id, err, err_len) ||
        get_int(o, "bos_id", &c->bos_id, err, err_len) ||
        get_int(o, "eos_id", &c->eos_id, err, err_len) ||
        get_int(o, "unk_id", &c->unk_id, err, err_len) ||
        get_text(o, &c->text, err, err_len))
        goto done;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "activation");
    if (!cJSON_IsString(act) || activation_parse(act->valuestring, &c->act)) {
        tp_error_set(err, err_len, "field 'activation' must be \"relu\" or \"gelu\"");
        goto done;
    }
    rc = config_validate(c, err, err_len);
done:
    cJSON_Delete(o);
    return rc;
}

TokenSpec config_tokens(const ModelConfig *c) {
    return (TokenSpec){.vocab_size = c->vocab_size, .max_len = c->max_len, .pad_id = c->pad_id, .bos_id = c->bos_id,
                       .eos_id = c->eos_id};
}

const char *config_diff(const ModelConfig *a, const char *a_name, const ModelConfig *b, const char *b_name, char *buf,
                        size_t buf_len) {
#define INT_FIELD(f)                                                                                    \
    if (a->f != b->f) {                                                                                 \
        snprintf(buf, buf_len, "%s has %s %d, %s %d", a_name, #f, (int)a->f, b_name, (int)b->f);       \
        return buf;                                                                                     \
    }
#define FLOAT_NAMED(f, name)                                                                              \
    if (a->f != b->f) {                                                                                   \
        snprintf(buf, buf_len, "%s has %s %g, %s %g", a_name, name, (double)a->f, b_name, (double)b->f); \
        return buf;                                                                                       \
    }
#define FLOAT_FIELD(f) FLOAT_NAMED(f, #f)
    INT_FIELD(d_model) INT_FIELD(n_heads) INT_FIELD(d_ff) INT_FIELD(enc_layers) INT_FIELD(dec_layers)
    INT_FIELD(vocab_size) INT_FIELD(max_len) INT_FIELD(act) INT_FIELD(pad_id) INT_FIELD(bos_id) INT_FIELD(eos_id)
    INT_FIELD(unk_id) FLOAT_FIELD(dropout) FLOAT_NAMED(attn_dropout, "attention_dropout")
    FLOAT_NAMED(act_dropout, "activation_dropout") FLOAT_FIELD(label_smoothing) FLOAT_FIELD(ln_eps)
#undef INT_FIELD
#undef FLOAT_FIELD
#undef FLOAT_NAMED
    return NULL;
}
