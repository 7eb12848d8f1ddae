/* model_bwd.c: the backward pass (model_backward): sub-block by sub-block
 * the mirror of the forward, recomputing what was not kept.
 *
 * Calls: model_fwd.c's operands and layers (model_internal.h),
 * kernels/ops.h, tp/parallel.h's mappings.
 */
#include "transformer/model.h"
#include "transformer/model_internal.h"

#include <math.h>
#include "err.h"

/* ---- backward ------------------------------------------------------------------ */

/* The output gradient of a residual sub-block on this rank's rows, through
 * its dropout written into out (d_tmp, or sp_part with sequence
 * parallelism); returned as the (N, C) input gradient of the ROW layer
 * (with sequence parallelism gathered into d_tmp). With grad16 (fc2_grad16)
 * it is stored as bf16 bits in the first half of d_tmp instead. The
 * bias gradient: with sequence parallelism taken here, on this rank's rows
 * before the gather; otherwise left to the ROW layer's linear backward,
 * whose pass over dy makes it (bias_bwd's bits; on a GPU in bf16 the same
 * pass stores the GEMMs' bf16 copy of an fp32 dy, one read of dy instead
 * of two): *row_db is d_bias then, NULL when taken here. d_x, the residual
 * stream's gradient, stays fp32 and is only read: it goes on to the
 * sub-block's LayerNorm backward and the layer below. */
static const float *residual_bwd(const Model *m, float *d_bias, float **row_db, const float *d_x, int N, float p,
                                 uint64_t seed, uint64_t stream, bool grad16) {
    const int C = m->cfg.d_model, n = seq_rows(m, N);
    ModelActs *A = m->acts;
    TP_CHECK(!(grad16 && m->seq_par), "bf16 output gradient under sequence parallelism (fc2_grad16)");
    float *out = m->seq_par ? A->sp_part : A->d_tmp;
    op_dropout_bwd_at(m->be, grad16 ? NULL : out, grad16 ? (uint16_t *)out : NULL, GRAD_WRITE, d_x, (size_t)n * C,
                      seq_first(m, N, C), p, seed, stream);
    *row_db = m->seq_par ? NULL : d_bias;
    if (m->seq_par) {
        op_bias_bwd(m->be, d_bias, out, n, C);
        tp_gather(&m->tp, m->be, out, A->d_tmp, (size_t)n * C);
    }
    return A->d_tmp;
}

/* Whether the FFN's output gradient, which residual_bwd makes (the layer
 * boundary's dropout, not fused in backward), reaches fc2's backward as
 * bf16 bits (backend.h's contract; linear_bwd16's dy16): bf16 mode, fc2's
 * input kept in bf16 (model_set_keep_bf16; kept in fp32, the fp32 route
 * runs, against which test_keep_bf16 holds these bits), no sequence
 * parallelism. The same bits as the fp32 route: fc2's GEMMs round that
 * fp32 dy to exactly these values and its bias gradient sums them. What
 * stays fp32: everything in fp32 mode or with fc2's input kept in fp32;
 * with sequence parallelism the dropout's output (this rank's rows, whose
 * bias gradient is summed here before the fp32 gather of every row); the
 * residual stream's gradient the dropout reads (d_res_s, d_res_t), which
 * the LayerNorm backward adds to and the layer below reads; and the
 * embeddings' dropout gradient (embed_bwd), read by the embedding's
 * scatter-add, no linear layer. */
static bool fc2_grad16(const Model *m, const FfnActs *f) {
    return m->be->dtype == DTYPE_BF16 && !m->seq_par && f->a.h;
}

/* The residual sub-block before a LayerNorm, whose output gradient that
 * LayerNorm's backward produces in the same op (op_residual_ln_bwd): its
 * ROW bias gradient and dropout stream. */
typedef struct {
    float *d_bias;    // (C) accumulated
    uint64_t stream;  // its dropout site's
    bool grad16;      // its output gradient stored as bf16 bits (out_grad16)
} PrevRes;

/* Whether an attention sub-block's output gradient, made by the next
 * sub-block's LayerNorm backward, reaches out_proj's backward as bf16 bits
 * (backend.h's contract) in the first half of d_tmp: bf16 mode, the
 * attention output kept in bf16, no sequence parallelism (whose gather is
 * fp32). The same bits as the fp32 route: out_proj's GEMMs round dy to bf16
 * and its bias gradient sums that rounding anyway. */
static bool out_grad16(const Model *m, const AttnActs *a) {
    return m->be->dtype == DTYPE_BF16 && !m->seq_par && a->att.h;
}

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
    TP_CHECK(!(prev->grad16 && m->seq_par), "bf16 output gradient under sequence parallelism (out_grad16)");
    uint16_t *d_br16 = prev->grad16 ? (uint16_t *)d_br : NULL;  // bf16 bits in the first half of the fp32 buffer
    op_residual_ln_bwd(m->be, d_x, d_br16 ? NULL : d_br, d_br16, g_g, g_b, prev->d_bias, d_y, x_in, mean, rstd, w_g, n, C,
                       seq_first(m, N, C), p, seed, prev->stream);
    if (m->seq_par) tp_gather(&m->tp, m->be, d_br, A->d_tmp, (size_t)n * C);
}

/* Whether attention's q, k, v gradients flow in bf16 (backend.h's
 * contract): bf16 mode with q, k, v kept in bf16 (the x16 and flash
 * attention ops). The attention backward then stores them as bf16 bits
 * (dq16, dk16, dv16) in the first half of d_q, d_k, d_v, and the q, k, v
 * projections' backward reads those bits (linear_bwd16's dy16): no fp32
 * copy is written, read and rounded again. The same bits as the fp32 route,
 * whose GEMMs round that fp32 dy to exactly these values (and whose bias
 * gradients sum them). What stays fp32: everything in fp32 mode, and with
 * q, k, v kept in fp32 (model_set_keep_bf16 off); and on either route the
 * projections' input gradient, which is summed: over tp (d_ln, reduced or
 * with sequence parallelism reduce-scattered), over q, k and v, and for
 * cross-attention's keys and values over every decoder layer (d_enc_out,
 * GRAD_ADD, and sent back across pipeline stages). The q, k, v gradients
 * themselves are this rank's heads, written whole (GRAD_WRITE) once per
 * sub-block: never accumulated or communicated, sequence parallelism
 * included. */
static bool qkv_grad16(const Model *m, const AttnActs *a) { return m->be->dtype == DTYPE_BF16 && a->q.h; }

/* A linear layer's backward from its output gradient d: fp32, or with
 * grad16 the bf16 bits there (the q, k, v projections' qkv_grad16, fc2's
 * fc2_grad16). */
static void proj_bwd(const Model *m, float *dx, GradMode mode, float *dW, float *db, const float *d, bool grad16,
                     GemmIn x, const float *W, int N, int in, int out) {
    if (grad16)
        op_linear_bwd16(m->be, dx, NULL, mode, dW, db, NULL, (const uint16_t *)d, NULL, x.f, x.h, W, N, in, out);
    else
        lin_bwd(m, dx, mode, dW, db, d, x, W, N, in, out);
}

/* d_x holds dL/dx_out on entry and dL/dx_in on return (this rank's rows).
 * With kv != NULL (cross-attention) this rank's partial key/value gradient
 * is added to d_kv, which the caller reduces over tp once for all layers.
 * res_done: the output gradient is in d_tmp already (the next sub-block's
 * ln_bwd put it there); prev: see ln_bwd. */
static void attn_bwd(const Model *m, const AttnW *w, AttnW *g, const AttnActs *a, float *d_x,
                     const float *x_in, const float *kv, float *d_kv, const int32_t *k_len, int B, int Tq, int Tk,
                     bool causal, const SubDrop *d, bool res_done, const PrevRes *prev) {
    const float p = d->p;
    const uint64_t seed = d->seed, stream = d->stream;
    const int C = m->cfg.d_model, H = m->cfg.n_heads, D = C / H;
    const int Cl = C / m->tp.size, Hl = H / m->tp.size;
    const int N = B * Tq, Nk = B * Tk;
    ModelActs *A = m->acts;
    /* probabilities not kept: recomputed from q, k (the same op on the same
     * inputs: bitwise the forward's); P alone, its product with v not needed */
    const float *P = a->P;
    if (!P && !a->lse) {
        attention_fwd_of(m, a, NULL, NULL, A->P_shared, k_len, B, Hl, Tq, Tk, D, causal, NULL);
        P = A->P_shared;
    }
    if (res_done && out_grad16(m, a)) {  // the next sub-block's ln_bwd stored it as bf16 (PrevRes.grad16)
        op_linear_bwd16(m->be, A->d_att, NULL, GRAD_WRITE, g->wo, NULL, NULL, (const uint16_t *)A->d_tmp, NULL,
                        a->att.f, a->att.h, w->wo, N, Cl, C);
    } else {
        float *row_db = NULL;
        const float *d_out = res_done ? A->d_tmp : residual_bwd(m, g->bo, &row_db, d_x, N, p, seed, stream, false);
        lin_bwd(m, A->d_att, GRAD_WRITE, g->wo, row_db, d_out, kept_in(&a->att), w->wo, N, Cl, C);
    }
    /* d_q, d_k, d_v written whole: (N, Cl) and (Nk, Cl), padding keys' rows
     * zeros; in fp32, or (g16) as bf16 bits in their first halves */
    const bool g16 = qkv_grad16(m, a);
    float *dq = g16 ? NULL : A->d_q, *dk = g16 ? NULL : A->d_k, *dv = g16 ? NULL : A->d_v;
    uint16_t *dq16 = g16 ? (uint16_t *)A->d_q : NULL, *dk16 = g16 ? (uint16_t *)A->d_k : NULL;
    uint16_t *dv16 = g16 ? (uint16_t *)A->d_v : NULL;
    if (d->in_p > 0.0f) {  // the mask of the probabilities again, from its key
        uint64_t first, ld;
        probs_window(m, Tq, Tk, &first, &ld);
        op_attention_drop_bwd(m->be, dq, dk, dv, dq16, dk16, dv16, GRAD_WRITE, A->d_att, P, a->q.f, a->k.f, a->v.f,
                              a->q.h, a->k.h, a->v.h, A->d_scratch, B, Hl, Tq, Tk, D, first, ld, d->in_p, seed,
                              d->in_stream);
    } else if (a->lse)
        op_attention_flash_bwd(m->be, dq, dk, dv, dq16, dk16, dv16, GRAD_WRITE, A->d_att, a->lse, a->q.h, a->k.h,
                               a->v.h, k_len, A->d_scratch, B, Hl, Tq, Tk, D, causal);
    else if (a->q.h)
        op_attention_bwd_x16(m->be, dq, dk, dv, dq16, dk16, dv16, GRAD_WRITE, A->d_att, P, a->q.h, a->k.h, a->v.h,
                             A->d_scratch, B, Hl, Tq, Tk, D);
    else
        op_attention_bwd(m->be, A->d_q, A->d_k, A->d_v, GRAD_WRITE, A->d_att, P, a->q.f, a->k.f, a->v.f,
                         A->d_scratch, B, Hl, Tq, Tk, D);
    const GemmIn ln = col_in_bwd(m, &a->ln, N);  // with sequence parallelism gathered again
    /* d_ln: q's part written, then (self-attention) k's and v's added; with
     * kv, k and v add to d_kv, which sums every decoder layer's part */
    zero_pad_rows(m, A->d_ln, N);
    proj_bwd(m, A->d_ln, GRAD_WRITE, g->wq, g->bq, A->d_q, g16, ln, w->wq, N, C, Cl);
    const GemmIn src = kv ? kv_in(m, kv) : ln;
    float *d_src = kv ? d_kv : A->d_ln;
    proj_bwd(m, d_src, GRAD_ADD, g->wk, NULL, A->d_k, g16, src, w->wk, Nk, C, Cl);
    proj_bwd(m, d_src, GRAD_ADD, g->wv, g->bv, A->d_v, g16, src, w->wv, Nk, C, Cl);
    ln_bwd(m, d_x, g->ln_g, g->ln_b, x_in, a->ln_m, a->ln_r, w->ln_g, N, p, seed, prev);
}

/* Whether the FFN's hidden gradient flows in bf16 (backend.h's contract):
 * bf16 mode, ReLU's output kept in bf16, no activation dropout. fc2's backward then stores it as bf16 and fc1's reads those
 * bits, masked by the ReLU as it reads them: no fp32 (N, F) gradient is
 * written or read. The same bits as the fp32 route (ReLU's mask commutes
 * with the rounding fc1's GEMMs apply); a dropout between them would
 * scale the rounded values, so with one the fp32 route stays. */
static bool ffn_grad16(const Model *m, const FfnActs *f, const SubDrop *d) {
    return m->be->dtype == DTYPE_BF16 && m->cfg.act == ACT_RELU && !f->h && f->a.h && !(d->in_p > 0.0f);
}

/* As attn_bwd; the output gradient always from d_x (the FFN ends its layer). */
static void ffn_bwd(const Model *m, const FfnW *w, FfnW *g, const FfnActs *f, float *d_x, const float *x_in,
                    int N, const SubDrop *d, const PrevRes *prev) {
    const float p = d->p;
    const uint64_t seed = d->seed, stream = d->stream;
    const int C = m->cfg.d_model, Fl = m->cfg.d_ff / m->tp.size;
    ModelActs *A = m->acts;
    const size_t nF = (size_t)N * Fl;
    float *row_db = NULL;
    const bool out16 = fc2_grad16(m, f);  // fc2's dy: fp32 d_out, or bf16 bits there (dy16)
    const float *d_out = residual_bwd(m, g->b2, &row_db, d_x, N, p, seed, stream, out16);
    const float *dy = out16 ? NULL : d_out;
    const uint16_t *dy16 = out16 ? (const uint16_t *)d_out : NULL;
    const GemmIn a = kept_in(&f->a);
    if (ffn_grad16(m, f, d)) {
        uint16_t *d_h16 = (uint16_t *)A->d_h;  // bf16 bits in the first half of the fp32 buffer
        /* with the kept mask, fc2's dx GEMM masks d_h16 and sums fc1's bias
         * gradient (the same bits on the CPU); else fc1's backward masks by
         * the ReLU's output as it reads */
        if (f->mask)
            op_linear_bwd16_drelu(m->be, d_h16, g->w2, row_db, g->b1, dy, dy16, f->mask, a.h, w->w2, N, Fl, C);
        else
            op_linear_bwd16(m->be, NULL, d_h16, GRAD_WRITE, g->w2, row_db, dy, dy16, NULL, a.f, a.h, w->w2, N, Fl,
                            C);
        zero_pad_rows(m, A->d_ln, N);
        const GemmIn ln = col_in_bwd(m, &f->ln, N);
        op_linear_bwd16(m->be, A->d_ln, NULL, GRAD_WRITE, g->w1, f->mask ? NULL : g->b1, NULL, d_h16,
                        f->mask ? NULL : f->a.h, ln.f, ln.h, w->w1, N, C, Fl);
        ln_bwd(m, d_x, g->ln_g, g->ln_b, x_in, f->ln_m, f->ln_r, w->ln_g, N, p, seed, prev);
        return;
    }
    proj_bwd(m, A->d_h, GRAD_WRITE, g->w2, row_db, d_out, out16, a, w->w2, N, Fl, C);
    if (d->in_p > 0.0f) {  // through the activations' dropout, in place (its mask again, from its key)
        const ActWin win = act_window(m, N);
        op_dropout_bwd_win(m->be, A->d_h, GRAD_WRITE, A->d_h, win.rows, win.cols, win.ld, win.first, d->in_p, seed,
                           d->in_stream);
    }
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
    op_dropout_bwd_at(m->be, tmp, NULL, GRAD_WRITE, d_x, (size_t)n * C, seq_first(m, N, C), p, seed, stream);
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
    const DropP dp = drop_p(m, train);
    const float p = dp.p;
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
        const SubDrop d_self = dec_drop(dp, key, l, 0), d_cross = dec_drop(dp, key, l, 1), d_ffn = dec_drop(dp, key, l, 2);
        if (full) dec_layer_fwd(m, l, B, S, T, dp, key);  // the layer again from its input
        if (mids_rebuilt(m)) {  // the streams after self- and cross-attention, from the input and kept outputs
            attn_out_fwd(m, &w->self, &a->self, A->dec_mid1[l], A->dec_res[l], Nt, p, key.seed, d_self.stream, NULL);
            attn_out_fwd(m, &w->cross, &a->cross, A->dec_mid2[l], A->dec_mid1[l], Nt, p, key.seed, d_cross.stream,
                         NULL);
        }
        const PrevRes cross = {g->cross.bo, d_cross.stream, out_grad16(m, &a->cross)};
        const PrevRes self = {g->self.bo, d_self.stream, out_grad16(m, &a->self)};
        ffn_bwd(m, &w->ffn, &g->ffn, &a->ffn, A->d_res_t, A->dec_mid2[l], Nt, &d_ffn, &cross);
        attn_bwd(m, &w->cross, &g->cross, &a->cross, A->d_res_t, A->dec_mid1[l], A->enc_out, A->d_enc_out,
                 A->dev_src_len, B, T, S, false, &d_cross, true, &self);
        attn_bwd(m, &w->self, &g->self, &a->self, A->d_res_t, A->dec_res[l], NULL, NULL, A->dev_tgt_len, B, T, T,
                 true, &d_self, true, NULL);
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
        const SubDrop d_attn = enc_drop(dp, key, l, false), d_ffn = enc_drop(dp, key, l, true);
        if (full) enc_layer_fwd(m, l, A->dev_src_len, B, S, dp, key);
        if (mids_rebuilt(m))
            attn_out_fwd(m, &w->self, &a->self, A->enc_mid[l], A->enc_res[l], Ns, p, key.seed, d_attn.stream, NULL);
        const PrevRes self = {g->self.bo, d_attn.stream, out_grad16(m, &a->self)};
        ffn_bwd(m, &w->ffn, &g->ffn, &a->ffn, A->d_res_s, A->enc_mid[l], Ns, &d_ffn, &self);
        attn_bwd(m, &w->self, &g->self, &a->self, A->d_res_s, A->enc_res[l], NULL, NULL, A->dev_src_len, B, S, S,
                 false, &d_attn, true, NULL);
        side_sum(m, &side);
        grads_final_from(m, w->self.ln_g);
    }
    if (st->enc_embed) {
        if (!st->dec_embed && !st->head) grads_needed_at(m, m->w.embed, (size_t)m->vocab_local * C);
        embed_bwd(m, A->d_res_s, A->dev_src, Ns, p, key.seed, stream_of(key, 0, SITE_ENC_EMB));
    }
    grads_final_from(m, m->params);
}
