/* stage.h: which part of the encoder-decoder stack a pipeline stage holds.
 *
 * The stack is one list, encoder layers then decoder layers; a stage holds
 * a contiguous, non-empty range of it, stages in order (encoder stages
 * first; one stage may end the encoder and begin the decoder). Besides its
 * layers, a stage holds:
 *   - the tied embedding when it embeds the source (the first stage), the
 *     target (the stage of decoder layer 0) or computes the output layer
 *     (the last stage): these copies form the embedding group, whose
 *     gradients are summed every step, as Megatron does for a tied
 *     embedding split across stages;
 *   - the final encoder LayerNorm when it holds the last encoder layer;
 *   - the final decoder LayerNorm, the output layer and the loss when it is
 *     the last stage.
 * A stage message carries the encoder states (the residual stream inside
 * the encoder, the encoder output after it) and, between decoder stages,
 * the decoder states; backward sends their gradients.
 */
#ifndef TPTRAIN_STAGE_H
#define TPTRAIN_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include "transformer/config.h"

typedef struct {
    int enc_lo, enc_hi;  // encoder layers [lo, hi)
    int dec_lo, dec_hi;  // decoder layers [lo, hi)
    bool enc_embed;      // embeds the source (the first stage)
    bool enc_ln;         // ends the encoder: its final LayerNorm, the encoder output
    bool dec_embed;      // embeds the target (holds decoder layer 0)
    bool head;           // final decoder LayerNorm, output layer, loss (the last stage)
} ModelStage;

/* The whole model as one stage. */
ModelStage model_stage_whole(const ModelConfig *cfg);
/* Whether the stage holds the tied embedding. */
bool model_stage_has_embed(const ModelStage *st);
/* Whether the stage's input includes the encoder residual stream (it
 * continues the encoder) or the encoder output, and the decoder states. */
bool model_stage_gets_enc_res(const ModelStage *st);
bool model_stage_gets_enc_out(const ModelStage *st);
bool model_stage_gets_dec(const ModelStage *st);

/* Stages for p-way pipelining: from layout (e.g. "enc:0-3|enc:4-5,dec:0-1|dec:2-5";
 * ranges inclusive) when non-NULL, else balanced by cost (FLOPs per layer:
 * a decoder layer costs more, the last stage carries the output layer).
 * out has room for p. 0, or -1 with one sentence in err. */
int model_stages_make(const ModelConfig *cfg, int p, const char *layout, ModelStage *out, char *err, size_t err_len);
/* "enc:0-3|enc:4-5,dec:0-1|dec:2-5" for the stages, into buf. */
void model_stages_format(const ModelStage *st, int p, char *buf, size_t len);
/* The relative cost used for balancing (for the start-up line). */
double model_stage_cost(const ModelConfig *cfg, const ModelStage *st);

#endif
