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
#include "json_keys.h"
#include "train/checkpoint.h"
#include "train/ckpt_pieces.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
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

/* Deletion never follows a symbolic link: an entry is looked at with
 * lstat semantics (fstatat AT_SYMLINK_NOFOLLOW), a link (to a folder or to
 * anything else) is removed itself, and a directory is entered only through
 * openat(O_NOFOLLOW) relative to its parent, so nothing outside the
 * checkpoint folder is ever deleted, even if an entry is swapped for a link
 * while the walk runs. Checkpoint directories are flat; the depth limit only
 * bounds the recursion. */
#define REMOVE_TREE_MAX_DEPTH 16

static int remove_tree_at(int parent_fd, const char *name, int depth) {
    struct stat st;
    if (fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlinkat(parent_fd, name, 0);
    if (depth >= REMOVE_TREE_MAX_DEPTH) {
        errno = ELOOP;
        return -1;
    }
    int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        remove_tree_at(dirfd(d), e->d_name, depth + 1);
    }
    closedir(d);
    return unlinkat(parent_fd, name, AT_REMOVEDIR);
}

/* Removes path (a file, a link or a directory tree) without following links
 * at or below it. */
static int remove_tree(const char *path) {
    const char *slash = strrchr(path, '/');
    char parent[4096];
    if (!slash) snprintf(parent, sizeof parent, ".");
    else pathf(parent, sizeof parent, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    const char *name = slash ? slash + 1 : path;
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        errno = EINVAL;
        return -1;
    }
    int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    int rc = remove_tree_at(fd, name, 0);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
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

/* Adds the whole moments of the tensors dealt to this dp rank (tensor i
 * goes to rank i % dp) to w, from the host views om, ov; the names live in
 * *names until the file is written (caller frees). */
static void opt_moments_add(StWriter *w, const ParamTable *tab, const Mesh *me, const float *om, const float *ov,
                            char **names_out) {
    char (*names)[112] = TP_MALLOC((size_t)(2 * tab->n + 1) * sizeof *names);
    int k = 0;
    for (int i = 0; i < tab->n; i++) {
        if (i % me->dp != me->dp_rank) continue;
        const ParamInfo *p = &tab->t[i];
        int64_t shape[2] = {p->local[0], p->local[1]};
        snprintf(names[k], sizeof names[k], "exp_avg.%s", p->name);
        st_writer_add(w, names[k++], ST_F32, p->ndim, shape, om + p->offset);
        snprintf(names[k], sizeof names[k], "exp_avg_sq.%s", p->name);
        st_writer_add(w, names[k++], ST_F32, p->ndim, shape, ov + p->offset);
    }
    *names_out = (char *)names;
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
    if (rc == 0) {  // ZeRO: this rank's pieces, as they lie; else the whole moments dealt to it
        StWriter *w = st_writer_new();
        add_shard_meta(w, rt, "tptrain-checkpoint-optim", meta);
        char *names = NULL;
        if (opt->sharded) opt_pieces_add(w, &m->tab, opt, om, ov, &names);
        else opt_moments_add(w, &m->tab, me, om, ov, &names);
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

/* A file's size and CRC-32C (as the manifest writes it: 8 hex digits). 0, or -1 with err set. */
static int file_crc(const char *path, size_t *n, char crc[16], char *err, size_t err_len) {
    uint8_t *bytes = read_file_bytes(path, n, err, err_len);
    if (!bytes) return -1;
    snprintf(crc, 16, "%08x", crc32c(0, bytes, *n));
    free(bytes);
    return 0;
}

static cJSON *file_entry(const char *dir, const char *name, char *err, size_t err_len) {
    char path[4096];
    pathf(path, sizeof path, "%s/%s", dir, name);
    size_t n = 0;
    char crc[16];
    if (file_crc(path, &n, crc, err, err_len)) return NULL;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "bytes", (double)n);
    cJSON_AddStringToObject(e, "crc32c", crc);
    return e;
}

/* ---- the manifest's own checksum ------------------------------------------------ */

/* manifest.json begins with the line MANIFEST_CRC_HEAD + 8 hex digits +
 * MANIFEST_CRC_TAIL; the digits are the CRC-32C of every byte after that
 * line, to the end of the file. The checksum is over the bytes as written,
 * not over a re-serialization, so checking it needs no JSON parser (and
 * cannot depend on how one prints numbers), and it is checked before any
 * field is read. */
#define MANIFEST_CRC_HEAD "{\n\t\"manifest_crc32c\":\t\""
#define MANIFEST_CRC_TAIL "\",\n"
#define MANIFEST_CRC_LINE_BYTES (sizeof MANIFEST_CRC_HEAD - 1 + 8 + sizeof MANIFEST_CRC_TAIL - 1)
/* A manifest lists a few hundred files at most; anything past this is not one. */
#define MANIFEST_MAX_BYTES (64u << 20)

/* The manifest text with its checksum line first (caller frees). */
static char *sealed_manifest(const cJSON *o) {
    char *body = cJSON_Print(o); /* "{\n\t\"format\": ..." */
    TP_CHECK(body && strncmp(body, "{\n\t", 3) == 0, "cJSON_Print did not print the manifest as expected");
    const char *rest = body + 2; /* from the first member on */
    const size_t n_rest = strlen(rest);
    char *out = TP_MALLOC(MANIFEST_CRC_LINE_BYTES + n_rest + 1);
    snprintf(out, MANIFEST_CRC_LINE_BYTES + 1, MANIFEST_CRC_HEAD "%08x" MANIFEST_CRC_TAIL, crc32c(0, rest, n_rest));
    memcpy(out + MANIFEST_CRC_LINE_BYTES, rest, n_rest + 1);
    cJSON_free(body);
    return out;
}

/* 0 when text (n bytes) carries a checksum line that matches the rest. */
static int check_manifest_seal(const char *text, size_t n, const char *path, char *err, size_t err_len) {
    const size_t head = sizeof MANIFEST_CRC_HEAD - 1;
    bool hex = n >= MANIFEST_CRC_LINE_BYTES && memcmp(text, MANIFEST_CRC_HEAD, head) == 0 &&
               memcmp(text + head + 8, MANIFEST_CRC_TAIL, sizeof MANIFEST_CRC_TAIL - 1) == 0;
    for (size_t i = 0; hex && i < 8; i++) hex = strchr("0123456789abcdef", text[head + i]) && text[head + i];
    if (!hex) {
        tp_error_set(err, err_len,
                     "%s: refused: it does not begin with its \"manifest_crc32c\" line, so its fields cannot be "
                     "trusted (a checkpoint of format version 1, written before manifests were checksummed, or an "
                     "edited file)", path);
        return -1;
    }
    char have[9];
    snprintf(have, sizeof have, "%08x", crc32c(0, text + MANIFEST_CRC_LINE_BYTES, n - MANIFEST_CRC_LINE_BYTES));
    if (memcmp(have, text + head, 8) != 0) {
        tp_error_set(err, err_len, "%s: manifest_crc32c is %.8s but the manifest's content has %s (damaged or edited)",
                     path, text + head, have);
        return -1;
    }
    return 0;
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
    if (rt->mesh.pp > 1) cJSON_AddStringToObject(mesh, "stages", st->pp_layout);
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
    if (opt->sharded) {  // the optimizer files hold ZeRO pieces cut by this layout
        cJSON_AddNumberToObject(oc, "zero_stage", opt->zero_stage);
        cJSON_AddNumberToObject(oc, "zero_bucket_elems", (double)opt->zero_bucket_elems);
    }
    char sched[96];
    if (opt->cfg.schedule == LR_COSINE)
        snprintf(sched, sizeof sched, "linear warmup, then cosine decay to 0 at step %d", opt->cfg.decay_steps);
    else
        snprintf(sched, sizeof sched, "linear warmup, then inverse square root of the step");
    cJSON_AddStringToObject(oc, "schedule", sched);
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    cJSON_AddStringToObject(data, "kind", st->corpus ? "corpus" : "synthetic");
    if (!st->corpus && st->task[0]) cJSON_AddStringToObject(data, "task", st->task);
    cJSON_AddNumberToObject(data, "epoch", (double)st->cursor.epoch);
    cJSON_AddNumberToObject(data, "position", (double)st->cursor.position);
    cJSON_AddNumberToObject(data, "synth_index", (double)st->synth_index);
    if (st->has_clock) {  // --max-minutes: the time horizon's clock
        cJSON *clk = cJSON_AddObjectToObject(o, "clock");
        cJSON_AddNumberToObject(clk, "train_seconds", st->train_s);
        cJSON_AddNumberToObject(clk, "step_seconds", st->step_s);
        if (st->warmup_end_s >= 0.0) cJSON_AddNumberToObject(clk, "warmup_end_seconds", st->warmup_end_s);
    }
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddNumberToObject(rng, "seed", (double)st->seed);
    cJSON_AddStringToObject(rng, "scheme", "philox4x32-10 keyed by (seed, step, micro-batch, layer, site)");
    cJSON *files = cJSON_AddObjectToObject(o, "files");
    char name[128];
    int rc = 0;
    for (int p = 0; p < rt->mesh.pp && rc == 0; p++) {
        for (int t = 0; t < rt->mesh.tp && rc == 0; t++) {
            snprintf(name, sizeof name, "model-tp%d-pp%d.safetensors", t, p);
            cJSON *e = file_entry(tmp, name, err, err_len);
            if (!e) rc = -1;
            else cJSON_AddItemToObject(files, name, e);
            for (int d = 0; d < rt->mesh.dp && rc == 0; d++) {
                snprintf(name, sizeof name, "optim-tp%d-pp%d-dp%d.safetensors", t, p, d);
                e = file_entry(tmp, name, err, err_len);
                if (!e) rc = -1;
                else cJSON_AddItemToObject(files, name, e);
            }
        }
    }
    if (rc == 0 && has_spm) {
        cJSON *e = file_entry(tmp, "spm.model", err, err_len);
        if (!e) rc = -1;
        else cJSON_AddItemToObject(files, "spm.model", e);
    }
    if (rc == 0) {
        char *text = sealed_manifest(o);
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

/* The step of a "step_N" entry name (N: 1 to 18 digits, nothing after);
 * -1 for any other name. */
static int64_t parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *d = name + 5;
    size_t n = strspn(d, "0123456789");
    if (n == 0 || n > 18 || d[n] != '\0') return -1;
    return strtoll(d, NULL, 10);
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
        int64_t s = parse_step_name(e->d_name);
        if (s < 0) continue;
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

static bool is_checkpoint(const char *dir) {
    char path[4096];
    pathf(path, sizeof path, "%s/manifest.json", dir);
    return access(path, F_OK) == 0;
}

/* The newest complete checkpoint's step in dir, or -1. */
static int64_t newest_complete(const char *dir) {
    int64_t *steps;
    int n = list_steps(dir, &steps);
    int64_t found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        char name[64], path[4096];
        step_name(name, sizeof name, steps[i]);
        pathf(path, sizeof path, "%s/%s", dir, name);
        if (is_checkpoint(path)) found = steps[i];
    }
    free(steps);
    return found;
}

/* 0 when final is no complete checkpoint, or one whose manifest.json has
 * exactly the bytes of the new one in tmp (the same step saved again with
 * the same contents, e.g. by a resumed run that continues bit for bit);
 * else -1: replacing it would lose a checkpoint. */
static int same_or_absent(const char *final, const char *tmp, int64_t step, char *err, size_t err_len) {
    if (!is_checkpoint(final)) return 0;
    char a[4096], b[4096], why[512];
    pathf(a, sizeof a, "%s/manifest.json", final);
    pathf(b, sizeof b, "%s/manifest.json", tmp);
    size_t na = 0, nb = 0;
    char *saved = read_file_bytes_max(a, MANIFEST_MAX_BYTES, &na, why, sizeof why);
    char *fresh = read_file_bytes_max(b, MANIFEST_MAX_BYTES, &nb, err, err_len);
    const bool same = saved && fresh && na == nb && memcmp(saved, fresh, na) == 0;
    free(saved);
    if (same || !fresh) {
        free(fresh);
        return same ? 0 : -1;
    }
    free(fresh);
    tp_error_set(err, err_len,
                 "%s already holds a checkpoint of step %lld with other contents: refusing to replace it (save "
                 "into another folder, or remove it first)", final, (long long)step);
    return -1;
}

/* ---- the best checkpoint ------------------------------------------------------ */

/* DIR/best.json records {"step", "metric", "value"}; DIR/best is a link to
 * step_N. best.json is written first and is the record a resume trusts; the
 * link follows it (a crash between the two leaves the link on the previous
 * best, which ckpt_best_write repairs next time). Both are replaced by
 * rename, so each is always whole. */
#define BEST_JSON_MAX_BYTES 4096

static int64_t best_link_step(const char *dir) {
    char path[4096], target[256];
    pathf(path, sizeof path, "%s/best", dir);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) return -1;
    target[n] = '\0';
    return parse_step_name(target);
}

int ckpt_best_read(const char *dir, int64_t *step, char *metric, size_t metric_len, double *value, char *err,
                   size_t err_len) {
    char path[4096];
    pathf(path, sizeof path, "%s/best.json", dir);
    if (access(path, F_OK) != 0) return 0;
    size_t n = 0;
    char *text = read_file_bytes_max(path, BEST_JSON_MAX_BYTES, &n, err, err_len);
    if (!text) return -1;
    cJSON *o = cJSON_ParseWithLength(text, n);
    free(text);
    if (json_refuse_duplicate_keys(o, path, err, err_len)) {
        cJSON_Delete(o);
        return -1;
    }
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "metric");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "value");
    const bool ok = cJSON_IsNumber(s) && s->valuedouble >= 1 && s->valuedouble <= (INT_MAX - 1) &&
                    s->valuedouble == (double)(int64_t)s->valuedouble && cJSON_IsString(m) &&
                    (strcmp(m->valuestring, "bleu") == 0 || strcmp(m->valuestring, "loss") == 0) &&
                    cJSON_IsNumber(v) && isfinite(v->valuedouble);
    if (ok) {
        *step = (int64_t)s->valuedouble;
        snprintf(metric, metric_len, "%s", m->valuestring);
        *value = v->valuedouble;
    } else {
        tp_error_set(err, err_len, "%s: not a best-checkpoint record (needs an integer step >= 1, metric bleu or "
                     "loss, a finite value)", path);
    }
    cJSON_Delete(o);
    return ok ? 1 : -1;
}

/* The steps best.json and the best link name (-1 where absent). */
static void best_steps(const char *dir, int64_t *recorded, int64_t *linked) {
    char metric[16], why[512];
    double v;
    if (ckpt_best_read(dir, recorded, metric, sizeof metric, &v, why, sizeof why) != 1) *recorded = -1;
    *linked = best_link_step(dir);
}

int ckpt_best_write(const char *dir, int64_t step, const char *metric, double value, char *err, size_t err_len) {
    char name[64], path[4096], link_tmp[4096], json[256];
    step_name(name, sizeof name, step);
    pathf(path, sizeof path, "%s/%s", dir, name);
    if (!is_checkpoint(path)) {
        tp_error_set(err, err_len, "%s: no complete checkpoint to keep as the best", path);
        return -1;
    }
    snprintf(json, sizeof json, "{\"step\": %lld, \"metric\": \"%s\", \"value\": %.17g}\n", (long long)step, metric,
             value);
    pathf(path, sizeof path, "%s/best.json", dir);
    if (write_file_atomic(path, json, strlen(json), err, err_len) != 0) return -1;
    pathf(link_tmp, sizeof link_tmp, "%s/best.tmp", dir);
    pathf(path, sizeof path, "%s/best", dir);
    unlink(link_tmp);
    if (symlink(name, link_tmp) != 0 || rename(link_tmp, path) != 0 || fsync_path(dir) != 0) {
        tp_error_set(err, err_len, "%s: cannot point it at %s (%s)", path, name, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_list_complete(const char *dir, int64_t **steps_out) {
    int64_t *steps;
    int n = list_steps(dir, &steps), k = 0;
    for (int i = 0; i < n; i++) {
        char name[64], path[4096];
        step_name(name, sizeof name, steps[i]);
        pathf(path, sizeof path, "%s/%s", dir, name);
        if (is_checkpoint(path)) steps[k++] = steps[i];
    }
    *steps_out = steps;
    return k;
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
    if (same_or_absent(final, tmp, step, err, err_len)) {
        remove_tree(tmp);
        return -1;
    }
    discard_checkpoint(final);  // the same step saved again with the same contents, or an incomplete one
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
        int64_t *steps, best_rec = -1, best_link = -1;
        best_steps(dir, &best_rec, &best_link);
        int n = list_steps(dir, &steps);
        int kept = 0;
        for (int i = 0; i < n; i++) {
            char sd[64];
            if (steps[i] == best_rec || steps[i] == best_link) continue;  // the kept best: never pruned
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
            discard_checkpoint(path);  // a step_N that is a link: the link goes, what it points to stays
        }
        free(steps);
    }
    /* Leftovers of discards a crash interrupted (links among them removed as links). */
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
    TP_CHECK(rt->mesh.pp == 1 || st->pp_layout[0], "ckpt_save: a run of %d pipeline stages gives their layout",
             rt->mesh.pp);
    char tmp[4096], name[64];
    step_name(name, sizeof name, st->step);
    pathf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    ckpt_fault_point("start of a save");
    int ok = 1;
    if (lead) {
        int64_t newest;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            tp_error_set(err, err_len, "%s: cannot create the checkpoint folder (%s)", dir, strerror(errno));
            ok = 0;
        } else if ((newest = newest_complete(dir)) > st->step) {
            tp_error_set(err, err_len,
                         "%s already holds step %lld, newer than the step %lld this run would save: refusing to "
                         "save into it (resume from its newest checkpoint, or save into another folder)",
                         dir, (long long)newest, (long long)st->step);
            ok = 0;
        } else {
            remove_tree(tmp);  // left by a crashed save of the same step (a link there: only the link goes)
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

/* The work folder OUT.partial of ckpt_save_as, made anew and marked as its
 * own (PARTIAL_MARK inside). One left by a crashed earlier write (its mark
 * inside, or empty) is replaced; any other folder of that name is someone
 * else's and is never deleted: refused, naming it. */
#define PARTIAL_MARK ".tptrain-partial"
static int claim_partial(const char *work, char *err, size_t err_len) {
    char mark[4096];
    struct stat sb;
    pathf(mark, sizeof mark, "%s/" PARTIAL_MARK, work);
    if (lstat(work, &sb) == 0) {
        if (S_ISDIR(sb.st_mode) && lstat(mark, &sb) == 0) remove_tree(work);  // ours, from a crash
        else if (rmdir(work) != 0) {
            tp_error_set(err, err_len,
                         "%s exists and was not made by an average (no %s in it): refusing to delete it; move it "
                         "away or choose another output",
                         work, PARTIAL_MARK);
            return -1;
        }
    }
    if (mkdir(work, 0755) != 0) {
        tp_error_set(err, err_len, "%s: cannot create (%s)", work, strerror(errno));
        return -1;
    }
    if (write_file_atomic(mark, "", 0, err, err_len)) {
        rmdir(work);
        return -1;
    }
    return 0;
}

int ckpt_save_as(const char *out, bool replace, const Runtime *rt, const Model *m, const AdamW *opt,
                 const TrainState *st, const char *spm_path, char *err, size_t err_len) {
    TP_CHECK(rt->mesh.world == 1, "ckpt_save_as writes a one-rank checkpoint");
    char work[4096], name[64], from[4096];
    struct stat sb;
    if (!replace && lstat(out, &sb) == 0) {
        tp_error_set(err, err_len, "%s already exists: refusing to replace it (give a new path)", out);
        return -1;
    }
    pathf(work, sizeof work, "%s.partial", out);
    if (claim_partial(work, err, err_len)) return -1;
    if (ckpt_save(work, rt, m, opt, st, spm_path, 0, err, err_len)) {
        remove_tree(work);
        return -1;
    }
    step_name(name, sizeof name, st->step);
    pathf(from, sizeof from, "%s/%s", work, name);
    if (replace) discard_checkpoint(out);
    if (rename(from, out) != 0) {
        tp_error_set(err, err_len, "%s: cannot publish the checkpoint (%s)", out, strerror(errno));
        remove_tree(work);
        return -1;
    }
    remove_tree(work);
    fsync_parent_dir(out);
    return 0;
}

/* ---- resolve ------------------------------------------------------------------ */

/* The longest `latest` a resume reads: "step_" and up to 18 digits, a newline. */
#define LATEST_MAX_BYTES 64

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
    char path[4096], why[512];
    pathf(path, sizeof path, "%s/latest", arg);
    if (access(path, F_OK) == 0) {
        size_t n = 0;
        char *latest = read_file_bytes_max(path, LATEST_MAX_BYTES, &n, why, sizeof why);
        bool named = false;
        if (latest) {
            if (n > 0 && latest[n - 1] == '\n') latest[--n] = '\0';
            if (n > 0 && latest[n - 1] == '\r') latest[--n] = '\0';
            named = strlen(latest) == n && parse_step_name(latest) >= 0;
        }
        if (named) pathf(path, sizeof path, "%s/%s", arg, latest);
        if (named && is_checkpoint(path)) {
            snprintf(out, out_len, "%s", path);
            free(latest);
            return 1;
        }
        if (!latest)
            fprintf(stderr, "checkpoint: %s; looking for the newest complete checkpoint\n", why);
        else if (!named)
            fprintf(stderr, "checkpoint: %s/latest does not name a step directory; looking for the newest complete "
                            "checkpoint\n", arg);
        else
            fprintf(stderr, "checkpoint: %s/latest names an incomplete checkpoint; looking for the newest complete "
                            "one\n", arg);
        free(latest);
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

/* Bounds of what a manifest may say; train_mt's flags accept no more. */
#define CKPT_MAX_STEP (INT_MAX - 1)        /* the step loop counts in int and runs step + 1 */
#define CKPT_MAX_DP (1 << 20)
#define CKPT_MAX_PP 510                    /* a stage holds at least one of at most 255 + 255 layers */
#define CKPT_MAX_WORLD (1 << 20)
#define CKPT_MAX_WARMUP (1 << 30)
#define CKPT_MAX_SEED 0x7fffffffLL         /* --seed's range */
#define CKPT_MAX_POSITION INT_MAX          /* batches in an epoch are counted in int */
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
static cJSON *load_manifest(const char *dir, char *path, size_t path_len, char *err, size_t err_len) {
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

int ckpt_read_manifest(const char *dir, ModelConfig *cfg, int *tp, int *dp, OptimConfig *oc, int *adam_t,
                       TrainState *st, char *err, size_t err_len) {
    char path[4096], why[512];
    cJSON *o = load_manifest(dir, path, sizeof path, err, err_len);
    if (!o) return -1;
    int rc = -1;
    int64_t step, mtp, mdp, mpp, warmup, t, epoch, position, synth_index, seed;
    double lr, beta1, beta2, eps, wd, clip;
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
        need_int(rng, "rng", "seed", 0, CKPT_MAX_SEED, &seed, path, err, err_len))
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

/* Places the local tensor loc (np's shard elements) into the optimizer's
 * host stage: whole (np's offset) or, sharded, the parts inside opt's ranges. */
static void stage_state(const AdamW *opt, const ParamInfo *np, const float *loc, float *stage) {
    if (!opt->sharded) {
        memcpy(stage + np->offset, loc, np->n_elems * sizeof(float));
        return;
    }
    for (int j = 0; j < opt->n_ranges; j++) {
        const OptRange *r = &opt->ranges[j];
        const size_t x0 = np->offset > r->lo ? np->offset : r->lo;
        const size_t x1 = np->offset + np->n_elems < r->hi ? np->offset + np->n_elems : r->hi;
        if (x1 > x0) memcpy(stage + r->at + (x0 - r->lo), loc + (x0 - np->offset), (x1 - x0) * sizeof(float));
    }
}

/* The saved layout's files, read on first use: slot ((p * tp) + t) * per + k
 * holds stage p's model shard of tp rank t (k = 0) or its optimizer shard
 * of dp rank k - 1. */
typedef struct {
    const char *dir;
    const cJSON *files;
    int tp, dp, pp, per;
    const ParamTable *tabs;  // per saved stage
    StFile *f;
    bool *loaded;
    char (*path)[4096];
} SavedFiles;

static int saved_slot(const SavedFiles *sf, int p, int t, int k) { return (p * sf->tp + t) * sf->per + k; }

/* The file of slot (p, t, k), read and checked when first asked for; NULL + err. */
static const StFile *saved_file(SavedFiles *sf, int p, int t, int k, char *err, size_t err_len) {
    const int i = saved_slot(sf, p, t, k);
    if (sf->loaded[i]) return &sf->f[i];
    char name[128];
    if (k == 0) snprintf(name, sizeof name, "model-tp%d-pp%d.safetensors", t, p);
    else snprintf(name, sizeof name, "optim-tp%d-pp%d-dp%d.safetensors", t, p, k - 1);
    pathf(sf->path[i], sizeof sf->path[0], "%s/%s", sf->dir, name);
    if (read_listed(sf->dir, sf->files, name, &sf->f[i], err, err_len)) return NULL;
    sf->loaded[i] = true;
    if (check_shard_meta(&sf->f[i], sf->path[i], t, sf->tp, &sf->tabs[p], err, err_len)) return NULL;
    return &sf->f[i];
}

/* A checkpoint opened for reading (what a load and a verify both start
 * from): its manifest's figures, the saved stages with their parameter
 * tables, and the files, read on first use; with_optim counts the
 * optimizer shards among them. saved_close frees all of it, also after a
 * failed saved_open. */
typedef struct {
    ModelConfig cfg;
    int tp, dp;
    TrainState *saved;
    cJSON *man;
    ModelStage *st;    // [saved->pp]
    ParamTable *tabs;  // [saved->pp]
    SavedFiles sf;
} SavedCkpt;

static int saved_open(SavedCkpt *c, const char *dir, bool with_optim, char *err, size_t err_len) {
    char path[4096], why[512];
    memset(c, 0, sizeof *c);
    c->saved = TP_MALLOC(sizeof *c->saved);
    if (ckpt_read_manifest(dir, &c->cfg, &c->tp, &c->dp, NULL, NULL, c->saved, err, err_len)) return -1;
    c->man = load_manifest(dir, path, sizeof path, err, err_len);
    if (!c->man) return -1;
    const int pp = c->saved->pp;
    c->st = TP_MALLOC((size_t)pp * sizeof *c->st);
    TP_CHECK(model_stages_make(&c->cfg, pp, c->saved->pp_layout, c->st, why, sizeof why) == 0, "%s", why);
    c->tabs = TP_CALLOC((size_t)pp, sizeof *c->tabs);
    for (int p = 0; p < pp; p++) param_table_build_stage(&c->cfg, c->tp, &c->st[p], &c->tabs[p]);
    const int per = 1 + (with_optim ? c->dp : 0), n_files = pp * c->tp * per;
    c->sf = (SavedFiles){.dir = dir, .files = cJSON_GetObjectItemCaseSensitive(c->man, "files"), .tp = c->tp,
                         .dp = c->dp, .pp = pp, .per = per, .tabs = c->tabs,
                         .f = TP_CALLOC((size_t)n_files, sizeof *c->sf.f),
                         .loaded = TP_CALLOC((size_t)n_files, sizeof *c->sf.loaded),
                         .path = TP_CALLOC((size_t)n_files, sizeof *c->sf.path)};
    return 0;
}

static void saved_close(SavedCkpt *c) {
    SavedFiles *sf = &c->sf;
    for (int i = 0; sf->loaded && i < sf->pp * sf->tp * sf->per; i++)
        if (sf->loaded[i]) st_free(&sf->f[i]);
    free(sf->f);
    free(sf->loaded);
    free(sf->path);
    for (int p = 0; c->tabs && p < c->saved->pp; p++) param_table_free(&c->tabs[p]);
    free(c->tabs);
    free(c->st);
    free(c->saved);
    cJSON_Delete(c->man);
}

/* Reads the saved tensor (kind 0: weights, 1: exp_avg, 2: exp_avg_sq) of
 * saved stage p's tensor i, every tp shard of it that is needed, into whole
 * (global layout): in the same tp layout only this rank's shard, otherwise
 * all of them (a replicated tensor from tp rank 0). */
static int read_saved(SavedFiles *sf, int p, int i, int kind, bool pieces, int my_tp, float *whole, float *loc,
                      char *err, size_t err_len) {
    const ParamInfo *op = &sf->tabs[p].t[i];
    const char *kname = kind == 1 ? "exp_avg" : "exp_avg_sq";
    char name[160];
    if (kind == 0) snprintf(name, sizeof name, "%s", op->name);
    else snprintf(name, sizeof name, "%s.%s", kname, op->name);
    memset(whole, 0, param_global_elems(op) * sizeof(float));
    for (int t = 0; t < sf->tp; t++) {
        if (my_tp >= 0 ? t != my_tp : (op->split == SPLIT_REPL && t > 0)) continue;
        if (kind > 0 && pieces) {  // ZeRO pieces of every dp file of tp rank t
            for (int d = 0; d < sf->dp; d++)
                if (!saved_file(sf, p, t, 1 + d, err, err_len)) return -1;
            const int f0 = saved_slot(sf, p, t, 1);
            if (opt_pieces_read(&sf->f[f0], &sf->path[f0], sf->dp, op, kname, loc, err, err_len)) return -1;
            shard_place(op, t, loc, whole);
            continue;
        }
        const int k = kind == 0 ? 0 : 1 + i % sf->dp;
        const StFile *f = saved_file(sf, p, t, k, err, err_len);
        if (!f) return -1;
        const StTensor *tt = shard_tensor(f, name, op, sf->path[saved_slot(sf, p, t, k)], err, err_len);
        if (!tt) return -1;
        shard_place(op, t, (const float *)tt->data, whole);
    }
    return 0;
}

int ckpt_load(const char *dir, Model *m, AdamW *opt, char *err, size_t err_len) {
    char path[4096], why[512];
    SavedCkpt c;
    int rc = -1;
    if (saved_open(&c, dir, opt != NULL, err, err_len)) goto done;
    pathf(path, sizeof path, "%s/manifest.json", dir);
    if (config_diff(&c.cfg, "the checkpoint", &m->cfg, "this run", why, sizeof why)) {
        tp_error_set(err, err_len, "%s: the checkpoint's model differs from this run's: %s", path, why);
        goto done;
    }
    const bool pieces = c.saved->zero_stage > 0;
    const int old_pp = c.saved->pp, old_tp = c.tp;
    const ModelStage *old_st = c.st;
    const ParamTable *old = c.tabs;
    /* A rank reads only the files it needs: of the saved stages holding its
     * tensors (its own stage first, when the layout is the same), and in
     * the same tp layout only its own tp rank's shards; another tp layout
     * reads every shard and re-cuts. */
    const int my_tp = old_tp == m->tp.size ? m->tp.rank : -1;
    int own = -1;  // the saved stage equal to this model's, if any
    for (int p = 0; p < old_pp && own < 0; p++)
        if (memcmp(&old_st[p], &m->stage, sizeof m->stage) == 0) own = p;
    size_t max_global = 1;
    for (int p = 0; p < old_pp; p++)
        for (int i = 0; i < old[p].n; i++)
            max_global = param_global_elems(&old[p].t[i]) > max_global ? param_global_elems(&old[p].t[i]) : max_global;
    float *whole = TP_MALLOC(max_global * sizeof(float));
    float *loc = TP_MALLOC(max_global * sizeof(float));  // one tp-local tensor
    /* host staging of the device buffers (the pointers themselves on the CPU) */
    float *stage[3] = {backend_host_stage(m->be, m->params, m->tab.n_elems),
                       opt ? backend_host_stage(opt->be, opt->m, opt->n_elems) : NULL,
                       opt ? backend_host_stage(opt->be, opt->v, opt->n_elems) : NULL};
    bool staged_ok = false;
    for (int j = 0; j < m->tab.n; j++) {
        const ParamInfo *np = &m->tab.t[j];
        /* the saved stage holding it, this model's own first */
        int p = own;
        const ParamInfo *op = own >= 0 ? param_table_find(&old[own], np->name) : NULL;
        for (int q = 0; !op && q < old_pp; q++)
            if ((op = param_table_find(&old[q], np->name))) p = q;
        /* every tensor of a model of this config is on some stage of any valid layout */
        TP_CHECK(op, "tensor '%s' is on none of the saved stages", np->name);
        const int i = (int)(op - old[p].t);
        for (int kind = 0; kind < (opt ? 3 : 1); kind++) {  // 0: weights, 1: exp_avg, 2: exp_avg_sq
            if (read_saved(&c.sf, p, i, kind, pieces, my_tp, whole, loc, err, err_len)) goto unstage;
            if (kind == 0) {
                shard_extract(np, m->tp.rank, whole, stage[0] + np->offset);
            } else {
                shard_extract(np, m->tp.rank, whole, loc);
                stage_state(opt, np, loc, stage[kind]);
            }
        }
    }
    staged_ok = true;
unstage:
    free(whole);
    free(loc);
    /* a failed load leaves the device buffers as the host stage has them: the caller stops anyway */
    backend_host_commit(m->be, m->params, stage[0], m->tab.n_elems);
    if (opt) {
        backend_host_commit(opt->be, opt->m, stage[1], opt->n_elems);
        backend_host_commit(opt->be, opt->v, stage[2], opt->n_elems);
    }
    backend_recast_weights(m->be);
    if (!staged_ok) goto done;
    if (opt) {
        ModelConfig cfg;
        int t;
        if (ckpt_read_manifest(dir, &cfg, NULL, NULL, NULL, &t, NULL, err, err_len)) goto done;
        opt->t = t;
    }
    rc = 0;
done:
    saved_close(&c);
    return rc;
}

/* ---- verify: every check a load runs, without a model ------------------------------ */

/* The model shard (p, t) and its tensors, as read_saved checks them. */
static int verify_model_shard(SavedFiles *sf, int p, int t, char *err, size_t err_len) {
    const StFile *f = saved_file(sf, p, t, 0, err, err_len);
    if (!f) return -1;
    const ParamTable *tab = &sf->tabs[p];
    for (int i = 0; i < tab->n; i++)
        if (!shard_tensor(f, tab->t[i].name, &tab->t[i], sf->path[saved_slot(sf, p, t, 0)], err, err_len)) return -1;
    return 0;
}

/* The optimizer shards of (p, t): whole moments of the tensors dealt to
 * each dp file, or ZeRO pieces covering every tensor exactly once. */
static int verify_optim_shards(SavedFiles *sf, int p, int t, bool pieces, float *loc, char *err, size_t err_len) {
    const ParamTable *tab = &sf->tabs[p];
    for (int d = 0; d < sf->dp; d++)
        if (!saved_file(sf, p, t, 1 + d, err, err_len)) return -1;
    const int f0 = saved_slot(sf, p, t, 1);
    for (int i = 0; i < tab->n; i++) {
        for (int kind = 1; kind <= 2; kind++) {
            const char *kname = kind == 1 ? "exp_avg" : "exp_avg_sq";
            if (pieces) {
                if (opt_pieces_read(&sf->f[f0], &sf->path[f0], sf->dp, &tab->t[i], kname, loc, err, err_len)) return -1;
                continue;
            }
            char name[160];
            snprintf(name, sizeof name, "%s.%s", kname, tab->t[i].name);
            const int k = f0 + i % sf->dp;
            if (!shard_tensor(&sf->f[k], name, &tab->t[i], sf->path[k], err, err_len)) return -1;
        }
    }
    return 0;
}

/* Frees the files of (p, t): one shard group in memory at a time. */
static void release_shards(SavedFiles *sf, int p, int t) {
    for (int k = 0; k < sf->per; k++) {
        const int i = saved_slot(sf, p, t, k);
        if (sf->loaded[i]) st_free(&sf->f[i]);
        sf->loaded[i] = false;
    }
}

int ckpt_verify(const char *dir, int what, char *err, size_t err_len) {
    SavedCkpt c;
    float *loc = NULL;
    int rc = -1;
    if (saved_open(&c, dir, true, err, err_len)) goto done;
    size_t max_local = 1;
    for (int p = 0; p < c.saved->pp; p++)
        for (int i = 0; i < c.tabs[p].n; i++)
            max_local = c.tabs[p].t[i].n_elems > max_local ? c.tabs[p].t[i].n_elems : max_local;
    loc = TP_MALLOC(max_local * sizeof(float));
    for (int p = 0; p < c.saved->pp; p++)
        for (int t = 0; t < c.tp; t++) {
            if ((what & CKPT_VERIFY_MODEL) && verify_model_shard(&c.sf, p, t, err, err_len)) goto done;
            if ((what & CKPT_VERIFY_OPTIM) &&
                verify_optim_shards(&c.sf, p, t, c.saved->zero_stage > 0, loc, err, err_len))
                goto done;
            release_shards(&c.sf, p, t);
        }
    if ((what & CKPT_VERIFY_MODEL) && c.saved->corpus &&
        ckpt_verify_file(dir, c.sf.files, "spm.model", err, err_len))
        goto done;
    rc = 0;
done:
    free(loc);
    saved_close(&c);
    return rc;
}
