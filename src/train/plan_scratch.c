/* plan_scratch.c: the largest scratch a rank's CUDA ops ask of the backend's
 * workspace arena (planner.h), walked op by op as transformer/model.c and
 * decode.c call them, each op's size from kernels/scratch_sizes.h, the
 * functions the CUDA ops carve with.
 *
 * Why a walk and not a formula: the largest request depends on the layout
 * (the logits' backward in bf16, the LayerNorm partials or the embedding's
 * sort in fp32), and which weights have an aligned bf16 twin depends on the
 * tensors' offsets. Every op's size depends on one row count (source or
 * target tokens, or decode rows) and grows with it, so the walk needs only
 * the largest of each. test_plan_gpu_sizes runs the real model on the CPU
 * with every scratch request recorded through the same functions and
 * compares. */
#include <stdio.h>
#include <string.h>

#include "kernels/scratch_sizes.h"
#include "train/planner.h"
#include "transformer/model.h"
#include "transformer/params.h"

typedef struct {
    const ParamTable *tab;
    bool bf16, fused_bgrad;  // fused_bgrad: the dW GEMM's bias epilogue (the CUDA default, either precision)
    int tp;
    bool sp;
    bool decoding;  // in decode.c's steps (which biases reach the GEMMs)
    size_t need;
} Walk;

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

/* The CUDA backend takes a weight's bf16 twin when it is 16-byte aligned:
 * the compute copy (a fresh allocation) at the tensor's element offset. */
static bool twin(const Walk *w, const char *prefix, const char *weight) {
    char name[160];
    snprintf(name, sizeof name, "%s%s%s.weight", prefix, *prefix ? "." : "", weight);
    const ParamInfo *p = param_table_find(w->tab, name);
    return p && p->offset % 8 == 0;
}

static int rows(const Walk *w, int N) { return w->sp ? (N + w->tp - 1) / w->tp : N; }

/* Whether the model passes this layer's bias to its GEMM: q, v and fc1 in
 * training (out_proj's and fc2's are added with the residual); decoding
 * passes every bias but k's and the output layer's (none). */
static bool biased(const char *weight, bool decoding) {
    if (!strcmp(weight, "k_proj") || !strcmp(weight, "embed")) return false;
    if (decoding) return true;
    return strcmp(weight, "out_proj") != 0 && strcmp(weight, "fc2") != 0;
}

/* x16: the input is a tensor the model keeps in bf16 (model.c's Kept, in
 * bf16 mode), which the GEMM takes as it is (op_linear_fwd_x16 / _bwd_x16). */
static void fwd_x(Walk *w, const char *prefix, const char *weight, int N, int in, int out, bool x16) {
    w->need = max_z(w->need, scratch_linear_fwd(w->bf16, N, in, out, twin(w, prefix, weight), x16,
                                                biased(weight, w->decoding)));
}

static void fwd(Walk *w, const char *prefix, const char *weight, int N, int in, int out) {
    fwd_x(w, prefix, weight, N, in, out, false);
}

static void bwd(Walk *w, const char *prefix, const char *weight, bool db, int N, int in, int out, bool x16) {
    w->need = max_z(w->need, scratch_linear_bwd(w->bf16, w->fused_bgrad, true, true, db, N, in, out,
                                                twin(w, prefix, weight), x16));
}

/* A q, k or v projection's backward: in bf16 from the attention's bf16
 * gradient (model_bwd.c's qkv_grad16: linear_bwd16 on dy16), else bwd. */
static void qkv_bwd(Walk *w, const char *prefix, const char *weight, bool db, int N, int in, int out, bool x16) {
    if (!w->bf16) {
        bwd(w, prefix, weight, db, N, in, out, x16);
        return;
    }
    w->need = max_z(w->need, scratch_linear_bwd16(true, w->fused_bgrad, true, false, true, db, N, in, out,
                                                  twin(w, prefix, weight), x16, true, false));
}

/* Kept in bf16: the LayerNorm outputs (gathered in fp32 with sequence
 * parallelism), the attention heads and the FFN activations. */
static bool ln_x16(const Walk *w) { return w->bf16 && !w->sp; }

/* The first LayerNorm's backward of a sub-block: fused with the residual
 * backward of the sub-block before it in the layer (model.c's ln_bwd), or
 * alone. */
static void ln_bwd(Walk *w, int N, int C, bool fused) {
    w->need = max_z(w->need, fused ? scratch_residual_ln_bwd(rows(w, N), C) : scratch_layernorm_bwd(rows(w, N), C));
}

/* attn_fwd / attn_bwd (model.c): N query rows, Nk key rows. In backward,
 * res_done: the output gradient came from the next sub-block's fused op
 * (no bias gradient pass of its own); fused: its LayerNorm's backward is. */
static void attn(Walk *w, const ModelConfig *c, const char *layer, const char *kind, int N, int Nk, bool backward,
                 bool res_done, bool fused) {
    const int C = c->d_model, Cl = C / w->tp;
    const bool kv16 = ln_x16(w) && strcmp(kind, "cross_attn") != 0;  // cross: the encoder output, fp32
    char p[128];
    snprintf(p, sizeof p, "%s.%s", layer, kind);
    fwd_x(w, p, "q_proj", N, C, Cl, ln_x16(w));
    fwd_x(w, p, "k_proj", Nk, C, Cl, kv16);
    fwd_x(w, p, "v_proj", Nk, C, Cl, kv16);
    fwd_x(w, p, "out_proj", N, Cl, C, w->bf16);
    if (!backward) return;
    if (!res_done) w->need = max_z(w->need, scratch_bias_bwd(rows(w, N), C));  // residual_bwd
    bwd(w, p, "out_proj", false, N, Cl, C, w->bf16);
    qkv_bwd(w, p, "q_proj", true, N, C, Cl, ln_x16(w));
    qkv_bwd(w, p, "k_proj", false, Nk, C, Cl, kv16);
    qkv_bwd(w, p, "v_proj", true, Nk, C, Cl, kv16);
    ln_bwd(w, N, C, fused);
}

static void ffn(Walk *w, const ModelConfig *c, const char *layer, int N, bool backward) {
    const int C = c->d_model, Fl = c->d_ff / w->tp;
    char p[128];
    snprintf(p, sizeof p, "%s.ffn", layer);
    fwd_x(w, p, "fc1", N, C, Fl, ln_x16(w));
    fwd_x(w, p, "fc2", N, Fl, C, w->bf16);
    if (!backward) return;
    w->need = max_z(w->need, scratch_bias_bwd(rows(w, N), C));
    /* fc2's dy: the dropout's bf16 bits in bf16 without sequence
     * parallelism (model_bwd.c's fc2_grad16; fc2's input kept in bf16, as
     * the walk takes it), its bias gradient fc2's own there */
    const bool dy16 = w->bf16 && !w->sp;
    if (w->bf16 && c->act == ACT_RELU && !(c->act_dropout > 0.0f)) {  // model_bwd.c's ffn_grad16: bf16 from fc2 to fc1
        const bool mask = model_ffn_mask_kept(c, true, w->tp);  // fc2's dx GEMM masks and sums fc1's db (DRELU_BGRAD)
        if (mask)
            w->need = max_z(w->need, scratch_linear_bwd16_drelu(true, w->fused_bgrad, true, !w->sp, N, Fl, C,
                                                                twin(w, p, "fc2"), dy16));
        else
            w->need = max_z(w->need, scratch_linear_bwd16(true, w->fused_bgrad, false, true, true, !w->sp, N, Fl, C,
                                                          twin(w, p, "fc2"), true, dy16, false));
        w->need = max_z(w->need, scratch_linear_bwd16(true, w->fused_bgrad, true, false, true, !mask, N, C, Fl,
                                                      twin(w, p, "fc1"), ln_x16(w), true, !mask));
        ln_bwd(w, N, C, true);
        return;
    }
    if (dy16)
        w->need = max_z(w->need, scratch_linear_bwd16(true, w->fused_bgrad, true, false, true, true, N, Fl, C,
                                                      twin(w, p, "fc2"), true, true, false));
    else
        bwd(w, p, "fc2", false, N, Fl, C, w->bf16);
    if (c->act == ACT_RELU && ln_x16(w))  // op_linear_bwd_relu_x16: ReLU's gradient in the bias pass
        w->need = max_z(w->need, scratch_linear_bwd_relu(w->bf16, w->fused_bgrad, true, true, true, N, C, Fl,
                                                         twin(w, p, "fc1")));
    else
        bwd(w, p, "fc1", true, N, C, Fl, ln_x16(w));
    ln_bwd(w, N, C, true);  // with the attention's residual before it
}

size_t planner_scratch_stage(const ModelConfig *cfg, bool bf16, int tp, const ModelStage *st, bool seq_par, int Ns,
                             int Nt, bool backward) {
    ParamTable tab;
    param_table_build_stage(cfg, tp, st, &tab);
    Walk w = {.tab = &tab, .bf16 = bf16, .fused_bgrad = true, .tp = tp, .sp = seq_par && tp > 1};
    const int C = cfg->d_model, Vl = vocab_padded(cfg, tp) / tp;
    char layer[64];
    for (int l = st->enc_lo; l < st->enc_hi; l++) {
        snprintf(layer, sizeof layer, "encoder.layers.%d", l);
        attn(&w, cfg, layer, "self_attn", Ns, Ns, backward, true, false);
        ffn(&w, cfg, layer, Ns, backward);
    }
    for (int l = st->dec_lo; l < st->dec_hi; l++) {
        snprintf(layer, sizeof layer, "decoder.layers.%d", l);
        attn(&w, cfg, layer, "self_attn", Nt, Nt, backward, true, false);
        attn(&w, cfg, layer, "cross_attn", Nt, Ns, backward, true, true);
        ffn(&w, cfg, layer, Nt, backward);
    }
    if (st->head) {  // the tied output layer (bf16: logits stored as bf16, no tmp), the loss sum
        if (bf16)  // no bias, x fp32, no tmp
            w.need = max_z(w.need, scratch_linear_fwd16(bf16, Nt, C, Vl, twin(&w, "", "embed"), false, false, false));
        else
            fwd(&w, "", "embed", Nt, C, Vl);
        w.need = max_z(w.need, scratch_sum((size_t)Nt));
        if (backward) {
            const bool tw = twin(&w, "", "embed");
            w.need = max_z(w.need, bf16 ? scratch_linear_bwd_dy16(bf16, true, true, Nt, C, Vl, tw)
                                        : scratch_linear_bwd(bf16, w.fused_bgrad, true, true, false, Nt, C, Vl, tw,
                                                             false));
            w.need = max_z(w.need, scratch_layernorm_bwd(rows(&w, Nt), C));  // the decoder's final LayerNorm
        }
    }
    if (backward) {
        if (st->enc_ln) w.need = max_z(w.need, scratch_layernorm_bwd(rows(&w, Ns), C));
        if (st->enc_embed) w.need = max_z(w.need, scratch_embedding_bwd(Ns, Vl));
        if (st->dec_embed) w.need = max_z(w.need, scratch_embedding_bwd(Nt, Vl));
    }
    param_table_free(&tab);
    return w.need;
}

size_t planner_scratch_decode(const ModelConfig *cfg, bool bf16, int n, int S, int beam) {
    const ModelStage whole = model_stage_whole(cfg);
    ParamTable tab;
    param_table_build_stage(cfg, 1, &whole, &tab);
    Walk w = {.tab = &tab, .bf16 = bf16, .fused_bgrad = true, .tp = 1};
    const int C = cfg->d_model, F = cfg->d_ff, Ns = n * S, R = n * (beam > 0 ? beam : 1);
    char layer[64], p[96];
    for (int l = 0; l < cfg->enc_layers; l++) {  // model_encode
        snprintf(layer, sizeof layer, "encoder.layers.%d", l);
        attn(&w, cfg, layer, "self_attn", Ns, Ns, false, false, false);
        ffn(&w, cfg, layer, Ns, false);
    }
    w.decoding = true;
    for (int l = 0; l < cfg->dec_layers; l++) {  // state_init's cross keys and values, then a step's rows
        snprintf(layer, sizeof layer, "decoder.layers.%d", l);
        snprintf(p, sizeof p, "%s.cross_attn", layer);
        fwd(&w, p, "k_proj", Ns, C, C);
        fwd(&w, p, "v_proj", Ns, C, C);
        fwd(&w, p, "q_proj", R, C, C);
        fwd(&w, p, "out_proj", R, C, C);
        snprintf(p, sizeof p, "%s.self_attn", layer);
        fwd(&w, p, "q_proj", R, C, C);
        fwd(&w, p, "k_proj", R, C, C);
        fwd(&w, p, "v_proj", R, C, C);
        fwd(&w, p, "out_proj", R, C, C);
        snprintf(p, sizeof p, "%s.ffn", layer);
        fwd(&w, p, "fc1", R, C, F);
        fwd(&w, p, "fc2", R, F, C);
    }
    fwd(&w, "", "embed", R, C, cfg->vocab_size);
    param_table_free(&tab);
    return w.need;
}
