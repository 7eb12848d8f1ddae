/* params.h: all parameters of a rank in one contiguous buffer, carved from a
 * table of named tensors. The gradient buffer and the optimizer state use
 * the same table and offsets, so zeroing, clipping or reducing any of them is
 * one call over one range.
 *
 * Names are global (they do not depend on the parallel layout) and follow
 * PyTorch's module naming so an export loads with load_state_dict. Every
 * tensor carries its tensor-parallel split label.
 */
#ifndef TPTRAIN_PARAMS_H
#define TPTRAIN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include "transformer/config.h"
#include "transformer/stage.h"

typedef enum {
    SPLIT_REPL = 0,  // whole on every tp rank (LayerNorm, biases of ROW layers)
    SPLIT_COL = 1,   // split along output features (rows of W[out, in]) and its bias
    SPLIT_ROW = 2,   // split along input features (columns of W[out, in])
    SPLIT_VOCAB = 3, // split along vocabulary rows (shared embedding / output layer)
} SplitLabel;

typedef struct {
    char name[96];
    int ndim;            // 1 or 2
    int shape[2];        // global shape (the vocabulary unpadded)
    int local[2];        // this rank's shard (VOCAB: padded vocabulary / tp rows)
    SplitLabel split;
    bool decay;          // AdamW weight decay applies (matrices only)
    size_t offset;       // in elements, into the rank's buffer
    size_t n_elems;      // of the shard
} ParamInfo;

typedef struct {
    ParamInfo *t;
    int n;
    size_t n_elems;      // total of this rank's shards
    int tp;              // tensor-parallel ways the table is sharded for
} ParamTable;

/* Pointers of one attention sub-block (pre-LN): LayerNorm, then q/k/v/out. */
typedef struct {
    float *ln_g, *ln_b;  // (C)
    float *wq, *bq;      // (C, C), (C)   COL
    float *wk;           // (C, C)        COL (no bias: it cannot change the attention)
    float *wv, *bv;      // (C, C), (C)   COL
    float *wo, *bo;      // (C, C), (C)   ROW, bias REPL
} AttnW;

typedef struct {
    float *ln_g, *ln_b;  // (C)
    float *w1, *b1;      // (F, C), (F)   COL
    float *w2, *b2;      // (C, F), (C)   ROW, bias REPL
} FfnW;

typedef struct { AttnW self; FfnW ffn; } EncLayerW;
typedef struct { AttnW self; AttnW cross; FfnW ffn; } DecLayerW;

/* A view of one buffer (parameters or gradients) as the model's tensors. */
typedef struct {
    float *embed;              // (V, C) VOCAB, tied with the output layer
    EncLayerW *enc;            // [enc_layers]
    DecLayerW *dec;            // [dec_layers]
    float *enc_ln_g, *enc_ln_b;  // (C) final encoder LayerNorm
    float *dec_ln_g, *dec_ln_b;  // (C) final decoder LayerNorm
} Weights;

/* The vocabulary padded to a multiple of tp (Megatron pads the same way). */
int vocab_padded(const ModelConfig *cfg, int tp);

/* Builds the table of one rank's shards for tp-way tensor parallelism
 * (tp = 1: whole tensors). Caller frees with param_table_free. */
void param_table_build(const ModelConfig *cfg, int tp, ParamTable *tab);
/* The same for the tensors of one pipeline stage (NULL: the whole model). */
void param_table_build_stage(const ModelConfig *cfg, int tp, const ModelStage *st, ParamTable *tab);
void param_table_free(ParamTable *tab);
const ParamInfo *param_table_find(const ParamTable *tab, const char *name);
/* The index of the tensor holding buffer element `offset` (the first one
 * at or after it when it falls in none), tab->n past the end. */
int param_table_index_at(const ParamTable *tab, size_t offset);

/* Points w's tensors into base (n_elems of the tp-way table). w->enc /
 * w->dec are allocated here; free with weights_free. */
void weights_bind(Weights *w, const ModelConfig *cfg, int tp, float *base);
/* The same for stage st's table (NULL: the whole model); other views NULL. */
void weights_bind_stage(Weights *w, const ModelConfig *cfg, int tp, const ModelStage *st, float *base);
void weights_free(Weights *w);
/* Points tensor i of w at each[i] (NULL allowed: not to be touched), for
 * tensors that do not live in one buffer; w may already be bound (its
 * arrays are reused). */
void weights_bind_each(Weights *w, const ModelConfig *cfg, int tp, const ModelStage *st, float *const *each);

/* Deterministic initialisation from seed: linear weights Xavier-uniform,
 * embedding N(0, C^-1/2), biases 0, LayerNorm gamma 1 / beta 0. Every
 * element's value depends only on (seed, tensor, global position), so the
 * shards of tp ranks assemble into exactly the tp = 1 model. */
void params_init(float *base, const ParamTable *tab, const ModelConfig *cfg, int tp_rank,
                 unsigned long long seed);
/* The same on n_threads threads (at most 64; params_init: OMP_NUM_THREADS,
 * else every core, and 256 Ki elements a thread at least); the values do
 * not depend on n_threads. */
void params_init_threads(float *base, const ParamTable *tab, const ModelConfig *cfg, int tp_rank,
                         unsigned long long seed, int n_threads);

/* Copies rank tp_rank's shard of one tensor out of the whole (global) tensor,
 * or places a shard into the whole tensor. Padding rows of a VOCAB shard
 * read as zeros and are not placed. */
void shard_extract(const ParamInfo *p, int tp_rank, const float *global, float *shard);
void shard_place(const ParamInfo *p, int tp_rank, const float *shard, float *global);
/* Element (r, c) of rank tp_rank's shard is element (gr, gc) of the whole
 * tensor; false only for the padding rows of a VOCAB shard. */
bool shard_to_global(const ParamInfo *p, int tp_rank, int r, int c, int *gr, int *gc);
size_t param_global_elems(const ParamInfo *p);

const char *split_label_name(SplitLabel s);

#endif
