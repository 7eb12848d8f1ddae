/* parallel.c: the Megatron mappings (see parallel.h). */
#include "tp/parallel.h"

#include "err.h"
#include "kernels/ops.h"

int tp_group_check(const TpGroup *g, char *err, size_t err_len) {
    if (g->size < 1 || g->rank < 0 || g->rank >= g->size || (g->size > 1 && !g->comm)) {
        tp_error_set(err, err_len, "tensor-parallel rank %d of %d is not a valid layout", g->rank, g->size);
        return -1;
    }
    return 0;
}

/* x over the group, in place; nothing to do without tensor parallelism. */
static void reduce(const TpGroup *g, float *x, size_t n_elems, CommOp op) {
    if (g->size == 1) return;
    TP_CHECK(comm_allreduce(g->comm, x, n_elems, op) == 0, "%s", comm_error(g->comm));
}

void tp_reduce_fwd(const TpGroup *g, float *x, size_t n_elems) { reduce(g, x, n_elems, COMM_SUM); }

void tp_reduce_bwd(const TpGroup *g, float *dx, size_t n_elems) { reduce(g, dx, n_elems, COMM_SUM); }

void tp_vocab_embedding_fwd(const TpGroup *g, Backend *be, float *out, const int32_t *ids, const float *table,
                            float scale, int N, int C, int vocab_start, int vocab_local) {
    op_embedding_fwd(be, out, ids, table, scale, N, C, vocab_start, vocab_local);
    reduce(g, out, (size_t)N * C, COMM_SUM);  // each id lives on one rank
}

void tp_vocab_xent_fwd(const TpGroup *g, Backend *be, float *losses, float *lse, float *row_max, float *stats,
                       const float *logits, const uint16_t *logits16, const int32_t *targets, int N,
                       int vocab_local, int vocab_valid, int vocab_start, int V, float eps, int32_t ignore_id) {
    TP_CHECK((logits == NULL) != (logits16 == NULL), "tp_vocab_xent_fwd: give exactly one of logits and logits16");
    if (logits16) op_xent_vp_max16(be, row_max, logits16, N, vocab_local, vocab_valid);
    else op_xent_vp_max(be, row_max, logits, N, vocab_local, vocab_valid);
    reduce(g, row_max, (size_t)N, COMM_MAX);
    if (logits16)
        op_xent_vp_sums16(be, stats, logits16, row_max, targets, N, vocab_local, vocab_valid, vocab_start, ignore_id);
    else op_xent_vp_sums(be, stats, logits, row_max, targets, N, vocab_local, vocab_valid, vocab_start, ignore_id);
    reduce(g, stats, (size_t)N * 3, COMM_SUM);
    op_xent_vp_loss(be, losses, lse, row_max, stats, targets, N, V, eps, ignore_id);
}

int tp_seq_rows(const TpGroup *g, int N) { return (N + g->size - 1) / g->size; }

void tp_seq_reduce_scatter(const TpGroup *g, Backend *be, const float *full, float *shard, size_t shard_elems) {
    if (g->size == 1) {
        op_copy(be, shard, full, shard_elems);
        return;
    }
    TP_CHECK(comm_reduce_scatter(g->comm, full, shard, shard_elems) == 0, "%s", comm_error(g->comm));
}

void tp_gather(const TpGroup *g, Backend *be, const float *shard, float *all, size_t n_elems) {
    if (g->size == 1) {
        op_copy(be, all, shard, n_elems);
        return;
    }
    TP_CHECK(comm_allgather(g->comm, shard, all, n_elems) == 0, "%s", comm_error(g->comm));
}
