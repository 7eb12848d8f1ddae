/* ckpt_load.c: validated load with resharding (checkpoint.h's ckpt_load),
 * and the saved layout's files that a verify reads as well.
 *
 * Loading needs no communication: every rank reads the shards it needs,
 * reassembles each whole tensor from the old layout's labels and cuts its
 * own shard of the new layout.
 *
 * Calls: ckpt_manifest.c (ckpt_internal.h, checkpoint.h), ckpt_pieces.h,
 * the model, common/.
 */
#include "train/checkpoint.h"
#include "train/ckpt_internal.h"
#include "train/ckpt_pieces.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "fileio.h"
#include "safetensors.h"

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

const StTensor *shard_tensor(const StFile *f, const char *name, const ParamInfo *old, const char *path,
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


int saved_slot(const SavedFiles *sf, int p, int t, int k) { return (p * sf->tp + t) * sf->per + k; }

/* The file of slot (p, t, k), read and checked when first asked for; NULL + err. */
const StFile *saved_file(SavedFiles *sf, int p, int t, int k, char *err, size_t err_len) {
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


int saved_open(SavedCkpt *c, const char *dir, bool with_optim, char *err, size_t err_len) {
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

void saved_close(SavedCkpt *c) {
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
int read_saved(SavedFiles *sf, int p, int i, int kind, bool pieces, int my_tp, float *whole, float *loc,
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
