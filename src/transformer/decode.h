/* decode.h: inference. The encoder runs once per batch; the decoder runs one
 * token at a time with cached self-attention keys/values and precomputed
 * cross-attention keys/values, so a step costs O(t) instead of O(t^2).
 * Greedy search and beam search (fairseq-style length normalisation,
 * score / length^lenpen) share that step function. Scoring (teacher
 * forcing) gives each pair's log-probability, as fairseq's score-reference
 * and Marian's scorer do. */
#ifndef TPTRAIN_DECODE_H
#define TPTRAIN_DECODE_H

#include <stdint.h>
#include "transformer/model.h"

/* A batch of source sentences for decoding (no targets needed). */
typedef struct {
    int n;                      // sentences
    int S;                      // padded source length
    const int32_t *src;         // (n, S) pieces + eos, right-padded with pad_id
    const int32_t *src_len;     // (n)
} SrcBatch;

/* Output of a search: hyp[i] holds len[i] ids (no bos, no eos). */
typedef struct {
    int n;
    int32_t **hyp;              // [n] malloc'ed arrays
    int *len;                   // (n)
    float *score;               // (n) sum of log-probabilities incl. eos (beam: before length normalisation)
} Hypotheses;

void hypotheses_free(Hypotheses *h);

/* The most MEM_WORKSPACE bytes decoding n sentences of source length S
 * (eos included) holds at once, beam 0 (greedy) or K: the decode state's
 * caches and buffers (the planner, train/planner.h). */
size_t decode_workspace_bytes(const ModelConfig *cfg, int n, int beam, int S);

/* Longest output for a source of src_len tokens: min(max_len - 1, 2*src_len + 10). */
int decode_max_len(const ModelConfig *cfg, int src_len);

/* Greedy search: argmax at every step (ties to the lowest id), pad and bos
 * never produced. */
void decode_greedy(Model *m, const SrcBatch *b, Hypotheses *out);

/* Beam search with beam >= 1: keeps `beam` live hypotheses per sentence,
 * finishes one when it emits eos, stops a sentence when `beam` hypotheses
 * have finished (or at decode_max_len) and returns the best by
 * score / (length incl. eos)^lenpen. With beam 1 it equals decode_greedy. */
void decode_beam(Model *m, const SrcBatch *b, int beam, float lenpen, Hypotheses *out);

/* Teacher-forced log-probability of each target (sum over tokens incl. eos,
 * no label smoothing): scores (B). */
void model_score(Model *m, const Batch *b, double *scores);

/* Encoder only: enc_out (B*S, C), the final encoder LayerNorm output. */
void model_encode(Model *m, const int32_t *src, const int32_t *src_len, int B, int S, float *enc_out);

#endif
