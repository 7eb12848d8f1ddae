/* mt.c: model + tokenizer directory, batched translation and scoring. */
#include "mt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "err.h"
#include "train/checkpoint.h"
#include "transformer/export.h"

/* A checkpoint (or a folder of them): the whole model assembled from its
 * shards, whatever layout it was saved with. 1 = loaded, 0 = not a
 * checkpoint, -1 = error. */
static int load_checkpoint(Model *m, Backend *be, const char *dir, char *resolved, size_t resolved_len, char *err,
                           size_t err_len) {
    const int found = ckpt_resolve_model(dir, resolved, resolved_len, err, err_len);
    if (found <= 0) return found;  // 0: an export, or nothing model_load can read either
    ModelConfig cfg;
    if (ckpt_read_manifest(resolved, &cfg, NULL, NULL, NULL, NULL, NULL, err, err_len)) return -1;
    /* no gradients to hold, no initial values to compute: ckpt_load writes every tensor */
    if (model_create_ex(m, be, &cfg, NULL, 0, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, err, err_len)) return -1;
    if (ckpt_load(resolved, m, NULL, err, err_len)) {
        model_free(m);
        return -1;
    }
    return 1;
}

int mt_load(MtModel *mt, const char *dir, char *err, size_t err_len) { return mt_load_on(mt, NULL, dir, err, err_len); }

int mt_load_on(MtModel *mt, Backend *be, const char *dir, char *err, size_t err_len) {
    memset(mt, 0, sizeof *mt);
    char resolved[2048];
    int ck = load_checkpoint(&mt->model, be, dir, resolved, sizeof resolved, err, err_len);
    if (ck < 0) return -1;
    if (ck == 1) dir = resolved;
    else if (model_load_on(&mt->model, be, dir, err, err_len)) return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/spm.model", dir);
    mt->spm = spm_load(path, err, err_len);
    if (!mt->spm) {
        model_free(&mt->model);
        return -1;
    }
    const ModelConfig *c = &mt->model.cfg;
    int v = spm_vocab_size(mt->spm);
    if (v != c->vocab_size || c->pad_id != SPM_PAD_ID || c->unk_id != SPM_UNK_ID || c->bos_id != SPM_BOS_ID ||
        c->eos_id != SPM_EOS_ID) {
        tp_error_set(err, err_len,
                     "%s: tokenizer has %d pieces (pad/unk/bos/eos %d/%d/%d/%d) but config.json says vocab_size %d "
                     "with %d/%d/%d/%d",
                     path, v, SPM_PAD_ID, SPM_UNK_ID, SPM_BOS_ID, SPM_EOS_ID, c->vocab_size, c->pad_id, c->unk_id,
                     c->bos_id, c->eos_id);
        mt_free(mt);
        return -1;
    }
    return 0;
}

void mt_free(MtModel *mt) {
    if (mt->spm) spm_free(mt->spm);
    if (mt->model.params) model_free(&mt->model);
    memset(mt, 0, sizeof *mt);
}

int mt_save(const Model *m, const char *spm_model_path, const char *dir, char *err, size_t err_len) {
    return model_export_files(m, spm_model_path, dir, err, err_len);
}

int32_t *mt_encode_line(const Spm *spm, const char *line, int *n) {
    int need = spm_encode(spm, line, NULL, 0);
    if (need < 0) return NULL;
    int32_t *ids = TP_MALLOC((size_t)(need > 0 ? need : 1) * sizeof(int32_t));
    *n = spm_encode(spm, line, ids, need);
    return ids;
}

/* Sentence order by source length (longest first), ties by index. */
typedef struct { int len, idx; } LenIdx;

static int by_len_desc(const void *a, const void *b) {
    const LenIdx *x = a, *y = b;
    if (x->len != y->len) return y->len - x->len;
    return x->idx - y->idx;
}

static LenIdx *length_order(const int *len, int n, int cap) {
    LenIdx *o = TP_MALLOC((size_t)(n > 0 ? n : 1) * sizeof *o);
    for (int i = 0; i < n; i++) o[i] = (LenIdx){len[i] < cap ? len[i] : cap, i};
    qsort(o, (size_t)n, sizeof *o, by_len_desc);
    return o;
}

/* Fills rows [0, B) of a padded (B, S) id matrix: ids (cut to len) + eos. */
static void fill_rows(int32_t *dst, int32_t *dst_len, int S, const LenIdx *o, int B, const int32_t *const *ids,
                      const ModelConfig *c, bool add_eos) {
    for (int r = 0; r < B; r++) {
        int n = o[r].len;
        int32_t *row = dst + (size_t)r * S;
        for (int t = 0; t < S; t++) row[t] = c->pad_id;
        memcpy(row, ids[o[r].idx], (size_t)n * sizeof(int32_t));
        if (add_eos) row[n++] = c->eos_id;
        dst_len[r] = n;
    }
}

void mt_translate_ids(Model *m, const int32_t *const *src, const int *len, int n, int beam, float lenpen,
                      int batch_size, Hypotheses *out) {
    const ModelConfig *c = &m->cfg;
    LenIdx *o = length_order(len, n, c->max_len - 1);
    memset(out, 0, sizeof *out);
    out->n = n;
    out->hyp = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof(int32_t *));
    out->len = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof(int));
    out->score = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof(float));
    for (int start = 0; start < n; start += batch_size) {
        int B = n - start < batch_size ? n - start : batch_size;
        int S = o[start].len + 1;  // longest first
        int32_t *ids = TP_MALLOC((size_t)B * S * sizeof(int32_t)), *lens = TP_MALLOC((size_t)B * sizeof(int32_t));
        fill_rows(ids, lens, S, o + start, B, src, c, true);
        SrcBatch sb = {.n = B, .S = S, .src = ids, .src_len = lens};
        Hypotheses h;
        if (beam <= 0) decode_greedy(m, &sb, &h);
        else decode_beam(m, &sb, beam, lenpen, &h);
        for (int r = 0; r < B; r++) {
            int i = o[start + r].idx;
            out->hyp[i] = h.hyp[r];
            out->len[i] = h.len[r];
            out->score[i] = h.score[r];
            h.hyp[r] = NULL;
        }
        hypotheses_free(&h);
        free(ids);
        free(lens);
    }
    free(o);
}

void mt_score_ids(Model *m, const int32_t *const *src, const int *src_len, const int32_t *const *tgt,
                  const int *tgt_len, int n, int batch_size, double *scores) {
    const ModelConfig *c = &m->cfg;
    LenIdx *o = length_order(src_len, n, c->max_len - 1);
    for (int start = 0; start < n; start += batch_size) {
        int B = n - start < batch_size ? n - start : batch_size;
        int S = o[start].len + 1, T = 1;
        LenIdx *tg = TP_MALLOC((size_t)B * sizeof *tg);
        for (int r = 0; r < B; r++) {
            int i = o[start + r].idx, tl = tgt_len[i] < c->max_len - 1 ? tgt_len[i] : c->max_len - 1;
            tg[r] = (LenIdx){tl, i};
            T = tl + 1 > T ? tl + 1 : T;
        }
        int32_t *s = TP_MALLOC((size_t)B * S * sizeof(int32_t)), *sl = TP_MALLOC((size_t)B * sizeof(int32_t));
        int32_t *ti = TP_MALLOC((size_t)B * T * sizeof(int32_t)), *to = TP_MALLOC((size_t)B * T * sizeof(int32_t));
        int32_t *tl = TP_MALLOC((size_t)B * sizeof(int32_t));
        fill_rows(s, sl, S, o + start, B, src, c, true);
        fill_rows(to, tl, T, tg, B, tgt, c, true);  // pieces + eos
        for (int r = 0; r < B; r++) {               // bos + pieces
            int32_t *row = ti + (size_t)r * T;
            for (int t = 0; t < T; t++) row[t] = c->pad_id;
            row[0] = c->bos_id;
            memcpy(row + 1, tgt[tg[r].idx], (size_t)tg[r].len * sizeof(int32_t));
        }
        Batch b = {.B = B, .S = S, .T = T, .src = s, .src_len = sl, .tgt_in = ti, .tgt_out = to, .tgt_len = tl};
        double *sc = TP_MALLOC((size_t)B * sizeof(double));
        model_score(m, &b, sc);
        for (int r = 0; r < B; r++) scores[tg[r].idx] = sc[r];
        free(sc);
        free(s);
        free(sl);
        free(ti);
        free(to);
        free(tl);
        free(tg);
    }
    free(o);
}
