/* decode.c: incremental decoding with key/value caches, greedy and beam
 * search, and teacher-forced scoring.
 *
 * One DecodeState holds, per decoder layer, the self-attention keys/values
 * of every row so far (rows, max_T, C) and the cross-attention keys/values
 * of the encoder output (rows, S, C). max_T is the positions the search can
 * reach, the batch's longest length limit (decode_max_len), not the
 * model's max_len: a few times the sentences' length, not 256. A step embeds one token per row and
 * runs the decoder stack on it with the same ops as training, so the logits
 * equal those of a full forward pass (the tests check it). Beam search
 * reorders the self-attention caches by parent row after every step (into
 * a second set of caches, which greedy search does without).
 *
 * Everything runs on the model's backend; host and device meet once per
 * step: the chosen tokens go up (with the rows' key lengths) and the logits
 * come down for the search's choice.
 */
#include "transformer/decode.h"

#include <float.h>
#include <math.h>
#include <string.h>
#include "err.h"

typedef struct {
    Model *m;
    int rows, S, max_T;
    int32_t *src_len;          // (rows) device
    int32_t *k_len;            // (rows) device: valid self-attention keys
    int32_t *tok;              // (rows) device: this step's input tokens
    int32_t *host_ids;         // (rows) host staging for k_len and tok
    float *host_logits;        // (rows, V) host: the step's logits, for the search
    float **sk, **sv;          // [dec_layers] (rows, max_T, C)
    float **sk2, **sv2;        // [dec_layers] same, reorder targets (beam search only)
    float **ck, **cv;          // [dec_layers] (rows, S, C)
    float *pe;                 // (max_T, C) sinusoidal positions
    float *x, *ln, *q, *kn, *vn, *att, *tmp;  // (rows, C)
    float *h, *a;              // (rows, F)
    float *mean, *rstd;        // (rows)
    float *P;                  // (rows, H, 1, max(S, max_T))
    float *logits;             // (rows, V)
} DecodeState;

void hypotheses_free(Hypotheses *h) {
    for (int i = 0; i < h->n; i++) free(h->hyp[i]);
    free(h->hyp);
    free(h->len);
    free(h->score);
    memset(h, 0, sizeof *h);
}

int decode_max_len(const ModelConfig *cfg, int src_len) {
    int n = 2 * src_len + 10;
    return n < cfg->max_len - 1 ? n : cfg->max_len - 1;
}

static float *fbuf(Backend *be, size_t n) { return backend_alloc(be, (n ? n : 1) * sizeof(float), MEM_WORKSPACE); }
static int32_t *ibuf(Backend *be, size_t n) { return backend_alloc(be, (n ? n : 1) * sizeof(int32_t), MEM_WORKSPACE); }

/* The positions a search over these sources can reach: one per step. */
static int positions(const ModelConfig *c, const int32_t *src_len, int n) {
    int T = 1;
    for (int i = 0; i < n; i++) {
        const int t = decode_max_len(c, src_len[i]) + 1;
        T = t > T ? t : T;
    }
    return T;
}

size_t decode_workspace_bytes(const ModelConfig *c, int n, int beam, int S) {
    const size_t C = (size_t)c->d_model, F = (size_t)c->d_ff, H = (size_t)c->n_heads, L = (size_t)c->dec_layers;
    const size_t R = (size_t)n * (size_t)(beam > 0 ? beam : 1), Sz = (size_t)S;
    const size_t T = (size_t)decode_max_len(c, S) + 1;  // sources of S tokens at most
    const size_t N = (size_t)n, caches = beam > 0 ? 4 : 2;  // beam search: the reorder targets too
    /* state_init's allocations in order: the row ids, the encoder output and
     * the cross keys/values it is projected into (gone once every layer's
     * caches are made), then the per-step buffers */
    const size_t kept = 3 * R + L * (caches * R * T * C + 2 * R * Sz * C);
    const size_t during = 2 * N * Sz * C;
    const size_t after = T * C + 7 * R * C + 2 * R * F + 2 * R + R * H * (Sz > T ? Sz : T) + R * (size_t)c->vocab_size;
    return (kept + (during > after ? during : after)) * sizeof(float);
}

/* Encodes the n sentences once and gives each of them `beam` rows;
 * reorders: the search will reorder the rows (beam search). */
static void state_init(DecodeState *st, Model *m, const SrcBatch *b, int beam, bool reorders) {
    const ModelConfig *c = &m->cfg;
    const int C = c->d_model, F = c->d_ff, H = c->n_heads, L = c->dec_layers, S = b->S;
    TP_CHECK(m->tp.size == 1, "decoding runs on a whole model (tensor parallelism 1), not a shard of %d", m->tp.size);
    memset(st, 0, sizeof *st);
    st->m = m;
    st->rows = b->n * beam;
    st->S = S;
    st->max_T = positions(c, b->src_len, b->n);
    Backend *be = m->be;
    const size_t R = (size_t)st->rows, T = (size_t)st->max_T;
    st->host_ids = TP_MALLOC(R * sizeof(int32_t));
    st->host_logits = TP_MALLOC(R * (size_t)c->vocab_size * sizeof(float));
    st->src_len = ibuf(be, R);
    st->k_len = ibuf(be, R);
    st->tok = ibuf(be, R);
    for (size_t r = 0; r < R; r++) st->host_ids[r] = b->src_len[r / (size_t)beam];
    backend_upload(be, st->src_len, st->host_ids, R * sizeof(int32_t));

    int32_t *src = ibuf(be, (size_t)b->n * S), *src_len = ibuf(be, (size_t)b->n);
    backend_upload(be, src, b->src, (size_t)b->n * S * sizeof(int32_t));
    backend_upload(be, src_len, b->src_len, (size_t)b->n * sizeof(int32_t));
    float *enc = fbuf(be, (size_t)b->n * S * C);
    model_encode(m, src, src_len, b->n, S, enc);
    backend_free(be, src);
    backend_free(be, src_len);
    float *kv = fbuf(be, (size_t)b->n * S * C);
    st->sk = TP_CALLOC((size_t)L, sizeof(float *));
    st->sv = TP_CALLOC((size_t)L, sizeof(float *));
    st->sk2 = TP_CALLOC((size_t)L, sizeof(float *));
    st->sv2 = TP_CALLOC((size_t)L, sizeof(float *));
    st->ck = TP_CALLOC((size_t)L, sizeof(float *));
    st->cv = TP_CALLOC((size_t)L, sizeof(float *));
    for (int l = 0; l < L; l++) {
        const AttnW *w = &m->w.dec[l].cross;
        st->sk[l] = fbuf(be, R * T * C);
        st->sv[l] = fbuf(be, R * T * C);
        st->sk2[l] = reorders ? fbuf(be, R * T * C) : NULL;
        st->sv2[l] = reorders ? fbuf(be, R * T * C) : NULL;
        st->ck[l] = fbuf(be, R * S * C);
        st->cv[l] = fbuf(be, R * S * C);
        /* Cross keys/values once per sentence, then copied to its beam rows. */
        float *dst[2] = {st->ck[l], st->cv[l]};
        const float *wt[2] = {w->wk, w->wv}, *bs[2] = {NULL, w->bv};
        for (int j = 0; j < 2; j++) {
            op_linear_fwd(be, kv, enc, wt[j], bs[j], b->n * S, C, C);
            for (size_t r = 0; r < R; r++)
                op_copy(be, dst[j] + r * S * C, kv + (r / (size_t)beam) * S * C, (size_t)S * C);
        }
    }
    backend_free(be, kv);
    backend_free(be, enc);
    st->pe = fbuf(be, T * C);
    op_zero(be, st->pe, T * C);
    op_add_positions(be, st->pe, 1, (int)T, C);
    st->x = fbuf(be, R * C);
    st->ln = fbuf(be, R * C);
    st->q = fbuf(be, R * C);
    st->kn = fbuf(be, R * C);
    st->vn = fbuf(be, R * C);
    st->att = fbuf(be, R * C);
    st->tmp = fbuf(be, R * C);
    st->h = fbuf(be, R * F);
    st->a = fbuf(be, R * F);
    st->mean = fbuf(be, R);
    st->rstd = fbuf(be, R);
    st->P = fbuf(be, R * H * (size_t)(S > st->max_T ? S : st->max_T));
    st->logits = fbuf(be, R * (size_t)c->vocab_size);
}

static void state_free(DecodeState *st) {
    Backend *be = st->m->be;
    for (int l = 0; l < st->m->cfg.dec_layers; l++) {
        backend_free(be, st->sk[l]);
        backend_free(be, st->sv[l]);
        backend_free(be, st->sk2[l]);
        backend_free(be, st->sv2[l]);
        backend_free(be, st->ck[l]);
        backend_free(be, st->cv[l]);
    }
    free(st->sk);
    free(st->sv);
    free(st->sk2);
    free(st->sv2);
    free(st->ck);
    free(st->cv);
    backend_free(be, st->src_len);
    backend_free(be, st->k_len);
    backend_free(be, st->pe);
    backend_free(be, st->x);
    backend_free(be, st->ln);
    backend_free(be, st->q);
    backend_free(be, st->kn);
    backend_free(be, st->vn);
    backend_free(be, st->att);
    backend_free(be, st->tmp);
    backend_free(be, st->h);
    backend_free(be, st->a);
    backend_free(be, st->mean);
    backend_free(be, st->rstd);
    backend_free(be, st->P);
    backend_free(be, st->logits);
    backend_free(be, st->tok);
    free(st->host_ids);
    free(st->host_logits);
    memset(st, 0, sizeof *st);
}

/* x += Attn(LN(x)) for one query per row over keys k/v (rows, Tk, C). */
static void step_attn(DecodeState *st, const AttnW *w, const float *k, const float *v, int Tk, const int32_t *k_len) {
    const ModelConfig *c = &st->m->cfg;
    const int R = st->rows, C = c->d_model, H = c->n_heads;
    Backend *be = st->m->be;
    op_linear_fwd(be, st->q, st->ln, w->wq, w->bq, R, C, C);
    op_attention_fwd(be, st->att, st->P, st->q, k, v, k_len, R, H, 1, Tk, C / H, false);
    op_linear_fwd(be, st->tmp, st->att, w->wo, w->bo, R, C, C);
    op_accumulate(be, st->x, st->tmp, (size_t)R * C);
}

/* Runs the decoder on token[r] (host) at position t for every row; the
 * logits (rows, V) land in st->host_logits. */
static void state_step(DecodeState *st, const int32_t *token, int t) {
    Model *m = st->m;
    Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const int R = st->rows, C = c->d_model, F = c->d_ff, V = c->vocab_size, T = st->max_T;
    TP_CHECK(t < T, "decode step %d beyond max_len %d", t, T);
    backend_upload(be, st->tok, token, (size_t)R * sizeof(int32_t));
    for (int r = 0; r < R; r++) st->host_ids[r] = t + 1;
    backend_upload(be, st->k_len, st->host_ids, (size_t)R * sizeof(int32_t));
    op_embedding_fwd(be, st->x, st->tok, m->w.embed, sqrtf((float)C), R, C, 0, V);
    for (int r = 0; r < R; r++) op_accumulate(be, st->x + (size_t)r * C, st->pe + (size_t)t * C, (size_t)C);
    for (int l = 0; l < c->dec_layers; l++) {
        const DecLayerW *w = &m->w.dec[l];
        /* self-attention: append this position's key/value to the cache */
        op_layernorm_fwd(be, st->ln, st->mean, st->rstd, st->x, w->self.ln_g, w->self.ln_b, R, C, c->ln_eps);
        op_linear_fwd(be, st->kn, st->ln, w->self.wk, NULL, R, C, C);
        op_linear_fwd(be, st->vn, st->ln, w->self.wv, w->self.bv, R, C, C);
        for (int r = 0; r < R; r++) {
            op_copy(be, st->sk[l] + ((size_t)r * T + t) * C, st->kn + (size_t)r * C, (size_t)C);
            op_copy(be, st->sv[l] + ((size_t)r * T + t) * C, st->vn + (size_t)r * C, (size_t)C);
        }
        step_attn(st, &w->self, st->sk[l], st->sv[l], T, st->k_len);
        /* cross-attention over the encoder output */
        op_layernorm_fwd(be, st->ln, st->mean, st->rstd, st->x, w->cross.ln_g, w->cross.ln_b, R, C, c->ln_eps);
        step_attn(st, &w->cross, st->ck[l], st->cv[l], st->S, st->src_len);
        /* feed-forward */
        op_layernorm_fwd(be, st->ln, st->mean, st->rstd, st->x, w->ffn.ln_g, w->ffn.ln_b, R, C, c->ln_eps);
        op_linear_fwd(be, st->h, st->ln, w->ffn.w1, w->ffn.b1, R, C, F);
        op_act_fwd(be, st->a, st->h, (size_t)R * F, c->act);
        op_linear_fwd(be, st->tmp, st->a, w->ffn.w2, w->ffn.b2, R, F, C);
        op_accumulate(be, st->x, st->tmp, (size_t)R * C);
    }
    op_layernorm_fwd(be, st->ln, st->mean, st->rstd, st->x, m->w.dec_ln_g, m->w.dec_ln_b, R, C, c->ln_eps);
    op_linear_fwd(be, st->logits, st->ln, m->w.embed, NULL, R, C, V);
    backend_download(be, st->host_logits, st->logits, (size_t)R * V * sizeof(float));
}

/* Row r of the self-attention caches becomes old row parent[r] (positions 0..t). */
static void state_reorder(DecodeState *st, const int *parent, int t) {
    Backend *be = st->m->be;
    const int C = st->m->cfg.d_model, T = st->max_T;
    for (int l = 0; l < st->m->cfg.dec_layers; l++) {
        for (int r = 0; r < st->rows; r++) {
            op_copy(be, st->sk2[l] + (size_t)r * T * C, st->sk[l] + (size_t)parent[r] * T * C, (size_t)(t + 1) * C);
            op_copy(be, st->sv2[l] + (size_t)r * T * C, st->sv[l] + (size_t)parent[r] * T * C, (size_t)(t + 1) * C);
        }
        float *k = st->sk[l], *v = st->sv[l];
        st->sk[l] = st->sk2[l];
        st->sv[l] = st->sv2[l];
        st->sk2[l] = k;
        st->sv2[l] = v;
    }
}

/* log-softmax of one row in double; returns log-sum-exp. */
static double row_lse(const float *x, int V) {
    double mx = -DBL_MAX, s = 0.0;
    for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
    for (int v = 0; v < V; v++) s += exp((double)x[v] - mx);
    return mx + log(s);
}

static void hyps_alloc(Hypotheses *out, int n) {
    memset(out, 0, sizeof *out);
    out->n = n;
    out->hyp = TP_CALLOC((size_t)n, sizeof(int32_t *));
    out->len = TP_CALLOC((size_t)n, sizeof(int));
    out->score = TP_CALLOC((size_t)n, sizeof(float));
}

void decode_greedy(Model *m, const SrcBatch *b, Hypotheses *out) {
    const ModelConfig *c = &m->cfg;
    const int n = b->n, V = c->vocab_size;
    DecodeState st;
    state_init(&st, m, b, 1, false);
    hyps_alloc(out, n);
    int32_t *tok = TP_MALLOC((size_t)n * sizeof(int32_t));
    bool *done = TP_CALLOC((size_t)n, sizeof(bool));
    double *score = TP_CALLOC((size_t)n, sizeof(double));
    int max_steps = 0;
    for (int i = 0; i < n; i++) {
        int L = decode_max_len(c, b->src_len[i]);
        out->hyp[i] = TP_MALLOC((size_t)(L > 0 ? L : 1) * sizeof(int32_t));
        max_steps = L + 1 > max_steps ? L + 1 : max_steps;
        tok[i] = c->bos_id;
    }
    for (int t = 0, left = n; t < max_steps && left > 0; t++) {
        state_step(&st, tok, t);
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            const float *lg = st.host_logits + (size_t)i * V;
            if (t == decode_max_len(c, b->src_len[i])) {  // length limit: stop without eos
                done[i] = true;
                left--;
                continue;
            }
            int best = -1;
            for (int v = 0; v < V; v++) {
                if (v == c->pad_id || v == c->bos_id) continue;
                if (best < 0 || lg[v] > lg[best]) best = v;
            }
            score[i] += (double)lg[best] - row_lse(lg, V);
            if (best == c->eos_id) {
                done[i] = true;
                left--;
            } else {
                out->hyp[i][out->len[i]++] = best;
            }
            tok[i] = best;
        }
    }
    for (int i = 0; i < n; i++) out->score[i] = (float)score[i];
    free(tok);
    free(done);
    free(score);
    state_free(&st);
}

typedef struct { double score; int beam; int32_t tok; } Cand;

/* Better candidate first: higher score, then lower beam, then lower id. */
static bool cand_better(const Cand *a, const Cand *b) {
    if (a->score != b->score) return a->score > b->score;
    if (a->beam != b->beam) return a->beam < b->beam;
    return a->tok < b->tok;
}

void decode_beam(Model *m, const SrcBatch *b, int beam, float lenpen, Hypotheses *out) {
    TP_CHECK(beam >= 1, "beam must be >= 1, got %d", beam);
    const ModelConfig *c = &m->cfg;
    const int n = b->n, V = c->vocab_size, K = beam, R = n * K, T = c->max_len;
    DecodeState st;
    state_init(&st, m, b, K, true);
    hyps_alloc(out, n);
    int32_t *tok = TP_MALLOC((size_t)R * sizeof(int32_t));
    double *score = TP_MALLOC((size_t)R * sizeof(double));      // running log-prob of each live row
    int32_t *seq = TP_MALLOC((size_t)R * T * sizeof(int32_t));   // tokens of each live row
    int32_t *seq2 = TP_MALLOC((size_t)R * T * sizeof(int32_t));
    int *parent = TP_MALLOC((size_t)R * sizeof(int));
    int *n_done = TP_CALLOC((size_t)n, sizeof(int));
    double *best_norm = TP_MALLOC((size_t)n * sizeof(double));
    Cand *cand = TP_MALLOC((size_t)2 * K * sizeof(Cand));
    double *lse = TP_MALLOC((size_t)R * sizeof(double));
    int max_steps = 0;
    for (int r = 0; r < R; r++) {
        tok[r] = c->bos_id;
        score[r] = (r % K == 0) ? 0.0 : -INFINITY;  // one live beam at the start
    }
    for (int i = 0; i < n; i++) {
        best_norm[i] = -INFINITY;
        int L = decode_max_len(c, b->src_len[i]);
        out->hyp[i] = TP_MALLOC((size_t)(L > 0 ? L : 1) * sizeof(int32_t));
        max_steps = L + 1 > max_steps ? L + 1 : max_steps;
    }
    int left = n;
    for (int t = 0; t < max_steps && left > 0; t++) {
        state_step(&st, tok, t);
        for (int r = 0; r < R; r++) lse[r] = row_lse(st.host_logits + (size_t)r * V, V);
        for (int i = 0; i < n; i++) {
            int base = i * K;
            if (n_done[i] >= K) {  // finished sentence: rows idle, keep their place
                for (int k = 0; k < K; k++) parent[base + k] = base + k;
                continue;
            }
            bool force_eos = t == decode_max_len(c, b->src_len[i]);
            /* the 2K best extensions of the live beams */
            int nc = 0;
            for (int k = 0; k < K; k++) {
                int r = base + k;
                if (!isfinite(score[r])) continue;
                const float *lg = st.host_logits + (size_t)r * V;
                for (int v = 0; v < V; v++) {
                    if (v == c->pad_id || v == c->bos_id || (force_eos && v != c->eos_id)) continue;
                    Cand x = {score[r] + (double)lg[v] - lse[r], k, v};
                    if (nc < 2 * K) {
                        cand[nc++] = x;
                    } else if (cand_better(&x, &cand[nc - 1])) {
                        cand[nc - 1] = x;
                    } else {
                        continue;
                    }
                    for (int j = nc - 1; j > 0 && cand_better(&cand[j], &cand[j - 1]); j--) {
                        Cand s = cand[j];
                        cand[j] = cand[j - 1];
                        cand[j - 1] = s;
                    }
                }
            }
            int next = 0;
            for (int j = 0; j < nc && next < K && n_done[i] < K; j++) {
                const Cand *x = &cand[j];
                int r = base + x->beam;
                if (x->tok == c->eos_id) {
                    if (j >= K) continue;  // eos only counts among the top K
                    double norm = x->score / pow((double)(t + 1), (double)lenpen);
                    if (norm > best_norm[i]) {
                        best_norm[i] = norm;
                        memcpy(out->hyp[i], seq + (size_t)r * T, (size_t)t * sizeof(int32_t));
                        out->len[i] = t;
                        out->score[i] = (float)x->score;
                    }
                    n_done[i]++;
                } else {
                    int dst = base + next++;
                    parent[dst] = r;
                    memcpy(seq2 + (size_t)dst * T, seq + (size_t)r * T, (size_t)t * sizeof(int32_t));
                    seq2[(size_t)dst * T + t] = x->tok;
                    tok[dst] = x->tok;
                    score[dst] = x->score;
                }
            }
            if (n_done[i] >= K || next == 0) {  // enough finished, or nothing left alive
                n_done[i] = K;
                left--;
                next = 0;
            }
            for (int k = next; k < K; k++) {  // rows without a live hypothesis
                parent[base + k] = base + k;
                score[base + k] = -INFINITY;
                tok[base + k] = c->pad_id;
            }
        }
        state_reorder(&st, parent, t);
        int32_t *s = seq;
        seq = seq2;
        seq2 = s;
    }
    free(tok);
    free(score);
    free(seq);
    free(seq2);
    free(parent);
    free(n_done);
    free(best_norm);
    free(cand);
    free(lse);
    state_free(&st);
}

void model_score(Model *m, const Batch *b, double *scores) {
    const ModelConfig *c = &m->cfg;
    const int N = b->B * b->T, V = c->vocab_size;
    TP_CHECK(m->tp.size == 1, "scoring runs on a whole model (tensor parallelism 1), not a shard of %d", m->tp.size);
    Backend *be = m->be;
    int n;
    model_forward(m, b, false, (DropoutKey){0}, &n);
    float *nll_dev = fbuf(be, (size_t)N), *lse = fbuf(be, (size_t)N), *wide = NULL;
    const float *logits = model_logits(m);
    if (!logits) {  // kept in bf16: their values, widened
        logits = wide = fbuf(be, (size_t)N * V);
        op_from_bf16(be, wide, model_logits16(m), (size_t)N * V);
    }
    op_xent_fwd(be, nll_dev, lse, logits, model_targets(m), N, V, 0.0f, c->pad_id);
    float *nll = TP_MALLOC((size_t)N * sizeof(float));
    backend_download(be, nll, nll_dev, (size_t)N * sizeof(float));
    backend_free(be, wide);
    backend_free(be, nll_dev);
    backend_free(be, lse);
    for (int i = 0; i < b->B; i++) {
        double s = 0.0;
        for (int t = 0; t < b->tgt_len[i]; t++) s -= nll[(size_t)i * b->T + t];
        scores[i] = s;
    }
    free(nll);
}
