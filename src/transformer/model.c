/* model.c: forward and backward of the pre-LN encoder-decoder.
 *
 * Written once against kernels/ops.h. The backward pass mirrors the forward
 * sub-block by sub-block; backward ops accumulate, so the residual gradient
 * flows through one buffer per stack and the tied embedding and the encoder
 * output collect their gradients from every use without extra adds. A
 * scratch gradient whose first contribution is the only one, or comes
 * first, is written instead (GRAD_WRITE): no pass to zero it, no read of
 * the zeros.
 * Dropout masks are never stored: they are recomputed from their Philox key.
 *
 * Tensor parallelism (Megatron): a rank holds H/tp heads (q/k/v COL, out
 * projection ROW), d_ff/tp FFN columns (fc1 COL, fc2 ROW) and 1/tp of the
 * tied embedding (VOCAB). Each sub-block ends with one tp allreduce in the
 * forward pass (the g operator, before the ROW bias) and starts with one in
 * the backward pass (the f operator, on the LayerNorm-output gradient). The
 * embeddings reduce their lookups, the cross-entropy its row statistics, the
 * output layer and the encoder output their input gradients: every one of
 * them is a mapping of tp/parallel.h on the model's group. Everything
 * between is replicated and identical on every tp rank, so the dropout
 * masks there are drawn without the tp rank in their key.
 *
 * With sequence parallelism (model_set_sequence_parallel) what lies between
 * the sub-blocks is split by token rows instead of replicated: the residual
 * streams, the LayerNorms (their outputs kept as this rank's rows, gathered
 * again in backward) and the dropout (a window of the whole mask). Every
 * (N, C) stream below has seq_rows(N) rows on this rank; the COL layers read
 * the gathered seq_full(N) rows (padding after N), the encoder output and the
 * final decoder LayerNorm are kept gathered for the cross-attention and the
 * output layer.
 *
 * Where one residual sub-block ends and the next pre-LN sub-block begins,
 * the residual add, its dropout and the next LayerNorm are one op each way
 * (op_residual_ln_fwd / _bwd, the same values as the unfused ops): inside a
 * layer in both directions, and from a layer's last sub-block into the next
 * layer's (or the stack's final) LayerNorm in the forward pass, except with
 * full recomputation, whose layers are rebuilt one at a time from their
 * inputs. Backward leaves the boundary between layers unfused: the bias
 * gradient there belongs to the layer below, whose gradients are not yet
 * open (grads_needed) when the layer above finishes.
 */
#include "transformer/model.h"
#include "transformer/decode.h"

#include <math.h>
#include <string.h>
#include "err.h"

enum { /* dropout sites (ops.h dropout_stream) */
    SITE_ENC_EMB = 0, SITE_DEC_EMB, SITE_ENC_ATTN, SITE_ENC_FFN,
    SITE_DEC_SELF, SITE_DEC_CROSS, SITE_DEC_FFN,
};

/* A tensor backward needs only as a GEMM operand: kept in fp32 (f), or
 * with model_set_keep_bf16 as its bf16 rounding (h), the very values the
 * bf16 GEMMs multiply. Its fp32 values are made where kept_dst says (f
 * itself, or a scratch buffer free at that point) and then keep() rounds
 * them into h. */
typedef struct {
    float *f;     // fp32, or NULL
    uint16_t *h;  // bf16 bits, or NULL
} Kept;

/* A GEMM's input: fp32 values, or bf16 bits alone (the x16 ops). */
typedef struct {
    const float *f;
    const uint16_t *h;
} GemmIn;

typedef struct {
    Kept ln;                    // (N, C) LayerNorm output (this rank's rows)
    float *ln_m, *ln_r;         // (N), (N)  its statistics
    Kept q, k, v;               // (N, C/tp) queries, (Nk, C/tp) keys and values (bf16 in bf16 mode, see qkv_fwd)
    float *P;                   // (B, H/tp, Tq, Tk) attention probabilities (NULL: recomputed in backward, or flash)
    float *lse;                 // (B, H/tp, Tq) flash attention's log-sum-exp per row (NULL: exact attention)
    Kept att;                   // (N, C/tp) this rank's heads, before out_proj
} AttnActs;

typedef struct {
    Kept ln;                    // (N, C)
    float *ln_m, *ln_r;         // (N), (N)
    float *h;                   // (N, F/tp) before the activation; NULL for ReLU, whose gradient needs a alone
    Kept a;                     // (N, F/tp) after it
} FfnActs;

typedef struct { AttnActs self; FfnActs ffn; } EncActs;
typedef struct { AttnActs self, cross; FfnActs ffn; } DecActs;

/* Backward's scratch (and forward's d_tmp): one buffer shared by the slots,
 * carved for the shape of the slot in use. */
struct ModelScratch {
    float *buf;                  // device, MEM_ACT
    size_t cap_elems;
    int B, S, T;                 // the shape it was last carved for
};

struct ModelActs {
    int B, S, T;                 // shape the layout was carved for
    float *buf;                  // device, MEM_ACT
    int32_t *ids;                // device, MEM_ACT: the uploaded batch (dev_* below point into it)
    size_t ids_cap;
    const Batch *staged;         // model_stage_batch's batch, whose ids are in place; NULL when none
    const int32_t *dev_src, *dev_src_len, *dev_tgt_in, *dev_tgt_out, *dev_tgt_len;
    size_t n_elems, cap_elems;
    EncActs *enc;                // [enc_layers]
    DecActs *dec;                // [dec_layers]
    float **enc_res;             // [enc_layers + 1] (Ns, C) residual stream
    float **enc_mid;             // [enc_layers] (Ns, C) after the attention block
    float **dec_res;             // [dec_layers + 1] (Nt, C)
    float **dec_mid1, **dec_mid2;  // [dec_layers] (Nt, C) after self / cross blocks
    float *enc_out, *enc_m, *enc_r;  // (Ns, C) final encoder LayerNorm
    uint16_t *enc_out16;         // (Ns, C) its bf16 rounding, the cross-attention k/v GEMMs' input (bf16 mode)
    float *dec_out, *dec_m, *dec_r;  // (Nt, C) final decoder LayerNorm
    Kept logits;                 // (Nt, V/tp), bf16 in bf16 mode; after model_backward, their gradient
    float *losses, *lse;         // (Nt)
    float *row_max, *xstats;     // (Nt), (Nt, 3) vocab-parallel loss statistics
    /* scratch, in the shared buffer */
    float *d_res_s, *d_enc_out;  // (Ns, C)
    float *d_res_t;              // (Nt, C)
    float *d_tmp, *d_ln;         // (maxN, C)
    float *d_att, *d_q, *d_k, *d_v;  // (maxN, C/tp)
    float *d_h;                  // (maxN, F/tp): the FFN's hidden gradient, after and before the activation
                                 // (the same room as d_att .. d_v: see carve_scratch)
    float *d_scratch;            // (B, H/tp, maxL, maxL); flash: (B, H/tp, maxL)
    /* recomputation (model_set_recompute), in the shared buffer too */
    float *P_shared;             // (B, H/tp, maxL, maxL): probabilities not kept per layer (exact attention)
    EncActs enc_shared;          // full: one encoder layer's activations, rebuilt per layer
    DecActs dec_shared;          // full: one decoder layer's
    float *enc_mid_shared, *dec_mid1_shared, *dec_mid2_shared;
    /* sequence parallelism, in the shared buffer too */
    float *sp_full;              // (maxNf, C): a LayerNorm output gathered for the COL layers
    float *sp_part;              // (max rows, C): this rank's rows of a reduce-scattered tensor
    float *sp_grads;             // (9, C): a layer's LayerNorm and ROW-bias gradients before their tp sum
};

/* Rows of a (N, C) stream on this rank: N, or its share with sequence parallelism. */
static int seq_rows(const Model *m, int N) { return m->seq_par ? tp_seq_rows(&m->tp, N) : N; }

/* Rows of the gathered (N, C) tensor: N, or every rank's share (padding after N). */
static int seq_full(const Model *m, int N) { return m->seq_par ? tp_seq_rows(&m->tp, N) * m->tp.size : N; }

/* Where this rank's rows start in the whole (N, C) tensor: its dropout window. */
static uint64_t seq_first(const Model *m, int N, int C) {
    return m->seq_par ? (uint64_t)m->tp.rank * (uint64_t)seq_rows(m, N) * (uint64_t)C : 0;
}

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

static void carve_ffn(Carver *c, FfnActs *f, size_t N, size_t n, int C, int Fl, bool relu, bool bf16) {
    f->ln = take_kept(c, n * C, bf16);
    f->ln_m = take(c, n);
    f->ln_r = take(c, n);
    f->h = relu ? NULL : take(c, N * Fl);
    f->a = take_kept(c, N * Fl, bf16);
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
    carve_ffn(c, &a->ffn, (size_t)B * S, ns, C, Fl, relu, bf16);
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
    carve_ffn(c, &a->ffn, (size_t)B * T, nt, C, Fl, relu, bf16);
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
static void acts_prepare_ex(Model *m, int B, int S, int T, bool scratch) {
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

static void acts_prepare(Model *m, int B, int S, int T) { acts_prepare_ex(m, B, S, T, true); }

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

static void acts_free(Backend *be, ModelActs *A) {
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
static void upload_batch(Model *m, const Batch *b, bool copy) {
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

/* ---- forward ------------------------------------------------------------------- */

static float drop_p(const Model *m, bool train) { return train ? m->cfg.dropout : 0.0f; }

static uint64_t stream_of(DropoutKey k, uint32_t layer, uint32_t site) {
    return dropout_stream(k.step, k.micro, layer, site, k.tp_rank);
}

/* A LayerNorm output of this rank's rows as the (N, C) input of a COL
 * layer: itself, or with sequence parallelism gathered into sp_full (f). */
static const float *col_input(const Model *m, const float *ln, int N) {
    if (!m->seq_par) return ln;
    tp_gather(&m->tp, m->be, ln, m->acts->sp_full, (size_t)seq_rows(m, N) * m->cfg.d_model);
    return m->acts->sp_full;
}

/* ---- kept GEMM operands (Kept) ---- */

/* Where a kept tensor's fp32 values are made: in it (fp32), or in tmp, a
 * scratch buffer free until keep() has rounded them into it. */
static float *kept_dst(const Kept *k, float *tmp) { return k->f ? k->f : tmp; }

static void keep(const Model *m, const Kept *k, const float *x, size_t n_elems) {
    if (k->h) op_to_bf16(m->be, k->h, x, n_elems);
}

static GemmIn kept_in(const Kept *k) { return (GemmIn){k->f, k->h}; }
static GemmIn f32_in(const float *x) { return (GemmIn){x, NULL}; }

static void lin_fwd(const Model *m, float *y, GemmIn x, const float *W, const float *b, int N, int in, int out) {
    if (x.h) op_linear_fwd_x16(m->be, y, x.h, W, b, N, in, out);
    else op_linear_fwd(m->be, y, x.f, W, b, N, in, out);
}

/* y16 = bf16(act(x W^T + b)) (ReLU when relu), tmp (N, out) free fp32 room. */
static void lin_fwd16(const Model *m, uint16_t *y16, float *tmp, GemmIn x, const float *W, const float *b, bool relu,
                      int N, int in, int out) {
    op_linear_fwd16(m->be, y16, tmp, x.f, x.h, W, b, relu, N, in, out);
}

static void lin_bwd(const Model *m, float *dx, GradMode mode, float *dW, float *db, const float *dy, GemmIn x,
                    const float *W, int N, int in, int out) {
    if (x.h) op_linear_bwd_x16(m->be, dx, mode, dW, db, dy, x.h, W, N, in, out);
    else op_linear_bwd(m->be, dx, mode, dW, db, dy, x.f, W, N, in, out);
}

/* A kept LayerNorm output (this rank's rows, its fp32 values in ln32) as
 * the (N, C) input of the COL layers: itself, or with sequence parallelism
 * ln32 gathered (fp32) into sp_full. */
static GemmIn col_in_fwd(const Model *m, const Kept *k, const float *ln32, int N) {
    return m->seq_par ? f32_in(col_input(m, ln32, N)) : kept_in(k);
}

/* The same in backward, where only the kept tensor is left: with sequence
 * parallelism a bf16 one is widened into sp_part (free there) first. */
static GemmIn col_in_bwd(const Model *m, const Kept *k, int N) {
    if (!m->seq_par) return kept_in(k);
    const float *rows = k->f;
    if (!rows) {
        op_from_bf16(m->be, m->acts->sp_part, k->h, (size_t)seq_rows(m, N) * m->cfg.d_model);
        rows = m->acts->sp_part;
    }
    return f32_in(col_input(m, rows, N));
}

/* The rows [N, seq_full(N)) of an (N, C) tensor padded for sequence
 * parallelism's reduce-scatter, zeroed (none without it): an op that writes
 * the N real rows leaves them as they were. */
static void zero_pad_rows(const Model *m, float *x, int N) {
    const size_t C = (size_t)m->cfg.d_model, n_pad = (size_t)(seq_full(m, N) - N) * C;
    if (n_pad) op_zero(m->be, x + (size_t)N * C, n_pad);
}

/* The partial (N, C) output of a ROW layer in tmp summed over tp (g): in
 * place, or with sequence parallelism reduce-scattered into this rank's
 * rows (sp_part; tmp's padding rows zeroed first). Returns where it is. */
static float *row_output(const Model *m, float *tmp, int N) {
    const int C = m->cfg.d_model;
    if (!m->seq_par) {
        tp_reduce_fwd(&m->tp, tmp, (size_t)N * C);
        return tmp;
    }
    const int n = seq_rows(m, N);
    zero_pad_rows(m, tmp, N);
    tp_seq_reduce_scatter(&m->tp, m->be, tmp, m->acts->sp_part, (size_t)n * C);
    return m->acts->sp_part;
}

/* The pre-LN LayerNorm that follows a residual sub-block, when that
 * sub-block's residual op writes it too: its weights, and where its output
 * and statistics go (this rank's rows): y in fp32, or y16 straight into the
 * kept bf16 tensor (ln_direct16). */
typedef struct {
    const float *g, *b;       // (C)
    float *y;                 // (n, C) or NULL
    uint16_t *y16;            // (n, C) or NULL
    float *mean, *rstd;       // (n), (n)
} NextLn;

/* A kept LayerNorm output that its LayerNorm writes as bf16 directly:
 * without sequence parallelism, whose COL layers gather the fp32 rows. */
static bool ln_direct16(const Model *m, const Kept *k) { return k->h && !m->seq_par; }

static NextLn next_ln(const Model *m, const float *g, const float *b, const Kept *k, float *mean, float *rstd) {
    const bool direct = ln_direct16(m, k);
    return (NextLn){g, b, direct ? NULL : kept_dst(k, m->acts->d_ln), direct ? k->h : NULL, mean, rstd};
}
static NextLn attn_ln(const Model *m, const AttnW *w, AttnActs *a) {
    return next_ln(m, w->ln_g, w->ln_b, &a->ln, a->ln_m, a->ln_r);
}
static NextLn ffn_ln(const Model *m, const FfnW *w, FfnActs *f) {
    return next_ln(m, w->ln_g, w->ln_b, &f->ln, f->ln_m, f->ln_r);
}

/* A sub-block's LayerNorm of x_in into its kept tensor k (n rows), or with
 * ln_done the previous residual op's: fp32 values in ln32, rounded into k
 * unless written there directly. */
static void ln_fwd_kept(const Model *m, const Kept *k, float *ln32, float *mean, float *rstd, const float *x_in,
                        const float *g, const float *b, int n, bool ln_done) {
    const int C = m->cfg.d_model;
    if (!ln_done) op_layernorm_fwd(m->be, ln32, mean, rstd, x_in, g, b, n, C, m->cfg.ln_eps);
    if (!ln_done || !ln_direct16(m, k)) keep(m, k, ln32, (size_t)n * C);
}

/* Layers write the next layer's first LayerNorm (and the last layer the
 * stack's final one), except with full recomputation, which rebuilds each
 * layer alone from its input. */
static bool ln_chained(const Model *m) { return m->recompute != MODEL_RECOMPUTE_FULL; }

/* x_out = x_in + Dropout(out + bias) on this rank's rows of the N; with
 * next, its LayerNorm of x_out in the same op. */
static void residual_fwd(const Model *m, float *x_out, const float *x_in, float *out, const float *bias, int N,
                         float p, uint64_t seed, uint64_t stream, const NextLn *next) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    if (next) {
        op_residual_ln_fwd(m->be, x_out, next->y, next->y16, next->mean, next->rstd, x_in, out, bias, next->g,
                           next->b, n, C, m->cfg.ln_eps, seq_first(m, N, C), p, seed, stream);
        return;
    }
    op_bias_add(m->be, out, bias, n, C);
    op_dropout_fwd_at(m->be, out, out, (size_t)n * C, seq_first(m, N, C), p, seed, stream);
    op_add(m->be, x_out, x_in, out, (size_t)n * C);
}

/* q, k, v of a sub-block from its COL input ln and key/value source src.
 * bf16 mode multiplies bf16 roundings of them in attention, as autocast
 * does: kept as bf16 (rounded as the GEMM stores them; d_q, d_k, d_v, free
 * in forward, are the op's fp32 room should it need one), or
 * with fp32 keeping (model_set_keep_bf16 off) rounded where they are, in
 * fp32, so both keepings compute on the same values. */
static void qkv_fwd(const Model *m, const AttnW *w, AttnActs *a, GemmIn ln, GemmIn src, int N, int Nk) {
    const int C = m->cfg.d_model, Cl = C / m->tp.size;
    ModelActs *A = m->acts;
    Kept *kp[3] = {&a->q, &a->k, &a->v};
    float *tmp[3] = {A->d_q, A->d_k, A->d_v};
    const float *W[3] = {w->wq, w->wk, w->wv}, *bias[3] = {w->bq, NULL, w->bv};
    for (int i = 0; i < 3; i++) {
        const int rows = i ? Nk : N;
        const size_t n = (size_t)rows * Cl;
        if (kp[i]->h) {  // rounded as the GEMM stores it
            lin_fwd16(m, kp[i]->h, tmp[i], i ? src : ln, W[i], bias[i], false, rows, C, Cl);
            continue;
        }
        float *x32 = kp[i]->f;
        lin_fwd(m, x32, i ? src : ln, W[i], bias[i], rows, C, Cl);
        if (m->be->dtype == DTYPE_BF16) op_round_bf16(m->be, x32, n);
    }
}

/* attention_fwd on the kept q, k, v as they are; the output to out in
 * fp32, or (bf16 q, k, v only) to out16 as its bf16 rounding; neither:
 * P alone. */
static void attention_fwd_of(const Model *m, const AttnActs *a, float *out, uint16_t *out16, float *P,
                             const int32_t *k_len, int B, int Hl, int Tq, int Tk, int D, bool causal) {
    if (a->q.h)
        op_attention_fwd_x16(m->be, out, out16, P, a->q.h, a->k.h, a->v.h, k_len, B, Hl, Tq, Tk, D, causal);
    else
        op_attention_fwd(m->be, out, P, a->q.f, a->k.f, a->v.f, k_len, B, Hl, Tq, Tk, D, causal);
}

/* x_out = x_in + Dropout(att W_o^T + b_o): an attention block's end, from
 * its kept output att (N rows; x_in, x_out this rank's), with next as in
 * residual_fwd. Also how selective recomputation rebuilds the stream
 * after an attention block in backward: the same ops and dropout keys on
 * the same inputs, so the same bits. */
static void attn_out_fwd(const Model *m, const AttnW *w, const AttnActs *a, float *x_out, const float *x_in, int N,
                         float p, uint64_t seed, uint64_t stream, const NextLn *next) {
    const int C = m->cfg.d_model, Cl = C / m->tp.size;
    float *tmp = m->acts->d_tmp;  // free in forward, and in backward between layers
    lin_fwd(m, tmp, kept_in(&a->att), w->wo, NULL, N, Cl, C);
    residual_fwd(m, x_out, x_in, row_output(m, tmp, N), w->bo, N, p, seed, stream, next);
}

/* The encoder output as the cross-attention's key/value source: in bf16
 * mode its rounding, made once per forward (enc_out16), which the k and v
 * GEMMs of every decoder layer multiply as it is instead of rounding the
 * fp32 values again each; else the fp32 values. */
static GemmIn kv_in(const Model *m, const float *kv) {
    const ModelActs *A = m->acts;
    return kv == A->enc_out && A->enc_out16 ? (GemmIn){NULL, A->enc_out16} : f32_in(kv);
}

/* x_out = x_in + Dropout(Attn(LN(x_in), kv)). kv == NULL: self-attention;
 * else the encoder output, (B Tk, C) gathered. ln_done: LN(x_in) is where
 * kept_dst(&a->ln, d_ln) says already (the previous residual op wrote it);
 * next: see residual_fwd. In forward d_ln, d_att and d_h are free: the
 * fp32 values of the tensors kept in bf16 are made there. */
static void attn_fwd(const Model *m, const AttnW *w, AttnActs *a, float *x_out, const float *x_in,
                     const float *kv, const int32_t *k_len, int B, int Tq, int Tk, bool causal,
                     float p, uint64_t seed, uint64_t stream, bool ln_done, const NextLn *next) {
    const int C = m->cfg.d_model, H = m->cfg.n_heads, D = C / H;
    const int Cl = C / m->tp.size, Hl = H / m->tp.size;
    const int N = B * Tq, Nk = B * Tk, n = seq_rows(m, N);
    ModelActs *A = m->acts;
    float *ln32 = kept_dst(&a->ln, A->d_ln);
    ln_fwd_kept(m, &a->ln, ln32, a->ln_m, a->ln_r, x_in, w->ln_g, w->ln_b, n, ln_done);
    const GemmIn ln = col_in_fwd(m, &a->ln, ln32, N);
    const GemmIn src = kv ? kv_in(m, kv) : ln;
    qkv_fwd(m, w, a, ln, src, N, Nk);
    if (a->lse) {  // flash: the output in bf16 and a log-sum-exp per row, no probabilities
        op_attention_flash_fwd(m->be, a->att.h, a->lse, a->q.h, a->k.h, a->v.h, k_len, B, Hl, Tq, Tk, D, causal);
        attn_out_fwd(m, w, a, x_out, x_in, N, p, seed, stream, next);
        return;
    }
    /* kept in bf16: written so by the attention (its q, k, v are bf16 then too) */
    float *att32 = a->att.h && a->q.h ? NULL : kept_dst(&a->att, A->d_att);
    attention_fwd_of(m, a, att32, att32 ? NULL : a->att.h, a->P ? a->P : A->P_shared, k_len, B, Hl, Tq, Tk, D,
                     causal);
    if (att32) keep(m, &a->att, att32, (size_t)N * Cl);
    attn_out_fwd(m, w, a, x_out, x_in, N, p, seed, stream, next);
}

static void ffn_fwd(const Model *m, const FfnW *w, FfnActs *f, float *x_out, const float *x_in, int N,
                    float p, uint64_t seed, uint64_t stream, bool ln_done, const NextLn *next) {
    const int C = m->cfg.d_model, Fl = m->cfg.d_ff / m->tp.size, n = seq_rows(m, N);
    const size_t nF = (size_t)N * Fl;
    ModelActs *A = m->acts;
    float *tmp = A->d_tmp;
    float *ln32 = kept_dst(&f->ln, A->d_ln);
    ln_fwd_kept(m, &f->ln, ln32, f->ln_m, f->ln_r, x_in, w->ln_g, w->ln_b, n, ln_done);
    /* the hidden before the activation: kept (GELU), or where a is made
     * (ReLU in place in fp32); in bf16 with ReLU never in fp32 (d_h is the
     * op's room should it need one) */
    const GemmIn ln = col_in_fwd(m, &f->ln, ln32, N);
    if (!f->h && f->a.h) {  // bf16 ReLU: bias, ReLU and rounding as the GEMM stores
        lin_fwd16(m, f->a.h, A->d_h, ln, w->w1, w->b1, true, N, C, Fl);
    } else {
        float *h = f->h ? f->h : f->a.f;
        lin_fwd(m, h, ln, w->w1, w->b1, N, C, Fl);
        if (f->a.h) op_act_fwd16(m->be, f->a.h, h, nF, m->cfg.act);
        else op_act_fwd(m->be, f->a.f, h, nF, m->cfg.act);
    }
    lin_fwd(m, tmp, kept_in(&f->a), w->w2, NULL, N, Fl, C);
    residual_fwd(m, x_out, x_in, row_output(m, tmp, N), w->b2, N, p, seed, stream, next);
}

static void embed_fwd(const Model *m, float *x, const int32_t *ids, int B, int T, float p, uint64_t seed,
                      uint64_t stream) {
    const int C = m->cfg.d_model, N = B * T;
    if (!m->seq_par) {
        tp_vocab_embedding_fwd(&m->tp, m->be, x, ids, m->w.embed, sqrtf((float)C), N, C, m->vocab_start,
                               m->vocab_local);
        op_add_positions(m->be, x, B, T, C);
    } else {
        /* this rank's vocabulary rows (zeros for the others' ids), the
         * positions added once (tp rank 0), reduce-scattered into its rows */
        float *full = m->acts->d_tmp;
        op_embedding_fwd(m->be, full, ids, m->w.embed, sqrtf((float)C), N, C, m->vocab_start, m->vocab_local);
        if (m->tp.rank == 0) op_add_positions(m->be, full, B, T, C);
        const int n = seq_rows(m, N);
        zero_pad_rows(m, full, N);
        tp_seq_reduce_scatter(&m->tp, m->be, full, x, (size_t)n * C);
    }
    op_dropout_fwd_at(m->be, x, x, (size_t)seq_rows(m, N) * C, seq_first(m, N, C), p, seed, stream);
}

/* The final LayerNorm of a stack over this rank's rows of x (N rows), into
 * out (N, C) gathered: with sequence parallelism through sp_part. */
static void final_ln_fwd(const Model *m, float *out, float *mean, float *rstd, const float *x, const float *g,
                         const float *b, int N) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    float *y = m->seq_par ? m->acts->sp_part : out;
    op_layernorm_fwd(m->be, y, mean, rstd, x, g, b, n, C, m->cfg.ln_eps);
    if (m->seq_par) tp_gather(&m->tp, m->be, y, out, (size_t)n * C);
}

/* The final LayerNorm written by the last layer's residual op (into out,
 * or with sequence parallelism into d_tmp, free once the layer's ROW output
 * is reduce-scattered, and gathered into out by final_ln_gather). */
static NextLn final_ln(const Model *m, float *out, float *mean, float *rstd, const float *g, const float *b) {
    return (NextLn){g, b, m->seq_par ? m->acts->d_tmp : out, NULL, mean, rstd};
}

static void final_ln_gather(const Model *m, float *out, int N) {
    if (m->seq_par) tp_gather(&m->tp, m->be, m->acts->d_tmp, out, (size_t)seq_rows(m, N) * m->cfg.d_model);
}

/* Whether the stage's last layer of a stack [lo, hi) of n_layers writes
 * the stack's final LayerNorm (the stage holding it: has_ln). */
static bool final_ln_chained(const Model *m, int lo, int hi, int n_layers, bool has_ln) {
    return ln_chained(m) && has_ln && hi == n_layers && hi > lo;
}

/* The stage's encoder layers (the source embedding first on the first
 * stage, the final LayerNorm into A->enc_out on the stage ending the
 * encoder); the activation layout must be prepared and, after the first
 * stage, A->enc_res[enc_lo] received. */
/* Encoder layer l, enc_res[l] -> enc_res[l + 1]; with full recomputation
 * backward runs it again from the kept input (the same dropout keys, so the
 * same values bit for bit; the output is rewritten with what it holds). */
static void enc_layer_fwd(Model *m, int l, const int32_t *src_len, int B, int S, float p, DropoutKey key) {
    const EncLayerW *w = &m->w.enc[l];
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    EncActs *a = &A->enc[l];
    const NextLn to_ffn = ffn_ln(m, &w->ffn, &a->ffn);
    NextLn after = {0};  // the next layer's first LayerNorm, or the encoder's final one
    if (ln_chained(m) && l + 1 < st->enc_hi) after = attn_ln(m, &m->w.enc[l + 1].self, &A->enc[l + 1].self);
    else if (final_ln_chained(m, st->enc_lo, st->enc_hi, m->cfg.enc_layers, st->enc_ln))
        after = final_ln(m, A->enc_out, A->enc_m, A->enc_r, m->w.enc_ln_g, m->w.enc_ln_b);
    attn_fwd(m, &w->self, &a->self, A->enc_mid[l], A->enc_res[l], NULL, src_len, B, S, S, false, p, key.seed,
             stream_of(key, l, SITE_ENC_ATTN), ln_chained(m) && l > st->enc_lo, &to_ffn);
    ffn_fwd(m, &w->ffn, &a->ffn, A->enc_res[l + 1], A->enc_mid[l], B * S, p, key.seed,
            stream_of(key, l, SITE_ENC_FFN), true, after.g ? &after : NULL);
}

/* Decoder layer l, dec_res[l] -> dec_res[l + 1] (the batch uploaded, enc_out in place). */
static void dec_layer_fwd(Model *m, int l, int B, int S, int T, float p, DropoutKey key) {
    const DecLayerW *w = &m->w.dec[l];
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    DecActs *a = &A->dec[l];
    const NextLn to_cross = attn_ln(m, &w->cross, &a->cross), to_ffn = ffn_ln(m, &w->ffn, &a->ffn);
    NextLn after = {0};  // the next layer's first LayerNorm, or the decoder's final one
    if (ln_chained(m) && l + 1 < st->dec_hi) after = attn_ln(m, &m->w.dec[l + 1].self, &A->dec[l + 1].self);
    else if (final_ln_chained(m, st->dec_lo, st->dec_hi, m->cfg.dec_layers, st->head))
        after = final_ln(m, A->dec_out, A->dec_m, A->dec_r, m->w.dec_ln_g, m->w.dec_ln_b);
    attn_fwd(m, &w->self, &a->self, A->dec_mid1[l], A->dec_res[l], NULL, A->dev_tgt_len, B, T, T, true, p, key.seed,
             stream_of(key, l, SITE_DEC_SELF), ln_chained(m) && l > st->dec_lo, &to_cross);
    attn_fwd(m, &w->cross, &a->cross, A->dec_mid2[l], A->dec_mid1[l], A->enc_out, A->dev_src_len, B, T, S, false, p,
             key.seed, stream_of(key, l, SITE_DEC_CROSS), true, &to_ffn);
    ffn_fwd(m, &w->ffn, &a->ffn, A->dec_res[l + 1], A->dec_mid2[l], B * T, p, key.seed,
            stream_of(key, l, SITE_DEC_FFN), true, after.g ? &after : NULL);
}

static void encoder_fwd(Model *m, const int32_t *src, const int32_t *src_len, int B, int S, float p,
                        DropoutKey key) {
    const ModelConfig *c = &m->cfg;
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    const int Ns = B * S;
    if (st->enc_embed) embed_fwd(m, A->enc_res[0], src, B, S, p, key.seed, stream_of(key, 0, SITE_ENC_EMB));
    for (int l = st->enc_lo; l < st->enc_hi; l++) enc_layer_fwd(m, l, src_len, B, S, p, key);
    if (final_ln_chained(m, st->enc_lo, st->enc_hi, c->enc_layers, st->enc_ln)) final_ln_gather(m, A->enc_out, Ns);
    else if (st->enc_ln)
        final_ln_fwd(m, A->enc_out, A->enc_m, A->enc_r, A->enc_res[c->enc_layers], m->w.enc_ln_g, m->w.enc_ln_b, Ns);
}

/* src and src_len are device arrays here (decode.c uploads them). */
void model_encode(Model *m, const int32_t *src, const int32_t *src_len, int B, int S, float *enc_out) {
    TP_CHECK(m->stage.enc_embed && m->stage.enc_ln, "model_encode needs the whole encoder on one stage");
    acts_prepare(m, B, S, 1);
    encoder_fwd(m, src, src_len, B, S, 0.0f, (DropoutKey){0});
    op_copy(m->be, enc_out, m->acts->enc_out, (size_t)B * S * m->cfg.d_model);
}

/* The tied output layer: this rank's vocabulary columns of the logits,
 * from the decoder's output (gathered). In bf16 mode kept as bf16, stored
 * so by the GEMM (the logits are the largest activation of the step: no
 * fp32 copy of them is ever made); with fp32 keeping in bf16 mode rounded
 * in place, so the loss sees the same values either way. */
static void head_fwd(const Model *m, int Nt) {
    const ModelActs *A = m->acts;
    const int C = m->cfg.d_model, Vl = m->vocab_local;
    if (A->logits.h) {
        op_linear_fwd16(m->be, A->logits.h, NULL, A->dec_out, NULL, m->w.embed, NULL, false, Nt, C, Vl);
        return;
    }
    op_linear_fwd(m->be, A->logits.f, A->dec_out, m->w.embed, NULL, Nt, C, Vl);
    if (m->be->dtype == DTYPE_BF16) op_round_bf16(m->be, A->logits.f, (size_t)Nt * Vl);
}

/* loss -> logits -> the decoder output's gradient (into d_ln) and the tied
 * embedding's output-layer part: the logits' gradient is written over them
 * (they are not needed again); kept in bf16, it is rounded as it is stored,
 * the very bits the bf16 GEMMs would round it to. */
static void head_bwd(Model *m, int Nt, float loss_scale) {
    const ModelConfig *c = &m->cfg;
    ModelActs *A = m->acts;
    const int C = c->d_model, Vl = m->vocab_local, V = c->vocab_size;
    if (A->logits.h) {
        op_xent_vp_grad_inplace16(m->be, A->logits.h, A->lse, A->dev_tgt_out, loss_scale, Nt, Vl, m->vocab_valid,
                                  m->vocab_start, V, c->label_smoothing, c->pad_id);
        op_linear_bwd_dy16(m->be, A->d_ln, GRAD_WRITE, m->g.embed, A->logits.h, A->dec_out, m->w.embed, Nt, C, Vl);
        return;
    }
    op_xent_vp_grad_inplace(m->be, A->logits.f, A->lse, A->dev_tgt_out, loss_scale, Nt, Vl, m->vocab_valid,
                            m->vocab_start, V, c->label_smoothing, c->pad_id);
    op_linear_bwd(m->be, A->d_ln, GRAD_WRITE, m->g.embed, NULL, A->logits.f, A->dec_out, m->w.embed, Nt, C, Vl);
}

void model_forward_step(Model *m, const Batch *b, bool train, DropoutKey key, float *loss_sum) {
    const ModelConfig *c = &m->cfg;
    const ModelStage *st = &m->stage;
    const int B = b->B, S = b->S, T = b->T, V = c->vocab_size;
    const int Nt = B * T;
    const float p = drop_p(m, train);
    acts_prepare(m, B, S, T);
    ModelActs *A = m->acts;
    if (A->staged != b) upload_batch(m, b, false);
    A->staged = NULL;
    const int32_t *src_len = A->dev_src_len, *tgt_out = A->dev_tgt_out;

    encoder_fwd(m, A->dev_src, src_len, B, S, p, key);
    if (A->enc_out16)  // the decoder layers' k/v input (computed, or received by a decoder stage), rounded once
        op_to_bf16(m->be, A->enc_out16, A->enc_out, (size_t)seq_full(m, B * S) * c->d_model);
    if (st->dec_embed) embed_fwd(m, A->dec_res[0], A->dev_tgt_in, B, T, p, key.seed, stream_of(key, 0, SITE_DEC_EMB));
    for (int l = st->dec_lo; l < st->dec_hi; l++) dec_layer_fwd(m, l, B, S, T, p, key);
    if (!st->head) return;
    if (final_ln_chained(m, st->dec_lo, st->dec_hi, c->dec_layers, st->head)) final_ln_gather(m, A->dec_out, Nt);
    else
        final_ln_fwd(m, A->dec_out, A->dec_m, A->dec_r, A->dec_res[c->dec_layers], m->w.dec_ln_g, m->w.dec_ln_b, Nt);
    head_fwd(m, Nt);
    tp_vocab_xent_fwd(&m->tp, m->be, A->losses, A->lse, A->row_max, A->xstats, A->logits.f, A->logits.h, tgt_out, Nt,
                      m->vocab_local, m->vocab_valid, m->vocab_start, V, c->label_smoothing, c->pad_id);
    op_sum_acc(m->be, loss_sum, A->losses, (size_t)Nt);
}

/* ---- stage boundaries -------------------------------------------------------- */

static bool stage_has_dec(const ModelStage *st) { return st->dec_hi > st->dec_lo; }

/* A boundary message for a micro-batch of (B, S, T): the encoder part as
 * a residual stream (this rank's rows) or as the encoder output (gathered),
 * the decoder part as a residual stream. */
static StageIO stage_io(const Model *m, int B, int S, int T, float *enc, bool enc_out, float *dec) {
    const size_t C = (size_t)m->cfg.d_model;
    const int Ns = B * S, Nt = B * T;
    StageIO io = {enc, dec, 0, 0};
    if (enc) io.n_enc = (size_t)(enc_out ? seq_full(m, Ns) : seq_rows(m, Ns)) * C;
    if (dec) io.n_dec = (size_t)seq_rows(m, Nt) * C;
    return io;
}

StageIO model_stage_input(Model *m, int B, int S, int T) {
    const ModelStage *st = &m->stage;
    acts_prepare_ex(m, B, S, T, false);  // the scratch may hold another slot's input gradient, not yet sent
    ModelActs *A = m->acts;
    const bool res = model_stage_gets_enc_res(st);
    float *enc = res ? A->enc_res[st->enc_lo] : model_stage_gets_enc_out(st) ? A->enc_out : NULL;
    return stage_io(m, B, S, T, enc, !res, model_stage_gets_dec(st) ? A->dec_res[st->dec_lo] : NULL);
}

StageIO model_stage_output(Model *m) {
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    const bool out = st->enc_ln || stage_has_dec(st);
    return stage_io(m, A->B, A->S, A->T, out ? A->enc_out : A->enc_res[st->enc_hi], out,
                    stage_has_dec(st) ? A->dec_res[st->dec_hi] : NULL);  // the slot's micro-batch
}

StageIO model_stage_output_grad(Model *m, int B, int S, int T) {
    const ModelStage *st = &m->stage;
    acts_prepare(m, B, S, T);
    ModelActs *A = m->acts;
    const bool out = st->enc_ln || stage_has_dec(st);
    return stage_io(m, B, S, T, out ? A->d_enc_out : A->d_res_s, out, stage_has_dec(st) ? A->d_res_t : NULL);
}

StageIO model_stage_input_grad(Model *m) {
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    const bool res = model_stage_gets_enc_res(st);
    float *enc = res ? A->d_res_s : model_stage_gets_enc_out(st) ? A->d_enc_out : NULL;
    /* the scratch's shape: backward's micro-batch (the slot may hold the next one's input by now) */
    const struct ModelScratch *X = m->scratch;
    return stage_io(m, X->B, X->S, X->T, enc, !res, model_stage_gets_dec(st) ? A->d_res_t : NULL);
}

float model_forward(Model *m, const Batch *b, bool train, DropoutKey key, int *n_tokens) {
    op_zero(m->be, m->scalars, 1);
    model_forward_step(m, b, train, key, m->scalars);
    float sum = 0.0f;
    backend_download(m->be, &sum, m->scalars, sizeof sum);
    int n = batch_target_tokens(b, m->cfg.pad_id);
    if (n_tokens) *n_tokens = n;
    return n > 0 ? sum / (float)n : 0.0f;
}

/* ---- backward ------------------------------------------------------------------ */

/* The output gradient of a residual sub-block on this rank's rows, through
 * its dropout written into out (d_tmp, or sp_part with sequence
 * parallelism); returned as the (N, C) input gradient of the ROW layer
 * (with sequence parallelism gathered into d_tmp). The bias gradient: with
 * sequence parallelism taken here, on this rank's rows before the gather;
 * otherwise left to the ROW layer's linear backward, whose pass over dy
 * makes it (bias_bwd's bits; on a GPU in bf16 the same pass stores the
 * GEMMs' bf16 copy of dy, one read of dy instead of two): *row_db is
 * d_bias then, NULL when taken here. */
static const float *residual_bwd(const Model *m, float *d_bias, float **row_db, const float *d_x, int N, float p,
                                 uint64_t seed, uint64_t stream) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    ModelActs *A = m->acts;
    float *out = m->seq_par ? A->sp_part : A->d_tmp;
    op_dropout_bwd_at(m->be, out, GRAD_WRITE, d_x, (size_t)n * C, seq_first(m, N, C), p, seed, stream);
    *row_db = m->seq_par ? NULL : d_bias;
    if (m->seq_par) {
        op_bias_bwd(m->be, d_bias, out, n, C);
        tp_gather(&m->tp, m->be, out, A->d_tmp, (size_t)n * C);
    }
    return A->d_tmp;
}

/* The residual sub-block before a LayerNorm, whose output gradient that
 * LayerNorm's backward produces in the same op (op_residual_ln_bwd): its
 * ROW bias gradient and dropout stream. */
typedef struct {
    float *d_bias;    // (C) accumulated
    uint64_t stream;  // its dropout site's
} PrevRes;

/* The partial (N, C) input gradient of COL layers in d (its padding rows
 * zero) summed over tp (f): in place, or with sequence parallelism
 * reduce-scattered into this rank's rows (sp_part). Returns where it is. */
static const float *col_input_bwd(const Model *m, float *d, int N) {
    const int C = m->cfg.d_model;
    if (!m->seq_par) {
        tp_reduce_bwd(&m->tp, d, (size_t)N * C);
        return d;
    }
    tp_seq_reduce_scatter(&m->tp, m->be, d, m->acts->sp_part, (size_t)seq_rows(m, N) * C);
    return m->acts->sp_part;
}

/* With sequence parallelism each rank's gradients of the replicated
 * LayerNorm weights and ROW biases cover its own rows only: backward
 * writes them into sp_grads (one C-vector each), sums them over tp and adds
 * them to the real ones (side_add / side_sum). Without it, nothing. */
typedef struct { float *dst[9]; int n; } SideGrads;

static void side_add(const Model *m, SideGrads *s, float **g) {
    if (!m->seq_par) return;
    const int C = m->cfg.d_model;
    TP_CHECK(s->n < 9, "sequence parallelism: more than 9 replicated gradients in one layer");
    float *side = m->acts->sp_grads + (size_t)s->n * C;
    op_zero(m->be, side, C);
    s->dst[s->n++] = *g;
    *g = side;
}

static void side_sum(const Model *m, SideGrads *s) {
    if (!m->seq_par || s->n == 0) return;
    const int C = m->cfg.d_model;
    tp_reduce_bwd(&m->tp, m->acts->sp_grads, (size_t)s->n * C);
    for (int i = 0; i < s->n; i++) op_add(m->be, s->dst[i], s->dst[i], m->acts->sp_grads + (size_t)i * C, C);
}

static void side_attn(const Model *m, SideGrads *s, AttnW *g) {
    side_add(m, s, &g->ln_g);
    side_add(m, s, &g->ln_b);
    side_add(m, s, &g->bo);
}

static void side_ffn(const Model *m, SideGrads *s, FfnW *g) {
    side_add(m, s, &g->ln_g);
    side_add(m, s, &g->ln_b);
    side_add(m, s, &g->b2);
}

/* Backward of final_ln_fwd: d_out holds this rank's partial gradient of
 * the gathered output (summed over tp here, col_input_bwd); d_x (this
 * rank's rows of the LayerNorm's input x) is zeroed and receives the input
 * gradient; the weights' gradients g_g, g_b (of w_g) are accumulated. */
static void final_ln_bwd(const Model *m, float *d_x, float *d_out, const float *x, const float *mean,
                         const float *rstd, const float *w_g, float *g_g, float *g_b, int N) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    const float *d_y = col_input_bwd(m, d_out, N);
    op_zero(m->be, d_x, (size_t)n * C);
    SideGrads side = {0};
    side_add(m, &side, &g_g);
    side_add(m, &side, &g_b);
    op_layernorm_bwd(m->be, d_x, g_g, g_b, d_y, x, mean, rstd, w_g, n, C);
    side_sum(m, &side);
}

/* The backward of a sub-block's first LayerNorm: d_x += its input gradient
 * from d_ln (this rank's partial, summed over tp here); with prev, the
 * previous residual sub-block's output gradient in the same op, left where
 * residual_bwd leaves it (d_tmp, gathered with sequence parallelism). */
static void ln_bwd(const Model *m, float *d_x, float *g_g, float *g_b, const float *x_in, const float *mean,
                   const float *rstd, const float *w_g, int N, float p, uint64_t seed, const PrevRes *prev) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    ModelActs *A = m->acts;
    const float *d_y = col_input_bwd(m, A->d_ln, N);
    if (!prev) {
        op_layernorm_bwd(m->be, d_x, g_g, g_b, d_y, x_in, mean, rstd, w_g, n, C);
        return;
    }
    float *d_br = m->seq_par ? A->d_ln : A->d_tmp;  // d_ln is free once reduce-scattered into d_y
    op_residual_ln_bwd(m->be, d_x, d_br, g_g, g_b, prev->d_bias, d_y, x_in, mean, rstd, w_g, n, C,
                       seq_first(m, N, C), p, seed, prev->stream);
    if (m->seq_par) tp_gather(&m->tp, m->be, d_br, A->d_tmp, (size_t)n * C);
}

/* d_x holds dL/dx_out on entry and dL/dx_in on return (this rank's rows).
 * With kv != NULL (cross-attention) this rank's partial key/value gradient
 * is added to d_kv, which the caller reduces over tp once for all layers.
 * res_done: the output gradient is in d_tmp already (the next sub-block's
 * ln_bwd put it there); prev: see ln_bwd. */
static void attn_bwd(const Model *m, const AttnW *w, AttnW *g, const AttnActs *a, float *d_x,
                     const float *x_in, const float *kv, float *d_kv, const int32_t *k_len, int B, int Tq, int Tk,
                     bool causal, float p, uint64_t seed, uint64_t stream, bool res_done, const PrevRes *prev) {
    const int C = m->cfg.d_model, H = m->cfg.n_heads, D = C / H;
    const int Cl = C / m->tp.size, Hl = H / m->tp.size;
    const int N = B * Tq, Nk = B * Tk;
    ModelActs *A = m->acts;
    /* probabilities not kept: recomputed from q, k (the same op on the same
     * inputs: bitwise the forward's); P alone, its product with v not needed */
    const float *P = a->P;
    if (!P && !a->lse) {
        attention_fwd_of(m, a, NULL, NULL, A->P_shared, k_len, B, Hl, Tq, Tk, D, causal);
        P = A->P_shared;
    }
    float *row_db = NULL;
    const float *d_out = res_done ? A->d_tmp : residual_bwd(m, g->bo, &row_db, d_x, N, p, seed, stream);
    lin_bwd(m, A->d_att, GRAD_WRITE, g->wo, row_db, d_out, kept_in(&a->att), w->wo, N, Cl, C);
    /* d_q, d_k, d_v written whole: (N, Cl) and (Nk, Cl), padding keys' rows zeros */
    if (a->lse)
        op_attention_flash_bwd(m->be, A->d_q, A->d_k, A->d_v, GRAD_WRITE, A->d_att, a->lse, a->q.h, a->k.h, a->v.h,
                               k_len, A->d_scratch, B, Hl, Tq, Tk, D, causal);
    else if (a->q.h)
        op_attention_bwd_x16(m->be, A->d_q, A->d_k, A->d_v, GRAD_WRITE, A->d_att, P, a->q.h, a->k.h, a->v.h,
                             A->d_scratch, B, Hl, Tq, Tk, D);
    else
        op_attention_bwd(m->be, A->d_q, A->d_k, A->d_v, GRAD_WRITE, A->d_att, P, a->q.f, a->k.f, a->v.f,
                         A->d_scratch, B, Hl, Tq, Tk, D);
    const GemmIn ln = col_in_bwd(m, &a->ln, N);  // with sequence parallelism gathered again
    /* d_ln: q's part written, then (self-attention) k's and v's added; with
     * kv, k and v add to d_kv, which sums every decoder layer's part */
    zero_pad_rows(m, A->d_ln, N);
    lin_bwd(m, A->d_ln, GRAD_WRITE, g->wq, g->bq, A->d_q, ln, w->wq, N, C, Cl);
    const GemmIn src = kv ? kv_in(m, kv) : ln;
    float *d_src = kv ? d_kv : A->d_ln;
    lin_bwd(m, d_src, GRAD_ADD, g->wk, NULL, A->d_k, src, w->wk, Nk, C, Cl);
    lin_bwd(m, d_src, GRAD_ADD, g->wv, g->bv, A->d_v, src, w->wv, Nk, C, Cl);
    ln_bwd(m, d_x, g->ln_g, g->ln_b, x_in, a->ln_m, a->ln_r, w->ln_g, N, p, seed, prev);
}

/* As attn_bwd; the output gradient always from d_x (the FFN ends its layer). */
static void ffn_bwd(const Model *m, const FfnW *w, FfnW *g, const FfnActs *f, float *d_x, const float *x_in,
                    int N, float p, uint64_t seed, uint64_t stream, const PrevRes *prev) {
    const int C = m->cfg.d_model, Fl = m->cfg.d_ff / m->tp.size;
    ModelActs *A = m->acts;
    const size_t nF = (size_t)N * Fl;
    float *row_db = NULL;
    const float *d_out = residual_bwd(m, g->b2, &row_db, d_x, N, p, seed, stream);
    lin_bwd(m, A->d_h, GRAD_WRITE, g->w2, row_db, d_out, kept_in(&f->a), w->w2, N, Fl, C);
    zero_pad_rows(m, A->d_ln, N);
    const GemmIn ln = col_in_bwd(m, &f->ln, N);
    if (!f->h && f->a.h && ln.h) {  // ReLU's output and the LayerNorm's kept in bf16: one op masks as it reads
        op_linear_bwd_relu_x16(m->be, A->d_ln, GRAD_WRITE, g->w1, g->b1, A->d_h, f->a.h, ln.h, w->w1, N, C, Fl);
    } else {
        /* through the activation in place: its input, or for ReLU its output
         * (positive exactly where the input is), as kept */
        if (!f->h && f->a.h) op_act_bwd_x16(m->be, A->d_h, GRAD_WRITE, A->d_h, f->a.h, nF, m->cfg.act);
        else op_act_bwd(m->be, A->d_h, GRAD_WRITE, A->d_h, f->h ? f->h : f->a.f, nF, m->cfg.act);
        lin_bwd(m, A->d_ln, GRAD_WRITE, g->w1, g->b1, A->d_h, ln, w->w1, N, C, Fl);
    }
    ln_bwd(m, d_x, g->ln_g, g->ln_b, x_in, f->ln_m, f->ln_r, w->ln_g, N, p, seed, prev);
}

static void embed_bwd(Model *m, const float *d_x, const int32_t *ids, int N, float p, uint64_t seed,
                      uint64_t stream) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    ModelActs *A = m->acts;
    float *tmp = m->seq_par ? A->sp_part : A->d_tmp;
    op_dropout_bwd_at(m->be, tmp, GRAD_WRITE, d_x, (size_t)n * C, seq_first(m, N, C), p, seed, stream);
    if (m->seq_par) tp_gather(&m->tp, m->be, tmp, A->d_tmp, (size_t)n * C);  // every row, for this rank's ids
    op_embedding_bwd(m->be, m->g.embed, A->d_tmp, ids, sqrtf((float)C), N, C, m->vocab_start, m->vocab_local);
}

/* Everything from weight tensor w (a view into m->params: the gradients
 * use the same offsets) to the buffer's end is final. */
static void grads_final_from(Model *m, const float *w) {
    if (m->grads_final) m->grads_final(m->grads_final_ctx, (size_t)(w - m->params));
}

/* Backward is about to accumulate into the gradients [w, w + n_elems) or,
 * n_elems 0, from weight tensor w to the buffer's end. */
static void grads_needed_at(Model *m, const float *w, size_t n_elems) {
    const size_t lo = (size_t)(w - m->params);
    if (m->grads_needed) m->grads_needed(m->grads_final_ctx, lo, n_elems ? lo + n_elems : m->tab.n_elems);
}

/* Backward of the current stage. The last stage starts from the loss; the
 * others from the output gradients the caller wrote where
 * model_stage_output_grad points. */
/* Selective recomputation keeps no stream between a layer's sub-blocks:
 * the layer's backward rebuilds them first (attn_out_fwd). */
static bool mids_rebuilt(const Model *m) { return m->recompute == MODEL_RECOMPUTE_SELECTIVE; }

void model_backward(Model *m, const Batch *b, bool train, DropoutKey key, float loss_scale) {
    const ModelConfig *c = &m->cfg;
    const ModelStage *st = &m->stage;
    const int B = b->B, S = b->S, T = b->T, C = c->d_model;
    const int Ns = B * S, Nt = B * T;
    const float p = drop_p(m, train);
    ModelActs *A = m->acts;
    TP_CHECK(A->buf && A->B == B && A->S == S && A->T == T,
             "model_backward called without a matching model_forward");
    acts_prepare(m, B, S, T);  // the shared scratch, for this slot's shape
    const bool full = m->recompute == MODEL_RECOMPUTE_FULL;

    if (st->head) {
        /* loss -> logits -> decoder output (tied embedding gets the output-layer part);
         * the logits' gradient is written over them (they are not needed again) */
        grads_needed_at(m, m->w.embed, (size_t)m->vocab_local * C);  // the tied embedding: written now, final last
        grads_needed_at(m, m->w.dec_ln_g, 0);
        zero_pad_rows(m, A->d_ln, Nt);
        head_bwd(m, Nt, loss_scale);
        final_ln_bwd(m, A->d_res_t, A->d_ln, A->dec_res[c->dec_layers], A->dec_m, A->dec_r, m->w.dec_ln_g,
                     m->g.dec_ln_g, m->g.dec_ln_b, Nt);
        grads_final_from(m, m->w.dec_ln_g);
        /* the encoder output's gradient starts here (a later stage's partial arrives otherwise) */
        op_zero(m->be, A->d_enc_out, (size_t)seq_full(m, Ns) * C);
    } else if (st->dec_embed && stage_has_dec(st)) {
        grads_needed_at(m, m->w.embed, (size_t)m->vocab_local * C);  // the target embedding's, written at the end
    }

    for (int l = st->dec_hi - 1; l >= st->dec_lo; l--) {
        const DecLayerW *w = &m->w.dec[l];
        grads_needed_at(m, w->self.ln_g, 0);
        DecLayerW gl = m->g.dec[l], *g = &gl;
        SideGrads side = {0};
        side_ffn(m, &side, &g->ffn);
        side_attn(m, &side, &g->cross);
        side_attn(m, &side, &g->self);
        DecActs *a = &A->dec[l];
        if (full) dec_layer_fwd(m, l, B, S, T, p, key);  // the layer again from its input
        if (mids_rebuilt(m)) {  // the streams after self- and cross-attention, from the input and kept outputs
            attn_out_fwd(m, &w->self, &a->self, A->dec_mid1[l], A->dec_res[l], Nt, p, key.seed,
                         stream_of(key, l, SITE_DEC_SELF), NULL);
            attn_out_fwd(m, &w->cross, &a->cross, A->dec_mid2[l], A->dec_mid1[l], Nt, p, key.seed,
                         stream_of(key, l, SITE_DEC_CROSS), NULL);
        }
        const PrevRes cross = {g->cross.bo, stream_of(key, l, SITE_DEC_CROSS)};
        const PrevRes self = {g->self.bo, stream_of(key, l, SITE_DEC_SELF)};
        ffn_bwd(m, &w->ffn, &g->ffn, &a->ffn, A->d_res_t, A->dec_mid2[l], Nt, p, key.seed,
                stream_of(key, l, SITE_DEC_FFN), &cross);
        attn_bwd(m, &w->cross, &g->cross, &a->cross, A->d_res_t, A->dec_mid1[l], A->enc_out, A->d_enc_out,
                 A->dev_src_len, B, T, S, false, p, key.seed, cross.stream, true, &self);
        attn_bwd(m, &w->self, &g->self, &a->self, A->d_res_t, A->dec_res[l], NULL, NULL, A->dev_tgt_len, B, T, T,
                 true, p, key.seed, self.stream, true, NULL);
        side_sum(m, &side);
        grads_final_from(m, w->self.ln_g);  // a layer's tensors start with its first LayerNorm
    }
    if (st->dec_embed) embed_bwd(m, A->d_res_t, A->dev_tgt_in, Nt, p, key.seed, stream_of(key, 0, SITE_DEC_EMB));

    if (st->enc_ln) {  // d_enc_out: from the cross-attention k/v of every decoder layer
        grads_needed_at(m, m->w.enc_ln_g, 0);
        final_ln_bwd(m, A->d_res_s, A->d_enc_out, A->enc_res[c->enc_layers], A->enc_m, A->enc_r, m->w.enc_ln_g,
                     m->g.enc_ln_g, m->g.enc_ln_b, Ns);
        grads_final_from(m, m->w.enc_ln_g);
    }
    for (int l = st->enc_hi - 1; l >= st->enc_lo; l--) {
        const EncLayerW *w = &m->w.enc[l];
        grads_needed_at(m, w->self.ln_g, 0);
        EncLayerW gl = m->g.enc[l], *g = &gl;
        SideGrads side = {0};
        side_ffn(m, &side, &g->ffn);
        side_attn(m, &side, &g->self);
        const EncActs *a = &A->enc[l];
        if (full) enc_layer_fwd(m, l, A->dev_src_len, B, S, p, key);
        if (mids_rebuilt(m))
            attn_out_fwd(m, &w->self, &a->self, A->enc_mid[l], A->enc_res[l], Ns, p, key.seed,
                         stream_of(key, l, SITE_ENC_ATTN), NULL);
        const PrevRes self = {g->self.bo, stream_of(key, l, SITE_ENC_ATTN)};
        ffn_bwd(m, &w->ffn, &g->ffn, &a->ffn, A->d_res_s, A->enc_mid[l], Ns, p, key.seed,
                stream_of(key, l, SITE_ENC_FFN), &self);
        attn_bwd(m, &w->self, &g->self, &a->self, A->d_res_s, A->enc_res[l], NULL, NULL, A->dev_src_len, B, S, S,
                 false, p, key.seed, self.stream, true, NULL);
        side_sum(m, &side);
        grads_final_from(m, w->self.ln_g);
    }
    if (st->enc_embed) {
        if (!st->dec_embed && !st->head) grads_needed_at(m, m->w.embed, (size_t)m->vocab_local * C);
        embed_bwd(m, A->d_res_s, A->dev_src, Ns, p, key.seed, stream_of(key, 0, SITE_ENC_EMB));
    }
    grads_final_from(m, m->params);
}
