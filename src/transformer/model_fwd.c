/* model_fwd.c: the forward pass, by sub-block and by pipeline stage
 * (model_forward, model_forward_step, model_encode), the kept GEMM
 * operands both passes read, and the stage boundaries (model_stage_input,
 * model_stage_output and their gradients).
 *
 * Calls: kernels/ops.h, tp/parallel.h's mappings, model_layout.c and
 * model.c (model_internal.h); the helpers backward reuses are declared there.
 */
#include "transformer/model.h"
#include "transformer/model_internal.h"
#include "transformer/decode.h"

#include <math.h>
#include "err.h"

/* ---- forward ------------------------------------------------------------------- */

DropP drop_p(const Model *m, bool train) {
    const ModelConfig *c = &m->cfg;
    return train ? (DropP){c->dropout, c->attn_dropout, c->act_dropout} : (DropP){0};
}

uint64_t stream_of(DropoutKey k, uint32_t layer, uint32_t site) {
    return dropout_stream(k.step, k.micro, layer, site, k.tp_rank);
}

SubDrop sub_drop(DropoutKey k, uint32_t layer, float p, uint32_t site, float in_p, uint32_t in_site) {
    return (SubDrop){p, stream_of(k, layer, site), in_p, stream_of(k, layer, in_site), k.seed};
}

/* Encoder layer l's attention (ffn false) or FFN sub-block's dropouts. */
SubDrop enc_drop(DropP dp, DropoutKey key, int l, bool ffn) {
    return ffn ? sub_drop(key, (uint32_t)l, dp.p, SITE_ENC_FFN, dp.act, SITE_ENC_FFN_ACT)
               : sub_drop(key, (uint32_t)l, dp.p, SITE_ENC_ATTN, dp.attn, SITE_ENC_ATTN_PROBS);
}

/* Decoder layer l's sub-block sub (0 self-attention, 1 cross-attention, 2 FFN). */
SubDrop dec_drop(DropP dp, DropoutKey key, int l, int sub) {
    static const uint32_t out[3] = {SITE_DEC_SELF, SITE_DEC_CROSS, SITE_DEC_FFN};
    static const uint32_t in[3] = {SITE_DEC_SELF_PROBS, SITE_DEC_CROSS_PROBS, SITE_DEC_FFN_ACT};
    return sub_drop(key, (uint32_t)l, dp.p, out[sub], sub == 2 ? dp.act : dp.attn, in[sub]);
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

GemmIn kept_in(const Kept *k) { return (GemmIn){k->f, k->h}; }
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

void lin_bwd(const Model *m, float *dx, GradMode mode, float *dW, float *db, const float *dy, GemmIn x,
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
GemmIn col_in_bwd(const Model *m, const Kept *k, int N) {
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
void zero_pad_rows(const Model *m, float *x, int N) {
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

/* This rank's heads' probabilities, (B, Hl, Tq, Tk), as a window of the
 * mask of every head's (B, H, Tq, Tk): row b starts at first + b*ld. */
void probs_window(const Model *m, int Tq, int Tk, uint64_t *first, uint64_t *ld) {
    const uint64_t per_head = (uint64_t)Tq * (uint64_t)Tk, Hl = (uint64_t)(m->cfg.n_heads / m->tp.size);
    *first = (uint64_t)m->tp.rank * Hl * per_head;
    *ld = (uint64_t)m->cfg.n_heads * per_head;
}

/* attention_fwd on the kept q, k, v as they are; the output to out in
 * fp32, or (bf16 q, k, v only) to out16 as its bf16 rounding; neither:
 * P alone. With d's inner dropout (d->in_p > 0) the output is taken from
 * the dropped probabilities (made in d_scratch, free in forward and between
 * backward's sub-blocks) while P keeps them undropped. */
void attention_fwd_of(const Model *m, const AttnActs *a, float *out, uint16_t *out16, float *P,
                      const int32_t *k_len, int B, int Hl, int Tq, int Tk, int D, bool causal, const SubDrop *d) {
    if (d && d->in_p > 0.0f) {
        uint64_t first, ld;
        probs_window(m, Tq, Tk, &first, &ld);
        op_attention_drop_fwd(m->be, out, out16, P, m->acts->d_scratch, a->q.f, a->k.f, a->v.f, a->q.h, a->k.h,
                              a->v.h, k_len, B, Hl, Tq, Tk, D, causal, first, ld, d->in_p, d->seed, d->in_stream);
        return;
    }
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
void attn_out_fwd(const Model *m, const AttnW *w, const AttnActs *a, float *x_out, const float *x_in, int N,
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
GemmIn kv_in(const Model *m, const float *kv) {
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
                     const SubDrop *d, bool ln_done, const NextLn *next) {
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
        TP_CHECK(d->in_p == 0.0f, "flash attention has no dropout on the probabilities (refused at set-up)");
        op_attention_flash_fwd(m->be, a->att.h, a->lse, a->q.h, a->k.h, a->v.h, k_len, B, Hl, Tq, Tk, D, causal);
        attn_out_fwd(m, w, a, x_out, x_in, N, d->p, d->seed, d->stream, next);
        return;
    }
    /* kept in bf16: written so by the attention (its q, k, v are bf16 then too) */
    float *att32 = a->att.h && a->q.h ? NULL : kept_dst(&a->att, A->d_att);
    attention_fwd_of(m, a, att32, att32 ? NULL : a->att.h, a->P ? a->P : A->P_shared, k_len, B, Hl, Tq, Tk, D,
                     causal, d);
    if (att32) keep(m, &a->att, att32, (size_t)N * Cl);
    attn_out_fwd(m, w, a, x_out, x_in, N, d->p, d->seed, d->stream, next);
}

ActWin act_window(const Model *m, int N) {
    const int Fl = m->cfg.d_ff / m->tp.size;
    return (ActWin){(size_t)N, (size_t)Fl, (uint64_t)m->cfg.d_ff, (uint64_t)m->tp.rank * (uint64_t)Fl};
}

/* With activation dropout: a (kept) = Dropout(act(h)), made in fp32 (in a
 * itself, or in d_h, free in forward, and rounded into a), so that fp32 and
 * bf16 keeping multiply the same values. For ReLU a is all backward needs:
 * a dropped element's gradient is zero, and a kept one is positive exactly
 * where its input is. */
static void ffn_act_dropout(const Model *m, FfnActs *f, const float *h, int N, const SubDrop *d) {
    const size_t nF = (size_t)N * (m->cfg.d_ff / m->tp.size);
    float *a32 = kept_dst(&f->a, m->acts->d_h);
    const ActWin win = act_window(m, N);
    op_act_fwd(m->be, a32, h, nF, m->cfg.act);
    op_dropout_fwd_win(m->be, a32, a32, win.rows, win.cols, win.ld, win.first, d->in_p, d->seed, d->in_stream);
    keep(m, &f->a, a32, nF);
}

static void ffn_fwd(const Model *m, const FfnW *w, FfnActs *f, float *x_out, const float *x_in, int N,
                    const SubDrop *d, bool ln_done, const NextLn *next) {
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
    if (d->in_p > 0.0f) {  // the hidden in fp32 (kept for GELU, else where a is made), then ffn_act_dropout
        float *h = f->h ? f->h : kept_dst(&f->a, A->d_h);
        lin_fwd(m, h, ln, w->w1, w->b1, N, C, Fl);
        ffn_act_dropout(m, f, h, N, d);
    } else if (f->mask) {  // bf16 ReLU and its bit-mask for backward (model_ffn_mask_kept), as the GEMM stores
        op_linear_relu_fwd16(m->be, f->a.h, A->d_h, f->mask, ln.f, ln.h, w->w1, w->b1, N, C, Fl);
    } else if (!f->h && f->a.h) {  // bf16 ReLU: bias, ReLU and rounding as the GEMM stores
        lin_fwd16(m, f->a.h, A->d_h, ln, w->w1, w->b1, true, N, C, Fl);
    } else {
        float *h = f->h ? f->h : f->a.f;
        lin_fwd(m, h, ln, w->w1, w->b1, N, C, Fl);
        if (f->a.h) op_act_fwd16(m->be, f->a.h, h, nF, m->cfg.act);
        else op_act_fwd(m->be, f->a.f, h, nF, m->cfg.act);
    }
    lin_fwd(m, tmp, kept_in(&f->a), w->w2, NULL, N, Fl, C);
    residual_fwd(m, x_out, x_in, row_output(m, tmp, N), w->b2, N, d->p, d->seed, d->stream, next);
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
void final_ln_fwd(const Model *m, float *out, float *mean, float *rstd, const float *x, const float *g,
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
void enc_layer_fwd(Model *m, int l, const int32_t *src_len, int B, int S, DropP dp, DropoutKey key) {
    const EncLayerW *w = &m->w.enc[l];
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    EncActs *a = &A->enc[l];
    const NextLn to_ffn = ffn_ln(m, &w->ffn, &a->ffn);
    NextLn after = {0};  // the next layer's first LayerNorm, or the encoder's final one
    if (ln_chained(m) && l + 1 < st->enc_hi) after = attn_ln(m, &m->w.enc[l + 1].self, &A->enc[l + 1].self);
    else if (final_ln_chained(m, st->enc_lo, st->enc_hi, m->cfg.enc_layers, st->enc_ln))
        after = final_ln(m, A->enc_out, A->enc_m, A->enc_r, m->w.enc_ln_g, m->w.enc_ln_b);
    const SubDrop d_attn = enc_drop(dp, key, l, false), d_ffn = enc_drop(dp, key, l, true);
    attn_fwd(m, &w->self, &a->self, A->enc_mid[l], A->enc_res[l], NULL, src_len, B, S, S, false, &d_attn,
             ln_chained(m) && l > st->enc_lo, &to_ffn);
    ffn_fwd(m, &w->ffn, &a->ffn, A->enc_res[l + 1], A->enc_mid[l], B * S, &d_ffn, true, after.g ? &after : NULL);
}

/* Decoder layer l, dec_res[l] -> dec_res[l + 1] (the batch uploaded, enc_out in place). */
void dec_layer_fwd(Model *m, int l, int B, int S, int T, DropP dp, DropoutKey key) {
    const DecLayerW *w = &m->w.dec[l];
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    DecActs *a = &A->dec[l];
    const NextLn to_cross = attn_ln(m, &w->cross, &a->cross), to_ffn = ffn_ln(m, &w->ffn, &a->ffn);
    NextLn after = {0};  // the next layer's first LayerNorm, or the decoder's final one
    if (ln_chained(m) && l + 1 < st->dec_hi) after = attn_ln(m, &m->w.dec[l + 1].self, &A->dec[l + 1].self);
    else if (final_ln_chained(m, st->dec_lo, st->dec_hi, m->cfg.dec_layers, st->head))
        after = final_ln(m, A->dec_out, A->dec_m, A->dec_r, m->w.dec_ln_g, m->w.dec_ln_b);
    const SubDrop d_self = dec_drop(dp, key, l, 0), d_cross = dec_drop(dp, key, l, 1), d_ffn = dec_drop(dp, key, l, 2);
    attn_fwd(m, &w->self, &a->self, A->dec_mid1[l], A->dec_res[l], NULL, A->dev_tgt_len, B, T, T, true, &d_self,
             ln_chained(m) && l > st->dec_lo, &to_cross);
    attn_fwd(m, &w->cross, &a->cross, A->dec_mid2[l], A->dec_mid1[l], A->enc_out, A->dev_src_len, B, T, S, false,
             &d_cross, true, &to_ffn);
    ffn_fwd(m, &w->ffn, &a->ffn, A->dec_res[l + 1], A->dec_mid2[l], B * T, &d_ffn, true, after.g ? &after : NULL);
}

static void encoder_fwd(Model *m, const int32_t *src, const int32_t *src_len, int B, int S, DropP dp,
                        DropoutKey key) {
    const ModelConfig *c = &m->cfg;
    const ModelStage *st = &m->stage;
    ModelActs *A = m->acts;
    const int Ns = B * S;
    if (st->enc_embed) embed_fwd(m, A->enc_res[0], src, B, S, dp.p, key.seed, stream_of(key, 0, SITE_ENC_EMB));
    for (int l = st->enc_lo; l < st->enc_hi; l++) enc_layer_fwd(m, l, src_len, B, S, dp, key);
    if (final_ln_chained(m, st->enc_lo, st->enc_hi, c->enc_layers, st->enc_ln)) final_ln_gather(m, A->enc_out, Ns);
    else if (st->enc_ln)
        final_ln_fwd(m, A->enc_out, A->enc_m, A->enc_r, A->enc_res[c->enc_layers], m->w.enc_ln_g, m->w.enc_ln_b, Ns);
}

/* src and src_len are device arrays here (decode.c uploads them). */
void model_encode(Model *m, const int32_t *src, const int32_t *src_len, int B, int S, float *enc_out) {
    TP_CHECK(m->stage.enc_embed && m->stage.enc_ln, "model_encode needs the whole encoder on one stage");
    acts_prepare(m, B, S, 1);
    encoder_fwd(m, src, src_len, B, S, (DropP){0}, (DropoutKey){0});
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
void head_bwd(Model *m, int Nt, float loss_scale) {
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
    const DropP dp = drop_p(m, train);
    acts_prepare(m, B, S, T);
    ModelActs *A = m->acts;
    if (A->staged != b) upload_batch(m, b, false);
    A->staged = NULL;
    const int32_t *src_len = A->dev_src_len, *tgt_out = A->dev_tgt_out;

    encoder_fwd(m, A->dev_src, src_len, B, S, dp, key);
    if (A->enc_out16)  // the decoder layers' k/v input (computed, or received by a decoder stage), rounded once
        op_to_bf16(m->be, A->enc_out16, A->enc_out, (size_t)seq_full(m, B * S) * c->d_model);
    if (st->dec_embed)
        embed_fwd(m, A->dec_res[0], A->dev_tgt_in, B, T, dp.p, key.seed, stream_of(key, 0, SITE_DEC_EMB));
    for (int l = st->dec_lo; l < st->dec_hi; l++) dec_layer_fwd(m, l, B, S, T, dp, key);
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

bool stage_has_dec(const ModelStage *st) { return st->dec_hi > st->dec_lo; }

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
