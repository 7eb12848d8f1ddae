/* ckpt_manifest.c: manifest.json: its own checksum line (sealed when
 * written, checked before any field is read), its bounds and fields, the
 * files it lists, the tokenizer and the save folder (checkpoint.h's
 * ckpt_manifest, ckpt_read_manifest, ckpt_manifest_entry, ckpt_verify_file,
 * ckpt_check_tokenizer, ckpt_check_save_folder).
 *
 * Calls: ckpt_save.c's and ckpt_dir.c's helpers (ckpt_internal.h), the
 * model's config and parameter tables, common/.
 */
#include "json_keys.h"
#include "json_seal.h"
#include "train/checkpoint.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_pieces.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h"
#include "transformer/export.h"

/* ---- the manifest's own checksum ------------------------------------------------ */

/* manifest.json carries the checksum of its own bytes in its first line
 * (common/json_seal.h), checked before any field is read. */
#define MANIFEST_CRC_FIELD "manifest_crc32c"

/* The manifest text with its checksum line first (caller frees). */
char *sealed_manifest(const cJSON *o) { return json_seal_print(o, MANIFEST_CRC_FIELD); }

/* 0 when text (n bytes) carries a checksum line that matches the rest. */
static int check_manifest_seal(const char *text, size_t n, const char *path, char *err, size_t err_len) {
    char found[9], have[9];
    const int seal = json_seal_check(text, n, MANIFEST_CRC_FIELD, found, have);
    if (seal == 1) {
        tp_error_set(err, err_len,
                     "%s: refused: it does not begin with its \"manifest_crc32c\" line, so its fields cannot be "
                     "trusted (a checkpoint of format version 1, written before manifests were checksummed, or an "
                     "edited file)", path);
        return -1;
    }
    if (seal == 2) {
        tp_error_set(err, err_len, "%s: manifest_crc32c is %s but the manifest's content has %s (damaged or edited)",
                     path, found, have);
        return -1;
    }
    return 0;
}


/* ---- manifest ----------------------------------------------------------------- */

/* Bounds of what a manifest may say; train_mt's flags accept no more. */
#define CKPT_MAX_STEP (INT_MAX - 1)        /* the step loop counts in int and runs step + 1 */
#define CKPT_MAX_DP (1 << 20)
#define CKPT_MAX_PP 510                    /* a stage holds at least one of at most 255 + 255 layers */
#define CKPT_MAX_WORLD (1 << 20)
#define CKPT_MAX_WARMUP (1 << 30)
#define CKPT_MAX_SEED 0x7fffffffLL         /* --seed's range */
#define CKPT_MAX_POSITION INT_MAX          /* batches in an epoch are counted in int */
#define CKPT_MAX_SPM_ALPHA 100.0           /* --spm-alpha's range */
#define CKPT_MAX_SPM_NBEST 10000           /* --spm-nbest's range */
#define CKPT_MAX_SECONDS 1e12              /* a --max-minutes run's clock (the flag allows 6e8 s) */
#define CKPT_JSON_EXACT_MAX (1LL << 53)    /* larger JSON numbers lose digits */
/* A shard's header (tensor entries and the split metadata): a few hundred
 * bytes per tensor, far below this even at the largest configuration. */
#define CKPT_MAX_SHARD_HEADER (64u << 20)

static const cJSON *need(const cJSON *o, const char *obj, const char *key, const char *path, char *err,
                         size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) tp_error_set(err, err_len, "%s: field '%s%s%s' is missing", path, obj, *obj ? "." : "", key);
    return v;
}

static const cJSON *need_object(const cJSON *o, const char *key, const char *path, char *err, size_t err_len) {
    const cJSON *v = need(o, "", key, path, err, err_len);
    if (v && !cJSON_IsObject(v)) {
        tp_error_set(err, err_len, "%s: field '%s' is not an object", path, key);
        return NULL;
    }
    return v;
}

/* An exact integer in [lo, hi]. */
static int need_int(const cJSON *o, const char *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    const char *path, char *err, size_t err_len) {
    const cJSON *v = need(o, obj, key, path, err, err_len);
    if (!v) return -1;
    const double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi && d == floor(d))) {
        char got[64];
        if (cJSON_IsNumber(v)) snprintf(got, sizeof got, "%.17g", d);
        else snprintf(got, sizeof got, "something that is not a number");
        tp_error_set(err, err_len, "%s: field '%s%s%s' must be an integer in [%lld, %lld], got %s", path, obj,
                     *obj ? "." : "", key, (long long)lo, (long long)hi, got);
        return -1;
    }
    *out = (int64_t)d;
    return 0;
}

/* A finite number that a float holds, in the interval lo..hi (open at an
 * end where the flag says so). */
static int need_real(const cJSON *o, const char *obj, const char *key, double lo, bool lo_open, double hi,
                     bool hi_open, double *out, const char *path, char *err, size_t err_len) {
    const cJSON *v = need(o, obj, key, path, err, err_len);
    if (!v) return -1;
    const double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    const bool ok = isfinite(d) && isfinite((float)d) && (lo_open ? d > lo : d >= lo) && (hi_open ? d < hi : d <= hi);
    if (!ok) {
        char got[64];
        if (cJSON_IsNumber(v)) snprintf(got, sizeof got, "%.17g", d);
        else snprintf(got, sizeof got, "something that is not a number");
        tp_error_set(err, err_len, "%s: field '%s.%s' must be a finite number in %c%g, %g%c, got %s", path, obj, key,
                     lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', got);
        return -1;
    }
    *out = d;
    return 0;
}

/* Reads DIR/manifest.json into path's buffer name; checks its checksum line
 * first, then parses it strictly (nothing may follow the object) and checks
 * format and version. The caller deletes the result. */
cJSON *load_manifest(const char *dir, char *path, size_t path_len, char *err, size_t err_len) {
    pathf(path, path_len, "%s/manifest.json", dir);
    size_t n = 0;
    char *text = read_file_bytes_max(path, MANIFEST_MAX_BYTES, &n, err, err_len);
    if (!text) return NULL;
    if (strlen(text) != n) {
        tp_error_set(err, err_len, "%s: holds a NUL byte, so it is not JSON text", path);
        free(text);
        return NULL;
    }
    if (check_manifest_seal(text, n, path, err, err_len)) {
        free(text);
        return NULL;
    }
    cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
    free(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        tp_error_set(err, err_len, "%s: not valid JSON (or bytes follow the object)", path);
        return NULL;
    }
    if (json_refuse_duplicate_keys(o, path, err, err_len)) {
        cJSON_Delete(o);
        return NULL;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "format_version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tptrain-checkpoint") != 0) {
        tp_error_set(err, err_len, "%s: field 'format' is not \"tptrain-checkpoint\"", path);
    } else if (!cJSON_IsNumber(ver) || ver->valuedouble != CKPT_FORMAT_VERSION) {
        if (cJSON_IsNumber(ver))
            tp_error_set(err, err_len, "%s: field 'format_version' is %g, this build reads version %d", path,
                         ver->valuedouble, CKPT_FORMAT_VERSION);
        else
            tp_error_set(err, err_len, "%s: field 'format_version' is missing or not a number", path);
    } else {
        return o;
    }
    cJSON_Delete(o);
    return NULL;
}

struct cJSON *ckpt_manifest(const char *dir, char *err, size_t err_len) {
    char path[4096];
    return load_manifest(dir, path, sizeof path, err, err_len);
}

/* One entry of "files": bytes an exact integer in [lo, hi], crc32c 8
 * lowercase hex digits. */
static int check_file_entry(const cJSON *files, const char *name, uint64_t lo, uint64_t hi, const char *why,
                            const char *path, char *err, size_t err_len) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, name);
    if (!cJSON_IsObject(e)) {
        tp_error_set(err, err_len, "%s: field 'files' does not list '%s'", path, name);
        return -1;
    }
    int64_t n;
    char obj[160];
    snprintf(obj, sizeof obj, "files.%s", name);
    if (need_int(e, obj, "bytes", 0, CKPT_JSON_EXACT_MAX, &n, path, err, err_len)) return -1;
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(e, "crc32c");
    bool hex = cJSON_IsString(crc) && strlen(crc->valuestring) == 8;
    for (int i = 0; hex && i < 8; i++) hex = strchr("0123456789abcdef", crc->valuestring[i]) != NULL;
    if (!hex) {
        tp_error_set(err, err_len, "%s: field 'files.%s.crc32c' is not 8 lowercase hex digits", path, name);
        return -1;
    }
    if ((uint64_t)n < lo || (uint64_t)n > hi) {
        tp_error_set(err, err_len,
                     "%s: file '%s' is listed with %lld bytes, but %s needs %llu to %llu: the config does not match "
                     "the shards", path, name, (long long)n, why, (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    return 0;
}

/* The files a tp x dp checkpoint of cfg holds, and nothing else; each
 * shard's size must fit the tensors cfg implies (8-byte length field, a
 * JSON header, then exactly the tensor bytes), so a config that disagrees
 * with the shards (d_model 4000 over 32-wide shards) is refused here,
 * before any loader allocates a model of it. */
static int check_files(const cJSON *files, const ModelConfig *cfg, int tp, int dp, const ModelStage *stages, int pp,
                       int zero, size_t bucket_elems, bool corpus, const char *path, char *err, size_t err_len) {
    if (!cJSON_IsObject(files)) {
        tp_error_set(err, err_len, "%s: field 'files' is not an object", path);
        return -1;
    }
    uint64_t *optim_elems = TP_CALLOC((size_t)dp, sizeof *optim_elems);
    int rc = 0, listed = 0;
    for (int p = 0; p < pp && rc == 0; p++) {
        ParamTable tab;
        param_table_build_stage(cfg, tp, &stages[p], &tab);
        memset(optim_elems, 0, (size_t)dp * sizeof *optim_elems);
        if (zero > 0)
            for (int d = 0; d < dp; d++) optim_elems[d] = opt_pieces_file_elems(&tab, zero, bucket_elems, dp, d, pp > 1);
        else
            for (int i = 0; i < tab.n; i++) optim_elems[i % dp] += 2 * (uint64_t)tab.t[i].n_elems;
        char why[200];
        snprintf(why, sizeof why, "the manifest's config (d_model %d, d_ff %d, vocab_size %d, %d+%d layers) at tp %d%s",
                 cfg->d_model, cfg->d_ff, cfg->vocab_size, cfg->enc_layers, cfg->dec_layers, tp,
                 pp > 1 ? " and the manifest's stages" : "");
        for (int t = 0; t < tp && rc == 0; t++) {
            char name[96];
            uint64_t lo = 8 + 2 + 4 * (uint64_t)tab.n_elems;
            snprintf(name, sizeof name, "model-tp%d-pp%d.safetensors", t, p);
            rc = check_file_entry(files, name, lo, lo + CKPT_MAX_SHARD_HEADER, why, path, err, err_len);
            listed++;
            for (int d = 0; d < dp && rc == 0; d++, listed++) {
                snprintf(name, sizeof name, "optim-tp%d-pp%d-dp%d.safetensors", t, p, d);
                lo = 8 + 2 + 4 * optim_elems[d];
                rc = check_file_entry(files, name, lo, lo + CKPT_MAX_SHARD_HEADER, why, path, err, err_len);
            }
        }
        param_table_free(&tab);
    }
    if (rc == 0 && corpus) {
        rc = check_file_entry(files, "spm.model", 1, CKPT_JSON_EXACT_MAX, "a tokenizer", path, err, err_len);
        listed++;
    }
    if (rc == 0 && cJSON_GetArraySize(files) != listed) {
        const cJSON *e;
        cJSON_ArrayForEach(e, files) {
            int t, p, d;
            char tail;
            bool known = (sscanf(e->string, "model-tp%d-pp%d.safetensor%c", &t, &p, &tail) == 3 && tail == 's' &&
                          t >= 0 && t < tp && p >= 0 && p < pp) ||
                         (sscanf(e->string, "optim-tp%d-pp%d-dp%d.safetensor%c", &t, &p, &d, &tail) == 4 &&
                          tail == 's' && t >= 0 && t < tp && p >= 0 && p < pp && d >= 0 && d < dp) ||
                         (corpus && strcmp(e->string, "spm.model") == 0);
            if (!known) break;
        }
        if (e)
            tp_error_set(err, err_len,
                         "%s: field 'files' lists '%s', which a %s checkpoint of tp %d x dp %d x pp %d does not have",
                         path, e->string, corpus ? "corpus" : "synthetic-task", tp, dp, pp);
        else
            tp_error_set(err, err_len, "%s: field 'files' lists a file twice", path);
        rc = -1;
    }
    free(optim_elems);
    return rc;
}

/* The optional "clock" of a --max-minutes run into st (absent: has_clock 0). */
static int read_clock(const cJSON *o, TrainState *st, const char *path, char *err, size_t err_len) {
    const cJSON *clk = cJSON_GetObjectItemCaseSensitive(o, "clock");
    st->warmup_end_s = -1.0;
    if (!clk) return 0;
    if (!cJSON_IsObject(clk)) {
        tp_error_set(err, err_len, "%s: field 'clock' must be an object", path);
        return -1;
    }
    if (need_real(clk, "clock", "train_seconds", 0.0, false, CKPT_MAX_SECONDS, false, &st->train_s, path, err,
                  err_len) ||
        need_real(clk, "clock", "step_seconds", 0.0, false, CKPT_MAX_SECONDS, false, &st->step_s, path, err, err_len))
        return -1;
    if (cJSON_GetObjectItemCaseSensitive(clk, "warmup_end_seconds") &&
        need_real(clk, "clock", "warmup_end_seconds", 0.0, false, st->train_s, false, &st->warmup_end_s, path, err,
                  err_len))
        return -1;
    st->has_clock = 1;
    return 0;
}

/* data.spm_alpha / spm_nbest: subword sampling (absent before the record: off, left as given). */
static int read_sampling(const cJSON *data, double *alpha, int64_t *nbest, const char *path, char *err,
                         size_t err_len) {
    if (!cJSON_GetObjectItemCaseSensitive(data, "spm_alpha")) return 0;
    return need_real(data, "data", "spm_alpha", 0.0, false, CKPT_MAX_SPM_ALPHA, false, alpha, path, err, err_len) ||
           need_int(data, "data", "spm_nbest", -1, CKPT_MAX_SPM_NBEST, nbest, path, err, err_len);
}

int ckpt_read_manifest(const char *dir, ModelConfig *cfg, int *tp, int *dp, OptimConfig *oc, int *adam_t,
                       TrainState *st, char *err, size_t err_len) {
    char path[4096], why[512];
    cJSON *o = load_manifest(dir, path, sizeof path, err, err_len);
    if (!o) return -1;
    int rc = -1;
    int64_t step, mtp, mdp, mpp, warmup, t, epoch, position, synth_index, seed, spm_nbest = -1;
    double lr, beta1, beta2, eps, wd, clip, spm_alpha = 0.0;
    ModelStage *stages = NULL;
    const cJSON *c = need_object(o, "config", path, err, err_len), *mesh, *opt, *data, *rng, *kind;
    if (!c) goto done;
    char *ctext = cJSON_PrintUnformatted(c);
    int crc = config_from_json(ctext, cfg, why, sizeof why);
    free(ctext);
    if (crc) {
        tp_error_set(err, err_len, "%s: config: %s", path, why);
        goto done;
    }
    if (need_int(o, "", "step", 0, CKPT_MAX_STEP, &step, path, err, err_len) ||
        !(mesh = need_object(o, "mesh", path, err, err_len)) ||
        need_int(mesh, "mesh", "tp", 1, CONFIG_MAX_HEADS, &mtp, path, err, err_len) ||
        need_int(mesh, "mesh", "dp", 1, CKPT_MAX_DP, &mdp, path, err, err_len) ||
        need_int(mesh, "mesh", "pp", 1, CKPT_MAX_PP, &mpp, path, err, err_len) ||
        !(opt = need_object(o, "optimizer", path, err, err_len)) ||
        need_real(opt, "optimizer", "lr", 0.0, true, INFINITY, true, &lr, path, err, err_len) ||
        need_int(opt, "optimizer", "warmup", 0, CKPT_MAX_WARMUP, &warmup, path, err, err_len) ||
        need_real(opt, "optimizer", "beta1", 0.0, false, 1.0, true, &beta1, path, err, err_len) ||
        need_real(opt, "optimizer", "beta2", 0.0, false, 1.0, true, &beta2, path, err, err_len) ||
        need_real(opt, "optimizer", "eps", 0.0, true, INFINITY, true, &eps, path, err, err_len) ||
        need_real(opt, "optimizer", "weight_decay", 0.0, false, INFINITY, true, &wd, path, err, err_len) ||
        need_real(opt, "optimizer", "clip_norm", -INFINITY, true, INFINITY, true, &clip, path, err, err_len) ||
        need_int(opt, "optimizer", "t", 0, CKPT_MAX_STEP, &t, path, err, err_len) ||
        !(data = need_object(o, "data", path, err, err_len)) ||
        need_int(data, "data", "epoch", 0, CKPT_JSON_EXACT_MAX, &epoch, path, err, err_len) ||
        need_int(data, "data", "position", 0, CKPT_MAX_POSITION, &position, path, err, err_len) ||
        need_int(data, "data", "synth_index", 0, CKPT_JSON_EXACT_MAX, &synth_index, path, err, err_len) ||
        !(kind = need(data, "data", "kind", path, err, err_len)) ||
        !(rng = need_object(o, "rng", path, err, err_len)) ||
        need_int(rng, "rng", "seed", 0, CKPT_MAX_SEED, &seed, path, err, err_len) ||
        read_sampling(data, &spm_alpha, &spm_nbest, path, err, err_len))
        goto done;
    const bool corpus = cJSON_IsString(kind) && strcmp(kind->valuestring, "corpus") == 0;
    if (!corpus && !(cJSON_IsString(kind) && strcmp(kind->valuestring, "synthetic") == 0)) {
        tp_error_set(err, err_len, "%s: field 'data.kind' must be \"corpus\" or \"synthetic\"", path);
        goto done;
    }
    /* data.task: the synthetic task (absent before the record, and for a corpus) */
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(data, "task");
    if (task && (corpus || !cJSON_IsString(task) ||
                 (strcmp(task->valuestring, "copy") != 0 && strcmp(task->valuestring, "reverse") != 0))) {
        tp_error_set(err, err_len, "%s: field 'data.task' must be \"copy\" or \"reverse\", and only for a synthetic run",
                     path);
        goto done;
    }
    if (t != step) {
        tp_error_set(err, err_len, "%s: field 'optimizer.t' is %lld but 'step' is %lld: they must agree", path,
                     (long long)t, (long long)step);
        goto done;
    }
    if (mtp * mdp * mpp > CKPT_MAX_WORLD || cfg->n_heads % mtp || cfg->d_ff % mtp) {
        tp_error_set(err, err_len, "%s: mesh tp %lld x dp %lld x pp %lld is not a layout of this model (tp must "
                     "divide n_heads %d and d_ff %d; at most %d ranks)", path, (long long)mtp, (long long)mdp,
                     (long long)mpp, cfg->n_heads, cfg->d_ff, CKPT_MAX_WORLD);
        goto done;
    }
    int64_t zero = 0, bucket_elems = 1;  // absent: whole tensors (checkpoints before ZeRO, or ZeRO-0)
    if (cJSON_GetObjectItemCaseSensitive(opt, "zero_stage") &&
        (need_int(opt, "optimizer", "zero_stage", 1, 2, &zero, path, err, err_len) ||
         need_int(opt, "optimizer", "zero_bucket_elems", 1, CKPT_JSON_EXACT_MAX, &bucket_elems, path, err, err_len)))
        goto done;
    /* The stages: given as text when pp > 1 (absent before pipelining), the whole stack otherwise. */
    stages = TP_MALLOC((size_t)mpp * sizeof *stages);
    char layout[CKPT_MAX_LAYOUT];
    if (mpp > 1) {
        const cJSON *sj = need(mesh, "mesh", "stages", path, err, err_len);
        if (!sj) goto done;
        if (!cJSON_IsString(sj) || strlen(sj->valuestring) >= sizeof layout) {
            tp_error_set(err, err_len, "%s: field 'mesh.stages' is not a layout text of at most %d characters", path,
                         CKPT_MAX_LAYOUT - 1);
            goto done;
        }
        if (model_stages_make(cfg, (int)mpp, sj->valuestring, stages, why, sizeof why)) {
            tp_error_set(err, err_len, "%s: field 'mesh.stages' does not fit the config: %s", path, why);
            goto done;
        }
    } else {
        stages[0] = model_stage_whole(cfg);
    }
    model_stages_format(stages, (int)mpp, layout, sizeof layout);
    if (check_files(cJSON_GetObjectItemCaseSensitive(o, "files"), cfg, (int)mtp, (int)mdp, stages, (int)mpp,
                    (int)zero, (size_t)bucket_elems, corpus, path, err, err_len))
        goto done;
    if (tp) *tp = (int)mtp;
    if (dp) *dp = (int)mdp;
    if (oc) *oc = (OptimConfig){.lr = (float)lr, .warmup = (int)warmup, .beta1 = (float)beta1, .beta2 = (float)beta2,
                                .eps = (float)eps, .weight_decay = (float)wd, .clip_norm = (float)clip};
    if (adam_t) *adam_t = (int)t;
    if (st) {
        memset(st, 0, sizeof *st);
        st->step = step;
        st->seed = (uint64_t)seed;
        st->cursor = (DataCursor){.seed = (uint64_t)seed, .epoch = epoch, .position = position};
        st->synth_index = (uint64_t)synth_index;
        st->corpus = corpus;
        st->spm_alpha = spm_alpha;
        st->spm_nbest = (int)spm_nbest;
        if (task) snprintf(st->task, sizeof st->task, "%s", task->valuestring);
        st->zero_stage = (int)zero;
        st->zero_bucket_elems = (uint64_t)bucket_elems;
        st->pp = (int)mpp;
        snprintf(st->pp_layout, sizeof st->pp_layout, "%s", layout);
        if (read_clock(o, st, path, err, err_len)) goto done;
    }
    rc = 0;
done:
    free(stages);
    cJSON_Delete(o);
    return rc;
}

int ckpt_manifest_entry(const struct cJSON *e, const char *dir, double *n_bytes, const char **crc, char *err,
                        size_t err_len) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "crc32c");
    if (!cJSON_IsNumber(b) || !cJSON_IsString(c)) {
        tp_error_set(err, err_len, "%s/manifest.json: file '%s' is not listed with its bytes and crc32c", dir,
                     e->string);
        return -1;
    }
    *n_bytes = b->valuedouble;
    *crc = c->valuestring;
    return 0;
}

/* Streams dir/NAME (a regular file: a FIFO or device is refused at open)
 * through CRC-32C in constant memory and compares size and CRC with the
 * manifest entry e (named NAME). */
static int verify_entry(const char *dir, const cJSON *e, char *err, size_t err_len) {
    double want_bytes;
    const char *want_crc;
    if (ckpt_manifest_entry(e, dir, &want_bytes, &want_crc, err, err_len)) return -1;
    char path[4096], why[1024];
    pathf(path, sizeof path, "%s/%s", dir, e->string);
    int fd = tp_open_regular(path, NULL, why, sizeof why);
    if (fd < 0) {
        tp_error_set(err, err_len, "%s; the manifest lists it", why);
        return -1;
    }
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = TP_MALLOC(CHUNK);
    uint32_t crc = 0;
    size_t n_bytes = 0;
    ssize_t got;
    while ((got = read(fd, buf, CHUNK)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        crc = crc32c(crc, buf, (size_t)got);
        n_bytes += (size_t)got;
    }
    const int bad_read = got < 0 ? errno : 0;
    close(fd);
    free(buf);
    if (bad_read) {
        tp_error_set(err, err_len, "%s: read error (%s)", path, strerror(bad_read));
        return -1;
    }
    if ((double)n_bytes != want_bytes) {
        tp_error_set(err, err_len, "%s: %zu bytes, the manifest says %.0f (truncated or replaced)", path, n_bytes,
                     want_bytes);
        return -1;
    }
    char have[16];
    snprintf(have, sizeof have, "%08x", crc);
    if (strcmp(have, want_crc) != 0) {
        tp_error_set(err, err_len, "%s: CRC-32C %s, the manifest says %s (corrupted)", path, have, want_crc);
        return -1;
    }
    return 0;
}

int ckpt_verify_file(const char *dir, const struct cJSON *files, const char *name, char *err, size_t err_len) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, name);
    if (!e) {
        tp_error_set(err, err_len, "%s/manifest.json: '%s' is not listed", dir, name);
        return -1;
    }
    return verify_entry(dir, e, err, err_len);
}

int ckpt_check_tokenizer(const char *dir, const char *spm_path, char *err, size_t err_len) {
    char path[4096];
    cJSON *o = load_manifest(dir, path, sizeof path, err, err_len);
    if (!o) return -1;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, "spm.model");
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(e, "bytes");
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(e, "crc32c");
    int rc = -1;
    if (!cJSON_IsNumber(bytes) || !cJSON_IsString(crc)) {
        tp_error_set(err, err_len, "%s: the checkpoint lists no tokenizer (spm.model), so it was not trained on a corpus",
                     path);
        goto done;
    }
    /* the checkpoint's own copy, as a load checks every file it relies on */
    if (verify_entry(dir, e, err, err_len)) goto done;
    size_t n = 0;
    char have[16];
    if (file_crc(spm_path, &n, have, err, err_len)) goto done;
    if ((double)n != bytes->valuedouble || strcmp(have, crc->valuestring) != 0) {
        tp_error_set(err, err_len,
                     "%s was trained with another tokenizer: its spm.model (%.0f bytes, crc32c %s) is not %s (%zu "
                     "bytes, crc32c %s) that this run tokenizes with; use the --data and --cache-dir it was trained "
                     "with", dir, bytes->valuedouble, crc->valuestring, spm_path, n, have);
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(o);
    return rc;
}

int ckpt_check_save_folder(const char *save_dir, const ModelConfig *cfg, bool corpus, const char *spm_path, char *err,
                           size_t err_len) {
    char export_config[4096];
    pathf(export_config, sizeof export_config, "%s/config.json", save_dir);
    if (access(export_config, F_OK) == 0) {
        tp_error_set(err, err_len,
                     "%s holds an exported model (config.json): checkpoints saved beside it would leave a folder "
                     "whose model a loader cannot tell apart, and the export stale; save into another folder",
                     save_dir);
        return -1;
    }
    int64_t *steps;
    const int n = list_steps(save_dir, &steps);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char name[64], dir[4096], why[1024];
        step_name(name, sizeof name, steps[i]);
        pathf(dir, sizeof dir, "%s/%s", save_dir, name);
        struct stat sb;
        /* a torn save (never published: the next save replaces it) or a link
         * to a folder elsewhere (never the run's own: saving removes only the
         * link) is not a checkpoint of this folder; one whose manifest cannot
         * be read cannot be compared (loading it says why) */
        if (!is_checkpoint(dir) || lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        ModelConfig theirs;
        TrainState st;
        if (ckpt_read_manifest(dir, &theirs, NULL, NULL, NULL, NULL, &st, why, sizeof why)) continue;
        if (config_diff(&theirs, "the checkpoint", cfg, "this run", why, sizeof why)) {
            tp_error_set(err, err_len, "--save %s holds %s of another model (%s): save into another folder, or "
                         "remove those checkpoints first; nothing was trained", save_dir, name, why);
            rc = -1;
        } else if (st.corpus != corpus) {
            tp_error_set(err, err_len, "--save %s holds %s of a %s run, this run trains on a %s: save into another "
                         "folder; nothing was trained", save_dir, name, st.corpus ? "corpus" : "synthetic-task",
                         corpus ? "corpus" : "synthetic task");
            rc = -1;
        } else if (corpus && ckpt_check_tokenizer(dir, spm_path, why, sizeof why)) {
            tp_error_set(err, err_len, "--save %s holds %s of another model: %s; save into another folder; nothing "
                         "was trained", save_dir, name, why);
            rc = -1;
        }
    }
    free(steps);
    return rc;
}
