/* export.c: model <-> export directory. The loader trusts nothing: the
 * config is validated, every tensor is matched by name, dtype and shape
 * before the model is allocated, and the safetensors reader has already
 * checked sizes and the checksum. The writer stages every file and renames
 * them into place together. */
#include "transformer/export.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "err.h"
#include "safetensors.h"

/* config.json is a few hundred bytes; anything past this is not one. */
#define EXPORT_CONFIG_MAX_BYTES (1u << 20)


/* The files of an export, staged as NAME.part in dir and renamed into place
 * only once every one of them is written: a failure (a full disk) leaves
 * neither a lone config.json nor a mix of old and new files. */
enum { EXPORT_CONFIG, EXPORT_WEIGHTS, EXPORT_SPM, EXPORT_N };
static const char *const k_export_names[EXPORT_N] = {"config.json", "model.safetensors", "spm.model"};

static int export_path(char *out, size_t n, const char *dir, int file, bool staged, char *err, size_t err_len) {
    int k = snprintf(out, n, "%s/%s%s", dir, k_export_names[file], staged ? ".part" : "");
    if (k < 0 || (size_t)k >= n) {
        tp_error_set(err, err_len, "%s: path too long", dir);
        return -1;
    }
    return 0;
}

static int write_staged(const Model *m, const char *spm_path, const char *dir, int file, char *err, size_t err_len) {
    char path[4096];
    if (export_path(path, sizeof path, dir, file, true, err, err_len)) return -1;
    if (file == EXPORT_CONFIG) {
        char *json = config_to_json(&m->cfg);
        int rc = write_file_atomic(path, json, strlen(json), err, err_len);
        free(json);
        return rc;
    }
    if (file == EXPORT_SPM) return copy_file_atomic(spm_path, path, err, err_len);
    StWriter *w = st_writer_new();
    st_writer_meta(w, "format", "tptrain-model");
    st_writer_meta(w, "format_version", "1");
    const float *params = backend_host_view(m->be, m->params, m->tab.n_elems);
    for (int i = 0; i < m->tab.n; i++) {
        const ParamInfo *p = &m->tab.t[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        st_writer_add(w, p->name, ST_F32, p->ndim, shape, params + p->offset);
    }
    int rc = st_writer_write(w, path, err, err_len);
    st_writer_free(w);
    backend_host_view_free(params, m->params);
    return rc;
}

int model_export_files(const Model *m, const char *spm_path, const char *dir, char *err, size_t err_len) {
    bool created = mkdir(dir, 0755) == 0;
    struct stat sb;
    if (!created && (errno != EEXIST || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        tp_error_set(err, err_len, "%s: cannot create directory (%s)", dir,
                     errno == EEXIST ? "it exists and is not a directory" : strerror(errno));
        return -1;
    }
    const int n_files = spm_path ? EXPORT_N : EXPORT_SPM;
    int rc = 0, written = 0;
    for (; written < n_files && rc == 0; written++) rc = write_staged(m, spm_path, dir, written, err, err_len);
    char staged[4096], final[4096];
    for (int i = 0; i < n_files && rc == 0; i++) {
        if (export_path(staged, sizeof staged, dir, i, true, err, err_len) ||
            export_path(final, sizeof final, dir, i, false, err, err_len))
            rc = -1;
        else if (rename(staged, final) != 0) {
            tp_error_set(err, err_len, "%s: cannot rename %s into place (%s)", final, staged, strerror(errno));
            rc = -1;
        }
    }
    if (rc != 0) {
        for (int i = 0; i < written; i++)
            if (export_path(staged, sizeof staged, dir, i, true, NULL, 0) == 0) unlink(staged);
        if (created) rmdir(dir);
        return -1;
    }
    fsync_path(dir); /* best effort: some file systems refuse fsync on directories */
    return 0;
}

int model_export(const Model *m, const char *dir, char *err, size_t err_len) {
    return model_export_files(m, NULL, dir, err, err_len);
}

/* Each tensor of the safetensors file against the table config.json implies,
 * before anything of the model's size is allocated: a config whose shapes
 * disagree with the tensors (d_model 4000 on a 32-wide export) is refused
 * instead of built. */
static int check_tensors(const StFile *f, const ParamTable *tab, const char *path, char *err, size_t err_len) {
    for (int i = 0; i < f->n_tensors; i++) {
        if (!param_table_find(tab, f->tensors[i].name)) {
            tp_error_set(err, err_len, "%s: tensor '%s' is not a parameter of this model", path, f->tensors[i].name);
            return -1;
        }
    }
    for (int i = 0; i < tab->n; i++) {
        const ParamInfo *p = &tab->t[i];
        const StTensor *t = st_find(f, p->name);
        if (!t) {
            tp_error_set(err, err_len, "%s: tensor '%s' is missing", path, p->name);
            return -1;
        }
        bool shape_ok = t->dtype == ST_F32 && t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
                        (p->ndim == 1 || t->shape[1] == p->shape[1]);
        if (!shape_ok) {
            char have[64] = "", want[64];
            for (int d = 0; d < t->ndim; d++)
                snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "",
                         (long long)t->shape[d]);
            if (p->ndim == 1) snprintf(want, sizeof want, "%d", p->shape[0]);
            else snprintf(want, sizeof want, "%d, %d", p->shape[0], p->shape[1]);
            tp_error_set(err, err_len, "%s: tensor '%s' is %s [%s] but config.json needs F32 [%s]", path, p->name,
                         st_dtype_name(t->dtype), have, want);
            return -1;
        }
    }
    return 0;
}

int model_load_on(Model *m, Backend *be, const char *dir, char *err, size_t err_len) {
    char path[4096], why[512];
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = read_file_bytes_max(path, EXPORT_CONFIG_MAX_BYTES, NULL, err, err_len);
    if (!json) return -1;
    ModelConfig cfg;
    int rc = config_from_json(json, &cfg, why, sizeof why);
    free(json);
    if (rc) {
        tp_error_set(err, err_len, "%s: %s", path, why);
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StFile f;
    if (st_read(path, &f, err, err_len)) return -1;
    ParamTable tab;
    param_table_build(&cfg, 1, &tab);
    rc = check_tensors(&f, &tab, path, err, err_len);
    param_table_free(&tab);
    /* no gradients, no initial values: every tensor is copied in below */
    if (rc == 0 && model_create_ex(m, be, &cfg, NULL, 0, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, why, sizeof why)) {
        tp_error_set(err, err_len, "%s: %s", path, why);
        rc = -1;
    }
    if (rc == 0) {
        float *params = backend_host_stage(m->be, m->params, m->tab.n_elems);
        for (int i = 0; i < m->tab.n; i++) {
            const ParamInfo *p = &m->tab.t[i];
            memcpy(params + p->offset, st_find(&f, p->name)->data, p->n_elems * sizeof(float));
        }
        backend_host_commit(m->be, m->params, params, m->tab.n_elems);
        backend_recast_weights(m->be);
    }
    st_free(&f);
    return rc;
}

int model_load(Model *m, const char *dir, char *err, size_t err_len) { return model_load_on(m, NULL, dir, err, err_len); }
