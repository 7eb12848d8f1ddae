/* checkpoint.c: sharded save, validated load with resharding, and the
 * crash-safety protocol of checkpoint.h.
 *
 * Writers: the dp-rank-0 member of every tp group writes its model shard;
 * every rank writes the optimizer tensors dealt to its dp rank (the state is
 * replicated across dp, so the writing is shared out). Rank 0 then re-reads
 * every file from disk to record its size and CRC-32C in the manifest (so
 * the manifest vouches for the bytes that landed, not for a buffer), writes
 * the manifest and publishes the directory.
 *
 * Loading needs no communication: every rank reads the shards it needs,
 * reassembles each whole tensor from the old layout's labels and cuts its
 * own shard of the new layout.
 */
#include "tp/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "safetensors.h"
#include "transformer/export.h"

/* ---- fault hook ------------------------------------------------------------ */

int ckpt_fault_point(const char *what) {
    static int passed = 0; /* per process: counts this rank's save points */
    passed++;
    const char *target = getenv("TPTRAIN_FAULT_POINT");
    if (!target) return passed;
    const char *rank_s = getenv("TPTRAIN_FAULT_RANK");
    int want_rank = rank_s ? atoi(rank_s) : 0, rank = tp_log_rank() < 0 ? 0 : tp_log_rank();
    if (rank == want_rank && passed == atoi(target)) {
        fprintf(stderr, "fault injection: killing rank %d at save point %d (%s)\n", rank, passed, what);
        fflush(stderr);
        raise(SIGKILL);
    }
    return passed;
}

/* ---- small file helpers ------------------------------------------------------ */

/* snprintf for paths: a path that does not fit is a fatal error, never a
 * silently truncated name. */
__attribute__((format(printf, 3, 4))) static void pathf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    TP_CHECK(k >= 0 && (size_t)k < n, "path too long: %s...", out);
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        pathf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(path);
        else unlink(path);
    }
    closedir(d);
    return rmdir(dir);
}

static void step_name(char *buf, size_t n, int64_t step) { snprintf(buf, n, "step_%08lld", (long long)step); }

/* Removes a checkpoint directory so that a crash halfway never leaves a
 * directory that still looks complete: it is first renamed to a name that
 * resolution ignores, then deleted. */
static int discard_checkpoint(const char *path) {
    char aside[4096];
    pathf(aside, sizeof aside, "%s.discard", path);
    remove_tree(aside);
    if (rename(path, aside) != 0) return errno == ENOENT ? 0 : -1;
    return remove_tree(aside);
}

/* ---- save --------------------------------------------------------------------- */

static int agree(const Runtime *rt, int ok, char *err, size_t err_len) {
    /* Every rank learns whether all succeeded (MAX of the failure flags). */
    float bad = ok ? 0.0f : 1.0f;
    if (comm_allreduce(rt->ctrl, &bad, 1, COMM_MAX)) {
        tp_error_set(err, err_len, "%s", comm_error(rt->ctrl));
        return -1;
    }
    if (bad != 0.0f && ok) tp_error_set(err, err_len, "another rank failed to write its part of the checkpoint");
    return bad == 0.0f ? 0 : -1;
}

static char *shard_meta_json(const Model *m) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < m->tab.n; i++) {
        const ParamInfo *p = &m->tab.t[i];
        cJSON *t = cJSON_AddObjectToObject(o, p->name);
        cJSON_AddStringToObject(t, "split", split_label_name(p->split));
        cJSON *g = cJSON_AddArrayToObject(t, "global_shape");
        for (int d = 0; d < p->ndim; d++) cJSON_AddItemToArray(g, cJSON_CreateNumber(p->shape[d]));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void add_shard_meta(StWriter *w, const Runtime *rt, const char *kind, const char *tensors_json) {
    char buf[32];
    st_writer_meta(w, "format", kind);
    snprintf(buf, sizeof buf, "%d", CKPT_FORMAT_VERSION);
    st_writer_meta(w, "format_version", buf);
    snprintf(buf, sizeof buf, "%d", rt->mesh.tp_rank);
    st_writer_meta(w, "tp_rank", buf);
    snprintf(buf, sizeof buf, "%d", rt->mesh.tp);
    st_writer_meta(w, "tp_size", buf);
    st_writer_meta(w, "tensors", tensors_json);
}

static int write_shards(const char *tmp, const Runtime *rt, const Model *m, const AdamW *opt, char *err,
                        size_t err_len) {
    const Mesh *me = &rt->mesh;
    char path[4096];
    char *meta = shard_meta_json(m);
    int rc = 0;
    /* host copies of the device buffers (the pointers themselves on the CPU) */
    const float *params = backend_host_view(m->be, m->params, m->tab.n_elems);
    const float *om = backend_host_view(opt->be, opt->m, opt->n_elems);
    const float *ov = backend_host_view(opt->be, opt->v, opt->n_elems);
    if (me->dp_rank == 0) {
        StWriter *w = st_writer_new();
        add_shard_meta(w, rt, "tptrain-checkpoint-model", meta);
        for (int i = 0; i < m->tab.n; i++) {
            const ParamInfo *p = &m->tab.t[i];
            int64_t shape[2] = {p->local[0], p->local[1]};
            st_writer_add(w, p->name, ST_F32, p->ndim, shape, params + p->offset);
        }
        pathf(path, sizeof path, "%s/model-tp%d-pp%d.safetensors", tmp, me->tp_rank, me->pp_rank);
        ckpt_fault_point("before a model shard");
        rc = st_writer_write(w, path, err, err_len);
        st_writer_free(w);
        ckpt_fault_point("after a model shard");
    }
    if (rc == 0) {
        StWriter *w = st_writer_new();
        add_shard_meta(w, rt, "tptrain-checkpoint-optim", meta);
        char (*names)[112] = TP_MALLOC((size_t)(2 * m->tab.n + 1) * sizeof *names);
        int k = 0;
        for (int i = 0; i < m->tab.n; i++) {
            if (i % me->dp != me->dp_rank) continue;
            const ParamInfo *p = &m->tab.t[i];
            int64_t shape[2] = {p->local[0], p->local[1]};
            snprintf(names[k], sizeof names[k], "exp_avg.%s", p->name);
            st_writer_add(w, names[k++], ST_F32, p->ndim, shape, om + p->offset);
            snprintf(names[k], sizeof names[k], "exp_avg_sq.%s", p->name);
            st_writer_add(w, names[k++], ST_F32, p->ndim, shape, ov + p->offset);
        }
        pathf(path, sizeof path, "%s/optim-tp%d-pp%d-dp%d.safetensors", tmp, me->tp_rank, me->pp_rank,
                 me->dp_rank);
        ckpt_fault_point("before an optimizer shard");
        rc = st_writer_write(w, path, err, err_len);
        st_writer_free(w);
        free(names);
        ckpt_fault_point("after an optimizer shard");
    }
    backend_host_view_free(params, m->params);
    backend_host_view_free(om, opt->m);
    backend_host_view_free(ov, opt->v);
    free(meta);
    return rc;
}

static cJSON *file_entry(const char *dir, const char *name, char *err, size_t err_len) {
    char path[4096];
    pathf(path, sizeof path, "%s/%s", dir, name);
    size_t n = 0;
    uint8_t *bytes = read_file_bytes(path, &n, err, err_len);
    if (!bytes) return NULL;
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", crc32c(0, bytes, n));
    free(bytes);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "bytes", (double)n);
    cJSON_AddStringToObject(e, "crc32c", crc);
    return e;
}

static int write_manifest(const char *tmp, const Runtime *rt, const Model *m, const AdamW *opt, const TrainState *st,
                          bool has_spm, char *err, size_t err_len) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "tptrain-checkpoint");
    cJSON_AddNumberToObject(o, "format_version", CKPT_FORMAT_VERSION);
    cJSON_AddNumberToObject(o, "step", (double)st->step);
    char *cj = config_to_json(&m->cfg);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cj));
    free(cj);
    cJSON *mesh = cJSON_AddObjectToObject(o, "mesh");
    cJSON_AddNumberToObject(mesh, "tp", rt->mesh.tp);
    cJSON_AddNumberToObject(mesh, "dp", rt->mesh.dp);
    cJSON_AddNumberToObject(mesh, "pp", rt->mesh.pp);
    cJSON *oc = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddStringToObject(oc, "name", "adamw");
    cJSON_AddNumberToObject(oc, "lr", opt->cfg.lr);
    cJSON_AddNumberToObject(oc, "warmup", opt->cfg.warmup);
    cJSON_AddNumberToObject(oc, "beta1", opt->cfg.beta1);
    cJSON_AddNumberToObject(oc, "beta2", opt->cfg.beta2);
    cJSON_AddNumberToObject(oc, "eps", opt->cfg.eps);
    cJSON_AddNumberToObject(oc, "weight_decay", opt->cfg.weight_decay);
    cJSON_AddNumberToObject(oc, "clip_norm", opt->cfg.clip_norm);
    cJSON_AddNumberToObject(oc, "t", opt->t);
    cJSON_AddStringToObject(oc, "schedule", "linear warmup, then inverse square root of the step");
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    cJSON_AddStringToObject(data, "kind", st->corpus ? "corpus" : "synthetic");
    cJSON_AddNumberToObject(data, "epoch", (double)st->cursor.epoch);
    cJSON_AddNumberToObject(data, "position", (double)st->cursor.position);
    cJSON_AddNumberToObject(data, "synth_index", (double)st->synth_index);
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddNumberToObject(rng, "seed", (double)st->seed);
    cJSON_AddStringToObject(rng, "scheme", "philox4x32-10 keyed by (seed, step, micro-batch, layer, site)");
    cJSON *files = cJSON_AddObjectToObject(o, "files");
    char name[128];
    int rc = 0;
    for (int t = 0; t < rt->mesh.tp && rc == 0; t++) {
        snprintf(name, sizeof name, "model-tp%d-pp0.safetensors", t);
        cJSON *e = file_entry(tmp, name, err, err_len);
        if (!e) rc = -1;
        else cJSON_AddItemToObject(files, name, e);
        for (int d = 0; d < rt->mesh.dp && rc == 0; d++) {
            snprintf(name, sizeof name, "optim-tp%d-pp0-dp%d.safetensors", t, d);
            e = file_entry(tmp, name, err, err_len);
            if (!e) rc = -1;
            else cJSON_AddItemToObject(files, name, e);
        }
    }
    if (rc == 0 && has_spm) {
        cJSON *e = file_entry(tmp, "spm.model", err, err_len);
        if (!e) rc = -1;
        else cJSON_AddItemToObject(files, "spm.model", e);
    }
    if (rc == 0) {
        char *text = cJSON_Print(o);
        char path[4096];
        pathf(path, sizeof path, "%s/manifest.json", tmp);
        ckpt_fault_point("before the manifest");
        rc = write_file_atomic(path, text, strlen(text), err, err_len);
        ckpt_fault_point("after the manifest");
        free(text);
    }
    cJSON_Delete(o);
    return rc;
}

/* Step directories in dir, newest first (caller frees). */
static int list_steps(const char *dir, int64_t **steps_out) {
    DIR *d = opendir(dir);
    *steps_out = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    int64_t *steps = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step_%lld%c", &s, &tail) != 1) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            steps = realloc(steps, (size_t)cap * sizeof *steps);
            TP_CHECK(steps, "out of memory listing %s", dir);
        }
        steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // newest first
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    *steps_out = steps;
    return n;
}

static int publish(const char *dir, const char *tmp, int64_t step, int keep_last, char *err, size_t err_len) {
    char final[4096], name[64], path[4096], latest_tmp[4096];
    step_name(name, sizeof name, step);
    pathf(final, sizeof final, "%s/%s", dir, name);
    ckpt_fault_point("before syncing the directory");
    if (fsync_path(tmp) != 0) {
        tp_error_set(err, err_len, "%s: cannot sync (%s)", tmp, strerror(errno));
        return -1;
    }
    discard_checkpoint(final);  // a step saved again (e.g. after a resume from an older one)
    ckpt_fault_point("before renaming the directory");
    if (rename(tmp, final) != 0 || fsync_path(dir) != 0) {
        tp_error_set(err, err_len, "%s: cannot publish the checkpoint (%s)", final, strerror(errno));
        return -1;
    }
    ckpt_fault_point("after renaming the directory");
    pathf(path, sizeof path, "%s/latest", dir);
    pathf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", dir);
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    ckpt_fault_point("before updating latest");
    if (write_file_atomic(path, line, strlen(line), err, err_len) != 0 || fsync_path(dir) != 0) return -1;
    ckpt_fault_point("after updating latest");
    if (keep_last > 0) {
        int64_t *steps;
        int n = list_steps(dir, &steps);
        int kept = 0;
        for (int i = 0; i < n; i++) {
            char sd[64];
            step_name(sd, sizeof sd, steps[i]);
            pathf(path, sizeof path, "%s/%s/manifest.json", dir, sd);
            bool complete = access(path, F_OK) == 0;
            if (complete && kept < keep_last) {
                kept++;
                continue;
            }
            if (!complete) continue;  // left for the user to inspect; resume ignores it
            pathf(path, sizeof path, "%s/%s", dir, sd);
            ckpt_fault_point("before pruning an old checkpoint");
            discard_checkpoint(path);
        }
        free(steps);
    }
    /* Leftovers of discards a crash interrupted. */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "step_", 5) == 0 && len > 8 && strcmp(e->d_name + len - 8, ".discard") == 0) {
            pathf(path, sizeof path, "%s/%s", dir, e->d_name);
            remove_tree(path);
        }
    }
    if (d) closedir(d);
    fsync_path(dir);
    return 0;
}

int ckpt_save(const char *dir, const Runtime *rt, const Model *m, const AdamW *opt, const TrainState *st,
              const char *spm_path, int keep_last, char *err, size_t err_len) {
    const bool lead = rt->mesh.rank == 0;
    char tmp[4096], name[64];
    step_name(name, sizeof name, st->step);
    pathf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    ckpt_fault_point("start of a save");
    int ok = 1;
    if (lead) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            tp_error_set(err, err_len, "%s: cannot create the checkpoint folder (%s)", dir, strerror(errno));
            ok = 0;
        } else {
            remove_tree(tmp);  // left by a crashed save of the same step
            if (mkdir(tmp, 0755) != 0) {
                tp_error_set(err, err_len, "%s: cannot create (%s)", tmp, strerror(errno));
                ok = 0;
            }
        }
    }
    if (agree(rt, ok, err, err_len)) return -1;
    ok = write_shards(tmp, rt, m, opt, err, err_len) == 0;
    if (ok && lead && spm_path) {
        char to[4096];
        pathf(to, sizeof to, "%s/spm.model", tmp);
        ckpt_fault_point("before the tokenizer");
        ok = copy_file_atomic(spm_path, to, err, err_len) == 0;
    }
    if (agree(rt, ok, err, err_len)) return -1;
    if (lead) {
        ok = write_manifest(tmp, rt, m, opt, st, spm_path != NULL, err, err_len) == 0 &&
             publish(dir, tmp, st->step, keep_last, err, err_len) == 0;
    }
    return agree(rt, ok, err, err_len);
}

/* ---- resolve ------------------------------------------------------------------ */

static bool is_checkpoint(const char *dir) {
    char path[4096];
    pathf(path, sizeof path, "%s/manifest.json", dir);
    return access(path, F_OK) == 0;
}

int ckpt_resolve(const char *arg, char *out, size_t out_len, char *err, size_t err_len) {
    struct stat sb;
    if (stat(arg, &sb) != 0) {
        if (errno == ENOENT) return 0;
        tp_error_set(err, err_len, "%s: %s", arg, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        tp_error_set(err, err_len, "%s: not a directory", arg);
        return -1;
    }
    if (is_checkpoint(arg)) {
        snprintf(out, out_len, "%s", arg);
        return 1;
    }
    char path[4096];
    pathf(path, sizeof path, "%s/latest", arg);
    char *latest = read_text_file(path, err, err_len);
    if (latest) {
        latest[strcspn(latest, "\r\n")] = '\0';
        pathf(path, sizeof path, "%s/%s", arg, latest);
        bool ok = strchr(latest, '/') == NULL && is_checkpoint(path);
        free(latest);
        if (ok) {
            snprintf(out, out_len, "%s", path);
            return 1;
        }
        fprintf(stderr, "checkpoint: %s/latest names an incomplete checkpoint; looking for the newest complete one\n",
                arg);
    }
    int64_t *steps;
    int n = list_steps(arg, &steps);
    int found = 0;
    for (int i = 0; i < n && !found; i++) {
        char name[64];
        step_name(name, sizeof name, steps[i]);
        pathf(path, sizeof path, "%s/%s", arg, name);
        if (is_checkpoint(path)) {
            snprintf(out, out_len, "%s", path);
            found = 1;
        } else {
            fprintf(stderr, "checkpoint: skipping %s: incomplete (no manifest.json)\n", path);
        }
    }
    free(steps);
    DIR *d = opendir(arg);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0 && strncmp(e->d_name, "step_", 5) == 0)
            fprintf(stderr, "checkpoint: ignoring %s/%s: a save that did not finish\n", arg, e->d_name);
    }
    if (d) closedir(d);
    return found;
}

/* ---- manifest ----------------------------------------------------------------- */

static const cJSON *need(const cJSON *o, const char *key, const char *path, char *err, size_t err_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) tp_error_set(err, err_len, "%s: field '%s' is missing", path, key);
    return v;
}

static int need_num(const cJSON *o, const char *key, double *out, const char *path, char *err, size_t err_len) {
    const cJSON *v = need(o, key, path, err, err_len);
    if (!v) return -1;
    if (!cJSON_IsNumber(v)) {
        tp_error_set(err, err_len, "%s: field '%s' is not a number", path, key);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static cJSON *load_manifest(const char *dir, char *path, size_t path_len, char *err, size_t err_len) {
    snprintf(path, path_len, "%s/manifest.json", dir);
    char *text = read_text_file(path, err, err_len);
    if (!text) return NULL;
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        tp_error_set(err, err_len, "%s: not valid JSON", path);
        return NULL;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    double version = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tptrain-checkpoint") != 0) {
        tp_error_set(err, err_len, "%s: field 'format' is not \"tptrain-checkpoint\"", path);
    } else if (need_num(o, "format_version", &version, path, err, err_len) == 0 && version != CKPT_FORMAT_VERSION) {
        tp_error_set(err, err_len, "%s: field 'format_version' is %g, this build reads version %d", path, version,
                     CKPT_FORMAT_VERSION);
    } else if (version == CKPT_FORMAT_VERSION) {
        return o;
    }
    cJSON_Delete(o);
    return NULL;
}

int ckpt_read_manifest(const char *dir, ModelConfig *cfg, int *tp, int *dp, OptimConfig *oc, int *adam_t,
                       TrainState *st, char *err, size_t err_len) {
    char path[4096], why[512];
    cJSON *o = load_manifest(dir, path, sizeof path, err, err_len);
    if (!o) return -1;
    int rc = -1;
    double step, mtp, mdp, mpp, v[12];
    const cJSON *c = need(o, "config", path, err, err_len), *mesh, *opt, *data, *rng;
    if (!c) goto done;
    char *ctext = cJSON_PrintUnformatted(c);
    int crc = config_from_json(ctext, cfg, why, sizeof why);
    free(ctext);
    if (crc) {
        tp_error_set(err, err_len, "%s: config: %s", path, why);
        goto done;
    }
    if (need_num(o, "step", &step, path, err, err_len) || !(mesh = need(o, "mesh", path, err, err_len)) ||
        need_num(mesh, "tp", &mtp, path, err, err_len) || need_num(mesh, "dp", &mdp, path, err, err_len) ||
        need_num(mesh, "pp", &mpp, path, err, err_len) || !(opt = need(o, "optimizer", path, err, err_len)) ||
        need_num(opt, "lr", &v[0], path, err, err_len) || need_num(opt, "warmup", &v[1], path, err, err_len) ||
        need_num(opt, "beta1", &v[2], path, err, err_len) || need_num(opt, "beta2", &v[3], path, err, err_len) ||
        need_num(opt, "eps", &v[4], path, err, err_len) || need_num(opt, "weight_decay", &v[5], path, err, err_len) ||
        need_num(opt, "clip_norm", &v[6], path, err, err_len) || need_num(opt, "t", &v[7], path, err, err_len) ||
        !(data = need(o, "data", path, err, err_len)) || need_num(data, "epoch", &v[8], path, err, err_len) ||
        need_num(data, "position", &v[9], path, err, err_len) ||
        need_num(data, "synth_index", &v[10], path, err, err_len) || !(rng = need(o, "rng", path, err, err_len)) ||
        need_num(rng, "seed", &v[11], path, err, err_len) || !need(o, "files", path, err, err_len))
        goto done;
    if (step < 0 || mtp < 1 || mdp < 1 || mpp != 1 || v[7] != step) {
        tp_error_set(err, err_len, "%s: step %g, mesh %gx%gx%g and optimizer step %g are inconsistent", path, step, mtp,
                     mdp, mpp, v[7]);
        goto done;
    }
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(data, "kind");
    if (tp) *tp = (int)mtp;
    if (dp) *dp = (int)mdp;
    if (oc) *oc = (OptimConfig){.lr = (float)v[0], .warmup = (int)v[1], .beta1 = (float)v[2], .beta2 = (float)v[3],
                                .eps = (float)v[4], .weight_decay = (float)v[5], .clip_norm = (float)v[6]};
    if (adam_t) *adam_t = (int)v[7];
    if (st) {
        memset(st, 0, sizeof *st);
        st->step = (int64_t)step;
        st->seed = (uint64_t)v[11];
        st->cursor = (DataCursor){.seed = (uint64_t)v[11], .epoch = (int64_t)v[8], .position = (int64_t)v[9]};
        st->synth_index = (uint64_t)v[10];
        st->corpus = cJSON_IsString(kind) && strcmp(kind->valuestring, "corpus") == 0;
    }
    rc = 0;
done:
    cJSON_Delete(o);
    return rc;
}

/* ---- load ---------------------------------------------------------------------- */

/* Reads one file listed in the manifest, checking size and CRC against it. */
static int read_listed(const char *dir, const cJSON *files, const char *name, StFile *f, char *err, size_t err_len) {
    char path[4096];
    pathf(path, sizeof path, "%s/%s", dir, name);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, name);
    const cJSON *bytes = e ? cJSON_GetObjectItemCaseSensitive(e, "bytes") : NULL;
    const cJSON *crc = e ? cJSON_GetObjectItemCaseSensitive(e, "crc32c") : NULL;
    if (!cJSON_IsNumber(bytes) || !cJSON_IsString(crc)) {
        tp_error_set(err, err_len, "%s/manifest.json: file '%s' is not listed with its bytes and crc32c", dir, name);
        return -1;
    }
    if (access(path, F_OK) != 0) {
        tp_error_set(err, err_len, "%s: missing (listed in the manifest)", path);
        return -1;
    }
    if (st_read(path, f, err, err_len)) return -1;
    char have[16];
    snprintf(have, sizeof have, "%08x", crc32c(0, f->buffer, f->file_bytes));
    if ((double)f->file_bytes != bytes->valuedouble) {
        tp_error_set(err, err_len, "%s: %zu bytes, the manifest says %.0f (truncated or replaced)", path, f->file_bytes,
                     bytes->valuedouble);
        st_free(f);
        return -1;
    }
    if (strcmp(have, crc->valuestring) != 0) {
        tp_error_set(err, err_len, "%s: CRC-32C %s, the manifest says %s (corrupted)", path, have, crc->valuestring);
        st_free(f);
        return -1;
    }
    return 0;
}

/* Checks a shard file's metadata: its tp rank and each tensor's label and global shape. */
static int check_shard_meta(const StFile *f, const char *path, int tp_rank, int tp_size, const ParamTable *tab,
                            char *err, size_t err_len) {
    const char *r = st_meta(f, "tp_rank"), *s = st_meta(f, "tp_size"), *t = st_meta(f, "tensors");
    if (!r || !s || !t || atoi(r) != tp_rank || atoi(s) != tp_size) {
        tp_error_set(err, err_len, "%s: metadata tp_rank/tp_size missing or not %d/%d", path, tp_rank, tp_size);
        return -1;
    }
    cJSON *o = cJSON_Parse(t);
    int rc = 0;
    for (int i = 0; i < tab->n && rc == 0; i++) {
        const ParamInfo *p = &tab->t[i];
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, p->name);
        const cJSON *split = e ? cJSON_GetObjectItemCaseSensitive(e, "split") : NULL;
        const cJSON *g = e ? cJSON_GetObjectItemCaseSensitive(e, "global_shape") : NULL;
        bool ok = cJSON_IsString(split) && strcmp(split->valuestring, split_label_name(p->split)) == 0 &&
                  cJSON_IsArray(g) && cJSON_GetArraySize(g) == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = cJSON_GetArrayItem(g, d)->valuedouble == p->shape[d];
        if (!ok) {
            tp_error_set(err, err_len, "%s: tensor '%s' is not recorded as %s with global shape of this model", path,
                         p->name, split_label_name(p->split));
            rc = -1;
        }
    }
    cJSON_Delete(o);
    return rc;
}

static const StTensor *shard_tensor(const StFile *f, const char *name, const ParamInfo *old, const char *path,
                                    char *err, size_t err_len) {
    const StTensor *t = st_find(f, name);
    if (!t) {
        tp_error_set(err, err_len, "%s: tensor '%s' is missing", path, name);
        return NULL;
    }
    bool ok = t->dtype == ST_F32 && t->ndim == old->ndim && t->shape[0] == old->local[0] &&
              (old->ndim == 1 || t->shape[1] == old->local[1]);
    if (!ok) {
        char want[48];
        if (old->ndim == 1) snprintf(want, sizeof want, "[%d]", old->local[0]);
        else snprintf(want, sizeof want, "[%d, %d]", old->local[0], old->local[1]);
        tp_error_set(err, err_len, "%s: tensor '%s' is not an F32 shard of shape %s", path, name, want);
        return NULL;
    }
    return t;
}

int ckpt_load(const char *dir, Model *m, AdamW *opt, char *err, size_t err_len) {
    ModelConfig cfg;
    int old_tp, old_dp;
    char path[4096], why[512];
    if (ckpt_read_manifest(dir, &cfg, &old_tp, &old_dp, NULL, NULL, NULL, err, err_len)) return -1;
    pathf(path, sizeof path, "%s/manifest.json", dir);
    if (config_diff(&cfg, &m->cfg, why, sizeof why)) {
        tp_error_set(err, err_len, "%s: the checkpoint's model differs from this run's: %s", path, why);
        return -1;
    }
    cJSON *man = load_manifest(dir, path, sizeof path, err, err_len);
    if (!man) return -1;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(man, "files");
    ParamTable old;
    param_table_build(&cfg, old_tp, &old);
    /* In the saved layout a rank reads only its own shards; another layout
     * reads every shard and re-cuts. File slot t * per_tp + k: k = 0 the
     * model shard of tp rank t, k = 1 + d its optimizer shard of dp rank d. */
    const bool same = old_tp == m->tp.size;
    const int per_tp = 1 + (opt ? old_dp : 0), n_files = old_tp * per_tp;
    StFile *f = TP_CALLOC((size_t)n_files, sizeof *f);
    bool *loaded = TP_CALLOC((size_t)n_files, sizeof *loaded);
    char (*fpath)[4096] = TP_CALLOC((size_t)n_files, sizeof *fpath);
    int rc = -1;
    for (int t = 0; t < old_tp; t++) {
        if (same && t != m->tp.rank) continue;
        for (int k = 0; k < per_tp; k++) {
            char name[128];
            if (k == 0) snprintf(name, sizeof name, "model-tp%d-pp0.safetensors", t);
            else snprintf(name, sizeof name, "optim-tp%d-pp0-dp%d.safetensors", t, k - 1);
            const int fi = t * per_tp + k;
            pathf(fpath[fi], sizeof fpath[0], "%s/%s", dir, name);
            if (read_listed(dir, files, name, &f[fi], err, err_len)) goto done;
            loaded[fi] = true;
            if (check_shard_meta(&f[fi], fpath[fi], t, old_tp, &old, err, err_len)) goto done;
        }
    }
    size_t max_global = 0;
    for (int i = 0; i < old.n; i++)
        max_global = param_global_elems(&old.t[i]) > max_global ? param_global_elems(&old.t[i]) : max_global;
    float *whole = TP_MALLOC(max_global * sizeof(float));
    /* host staging of the device buffers (the pointers themselves on the CPU) */
    float *stage[3] = {backend_host_stage(m->be, m->params, m->tab.n_elems),
                       opt ? backend_host_stage(opt->be, opt->m, opt->n_elems) : NULL,
                       opt ? backend_host_stage(opt->be, opt->v, opt->n_elems) : NULL};
    bool staged_ok = false;
    for (int i = 0; i < old.n; i++) {
        const ParamInfo *op = &old.t[i], *np = &m->tab.t[i];
        /* 0: weights, 1: exp_avg, 2: exp_avg_sq */
        for (int kind = 0; kind < (opt ? 3 : 1); kind++) {
            char name[160];
            if (kind == 0) snprintf(name, sizeof name, "%s", op->name);
            else snprintf(name, sizeof name, "%s.%s", kind == 1 ? "exp_avg" : "exp_avg_sq", op->name);
            memset(whole, 0, param_global_elems(op) * sizeof(float));
            for (int t = 0; t < old_tp; t++) {
                if (same ? t != m->tp.rank : (op->split == SPLIT_REPL && t > 0)) continue;
                const int fi = t * per_tp + (kind == 0 ? 0 : 1 + i % old_dp);
                const StTensor *tt = shard_tensor(&f[fi], name, op, fpath[fi], err, err_len);
                if (!tt) goto unstage;
                shard_place(op, t, (const float *)tt->data, whole);
            }
            shard_extract(np, m->tp.rank, whole, stage[kind] + np->offset);
        }
    }
    staged_ok = true;
unstage:
    free(whole);
    /* a failed load leaves the device buffers as the host stage has them: the caller stops anyway */
    backend_host_commit(m->be, m->params, stage[0], m->tab.n_elems);
    if (opt) {
        backend_host_commit(opt->be, opt->m, stage[1], opt->n_elems);
        backend_host_commit(opt->be, opt->v, stage[2], opt->n_elems);
    }
    backend_recast_weights(m->be);
    if (!staged_ok) goto done;
    if (opt) {
        int t;
        if (ckpt_read_manifest(dir, &cfg, NULL, NULL, NULL, &t, NULL, err, err_len)) goto done;
        opt->t = t;
    }
    rc = 0;
done:
    for (int i = 0; i < n_files; i++)
        if (loaded[i]) st_free(&f[i]);
    free(f);
    free(loaded);
    free(fpath);
    param_table_free(&old);
    cJSON_Delete(man);
    return rc;
}
