/* ckpt_pieces.c: ZeRO optimizer pieces in checkpoint files (see
 * ckpt_pieces.h). The metadata list is the authority on where a piece
 * lies; the entry names repeat its start only to be unique and readable. */
#include "train/ckpt_pieces.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "train/grad_sync.h"

#define PIECE_NAME_BYTES 160

OptPiece *opt_pieces(const ParamTable *tab, const OptRange *r, int n, int *count) {
    int cap = 16, k = 0;
    OptPiece *out = TP_MALLOC((size_t)cap * sizeof *out);
    for (int j = 0; j < n; j++) {
        for (int i = param_table_index_at(tab, r[j].lo); i < tab->n && tab->t[i].offset < r[j].hi; i++) {
            const ParamInfo *p = &tab->t[i];
            const size_t x0 = p->offset > r[j].lo ? p->offset : r[j].lo;
            const size_t x1 = p->offset + p->n_elems < r[j].hi ? p->offset + p->n_elems : r[j].hi;
            if (x1 <= x0) continue;
            if (k == cap) {
                cap *= 2;
                out = realloc(out, (size_t)cap * sizeof *out);
                TP_CHECK(out, "out of memory listing optimizer pieces");
            }
            out[k++] = (OptPiece){.tensor = i, .start = x0 - p->offset, .end = x1 - p->offset};
        }
    }
    *count = k;
    return out;
}

/* Where piece q of opt's state starts (state offset). */
static size_t piece_state_at(const ParamTable *tab, const AdamW *opt, const OptPiece *q) {
    const size_t x0 = tab->t[q->tensor].offset + q->start;
    for (int j = 0; j < opt->n_ranges; j++)
        if (x0 >= opt->ranges[j].lo && x0 < opt->ranges[j].hi) return opt->ranges[j].at + (x0 - opt->ranges[j].lo);
    TP_CHECK(0, "optimizer piece at %zu is in no range", x0);
    return 0;
}

void opt_pieces_add(StWriter *w, const ParamTable *tab, const AdamW *opt, const float *m, const float *v,
                    char **names) {
    int n = 0;
    OptPiece *pc = opt_pieces(tab, opt->ranges, opt->n_ranges, &n);
    char *nm = TP_MALLOC((size_t)(2 * n + 1) * PIECE_NAME_BYTES);
    cJSON *list = cJSON_CreateArray();
    for (int k = 0; k < n; k++) {
        const ParamInfo *p = &tab->t[pc[k].tensor];
        const size_t at = piece_state_at(tab, opt, &pc[k]);
        const int64_t len = (int64_t)(pc[k].end - pc[k].start);
        char *a = nm + (size_t)(2 * k) * PIECE_NAME_BYTES, *b = a + PIECE_NAME_BYTES;
        snprintf(a, PIECE_NAME_BYTES, "exp_avg.%s@%zu", p->name, pc[k].start);
        snprintf(b, PIECE_NAME_BYTES, "exp_avg_sq.%s@%zu", p->name, pc[k].start);
        st_writer_add(w, a, ST_F32, 1, &len, m + at);
        st_writer_add(w, b, ST_F32, 1, &len, v + at);
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateString(p->name));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)pc[k].start));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)pc[k].end));
        cJSON_AddItemToArray(list, e);
    }
    char *text = cJSON_PrintUnformatted(list);
    st_writer_meta(w, "pieces", text);
    free(text);
    cJSON_Delete(list);
    free(pc);
    *names = nm;
}

uint64_t opt_pieces_file_elems(const ParamTable *tab, int zero, size_t bucket_elems, int dp, int d, bool staged) {
    BucketLayout L;
    bucket_layout_for_stage(&L, tab, zero, bucket_elems, dp, staged);
    OptRange *r = TP_MALLOC((size_t)(L.n > 0 ? L.n : 1) * sizeof *r);
    const int n = bucket_ranges(&L, d, r);
    uint64_t elems = 0;
    for (int j = 0; j < n; j++) elems += 2 * (uint64_t)(r[j].hi - r[j].lo);
    free(r);
    bucket_layout_free(&L);
    return elems;
}

/* One file's pieces of tensor p into loc, counting coverage in seen. */
static int read_file_pieces(const StFile *f, const char *path, const ParamInfo *p, const char *kind, float *loc,
                            unsigned char *seen, char *err, size_t err_len) {
    const char *meta = st_meta(f, "pieces");
    cJSON *list = meta ? cJSON_Parse(meta) : NULL;
    if (!cJSON_IsArray(list)) {
        tp_error_set(err, err_len, "%s: metadata 'pieces' is missing or not a JSON array", path);
        cJSON_Delete(list);
        return -1;
    }
    int rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const cJSON *nm = cJSON_GetArrayItem(e, 0), *s = cJSON_GetArrayItem(e, 1), *t = cJSON_GetArrayItem(e, 2);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 3 || !cJSON_IsString(nm) || !cJSON_IsNumber(s) ||
            !cJSON_IsNumber(t)) {
            tp_error_set(err, err_len, "%s: a 'pieces' entry is not [name, start, end]", path);
            rc = -1;
            break;
        }
        if (strcmp(nm->valuestring, p->name) != 0) continue;
        const double a = s->valuedouble, b = t->valuedouble;
        if (!(a >= 0 && a < b && b <= (double)p->n_elems) || a != (double)(size_t)a || b != (double)(size_t)b) {
            tp_error_set(err, err_len, "%s: piece [%g, %g) of '%s' is outside its %zu elements", path, a, b, p->name,
                         p->n_elems);
            rc = -1;
            break;
        }
        char name[PIECE_NAME_BYTES];
        snprintf(name, sizeof name, "%s.%s@%zu", kind, p->name, (size_t)a);
        const StTensor *x = st_find(f, name);
        const size_t len = (size_t)b - (size_t)a;
        if (!x || x->dtype != ST_F32 || x->ndim != 1 || x->shape[0] != (int64_t)len) {
            tp_error_set(err, err_len, "%s: tensor '%s' is missing or not F32 of shape [%zu]", path, name, len);
            rc = -1;
            break;
        }
        memcpy(loc + (size_t)a, x->data, len * sizeof(float));
        for (size_t i = (size_t)a; i < (size_t)b; i++) seen[i]++;
    }
    cJSON_Delete(list);
    return rc;
}

int opt_pieces_read(const StFile *f, char (*paths)[4096], int dp, const ParamInfo *p, const char *kind, float *loc,
                    char *err, size_t err_len) {
    unsigned char *seen = TP_CALLOC(p->n_elems ? p->n_elems : 1, 1);
    int rc = 0;
    for (int d = 0; d < dp && rc == 0; d++) rc = read_file_pieces(&f[d], paths[d], p, kind, loc, seen, err, err_len);
    for (size_t i = 0; rc == 0 && i < p->n_elems; i++) {
        if (seen[i] != 1) {
            tp_error_set(err, err_len, "%s and the other optimizer files of its tp rank cover element %zu of '%s' %d "
                         "times (once expected)", paths[0], i, p->name, seen[i]);
            rc = -1;
        }
    }
    free(seen);
    return rc;
}
