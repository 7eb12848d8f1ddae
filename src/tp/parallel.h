/* parallel.h: the Megatron mappings of tensor parallelism on one tp group.
 *
 * A layer split over the group (see the split labels of transformer/params.h)
 * meets the rest of the model at these points only; each is one collective
 * on the group's communicator, nothing at all when the group has one rank:
 *
 *  - g, after a ROW-parallel layer in the forward pass: every rank holds a
 *    partial sum of the output, the group sums it (tp_reduce_fwd).
 *  - f, before a COL-parallel layer in the backward pass: every rank holds a
 *    partial gradient of the (replicated) input, the group sums it
 *    (tp_reduce_bwd). The tied output layer (VOCAB rows used as COL) and the
 *    encoder output feeding every decoder layer's cross-attention keys and
 *    values take the same reduction.
 *  - the vocabulary-parallel embedding: each id lives on the one rank whose
 *    rows hold it, the others look up zeros, the group sums the lookups.
 *    Its backward needs no collective (op_embedding_bwd adds the replicated
 *    gradient into this rank's own rows).
 *  - the vocabulary-parallel cross-entropy: the logits of a row are never
 *    gathered; the group reduces each row's max (MAX) and its statistics
 *    (SUM), after which every rank holds the same losses and lse, and the
 *    backward pass (op_xent_vp_bwd) needs no collective.
 *  - the gather of a sharded tensor: every rank's shard, side by side.
 *  - sequence parallelism (Korthikanti et al., 2022): between the
 *    sub-blocks (LayerNorms, dropout, residual adds) each rank holds 1/tp of
 *    the token rows. g becomes a reduce-scatter of the ROW layer's partial
 *    output into this rank's rows, f an allgather of the rows into the COL
 *    layer's input; backward takes the conjugates (an allgather of the
 *    output gradient, a reduce-scatter of the input gradient).
 *
 * Everything takes the group, buffers of the model's backend (device
 * pointers on a GPU) and, where it runs ops, the backend; never the model. A failed collective is fatal
 * (comm.h: the communicator is then poisoned, the run cannot go on). The
 * collectives are counted by the communicator itself (comm_stats).
 */
#ifndef TPTRAIN_PARALLEL_H
#define TPTRAIN_PARALLEL_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"
#include "tp/comm.h"

/* This rank's tensor-parallel group: heads, FFN columns and vocabulary rows
 * are split `size` ways (Megatron). comm may be NULL when size == 1. */
typedef struct {
    int size, rank;
    Comm *comm;
} TpGroup;

/* 0 when g is a usable group (1 <= size, 0 <= rank < size, a communicator
 * when size > 1), else -1 with one sentence in err. */
int tp_group_check(const TpGroup *g, char *err, size_t err_len);

/* In place, n_elems floats summed over the group: Megatron's g (forward,
 * the partial output of a ROW layer) and f (backward, the partial input
 * gradient of a COL layer). */
void tp_reduce_fwd(const TpGroup *g, float *x, size_t n_elems);
void tp_reduce_bwd(const TpGroup *g, float *dx, size_t n_elems);

/* out (N, C) = scale * table[ids[n]] over the whole vocabulary, from this
 * rank's rows [vocab_start, vocab_start + vocab_local) of it (table is the
 * shard, (vocab_local, C)). */
void tp_vocab_embedding_fwd(const TpGroup *g, Backend *be, float *out, const int32_t *ids, const float *table,
                            float scale, int N, int C, int vocab_start, int vocab_local);

/* The label-smoothed cross-entropy of N rows whose logits (N, vocab_local)
 * hold this rank's vocabulary columns (the first vocab_valid real, from
 * vocab_start; V is the real vocabulary size): losses (N) and lse (N), the
 * same on every rank, for op_xent_vp_bwd. The logits come as fp32 (logits)
 * or as bf16 bits (logits16), exactly one of them. row_max (N) and stats
 * (N, 3) are scratch the backward pass does not need. */
void tp_vocab_xent_fwd(const TpGroup *g, Backend *be, float *losses, float *lse, float *row_max, float *stats,
                       const float *logits, const uint16_t *logits16, const int32_t *targets, int N,
                       int vocab_local, int vocab_valid, int vocab_start, int V, float eps, int32_t ignore_id);

/* Sequence parallelism: a (N, C) tensor split by rows gives rank r the rows
 * [r n, r n + n) of its padded whole (size n rows, C), n = tp_seq_rows(g, N)
 * = ceil(N / size). The rows past N are padding: zero in every gradient
 * (the ROW layers' outputs are zeroed there before the reduce-scatter, so
 * they stay zero), finite in the activations, never read by a layer that
 * mixes rows. */
int tp_seq_rows(const TpGroup *g, int N);
/* (The allgather of rows is tp_gather: rank r's n C floats at r n C.)
 * full (size n C, each rank's partial sums) summed over the group, this rank's rows into shard. */
void tp_seq_reduce_scatter(const TpGroup *g, Backend *be, const float *full, float *shard, size_t shard_elems);

/* Every rank's shard (n_elems) into all (size * n_elems, rank r's at
 * all + r * n_elems), on every rank; a copy when the group has one rank. */
void tp_gather(const TpGroup *g, Backend *be, const float *shard, float *all, size_t n_elems);

#endif
