/* ckpt_save.c: writing a checkpoint (checkpoint.h's ckpt_save, ckpt_save_as)
 * and the crash-safety protocol around it: the fault hook, deletion that
 * never follows a link, the shards, the manifest, publishing.
 *
 * Writers: the dp-rank-0 member of every tp group writes its model shard;
 * every rank writes the optimizer tensors dealt to its dp rank (the state is
 * replicated across dp, so the writing is shared out). Rank 0 then re-reads
 * every file from disk to record its size and CRC-32C in the manifest (so
 * the manifest vouches for the bytes that landed, not for a buffer), writes
 * the manifest and publishes the directory.
 *
 * Calls: ckpt_dir.c (steps, best) and ckpt_manifest.c (the seal) through
 * ckpt_internal.h; ckpt_pieces.h, the model, the runtime's comm, common/.
 */
#include "train/checkpoint.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_pieces.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h"

/* ---- fault hook ------------------------------------------------------------ */

/* Whether the fault variable var (TPTRAIN_FAULT_POINT or TPTRAIN_FAULT_FAIL)
 * names point n of this rank (TPTRAIN_FAULT_RANK, default 0). */
static bool fault_here(const char *var, int n) {
    const char *target = getenv(var);
    if (!target) return false;
    const char *rank_s = getenv("TPTRAIN_FAULT_RANK");
    int want_rank = rank_s ? atoi(rank_s) : 0, rank = tp_log_rank() < 0 ? 0 : tp_log_rank();
    return rank == want_rank && n == atoi(target);
}

int ckpt_fault_point(const char *what) {
    /* per process: counts this rank's save points; atomic, as the writer
     * thread of an asynchronous save passes them too (one write at a time) */
    static atomic_int passed;
    const int n = atomic_fetch_add(&passed, 1) + 1;
    if (fault_here("TPTRAIN_FAULT_POINT", n)) {
        fprintf(stderr, "fault injection: killing rank %d at save point %d (%s)\n",
                tp_log_rank() < 0 ? 0 : tp_log_rank(), n, what);
        fflush(stderr);
        raise(SIGKILL);
    }
    return n;
}

/* A save point before path is written: with TPTRAIN_FAULT_FAIL=N, the N-th
 * point fails as a full disk would (the test of a failed write). 0, or -1
 * with err naming path. */
static int fault_write(const char *what, const char *path, char *err, size_t err_len) {
    const int n = ckpt_fault_point(what);
    if (!fault_here("TPTRAIN_FAULT_FAIL", n)) return 0;
    tp_error_set(err, err_len, "%s: cannot write (%s; injected at save point %d by TPTRAIN_FAULT_FAIL)", path,
                 strerror(ENOSPC), n);
    return -1;
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

void step_name(char *buf, size_t n, int64_t step) { snprintf(buf, n, "step_%08lld", (long long)step); }

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

int agree(const Runtime *rt, int ok, char *err, size_t err_len) {
    /* Every rank learns whether all succeeded (MAX of the failure flags). */
    float bad = ok ? 0.0f : 1.0f;
    if (comm_allreduce(rt->ctrl, &bad, 1, COMM_MAX)) {
        tp_error_set(err, err_len, "%s", comm_error(rt->ctrl));
        return -1;
    }
    if (bad != 0.0f && ok) tp_error_set(err, err_len, "another rank failed to write its part of the checkpoint");
    return bad == 0.0f ? 0 : -1;
}

char *shard_meta_json(const ParamTable *tab) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        cJSON *t = cJSON_AddObjectToObject(o, p->name);
        cJSON_AddStringToObject(t, "split", split_label_name(p->split));
        cJSON *g = cJSON_AddArrayToObject(t, "global_shape");
        for (int d = 0; d < p->ndim; d++) cJSON_AddItemToArray(g, cJSON_CreateNumber(p->shape[d]));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void add_shard_meta(StWriter *w, const Mesh *me, const char *kind, const char *tensors_json) {
    char buf[32];
    st_writer_meta(w, "format", kind);
    snprintf(buf, sizeof buf, "%d", CKPT_FORMAT_VERSION);
    st_writer_meta(w, "format_version", buf);
    snprintf(buf, sizeof buf, "%d", me->tp_rank);
    st_writer_meta(w, "tp_rank", buf);
    snprintf(buf, sizeof buf, "%d", me->tp);
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

int write_shards(const char *tmp, const CkptShards *s, char *err, size_t err_len) {
    const Mesh *me = &s->mesh;
    const ParamTable *tab = s->tab;
    char path[4096];
    int rc = 0;
    if (me->dp_rank == 0) {
        StWriter *w = st_writer_new();
        add_shard_meta(w, me, "tptrain-checkpoint-model", s->meta);
        for (int i = 0; i < tab->n; i++) {
            const ParamInfo *p = &tab->t[i];
            int64_t shape[2] = {p->local[0], p->local[1]};
            st_writer_add(w, p->name, ST_F32, p->ndim, shape, s->params + p->offset);
        }
        pathf(path, sizeof path, "%s/model-tp%d-pp%d.safetensors", tmp, me->tp_rank, me->pp_rank);
        rc = fault_write("before a model shard", path, err, err_len);
        if (rc == 0) rc = st_writer_write(w, path, err, err_len);
        st_writer_free(w);
        ckpt_fault_point("after a model shard");
    }
    if (rc == 0) {  // ZeRO: this rank's pieces, as they lie; else the whole moments dealt to it
        StWriter *w = st_writer_new();
        add_shard_meta(w, me, "tptrain-checkpoint-optim", s->meta);
        char *names = NULL;
        if (s->opt->sharded) opt_pieces_add(w, tab, s->opt, s->om, s->ov, &names);
        else opt_moments_add(w, tab, me, s->om, s->ov, &names);
        pathf(path, sizeof path, "%s/optim-tp%d-pp%d-dp%d.safetensors", tmp, me->tp_rank, me->pp_rank,
                 me->dp_rank);
        rc = fault_write("before an optimizer shard", path, err, err_len);
        if (rc == 0) rc = st_writer_write(w, path, err, err_len);
        st_writer_free(w);
        free(names);
        ckpt_fault_point("after an optimizer shard");
    }
    return rc;
}

/* A file's size and CRC-32C (as the manifest writes it: 8 hex digits). 0, or -1 with err set. */
int file_crc(const char *path, size_t *n, char crc[16], char *err, size_t err_len) {
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


cJSON *manifest_start(const Runtime *rt, const Model *m, const AdamW *opt, const TrainState *st) {
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
    if (st->corpus) {  // the epochs' segmentations follow them as they follow the seed
        cJSON_AddNumberToObject(data, "spm_alpha", st->spm_alpha);
        cJSON_AddNumberToObject(data, "spm_nbest", st->spm_nbest);
    }
    if (st->has_clock) {  // --max-minutes: the time horizon's clock
        cJSON *clk = cJSON_AddObjectToObject(o, "clock");
        cJSON_AddNumberToObject(clk, "train_seconds", st->train_s);
        cJSON_AddNumberToObject(clk, "step_seconds", st->step_s);
        if (st->warmup_end_s >= 0.0) cJSON_AddNumberToObject(clk, "warmup_end_seconds", st->warmup_end_s);
    }
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddNumberToObject(rng, "seed", (double)st->seed);
    cJSON_AddStringToObject(rng, "scheme", "philox4x32-10 keyed by (seed, step, micro-batch, layer, site)");
    return o;
}

int manifest_finish(const char *tmp, cJSON *o, const Mesh *mesh, bool has_spm, char *err, size_t err_len) {
    cJSON *files = cJSON_AddObjectToObject(o, "files");
    char name[128];
    int rc = 0;
    for (int p = 0; p < mesh->pp && rc == 0; p++) {
        for (int t = 0; t < mesh->tp && rc == 0; t++) {
            snprintf(name, sizeof name, "model-tp%d-pp%d.safetensors", t, p);
            cJSON *e = file_entry(tmp, name, err, err_len);
            if (!e) rc = -1;
            else cJSON_AddItemToObject(files, name, e);
            for (int d = 0; d < mesh->dp && rc == 0; d++) {
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
        rc = fault_write("before the manifest", path, err, err_len);
        if (rc == 0) rc = write_file_atomic(path, text, strlen(text), err, err_len);
        ckpt_fault_point("after the manifest");
        free(text);
    }
    return rc;
}

int publish(const char *dir, const char *tmp, int64_t step, int keep_last, char *err, size_t err_len) {
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

int save_prepare(const char *dir, const Runtime *rt, const TrainState *st, char *tmp, size_t tmp_len, char *err,
                 size_t err_len) {
    TP_CHECK(rt->mesh.pp == 1 || st->pp_layout[0], "ckpt_save: a run of %d pipeline stages gives their layout",
             rt->mesh.pp);
    char name[64];
    step_name(name, sizeof name, st->step);
    pathf(tmp, tmp_len, "%s/%s.tmp", dir, name);
    ckpt_fault_point("start of a save");
    int ok = 1;
    if (rt->mesh.rank == 0) {
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
    return agree(rt, ok, err, err_len);
}

int save_tokenizer(const char *tmp, const char *spm_path, char *err, size_t err_len) {
    char to[4096];
    pathf(to, sizeof to, "%s/spm.model", tmp);
    if (fault_write("before the tokenizer", to, err, err_len)) return -1;
    return copy_file_atomic(spm_path, to, err, err_len);
}

int ckpt_save(const char *dir, const Runtime *rt, const Model *m, const AdamW *opt, const TrainState *st,
              const char *spm_path, int keep_last, char *err, size_t err_len) {
    const bool lead = rt->mesh.rank == 0;
    char tmp[4096];
    if (save_prepare(dir, rt, st, tmp, sizeof tmp, err, err_len)) return -1;
    /* host copies of the device buffers (the pointers themselves on the CPU) */
    CkptShards s = {.mesh = rt->mesh, .tab = &m->tab, .opt = opt, .meta = shard_meta_json(&m->tab),
                    .params = backend_host_view(m->be, m->params, m->tab.n_elems),
                    .om = backend_host_view(opt->be, opt->m, opt->n_elems),
                    .ov = backend_host_view(opt->be, opt->v, opt->n_elems)};
    int ok = write_shards(tmp, &s, err, err_len) == 0;
    backend_host_view_free(s.params, m->params);
    backend_host_view_free(s.om, opt->m);
    backend_host_view_free(s.ov, opt->v);
    free(s.meta);
    if (ok && lead && spm_path) ok = save_tokenizer(tmp, spm_path, err, err_len) == 0;
    if (agree(rt, ok, err, err_len)) return -1;
    if (lead) {
        cJSON *o = manifest_start(rt, m, opt, st);
        ok = manifest_finish(tmp, o, &rt->mesh, spm_path != NULL, err, err_len) == 0 &&
             publish(dir, tmp, st->step, keep_last, err, err_len) == 0;
        cJSON_Delete(o);
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
