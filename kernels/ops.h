/* ops.h: every operation the Transformer needs, forward and backward.
 *
 * The contract of the backend table (backend.h): each op_<name> here calls
 * the backend's entry, so model code is written once and runs on whatever
 * backend it is given. Every op's prototype and contract is written once,
 * in ops_list.h, and the dispatchers below are generated from it.
 * kernels/cpu/ is the fp32 reference (plain C plus OpenBLAS sgemm;
 * cpu_ops.h, the same ops without the backend argument) and the oracle for
 * every test; kernels/cuda/ implements the same ops with the same arguments
 * on device pointers, queued on the backend's stream.
 *
 * No op returns a value to the host: results that the host needs (the loss
 * sum, the gradient norm) are accumulated into device scalars and read at
 * the step's one read point (backend_download).
 *
 * Conventions, for every op:
 *  - All tensors are row-major and contiguous; the shape comment on each
 *    pointer spells out the dimensions, e.g. `// (N, C)`.
 *  - Linear weights use PyTorch's layout W[out, in]: y = x W^T + b.
 *  - Backward ops ACCUMULATE into every gradient they produce (dx += ...,
 *    dW += ...), so residual branches and tied weights need no extra adds.
 *    Callers zero gradient buffers once per step. The ops that take a
 *    GradMode (backend.h) WRITE their input gradient instead when given
 *    GRAD_WRITE: the first contribution to a buffer needs no zeroing pass.
 *  - Sequences are right-padded; a padding mask is given as a per-sequence
 *    valid length (k_len[b] keys of row b are real, the rest are padding).
 *  - Counts are `int` (tensors here stay below 2^31 elements per call) except
 *    whole-buffer ops, which take `size_t n_elems`.
 */
#ifndef TPTRAIN_OPS_H
#define TPTRAIN_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "backend.h"

/* op_<name>(Backend *be, parameters) for every entry of ops_list.h. */
#define OP(name, cls, cpu, cuda, params, args) \
    static inline void op_##name TP_OP_WITH_BE params { be->ops->name TP_OP_ARGS_WITH_BE args; }
#include "ops_list.h"

/* Dropout over a whole tensor: the window that starts at element 0. */
static inline void op_dropout_fwd(Backend *be, float *out, const float *x, size_t n_elems, float p,
                                  uint64_t seed, uint64_t stream_id) {
    op_dropout_fwd_at(be, out, x, n_elems, 0, p, seed, stream_id);
}
static inline void op_dropout_bwd(Backend *be, float *dx, GradMode mode, const float *dy, size_t n_elems, float p,
                                  uint64_t seed, uint64_t stream_id) {
    op_dropout_bwd_at(be, dx, NULL, mode, dy, n_elems, 0, p, seed, stream_id);
}
/* The raw generator, exposed for tests: 4 words for one counter. */
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Stream id of one dropout site: packs (step, micro-batch, layer, site,
 * tp rank) into 64 bits: step 32 bits | micro 8 | layer 8 | site 6 | tp 10. */
uint64_t dropout_stream(uint32_t step, uint32_t micro, uint32_t layer,
                        uint32_t site, uint32_t tp_rank);

/* ---- multi-tensor: one launch over a table of segments (OpSeg, backend.h) ----
 * op_segs_create uploads the table once (a device buffer tagged tag; the
 * segments with n = 0 are dropped); op_segs_free releases it (NULL: no-op).
 * Dies with one sentence on a segment naming an accumulator outside
 * [0, OP_SEG_MAX_ACC) or more chunks than an int counts. The table serves
 * op_sumsq_segs and op_adamw_segs. */
OpSegTable *op_segs_create(Backend *be, const OpSeg *segs, int n_segs, MemTag tag);
void op_segs_free(Backend *be, OpSegTable *t);
/* The device bytes of a table of n_segs segments in n_chunks chunks, and
 * the chunks of a segment of n_elems (the memory planner's figures). */
size_t op_segs_bytes(int n_segs, size_t n_chunks);
size_t op_segs_chunks(size_t n_elems);

#endif
