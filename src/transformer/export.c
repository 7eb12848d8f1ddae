/* export.c: model <-> export directory. The loader trusts nothing: the
 * config is validated, every tensor is matched by name, dtype and shape, and
 * the safetensors reader has already checked sizes and the checksum. */
#include "transformer/export.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "err.h"
#include "safetensors.h"

void *read_file_bytes(const char *path, size_t *n_bytes, char *err, size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        tp_error_set(err, err_len, "%s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            buf = realloc(buf, cap);
            TP_CHECK(buf, "out of memory reading %s", path);
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        tp_error_set(err, err_len, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    if (n_bytes) *n_bytes = n;
    return buf;
}

char *read_text_file(const char *path, char *err, size_t err_len) { return read_file_bytes(path, NULL, err, err_len); }

int copy_file_atomic(const char *from, const char *to, char *err, size_t err_len) {
    size_t n = 0;
    void *bytes = read_file_bytes(from, &n, err, err_len);
    if (!bytes) return -1;
    int rc = write_file_atomic(to, bytes, n, err, err_len);
    free(bytes);
    return rc;
}

int write_file_atomic(const char *path, const void *data, size_t n_bytes, char *err, size_t err_len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        tp_error_set(err, err_len, "%s: cannot create (%s)", tmp, strerror(errno));
        return -1;
    }
    const char *p = data;
    size_t left = n_bytes;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            tp_error_set(err, err_len, "%s: write failed (%s)", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        tp_error_set(err, err_len, "%s: cannot finish writing (%s)", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int model_export(const Model *m, const char *dir, char *err, size_t err_len) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        tp_error_set(err, err_len, "%s: cannot create directory (%s)", dir, strerror(errno));
        return -1;
    }
    char path[4096];
    char *json = config_to_json(&m->cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = write_file_atomic(path, json, strlen(json), err, err_len);
    free(json);
    if (rc) return -1;

    StWriter *w = st_writer_new();
    st_writer_meta(w, "format", "tptrain-model");
    st_writer_meta(w, "format_version", "1");
    const float *params = backend_host_view(m->be, m->params, m->tab.n_elems);
    for (int i = 0; i < m->tab.n; i++) {
        const ParamInfo *p = &m->tab.t[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        st_writer_add(w, p->name, ST_F32, p->ndim, shape, params + p->offset);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = st_writer_write(w, path, err, err_len);
    st_writer_free(w);
    backend_host_view_free(params, m->params);
    return rc;
}

int model_load_on(Model *m, Backend *be, const char *dir, char *err, size_t err_len) {
    char path[4096], why[512];
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = read_text_file(path, err, err_len);
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
    if (model_create(m, be, &cfg, NULL, 0, why, sizeof why)) {
        tp_error_set(err, err_len, "%s: %s", path, why);
        st_free(&f);
        return -1;
    }
    rc = -1;
    float *params = backend_host_stage(m->be, m->params, m->tab.n_elems);
    for (int i = 0; i < f.n_tensors; i++) {
        if (!param_table_find(&m->tab, f.tensors[i].name)) {
            tp_error_set(err, err_len, "%s: tensor '%s' is not a parameter of this model", path,
                         f.tensors[i].name);
            goto done;
        }
    }
    for (int i = 0; i < m->tab.n; i++) {
        const ParamInfo *p = &m->tab.t[i];
        const StTensor *t = st_find(&f, p->name);
        if (!t) {
            tp_error_set(err, err_len, "%s: tensor '%s' is missing", path, p->name);
            goto done;
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
            goto done;
        }
        memcpy(params + p->offset, t->data, p->n_elems * sizeof(float));
    }
    rc = 0;
done:
    backend_host_commit(m->be, m->params, params, m->tab.n_elems);
    if (rc == 0) backend_recast_weights(m->be);
    st_free(&f);
    if (rc) model_free(m);
    return rc;
}

int model_load(Model *m, const char *dir, char *err, size_t err_len) { return model_load_on(m, NULL, dir, err, err_len); }
