/* model.c: the model's life cycle (model_create*, model_free, gradients,
 * gathering a stage into a whole model, parameters to and from the host)
 * and its batches (staging, checking ids).
 *
 * Calls: model_layout.c (model_internal.h), the parameter table, the
 * backend, tp/parallel.h. The forward and backward passes are in
 * model_fwd.c and model_bwd.c; model_internal.h says how they work.
 */
#include "transformer/model.h"
#include "transformer/model_internal.h"

#include <string.h>
#include "err.h"

/* ---- life cycle ----------------------------------------------------------------- */

int model_create(Model *m, Backend *be, const ModelConfig *cfg, const TpGroup *tp, unsigned long long seed,
                 char *err, size_t err_len) {
    return model_create_ex(m, be, cfg, tp, seed, 0, err, err_len);
}

int model_create_ex(Model *m, Backend *be, const ModelConfig *cfg, const TpGroup *tp, unsigned long long seed,
                    unsigned flags, char *err, size_t err_len) {
    return model_create_stage(m, be, cfg, tp, NULL, seed, flags, err, err_len);
}

int model_create_stage(Model *m, Backend *be, const ModelConfig *cfg, const TpGroup *tp, const ModelStage *stage,
                       unsigned long long seed, unsigned flags, char *err, size_t err_len) {
    memset(m, 0, sizeof *m);
    if (config_validate(cfg, err, err_len)) return -1;
    m->cfg = *cfg;
    m->stage = stage ? *stage : model_stage_whole(cfg);
    m->tp = tp ? *tp : (TpGroup){.size = 1, .rank = 0, .comm = NULL};
    if (tp_group_check(&m->tp, err, err_len)) return -1;
    const int t = m->tp.size;
    if (cfg->n_heads % t || cfg->d_ff % t) {
        tp_error_set(err, err_len, "tensor parallelism %d must divide n_heads (%d) and d_ff (%d)", t, cfg->n_heads,
                     cfg->d_ff);
        return -1;
    }
    m->vocab_local = vocab_padded(cfg, t) / t;
    m->vocab_start = m->tp.rank * m->vocab_local;
    m->vocab_valid = cfg->vocab_size - m->vocab_start < m->vocab_local ? cfg->vocab_size - m->vocab_start
                                                                        : m->vocab_local;
    if (m->vocab_valid < 1) {
        tp_error_set(err, err_len, "vocabulary of %d is too small to split %d ways", cfg->vocab_size, t);
        return -1;
    }
    if (!be) {
        be = backend_create(DEVICE_CPU, DTYPE_F32, 0, err, err_len);
        if (!be) return -1;
        m->owns_be = true;
    }
    m->be = be;
    param_table_build_stage(cfg, t, &m->stage, &m->tab);
    m->params = backend_alloc(be, m->tab.n_elems * sizeof(float), MEM_MASTER);
    if (!(flags & MODEL_NO_GRAD_BUFFER)) m->grads = backend_alloc(be, m->tab.n_elems * sizeof(float), MEM_GRAD);
    m->scalars = backend_alloc(be, 2 * sizeof(float), MEM_WORKSPACE);
    weights_bind_stage(&m->w, cfg, t, &m->stage, m->params);
    weights_bind_stage(&m->g, cfg, t, &m->stage, m->grads);  // all NULL without the buffer
    /* initialised on the host (a pure function of seed and position), uploaded once */
    if (!(flags & MODEL_NO_INIT)) {
        float *init = be->host_visible ? m->params : TP_MALLOC(m->tab.n_elems * sizeof(float));
        params_init(init, &m->tab, cfg, m->tp.rank, seed);
        if (init != m->params) {
            backend_upload(be, m->params, init, m->tab.n_elems * sizeof(float));
            free(init);
        }
    }
    backend_add_compute_weights(be, m->params, m->tab.n_elems);
    m->scratch = TP_CALLOC(1, sizeof *m->scratch);
    m->keep_bf16 = be->dtype == DTYPE_BF16;
    model_set_slots(m, 1);
    return 0;
}

void model_free(Model *m) {
    for (int i = 0; i < m->n_slots; i++) acts_free(m->be, m->slots[i]);
    free(m->slots);
    if (m->scratch) {
        backend_free(m->be, m->scratch->buf);
        free(m->scratch);
    }
    weights_free(&m->w);
    weights_free(&m->g);
    param_table_free(&m->tab);
    if (m->be) {
        backend_remove_compute_weights(m->be, m->params);
        backend_free(m->be, m->params);
        backend_free(m->be, m->grads);
        backend_free(m->be, m->scalars);
        if (m->owns_be) backend_destroy(m->be);
    }
    memset(m, 0, sizeof *m);
}

void model_zero_grad(Model *m) {
    if (m->grads) op_zero(m->be, m->grads, m->tab.n_elems);
}

void model_release_grads(Model *m) {
    backend_free(m->be, m->grads);
    m->grads = NULL;
    float **none = TP_CALLOC((size_t)m->tab.n, sizeof *none);
    weights_bind_each(&m->g, &m->cfg, m->tp.size, &m->stage, none);
    free(none);
}

void model_bind_grads(Model *m, float *const *each) { weights_bind_each(&m->g, &m->cfg, m->tp.size, &m->stage, each); }

void model_gather(const Model *m, Model *whole) {
    const int tp = m->tp.size;
    TP_CHECK(!whole || (whole->tp.size == 1 && whole->tab.n == m->tab.n),
             "model_gather needs a whole model of the same config");
    size_t max_n = 0;
    for (int i = 0; i < m->tab.n; i++) max_n = m->tab.t[i].n_elems > max_n ? m->tab.t[i].n_elems : max_n;
    /* gathered on the device, assembled on the host, uploaded into `whole` */
    float *all = backend_alloc(m->be, (size_t)tp * max_n * sizeof(float), MEM_COMM);
    float *host = TP_MALLOC((size_t)tp * max_n * sizeof(float));
    float *whole_host = whole ? TP_MALLOC(whole->tab.n_elems * sizeof(float)) : NULL;
    for (int i = 0; i < m->tab.n; i++) {
        const ParamInfo *p = &m->tab.t[i];
        float *dst = whole ? whole_host + whole->tab.t[i].offset : NULL;
        if (tp == 1) {
            if (dst) backend_download(m->be, dst, m->params + p->offset, p->n_elems * sizeof(float));
            continue;
        }
        tp_gather(&m->tp, m->be, m->params + p->offset, all, p->n_elems);
        if (!dst) continue;
        backend_download(m->be, host, all, (size_t)tp * p->n_elems * sizeof(float));
        for (int r = 0; r < (p->split == SPLIT_REPL ? 1 : tp); r++) shard_place(p, r, host + (size_t)r * p->n_elems, dst);
    }
    if (whole) {
        model_params_from_host(whole, whole_host);
        free(whole_host);
    }
    free(host);
    backend_free(m->be, all);
}

void model_stage_collect(const Model *m, Comm *pp, const ModelStage *stages, int p, Model *full) {
    const int me = comm_rank(pp);
    TP_CHECK(me == 0 ? full != NULL : full == NULL, "model_stage_collect: the whole stack is assembled on stage 0");
    if (me == 0) {  // its own tensors first
        for (int i = 0; i < m->tab.n; i++) {
            const ParamInfo *t = &m->tab.t[i], *w = param_table_find(&full->tab, t->name);
            TP_CHECK(w && w->n_elems == t->n_elems, "model_stage_collect: %s", t->name);
            op_copy(m->be, full->params + w->offset, m->params + t->offset, t->n_elems);
        }
    }
    for (int s = 1; s < p; s++) {
        if (me != 0 && me != s) continue;
        ParamTable tab;
        param_table_build_stage(&m->cfg, m->tp.size, &stages[s], &tab);
        for (int i = 0; i < tab.n; i++) {
            const ParamInfo *t = &tab.t[i];
            if (strcmp(t->name, "embed.weight") == 0) continue;  // stage 0's copy, the same after every step
            const size_t bytes = t->n_elems * sizeof(float);
            int rc;
            if (me == 0) {
                const ParamInfo *w = param_table_find(&full->tab, t->name);
                TP_CHECK(w && w->n_elems == t->n_elems, "model_stage_collect: %s", t->name);
                rc = comm_recv(pp, full->params + w->offset, bytes, s);
            } else {
                rc = comm_send(pp, m->params + t->offset, bytes, 0);
            }
            TP_CHECK(rc == 0, "%s", comm_error(pp));
        }
        param_table_free(&tab);
    }
    if (me == 0) backend_recast_weights(full->be);
}

const float *model_logits(const Model *m) { return m->acts->logits.f; }
const uint16_t *model_logits16(const Model *m) { return m->acts->logits.h; }

const int32_t *model_targets(const Model *m) { return m->acts->dev_tgt_out; }

void model_params_to_host(const Model *m, float *host) {
    backend_download(m->be, host, m->params, m->tab.n_elems * sizeof(float));
}

void model_params_from_host(Model *m, const float *host) {
    backend_upload(m->be, m->params, host, m->tab.n_elems * sizeof(float));
    backend_recast_weights(m->be);
}

int batch_target_tokens(const Batch *b, int32_t pad_id) {
    int n = 0;
    for (int i = 0; i < b->B; i++)
        for (int t = 0; t < b->tgt_len[i]; t++) n += b->tgt_out[(size_t)i * b->T + t] != pad_id;
    return n;
}

/* The batch's ids on the device: the host arrays themselves where the
 * backend sees host memory (unless copy), else one upload into a buffer
 * kept for reuse. */
void upload_batch(Model *m, const Batch *b, bool copy) {
    ModelActs *A = m->acts;
    const size_t nS = (size_t)b->B * b->S, nT = (size_t)b->B * b->T, B = (size_t)b->B;
    A->staged = NULL;
    if (m->be->host_visible && !copy) {
        A->dev_src = b->src, A->dev_src_len = b->src_len, A->dev_tgt_in = b->tgt_in;
        A->dev_tgt_out = b->tgt_out, A->dev_tgt_len = b->tgt_len;
        return;
    }
    const size_t need = nS + 2 * nT + 2 * B;
    if (need > A->ids_cap) {
        backend_free(m->be, A->ids);
        A->ids = backend_alloc(m->be, need * sizeof(int32_t), MEM_ACT);
        A->ids_cap = need;
    }
    int32_t *p = A->ids;
    const struct { const int32_t *src; size_t n; const int32_t **dst; } parts[] = {
        {b->src, nS, &A->dev_src}, {b->tgt_in, nT, &A->dev_tgt_in}, {b->tgt_out, nT, &A->dev_tgt_out},
        {b->src_len, B, &A->dev_src_len}, {b->tgt_len, B, &A->dev_tgt_len}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        backend_upload(m->be, p, parts[i].src, parts[i].n * sizeof(int32_t));
        *parts[i].dst = p;
        p += parts[i].n;
    }
}

void model_stage_batch(Model *m, const Batch *b) {
    acts_prepare(m, b->B, b->S, b->T);
    upload_batch(m, b, true);
    m->acts->staged = b;
}

void model_unstage_batch(Model *m) { m->acts->staged = NULL; }

size_t model_activation_bytes(const Model *m) {
    size_t n = m->scratch->cap_elems;
    for (int i = 0; i < m->n_slots; i++) n += m->slots[i]->cap_elems;
    return n * sizeof(float);
}

static int check_ids(const int32_t *ids, const int32_t *len, int B, int T, const ModelConfig *c,
                     const char *what, char *err, size_t err_len) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t id = ids[(size_t)b * T + t];
            if (id < 0 || id >= c->vocab_size) {
                tp_error_set(err, err_len, "%s[%d][%d] = %d is outside the vocabulary [0, %d)",
                             what, b, t, id, c->vocab_size);
                return -1;
            }
            if (t >= len[b] && id != c->pad_id) {
                tp_error_set(err, err_len, "%s[%d][%d] = %d lies past the sequence length %d but is not pad_id %d",
                             what, b, t, id, len[b], c->pad_id);
                return -1;
            }
        }
    return 0;
}

int model_check_batch(const Model *m, const Batch *b, char *err, size_t err_len) {
    const ModelConfig *c = &m->cfg;
    if (b->B < 1 || b->S < 1 || b->T < 1) {
        tp_error_set(err, err_len, "batch shape (B=%d, S=%d, T=%d) must be positive", b->B, b->S, b->T);
        return -1;
    }
    if (b->S > c->max_len || b->T > c->max_len) {
        tp_error_set(err, err_len, "batch lengths S=%d, T=%d exceed max_len %d", b->S, b->T, c->max_len);
        return -1;
    }
    for (int i = 0; i < b->B; i++) {
        if (b->src_len[i] < 1 || b->src_len[i] > b->S || b->tgt_len[i] < 1 || b->tgt_len[i] > b->T) {
            tp_error_set(err, err_len, "sequence %d has lengths src %d, tgt %d outside [1, %d] and [1, %d]",
                         i, b->src_len[i], b->tgt_len[i], b->S, b->T);
            return -1;
        }
    }
    if (check_ids(b->src, b->src_len, b->B, b->S, c, "src", err, err_len) ||
        check_ids(b->tgt_in, b->tgt_len, b->B, b->T, c, "tgt_in", err, err_len) ||
        check_ids(b->tgt_out, b->tgt_len, b->B, b->T, c, "tgt_out", err, err_len))
        return -1;
    return 0;
}
