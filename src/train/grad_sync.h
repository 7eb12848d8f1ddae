/* grad_sync.h: the data-parallel gradient reduction, bucketed, optionally
 * overlapped with backward, in fp32 or bf16, and the ZeRO shard layout.
 *
 * Buckets are ranges of the contiguous gradient buffer cut from its end:
 * the model's backward finishes gradients from the end of the buffer to
 * its start (decoder LayerNorm, decoder layers last to first, encoder
 * LayerNorm, encoder layers, the shared embedding last), so a bucket is
 * final as soon as backward has passed its start, whatever tensors it cuts
 * through. Every bucket but the first in the buffer (the one holding the
 * embedding) has a length that is a multiple of dp, so it reduce-scatters
 * in place; the first is staged with zero padding.
 *
 * ZeRO-2 cuts buckets at tensor boundaries instead (each tensor's gradient
 * must be contiguous) and gives each its own storage, padded to dp q_k:
 * made when backward first reaches the bucket, reduce-scattered into the
 * rank's shard, then released, so no rank ever holds the whole gradient.
 *
 * ZeRO (stage >= 1): bucket k of length len_k is split into dp pieces of
 * q_k = ceil(len_k / dp) elements; rank r owns [lo_k + r q_k, lo_k + (r+1)
 * q_k) clipped to the bucket, and its optimizer state and reduced gradient
 * shard hold those pieces one after the other (shard offset at_k = sum of
 * the earlier q); its gradients stay in place in the buffer. The shard follows the buffer, not tensor boundaries
 * (Megatron's distributed optimizer cuts its buckets the same way). */
#ifndef TPTRAIN_GRAD_SYNC_H
#define TPTRAIN_GRAD_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include "kernels/backend.h"
#include "tp/comm.h"
#include "transformer/model.h"
#include "transformer/optim.h"

/* 25 MiB of fp32 gradients, like PyTorch DDP's default bucket_cap_mb. */
#define GRAD_BUCKET_MB_DEFAULT 25.0

typedef struct {
    size_t lo, hi;  // [lo, hi) of the gradient buffer
    size_t q;       // elements per dp rank: ceil((hi - lo) / dp)
    size_t at;      // where this bucket's piece starts in a rank's shard
} GradBucket;

typedef struct {
    GradBucket *b;       // [n], in reduction order: b[0] ends at the buffer's end
    int n;
    int dp;
    size_t n_elems;      // the gradient buffer
    size_t bucket_elems; // the nominal bucket length (a multiple of dp)
    size_t shard_elems;  // sum of q: a rank's shard, padding included
} BucketLayout;

/* Cuts n_elems into buckets of bucket_elems (rounded up to a multiple of dp,
 * at least dp) from the end. Free with bucket_layout_free. */
void bucket_layout_build(BucketLayout *L, size_t n_elems, size_t bucket_elems, int dp);
/* ZeRO-2's buckets: whole tensors of tab, closed from the end once they
 * hold bucket_elems, each with its own storage (padded to dp q). With
 * embed_alone the tied embedding (the table's first tensor) is a bucket of
 * its own: with pipeline stages every stage of the embedding group then
 * shards it alike, so the group sums the shards' embedding pieces. */
void bucket_layout_build_aligned(BucketLayout *L, const ParamTable *tab, size_t bucket_elems, int dp,
                                 bool embed_alone);
/* The layout a ZeRO stage uses (0 and 1: bucket_layout_build; 2: aligned,
 * the embedding alone when the model is cut into pipeline stages). */
void bucket_layout_for_stage(BucketLayout *L, const ParamTable *tab, int zero, size_t bucket_elems, int dp,
                             bool staged);
void bucket_layout_free(BucketLayout *L);
/* bucket_elems for a size in MiB of fp32 gradients (at least 1 element). */
size_t bucket_elems_for_mb(double mib);
/* Rank r's piece of bucket k: [*lo, *hi) of the buffer (may be empty). */
void bucket_piece(const BucketLayout *L, int k, int r, size_t *lo, size_t *hi);
/* Rank r's optimizer ranges (one per non-empty piece, ascending lo) into
 * out (room for L->n); returns their count. */
int bucket_ranges(const BucketLayout *L, int r, OptRange *out);

typedef struct GradSync GradSync;

typedef struct {
    size_t grad_bytes;       // MEM_GRAD held for the whole run: the buffer, or ZeRO-2's shard
    size_t grad_live_bytes;  // ZeRO-2: bucket storage alive at once during backward (an estimate)
    size_t optim_bytes;      // MEM_OPTIM: AdamW's m and v
    size_t comm_bytes;       // MEM_COMM: the staging buffer
    int n_buckets;
} GradSyncPlan;

typedef struct {
    int zero;             // 0: allreduce in place; 1: reduce-scatter in place; 2: into a shard, no full buffer
    CommDtype dtype;      // of the reduction (bf16: cast, reduced with fp32 sums, cast back)
    size_t bucket_elems;  // nominal bucket length
    bool overlap;         // reduce buckets on a communication thread while backward runs
    bool staged;          // the model is a pipeline stage (bucket_layout_for_stage)
} GradSyncConfig;

/* For m's gradients on be, reduced over dp (size >= 1). ZeRO-2 releases
 * m's gradient buffer and binds m's gradient views to bucket storage made
 * and released as backward runs. */
GradSync *grad_sync_create(Backend *be, Comm *dp, Model *m, const GradSyncConfig *cfg);
void grad_sync_free(GradSync *g);
/* What grad_sync_create and grad_sync_adamw_init (step.h) would allocate for
 * a stage of parameter table tab over dp ranks, without allocating. */
void grad_sync_plan(const ParamTable *tab, const GradSyncConfig *cfg, int dp, GradSyncPlan *out);
const BucketLayout *grad_sync_layout(const GradSync *g);
int grad_sync_rank(const GradSync *g);  // this rank in the dp group
int grad_sync_zero(const GradSync *g);  // the ZeRO stage
/* Whether the reduction leaves only this rank's pieces reduced (ZeRO). */
bool grad_sync_sharded(const GradSync *g);
/* ZeRO-2: the reduced pieces (layout shard_elems, each at its bucket's
 * `at`); NULL at stages 0 and 1, where they stay in the gradient buffer. */
float *grad_sync_shard(GradSync *g);

/* One step: begin before backward; ready(from) whenever every gradient at
 * buffer offset >= from is final (the model's hook: launches the buckets
 * that became final); finish after backward (launches the rest and waits).
 * After finish, zero 0: grads holds the sum over dp; zero 1: grads holds
 * it in this rank's pieces (reduce-scattered in place, as Megatron's
 * distributed optimizer does: no second gradient buffer), elsewhere
 * unspecified values.
 * With micro-batches (gradient accumulation) stages 0 and 1 reduce once,
 * during the last micro-batch's backward (the hooks are off before it);
 * ZeRO-2 has no buffer to accumulate in, so it reduces every micro-batch
 * (begin ... finish each time, accumulate set after the first: the pieces
 * are added into the shard), as DeepSpeed's stage 2 does: M times the
 * communication for the memory. */
void grad_sync_begin(GradSync *g, float *grads, bool accumulate);
void grad_sync_ready(GradSync *g, size_t from);
/* ZeRO-2 (the model's grads_needed hook): storage for the buckets that hold
 * [lo, hi), zeroed, bound to the model; storage of reduced buckets goes. */
void grad_sync_needed(GradSync *g, size_t lo, size_t hi);
void grad_sync_finish(GradSync *g);
/* ZeRO: every rank's updated pieces of params into every rank's buffer. */
void grad_sync_allgather_params(GradSync *g, float *params);
/* Seconds of the last step's data-parallel communication (every moment a
 * bucket's reduction was pending, collectives and their staging copies) and
 * of that the seconds the caller waited for it (not hidden behind
 * backward): never more than the first (see grad_sync.c). */
double grad_sync_exposed_s(const GradSync *g);
double grad_sync_comm_s(const GradSync *g);

#endif
