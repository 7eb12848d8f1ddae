/* model_layout.c: the activation layout: which buffers a batch shape
 * needs, carved out of the slots and the shared scratch (acts_prepare),
 * and the knobs that change it (model_plan_activations, model_set_slots,
 * model_set_recompute, model_set_sequence_parallel, model_set_keep_bf16,
 * model_set_attention).
 *
 * Calls: model_internal.h's types, the backend's memory (kernels/backend.h).
 */
#include "transformer/model.h"
#include "transformer/model_internal.h"

#include <string.h>
#include "err.h"

/* ---- activation layout ----------------------------------------------------- */

/* Flash attention in use: asked for, on q, k, v kept in bf16. */
static bool flash_on(const Model *m) { return m->attention == MODEL_ATTENTION_FLASH && m->keep_bf16; }

typedef struct { float *base; size_t off; } Carver;

static float *take(Carver *c, size_t n) {
    float *p = c->base ? c->base + c->off : NULL;
    c->off += (n + 15) & ~(size_t)15; /* 64-byte aligned slices */
    return p;
}

/* Room for a kept tensor of n values: fp32, or bf16 (half the floats). */
static Kept take_kept(Carver *c, size_t n, bool bf16) {
    Kept k = {NULL, NULL};
    if (bf16) k.h = (uint16_t *)take(c, (n + 1) / 2);
    else k.f = take(c, n);
    return k;
}

/* n: this rank's rows of the LayerNorm (seq_rows of B Tq). */
static void carve_attn(Carver *c, AttnActs *a, int B, int Hl, int Tq, int Tk, int C, int Cl, bool keep_P,
                       size_t n, bool bf16, bool flash) {
    size_t N = (size_t)B * Tq, Nk = (size_t)B * Tk;
    a->ln = take_kept(c, n * C, bf16);
    a->ln_m = take(c, n);
    a->ln_r = take(c, n);
    a->q = take_kept(c, N * Cl, bf16);
    a->k = take_kept(c, Nk * Cl, bf16);
    a->v = take_kept(c, Nk * Cl, bf16);
    a->P = keep_P && !flash ? take(c, (size_t)B * Hl * Tq * Tk) : NULL;
    a->lse = flash ? take(c, (size_t)B * Hl * Tq) : NULL;
    a->att = take_kept(c, N * Cl, bf16);
}

static void carve_ffn(Carver *c, FfnActs *f, size_t N, size_t n, int C, int Fl, bool relu, bool bf16, bool mask) {
    f->ln = take_kept(c, n * C, bf16);
    f->ln_m = take(c, n);
    f->ln_r = take(c, n);
    f->h = relu ? NULL : take(c, N * Fl);
    f->a = take_kept(c, N * Fl, bf16);
    f->mask = mask ? (uint8_t *)take(c, (N * relu_mask_row_bytes(Fl) + 3) / 4) : NULL;  // bytes in floats
}

bool model_ffn_mask_kept(const ModelConfig *cfg, bool keep_bf16, int tp) {
    const int Fl = cfg->d_ff / tp;
    return keep_bf16 && cfg->act == ACT_RELU && !(cfg->act_dropout > 0.0f) && cfg->d_model % 8 == 0 && Fl % 8 == 0;
}

/* One encoder layer's activations for backward (beside its input), and
 * with keep_mid its stream between attention and FFN into *mid (else *mid
 * is left as it is: see carve_scratch). */
static void carve_enc_layer(Carver *c, const Model *m, EncActs *a, float **mid, int B, int S, bool keep_P,
                            bool keep_mid) {
    const int C = m->cfg.d_model, tp = m->tp.size, Cl = C / tp, Fl = m->cfg.d_ff / tp, Hl = m->cfg.n_heads / tp;
    const size_t ns = (size_t)seq_rows(m, B * S);
    const bool relu = m->cfg.act == ACT_RELU, bf16 = m->keep_bf16;
    if (keep_mid) *mid = take(c, ns * C);
    carve_attn(c, &a->self, B, Hl, S, S, C, Cl, keep_P, ns, bf16, flash_on(m));
    carve_ffn(c, &a->ffn, (size_t)B * S, ns, C, Fl, relu, bf16, model_ffn_mask_kept(&m->cfg, bf16, tp));
}

/* The same for a decoder layer: its streams after self- and cross-attention. */
static void carve_dec_layer(Carver *c, const Model *m, DecActs *a, float **mid1, float **mid2, int B, int S, int T,
                            bool keep_P, bool keep_mid) {
    const int C = m->cfg.d_model, tp = m->tp.size, Cl = C / tp, Fl = m->cfg.d_ff / tp, Hl = m->cfg.n_heads / tp;
    const size_t nt = (size_t)seq_rows(m, B * T);
    const bool relu = m->cfg.act == ACT_RELU, bf16 = m->keep_bf16;
    if (keep_mid) {
        *mid1 = take(c, nt * C);
        *mid2 = take(c, nt * C);
    }
    carve_attn(c, &a->self, B, Hl, T, T, C, Cl, keep_P, nt, bf16, flash_on(m));
    carve_attn(c, &a->cross, B, Hl, T, S, C, Cl, keep_P, nt, bf16, flash_on(m));
    carve_ffn(c, &a->ffn, (size_t)B * T, nt, C, Fl, relu, bf16, model_ffn_mask_kept(&m->cfg, bf16, tp));
}

/* One walk both sizes (base NULL) and binds what the current stage keeps
 * for backward, for (B, S, T): its layers' activations, the streams at its
 * boundaries, the encoder output where the decoder needs it, the head's. */
static size_t carve_acts(ModelActs *A, const Model *m, float *base, int B, int S, int T) {
    const ModelConfig *cfg = &m->cfg;
    const ModelStage *st = &m->stage;
    const int C = cfg->d_model, Vl = m->vocab_local;
    const size_t Nt = (size_t)B * T;
    const size_t ns = (size_t)seq_rows(m, B * S), nt = (size_t)seq_rows(m, B * T);  // this rank's stream rows
    const bool has_enc = st->enc_hi > st->enc_lo, has_dec = st->dec_hi > st->dec_lo;
    Carver c = {base, 0};
    const bool full = m->recompute == MODEL_RECOMPUTE_FULL, keep_P = m->recompute == MODEL_RECOMPUTE_NONE;
    const bool keep_mid = keep_P;  // selective rebuilds the streams between sub-blocks too
    if (has_enc)
        for (int l = st->enc_lo; l <= st->enc_hi; l++) A->enc_res[l] = take(&c, ns * C);
    for (int l = st->enc_lo; l < st->enc_hi && !full; l++)  // full: only the layer inputs (enc_res)
        carve_enc_layer(&c, m, &A->enc[l], &A->enc_mid[l], B, S, keep_P, keep_mid);
    if (st->enc_ln || has_dec) A->enc_out = take(&c, (size_t)seq_full(m, B * S) * C);  // gathered
    A->enc_out16 = has_dec && m->keep_bf16 ? take_kept(&c, (size_t)seq_full(m, B * S) * C, true).h : NULL;
    if (st->enc_ln) {
        A->enc_m = take(&c, ns);
        A->enc_r = take(&c, ns);
    }
    if (has_dec)
        for (int l = st->dec_lo; l <= st->dec_hi; l++) A->dec_res[l] = take(&c, nt * C);
    for (int l = st->dec_lo; l < st->dec_hi && !full; l++)
        carve_dec_layer(&c, m, &A->dec[l], &A->dec_mid1[l], &A->dec_mid2[l], B, S, T, keep_P, keep_mid);
    if (st->head) {
        A->dec_out = take(&c, (size_t)seq_full(m, B * T) * C);  // gathered: the output layer's input
        A->dec_m = take(&c, nt);
        A->dec_r = take(&c, nt);
        A->logits = take_kept(&c, Nt * Vl, m->keep_bf16);
        A->losses = take(&c, Nt);
        A->lse = take(&c, Nt);
        A->row_max = take(&c, Nt);
        A->xstats = take(&c, Nt * 3);
    }
    return c.off;
}

/* Every layer's streams between its sub-blocks pointing at the one set
 * in the scratch (recomputation rebuilds them layer by layer). */
static void bind_shared_mids(ModelActs *A, const ModelStage *st) {
    for (int l = st->enc_lo; l < st->enc_hi; l++) A->enc_mid[l] = A->enc_mid_shared;
    for (int l = st->dec_lo; l < st->dec_hi; l++) {
        A->dec_mid1[l] = A->dec_mid1_shared;
        A->dec_mid2[l] = A->dec_mid2_shared;
    }
}

/* The same for the scratch of (B, S, T), shared by the slots. */
static size_t carve_scratch(ModelActs *A, const Model *m, float *base, int B, int S, int T) {
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->d_model, tp = m->tp.size;
    const int Cl = C / tp, Fl = cfg->d_ff / tp, Hl = cfg->n_heads / tp;
    const size_t Ns = (size_t)B * S, Nt = (size_t)B * T, maxN = Ns > Nt ? Ns : Nt;
    const size_t ns = (size_t)seq_rows(m, B * S), nt = (size_t)seq_rows(m, B * T), maxn = ns > nt ? ns : nt;
    const size_t maxNf = (size_t)seq_full(m, (int)maxN);  // maxN, or rounded up to tp shares
    const size_t maxL = (size_t)(S > T ? S : T);
    Carver c = {base, 0};
    A->d_res_s = take(&c, ns * C);
    A->d_enc_out = take(&c, (size_t)seq_full(m, B * S) * C);
    A->d_res_t = take(&c, nt * C);
    A->d_tmp = take(&c, maxNf * C);
    A->d_ln = take(&c, maxNf * C);
    /* The attention's gradients (d_att, d_q, d_k, d_v) and the FFN's (d_h)
     * are never live together: backward runs one sub-block at a time, and
     * forward uses each only as its own sub-block's free room. One region. */
    const size_t slice = (maxN * Cl + 15) & ~(size_t)15, attn4 = 4 * slice, ffn = maxN * Fl;
    float *grads = take(&c, attn4 > ffn ? attn4 : ffn);
    float **attn_grads[4] = {&A->d_att, &A->d_q, &A->d_k, &A->d_v};
    for (int i = 0; i < 4; i++) *attn_grads[i] = grads ? grads + i * slice : NULL;
    A->d_h = grads;
    A->d_scratch = take(&c, (size_t)B * Hl * maxL * (flash_on(m) ? 1 : maxL));  // flash: delta per row
    /* Recomputation: the probabilities of the attention being computed or
     * differentiated; with selective, one layer's streams between its
     * sub-blocks; with full, one layer's activations of each stack; the
     * views of every layer pointing at them. */
    const ModelStage *st = &m->stage;
    A->sp_full = m->seq_par ? take(&c, maxNf * C) : NULL;
    A->sp_part = m->seq_par ? take(&c, maxn * C) : NULL;
    A->sp_grads = m->seq_par ? take(&c, (size_t)9 * C) : NULL;
    const bool P_shared = m->recompute != MODEL_RECOMPUTE_NONE && !flash_on(m);
    A->P_shared = P_shared ? take(&c, (size_t)B * Hl * maxL * maxL) : NULL;
    if (m->recompute == MODEL_RECOMPUTE_SELECTIVE) {  // the streams between sub-blocks: one layer's, rebuilt
        const bool has_enc = st->enc_hi > st->enc_lo, has_dec = st->dec_hi > st->dec_lo;
        A->enc_mid_shared = has_enc ? take(&c, ns * C) : NULL;
        A->dec_mid1_shared = has_dec ? take(&c, nt * C) : NULL;
        A->dec_mid2_shared = has_dec ? take(&c, nt * C) : NULL;
        bind_shared_mids(A, st);
    }
    if (m->recompute == MODEL_RECOMPUTE_FULL) {
        if (st->enc_hi > st->enc_lo) carve_enc_layer(&c, m, &A->enc_shared, &A->enc_mid_shared, B, S, false, true);
        for (int l = st->enc_lo; l < st->enc_hi; l++) A->enc[l] = A->enc_shared;
        if (st->dec_hi > st->dec_lo)
            carve_dec_layer(&c, m, &A->dec_shared, &A->dec_mid1_shared, &A->dec_mid2_shared, B, S, T, false, true);
        for (int l = st->dec_lo; l < st->dec_hi; l++) A->dec[l] = A->dec_shared;
        bind_shared_mids(A, st);
    }
    return c.off;
}

/* The current slot's layout for (B, S, T), and with scratch the shared
 * scratch carved for that shape too (it may move: nothing in it lives
 * from one call to the next, except between model_stage_output_grad and
 * model_backward of the same slot, whose shape needs no more room). */
void acts_prepare_ex(Model *m, int B, int S, int T, bool scratch) {
    ModelActs *A = m->acts;
    struct ModelScratch *X = m->scratch;
    if (scratch) {
        const size_t need_x = carve_scratch(A, m, NULL, B, S, T);
        if (need_x > X->cap_elems) {
            backend_free(m->be, X->buf);
            X->buf = backend_alloc(m->be, need_x * sizeof(float), MEM_ACT);
            X->cap_elems = need_x;
        }
        carve_scratch(A, m, X->buf, B, S, T);
        X->B = B, X->S = S, X->T = T;
    }
    if (A->buf && A->B == B && A->S == S && A->T == T) return;
    size_t need = carve_acts(A, m, NULL, B, S, T);
    if (need > A->cap_elems) {
        backend_free(m->be, A->buf);
        A->buf = backend_alloc(m->be, need * sizeof(float), MEM_ACT);
        A->cap_elems = need;
    }
    carve_acts(A, m, A->buf, B, S, T);
    A->n_elems = need;
    A->B = B;
    A->S = S;
    A->T = T;
}

void acts_prepare(Model *m, int B, int S, int T) { acts_prepare_ex(m, B, S, T, true); }

static ModelActs *acts_new(const ModelConfig *cfg) {
    ModelActs *A = TP_CALLOC(1, sizeof *A);
    A->enc = TP_CALLOC((size_t)cfg->enc_layers, sizeof *A->enc);
    A->dec = TP_CALLOC((size_t)cfg->dec_layers, sizeof *A->dec);
    A->enc_res = TP_CALLOC((size_t)cfg->enc_layers + 1, sizeof *A->enc_res);
    A->enc_mid = TP_CALLOC((size_t)cfg->enc_layers, sizeof *A->enc_mid);
    A->dec_res = TP_CALLOC((size_t)cfg->dec_layers + 1, sizeof *A->dec_res);
    A->dec_mid1 = TP_CALLOC((size_t)cfg->dec_layers, sizeof *A->dec_mid1);
    A->dec_mid2 = TP_CALLOC((size_t)cfg->dec_layers, sizeof *A->dec_mid2);
    return A;
}

void acts_free(Backend *be, ModelActs *A) {
    if (!A) return;
    backend_free(be, A->buf);
    backend_free(be, A->ids);
    free(A->enc);
    free(A->dec);
    free(A->enc_res);
    free(A->enc_mid);
    free(A->dec_res);
    free(A->dec_mid1);
    free(A->dec_mid2);
    free(A);
}

/* The floats one slot and the shared scratch take for (B, S, T), from the
 * same walks that carve them, on a model shell: nothing is allocated. */
void model_plan_activations(const ModelConfig *cfg, int tp, const ModelStage *stage, ModelRecompute recompute,
                            bool seq_par, bool keep_bf16, bool flash, int B, int S, int T, size_t *slot_elems,
                            size_t *scratch_elems) {
    Model m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.tp = (TpGroup){.size = tp, .rank = 0, .comm = NULL};
    m.stage = stage ? *stage : model_stage_whole(cfg);
    m.vocab_local = vocab_padded(cfg, tp) / tp;
    m.recompute = recompute;
    m.seq_par = seq_par && tp > 1;
    m.keep_bf16 = keep_bf16;
    m.attention = flash ? MODEL_ATTENTION_FLASH : MODEL_ATTENTION_EXACT;
    ModelActs *A = acts_new(cfg);
    *slot_elems = carve_acts(A, &m, NULL, B, S, T);
    *scratch_elems = carve_scratch(A, &m, NULL, B, S, T);
    acts_free(NULL, A);
}

void model_set_slots(Model *m, int n) {
    TP_CHECK(n >= 1, "model_set_slots: %d slots", n);
    for (int i = n; i < m->n_slots; i++) acts_free(m->be, m->slots[i]);
    m->slots = realloc(m->slots, (size_t)n * sizeof *m->slots);
    TP_CHECK(m->slots, "out of memory");
    for (int i = m->n_slots; i < n; i++) m->slots[i] = acts_new(&m->cfg);
    m->n_slots = n;
    m->layout_gen++;
    model_use_slot(m, 0);
}

/* Every slot is carved again at its next use (the layout changed). */
static void slots_recarve(Model *m) {
    for (int i = 0; i < m->n_slots; i++) m->slots[i]->B = 0;
    m->layout_gen++;
}

void model_set_recompute(Model *m, ModelRecompute mode) {
    if (m->recompute == mode) return;
    m->recompute = mode;
    slots_recarve(m);
}

int model_set_sequence_parallel(Model *m, bool on, char *err, size_t err_len) {
    if (on && m->tp.size > 1 && m->cfg.d_model % 4) {
        tp_error_set(err, err_len, "sequence parallelism needs d_model (%d) to be a multiple of 4", m->cfg.d_model);
        return -1;
    }
    on = on && m->tp.size > 1;  // one rank holds every row anyway
    if (m->seq_par == on) return 0;
    m->seq_par = on;
    slots_recarve(m);
    return 0;
}

void model_set_keep_bf16(Model *m, bool on) {
    on = on && m->be->dtype == DTYPE_BF16;
    if (m->keep_bf16 == on) return;
    m->keep_bf16 = on;
    slots_recarve(m);
}

int model_set_attention(Model *m, ModelAttention kind, char *err, size_t err_len) {
    const int D = m->cfg.d_model / m->cfg.n_heads;
    if (kind == MODEL_ATTENTION_FLASH && !m->keep_bf16) {
        tp_error_set(err, err_len, "flash attention works on bf16 q, k and v: it needs bf16 (--dtype bf16)");
        return -1;
    }
    if (kind == MODEL_ATTENTION_FLASH && m->cfg.attn_dropout > 0.0f) {
        tp_error_set(err, err_len, "flash attention never holds the probabilities: attention dropout %g needs exact "
                     "attention", (double)m->cfg.attn_dropout);
        return -1;
    }
    if (kind == MODEL_ATTENTION_FLASH && (D % 16 || D > 128)) {
        tp_error_set(err, err_len, "flash attention needs a head width (d_model / heads = %d) that is a multiple of "
                     "16, at most 128", D);
        return -1;
    }
    if (m->attention == kind) return 0;
    m->attention = kind;
    slots_recarve(m);
    return 0;
}

const char *model_attention_name(ModelAttention kind) { return kind == MODEL_ATTENTION_FLASH ? "flash" : "exact"; }

const char *model_recompute_name(ModelRecompute mode) {
    return mode == MODEL_RECOMPUTE_FULL ? "full" : mode == MODEL_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

void model_use_slot(Model *m, int slot) {
    TP_CHECK(slot >= 0 && slot < m->n_slots, "activation slot %d of %d", slot, m->n_slots);
    m->slot = slot;
    m->acts = m->slots[slot];
}
