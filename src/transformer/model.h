/* model.h: the encoder-decoder Transformer, forward and backward by hand.
 *
 * The model owns three buffers, each carved from a size table and allocated
 * by its backend (kernels/backend.h) with a memory tag: parameters (the fp32
 * master weights), gradients (same table as parameters) and activations
 * (sized for the largest batch seen). Everything it computes goes through
 * kernels/ops.h, so the same code runs on any backend; params, grads and the
 * activations are device pointers (host pointers on the CPU backend).
 *
 * A training step is: model_zero_grad, model_forward_step(train=true),
 * model_backward, then the optimizer (optim.h) on params/grads. The batch
 * (host arrays) is uploaded once by the forward pass and reused by backward.
 */
#ifndef TPTRAIN_MODEL_H
#define TPTRAIN_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include "data/batch.h"
#include "kernels/backend.h"
#include "tp/parallel.h"
#include "transformer/config.h"
#include "transformer/params.h"
#include "transformer/stage.h"

/* Keys of the dropout masks of one forward pass (see ops.h dropout_stream). */
typedef struct {
    uint64_t seed;
    uint32_t step;
    uint32_t micro;
    uint32_t tp_rank;
} DropoutKey;

typedef struct ModelActs ModelActs;

/* What backward recomputes instead of keeping from forward. */
typedef enum {
    MODEL_RECOMPUTE_NONE = 0,       // every layer's activations kept
    MODEL_RECOMPUTE_SELECTIVE = 1,  // the attention probabilities recomputed from the kept q, k
    MODEL_RECOMPUTE_FULL = 2,       // only each layer's input kept; the layer run again in backward
} ModelRecompute;

/* How attention keeps what its backward needs. */
typedef enum {
    MODEL_ATTENTION_EXACT = 0,  // the probabilities P (B, H, Tq, Tk), kept or recomputed (attention_fwd)
    MODEL_ATTENTION_FLASH = 1,  // a log-sum-exp per row (B, H, Tq); P rebuilt tile by tile (attention_flash_*)
} ModelAttention;

typedef struct {
    ModelConfig cfg;
    Backend *be;         // where the buffers live and the ops run
    bool owns_be;        // created by model_create (be == NULL was passed)
    TpGroup tp;
    ModelStage stage;    // the part of the stack this model holds (the whole by default)
    int vocab_local;     // vocabulary rows of this rank's shard (padded / tp)
    int vocab_start;     // first vocabulary id of the shard
    int vocab_valid;     // real (unpadded) rows of the shard
    ParamTable tab;
    float *params;       // (tab.n_elems) device, MEM_MASTER
    float *grads;        // (tab.n_elems) device, MEM_GRAD
    float *scalars;      // (2) device: loss sum of the last forward, spare
    Weights w;           // views into params
    Weights g;           // views into grads
    ModelActs *acts;     // private: the activation slot in use (slots[slot])
    ModelActs **slots;   // private: [n_slots] activations kept per micro-batch in flight
    int n_slots, slot;
    ModelRecompute recompute;  // model_set_recompute; NONE by default
    bool seq_par;        // model_set_sequence_parallel; false by default
    bool keep_bf16;      // model_set_keep_bf16; by default true in bf16 mode
    ModelAttention attention;  // model_set_attention; EXACT by default
    struct ModelScratch *scratch;  // private: backward's scratch, shared by the slots
    uint64_t layout_gen;  // bumped whenever the slots' carving may change (graphs captured before it are stale)
    /* Called by model_backward each time every gradient at buffer offset
     * >= from is final (backward finishes the buffer from its end to its
     * start), so a data-parallel reduction can start on finished buckets
     * while backward goes on. NULL: no calls. */
    void (*grads_final)(void *ctx, size_t from);
    /* Called by model_backward before it accumulates into the gradients at
     * buffer offsets [lo, hi) (the tied embedding first, then from the end
     * of the buffer down), so gradient storage can be made as backward
     * reaches it (ZeRO-2; see model_bind_grads). NULL: no calls. */
    void (*grads_needed)(void *ctx, size_t lo, size_t hi);
    void *grads_final_ctx;  // the context of both hooks
} Model;

/* model_create_ex for one pipeline stage: only the tensors of *stage
 * (NULL: the whole model) are allocated, in that stage's table
 * (param_table_build_stage); they are initialised to the values the whole
 * model has for the same seed. */
int model_create_stage(Model *m, Backend *be, const ModelConfig *cfg, const TpGroup *tp, const ModelStage *stage,
                       unsigned long long seed, unsigned flags, char *err, size_t err_len);

/* Keeps activations for n micro-batches in flight (slots 0..n-1; 1 by
 * default); model_use_slot picks the one the next forward writes and the
 * next backward reads. */
void model_set_slots(Model *m, int n);
void model_use_slot(Model *m, int slot);

/* A pipeline stage's boundary tensors for a batch of shape (B, S, T).
 * Forward input (stages after the first), written by the caller before
 * model_forward_step: enc = the encoder residual stream entering the
 * stage's first encoder layer, or the encoder output for a stage after the
 * encoder ((B S, C)); dec = the decoder residual stream entering its first
 * decoder layer ((B T, C), NULL unless model_stage_gets_dec). Forward
 * output (stages before the last), read after it: the encoder stream leaving
 * the stage (the encoder output once it is computed) and the decoder stream
 * (NULL when the stage holds no decoder layer). Backward input: the
 * gradients of the output, written before model_backward (the encoder
 * output's gradient is this tp rank's partial sum over the later stages);
 * backward output: the gradients of the input, the same way. Pointers into
 * the current slot (inputs and outputs) or the shared scratch (gradients):
 * valid until the next call on the model. n_enc and n_dec: their floats
 * (0 with a NULL part). With sequence parallelism the residual streams are
 * this tp rank's rows (model_set_sequence_parallel) and the encoder output
 * and its gradient the gathered (padded) rows; the two sides of a boundary
 * agree on them. */
typedef struct {
    float *enc, *dec;
    size_t n_enc, n_dec;
} StageIO;
StageIO model_stage_input(Model *m, int B, int S, int T);
StageIO model_stage_output(Model *m);
StageIO model_stage_output_grad(Model *m, int B, int S, int T);
StageIO model_stage_input_grad(Model *m);

/* Allocates a model for a validated cfg on backend be; parameters
 * initialised from seed. be == NULL: the model makes (and owns) an fp32 CPU
 * backend. tp == NULL: a whole model on one rank. Otherwise this rank's
 * shard of a tp->size-way tensor-parallel model (heads and d_ff must
 * divide). Returns 0, or -1 with one sentence in err when cfg or the layout
 * is invalid. */
int model_create(Model *m, Backend *be, const ModelConfig *cfg, const TpGroup *tp, unsigned long long seed,
                 char *err, size_t err_len);
/* model_create with flags: MODEL_NO_GRAD_BUFFER leaves m->grads NULL from
 * the start (gradients kept elsewhere: see model_bind_grads);
 * MODEL_NO_INIT skips params_init, leaving the parameters as allocated, for
 * a model whose every value is written before it is read (model_gather,
 * model_stage_collect). */
#define MODEL_NO_GRAD_BUFFER 1u
#define MODEL_NO_INIT 2u
int model_create_ex(Model *m, Backend *be, const ModelConfig *cfg, const TpGroup *tp, unsigned long long seed,
                    unsigned flags, char *err, size_t err_len);
void model_free(Model *m);

/* Sets what backward recomputes (the activation layout is carved again
 * at the next forward). Results are bit for bit those of NONE: the same
 * ops run on the same inputs with the same dropout keys; full also repeats
 * each layer's tp allreduces. */
void model_set_recompute(Model *m, ModelRecompute mode);

/* Sequence parallelism (with tp > 1; nothing changes with one rank): the
 * residual streams, LayerNorms and dropout hold this rank's 1/tp of the
 * token rows (tp/parallel.h), the ROW layers' allreduces become
 * reduce-scatters and the COL layers' inputs are allgathered; the dropout
 * masks are windows of the unsharded ones, so results equal tp without it up
 * to the order of the sums (the LayerNorm and ROW-bias gradients are summed
 * over the ranks' rows). Stage messages carry this rank's rows of the
 * residual streams (StageIO). d_model must be a multiple of 4. Returns 0, or -1 with a sentence in err. */
int model_set_sequence_parallel(Model *m, bool on, char *err, size_t err_len);
const char *model_recompute_name(ModelRecompute mode);

/* The tensors backward needs only as GEMM operands (the LayerNorm outputs
 * before the COL layers, the attention heads before the output projection,
 * the FFN activation's output) are kept as their bf16 rounding, which is
 * what the bf16 GEMMs multiply anyway: half their bytes, results bit for
 * bit those of keeping them in fp32 (on = false, the layout of fp32 mode).
 * On by default in bf16 mode; without bf16 it changes nothing (the
 * activation layout is carved again at the next forward). */
void model_set_keep_bf16(Model *m, bool on);

/* The attention kind. FLASH needs q, k and v kept in bf16 (bf16 mode,
 * model_set_keep_bf16 on) and a head width (d_model / n_heads) that is a
 * multiple of 16, at most 128: then no (B, H, Tq, Tk) tensor is stored or
 * recomputed, only a float per query row and head; results are those of
 * EXACT within the bf16 roundings of the probabilities and gradients the
 * flash ops make (ops_list.h). Returns 0, or -1 with a sentence in err. */
int model_set_attention(Model *m, ModelAttention kind, char *err, size_t err_len);
const char *model_attention_name(ModelAttention kind);

/* Checks a batch against the config (ids in range, lengths consistent).
 * Returns 0 or -1 with a sentence in err. */
int model_check_batch(const Model *m, const Batch *b, char *err, size_t err_len);

/* Forward pass; keeps what backward needs. Adds the sum of the
 * label-smoothed token losses (non-padding targets) to the device scalar
 * loss_sum; nothing is read back. train = false disables dropout. */
void model_forward_step(Model *m, const Batch *b, bool train, DropoutKey key, float *loss_sum);

/* Carves the current slot for b's shape and copies b's ids into the
 * slot's own device buffer (also on the CPU, where the forward otherwise
 * reads the host arrays in place), so that the next model_forward_step of
 * b uploads nothing and reads its ids from buffers that do not move: what
 * a captured forward (backend_capture_begin) needs, since a graph replays
 * the pointers it was recorded with. */
void model_stage_batch(Model *m, const Batch *b);
/* Forgets the staged batch when no model_forward_step consumed it (its
 * forward was a graph's replay), so that a later forward of another batch
 * at the same address uploads its own ids. */
void model_unstage_batch(Model *m);

/* model_forward_step, then one read: returns the mean loss over
 * non-padding target tokens; *n_tokens receives their count. */
float model_forward(Model *m, const Batch *b, bool train, DropoutKey key, int *n_tokens);

/* Non-padding target tokens of a batch (tgt_out != pad_id within tgt_len). */
int batch_target_tokens(const Batch *b, int32_t pad_id);

/* Host copies of the master weights (checkpoint and export points): whole
 * buffer out, or in (then the compute copy is re-cast). */
void model_params_to_host(const Model *m, float *host);
void model_params_from_host(Model *m, const float *host);

/* Accumulates d(loss_scale * sum of token losses)/d(params) into m->grads,
 * for the batch of the last model_forward (same key, same train flag).
 * loss_scale = 1 / (number of target tokens the loss is averaged over). */
void model_backward(Model *m, const Batch *b, bool train, DropoutKey key, float loss_scale);

void model_zero_grad(Model *m);  // no-op once the buffer is released
/* Releases the contiguous gradient buffer (m->grads becomes NULL) for
 * gradients kept elsewhere: model_bind_grads then points tensor i's
 * gradient at each[i] (NULL: not bound now), e.g. into per-bucket storage
 * made by the grads_needed hook. */
void model_release_grads(Model *m);
void model_bind_grads(Model *m, float *const *each);

/* Assembles the whole model from the tp shards into `whole` (a model with
 * the same config created without tensor parallelism), on the ranks that
 * pass one; the others pass NULL. Collective over the tp group: every tp
 * rank calls it. */
void model_gather(const Model *m, Model *whole);

/* Assembles the whole stack (with this rank's tp shards) from the p
 * pipeline stages into `full` (a model of the same config and tp created
 * for the whole stack) on pp rank 0, which passes it; the other stages
 * pass NULL and send their tensors (the embedding is taken from stage 0).
 * Collective over the pp group. */
void model_stage_collect(const Model *m, Comm *pp, const ModelStage *stages, int p, Model *full);

/* Logits of the last forward pass: (B*T, vocab_local), row b*T + t (the
 * whole vocabulary when tp = 1); a device pointer. model_backward writes
 * the logits' gradient over them: read them before it. A model keeping
 * bf16 (model_set_keep_bf16) holds them as bf16 bits alone: model_logits
 * is then NULL and model_logits16 gives them; otherwise the reverse. */
const float *model_logits(const Model *m);
const uint16_t *model_logits16(const Model *m);
/* The device copy of the last batch's target ids (B*T). */
const int32_t *model_targets(const Model *m);

/* Whether the FFN keeps its ReLU's bit-mask (1 bit per hidden element,
 * each row padded to 128 bits: relu_mask_row_bytes(d_ff/tp) bytes per
 * token, in the activation slot) from forward to backward, where fc2's dx
 * GEMM takes the ReLU's gradient and fc1's bias gradient from it in its
 * epilogue (op_linear_relu_fwd16, op_linear_bwd16_drelu: cuBLASLt's
 * RELU_AUX_BIAS and DRELU_BGRAD): bf16 keeping (bf16 mode), ReLU, no
 * activation dropout (a mask of the ReLU alone would miss the dropped
 * elements), d_model and d_ff/tp multiples of 8 (the GEMMs that store bf16
 * in one pass, gemm.cu's out16_fusable; elsewhere the mask would buy
 * nothing). Recomputation rebuilds it with its layer. */
bool model_ffn_mask_kept(const ModelConfig *cfg, bool keep_bf16, int tp);

/* The floats one activation slot (*slot_elems) and the shared backward
 * scratch (*scratch_elems) take for a batch of (B, S, T) on tp rank shards
 * of `stage` (NULL: the whole stack) with this recomputation, sequence
 * parallelism, bf16 keeping (model_set_keep_bf16, as a model in bf16
 * mode has it) and flash attention (model_set_attention; with bf16 keeping
 * only): the same walks the model carves them with, nothing
 * allocated (the planner, train/planner.h). */
void model_plan_activations(const ModelConfig *cfg, int tp, const ModelStage *stage, ModelRecompute recompute,
                            bool seq_par, bool keep_bf16, bool flash, int B, int S, int T, size_t *slot_elems,
                            size_t *scratch_elems);

/* Bytes held by the activation buffer now (for memory reports). */
size_t model_activation_bytes(const Model *m);

#endif
