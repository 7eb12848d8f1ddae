/* model_internal.h: the model's private parts, shared by model_layout.c
 * (activation layout), model.c (life cycle, batch staging), model_fwd.c
 * (forward, kept operands, stage boundaries) and model_bwd.c (backward);
 * nothing else includes it. Private to src/transformer.
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
 * masks there are drawn without the tp rank in their key. The dropouts
 * inside the sub-blocks (attention probabilities, FFN activations: SubDrop)
 * act on tensors split by heads and columns; each rank draws its window of
 * the unsharded tensor's mask (op_dropout_fwd_win), so the tp rank enters
 * through the window, not the key, and a tp run draws the one-rank masks.
 * Neither keeps anything: the dropped probabilities are made in d_scratch
 * (free in forward; backward's attention scratch), the undropped P is what
 * backward keeps or recomputes, and the FFN keeps its dropped activations
 * in place of the undropped ones. Attention dropout runs on exact attention
 * only (flash holds no probabilities: model_set_attention refuses it).
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
#ifndef TPTRAIN_MODEL_INTERNAL_H
#define TPTRAIN_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include "transformer/model.h"

enum { /* dropout sites (ops.h dropout_stream): the sub-blocks' outputs, then the ones inside them */
    SITE_ENC_EMB = 0, SITE_DEC_EMB, SITE_ENC_ATTN, SITE_ENC_FFN,
    SITE_DEC_SELF, SITE_DEC_CROSS, SITE_DEC_FFN,
    SITE_ENC_ATTN_PROBS, SITE_ENC_FFN_ACT, SITE_DEC_SELF_PROBS, SITE_DEC_CROSS_PROBS, SITE_DEC_FFN_ACT,
};

/* The dropout probabilities of one pass (all 0 outside training). */
typedef struct {
    float p;     // cfg.dropout: embeddings and every sub-block's output
    float attn;  // cfg.attn_dropout: the attention probabilities
    float act;   // cfg.act_dropout: the FFN's hidden activations
} DropP;

/* One sub-block's dropouts: its output's (p, stream) and the one inside it
 * (the attention probabilities or the FFN activations: in_p, in_stream),
 * under seed. The inner tensors are split over tp by columns (heads, FFN
 * columns): their masks are a rank's window of the unsharded tensor's mask
 * (op_dropout_fwd_win), so no mask element repeats across ranks and a tp
 * run draws the masks of the one-rank run. */
typedef struct {
    float p;
    uint64_t stream;
    float in_p;
    uint64_t in_stream;
    uint64_t seed;
} SubDrop;

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
    uint8_t *mask;              // (N, relu_mask_row_bytes(F/tp)) the ReLU's bit-mask (model_ffn_mask_kept), or NULL
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
static inline int seq_rows(const Model *m, int N) { return m->seq_par ? tp_seq_rows(&m->tp, N) : N; }

/* Rows of the gathered (N, C) tensor: N, or every rank's share (padding after N). */
static inline int seq_full(const Model *m, int N) { return m->seq_par ? tp_seq_rows(&m->tp, N) * m->tp.size : N; }

/* Where this rank's rows start in the whole (N, C) tensor: its dropout window. */
static inline uint64_t seq_first(const Model *m, int N, int C) {
    return m->seq_par ? (uint64_t)m->tp.rank * (uint64_t)seq_rows(m, N) * (uint64_t)C : 0;
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

/* ---- model_layout.c ---- */
void acts_prepare_ex(Model *m, int B, int S, int T, bool scratch);
void acts_prepare(Model *m, int B, int S, int T);
void acts_free(Backend *be, ModelActs *A);

/* ---- model.c ---- */
void upload_batch(Model *m, const Batch *b, bool copy);

/* ---- model_fwd.c: what backward reuses of the forward pass ---- */
DropP drop_p(const Model *m, bool train);
uint64_t stream_of(DropoutKey k, uint32_t layer, uint32_t site);
SubDrop sub_drop(DropoutKey k, uint32_t layer, float p, uint32_t site, float in_p, uint32_t in_site);
GemmIn kept_in(const Kept *k);
void lin_bwd(const Model *m, float *dx, GradMode mode, float *dW, float *db, const float *dy, GemmIn x,
             const float *W, int N, int in, int out);
GemmIn col_in_bwd(const Model *m, const Kept *k, int N);
void zero_pad_rows(const Model *m, float *x, int N);
void attention_fwd_of(const Model *m, const AttnActs *a, float *out, uint16_t *out16, float *P,
                      const int32_t *k_len, int B, int Hl, int Tq, int Tk, int D, bool causal, const SubDrop *d);
void probs_window(const Model *m, int Tq, int Tk, uint64_t *first, uint64_t *ld);
/* The FFN's hidden activations after the activation, (N, F/tp), as a window
 * of the columns of the whole (N, F) mask: op_dropout_fwd_win's arguments
 * but the tensors. */
typedef struct { size_t rows, cols; uint64_t ld, first; } ActWin;
ActWin act_window(const Model *m, int N);
void attn_out_fwd(const Model *m, const AttnW *w, const AttnActs *a, float *x_out, const float *x_in, int N,
                  float p, uint64_t seed, uint64_t stream, const NextLn *next);
GemmIn kv_in(const Model *m, const float *kv);
void final_ln_fwd(const Model *m, float *out, float *mean, float *rstd, const float *x, const float *g,
                  const float *b, int N);
void enc_layer_fwd(Model *m, int l, const int32_t *src_len, int B, int S, DropP dp, DropoutKey key);
void dec_layer_fwd(Model *m, int l, int B, int S, int T, DropP dp, DropoutKey key);
SubDrop enc_drop(DropP dp, DropoutKey key, int l, bool ffn);
SubDrop dec_drop(DropP dp, DropoutKey key, int l, int sub);
void head_bwd(Model *m, int Nt, float loss_scale);
bool stage_has_dec(const ModelStage *st);

#endif
