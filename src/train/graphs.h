/* graphs.h: the training step's forward and backward as graphs
 * (backend.h's capture and launch: CUDA graphs on a GPU), one per phase
 * and batch shape, replayed whenever that shape comes again
 * (`train_mt --cuda-graphs on`). A step of the base model queues over a
 * thousand kernels; replayed, it is one launch per phase, so the host no
 * longer sets the pace of small batches.
 *
 * Policy. A shape's first forward and backward run as usual (that sizes
 * every buffer and the ops' workspace, so a capture never allocates); its
 * second is captured, then launched; from then on it is replayed. A graph
 * names the buffers it was captured with, so it is replayed only while
 * they hold: the backend has freed nothing since (Backend.n_frees) and the
 * model's carving is unchanged (Model.layout_gen); otherwise it is
 * captured again. At most max_graphs graphs are kept; shapes beyond them
 * run as usual (no eviction: with more shapes than room, recapturing in
 * turn would cost more than it saves). A capture the backend refuses ends
 * the use of graphs for the run, with one line on stderr; the step then
 * runs its ops as usual, with the same results.
 *
 * What changes between replays lives in device memory: the batch's ids
 * (model_stage_batch, before each forward) and the StepVars (the dropout
 * masks' step and micro-batch, the loss scale), which the trainer uploads
 * before each forward; the ops read them on the device (backend.h). */
#ifndef TPTRAIN_GRAPHS_H
#define TPTRAIN_GRAPHS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"

typedef enum { GRAPH_FORWARD = 0, GRAPH_BACKWARD = 1 } GraphPhase;

typedef struct {
    long captured;  // graphs captured (recaptures included)
    long replayed;  // phases run by launching a graph captured earlier (the launch right after a capture excluded)
    long eager;     // phases run op by op (a shape's first sight, no room, or graphs off after a refusal)
    long stale;     // graphs dropped because the buffers they name moved
    int kept;       // graphs held now
    bool failed;    // a capture was refused: graphs are off for the rest of the run
} GraphStats;

typedef struct StepGraphs StepGraphs;

StepGraphs *step_graphs_new(Backend *be, int max_graphs);
void step_graphs_free(StepGraphs *g);  // NULL is a no-op

/* Runs phase `phase` of a micro-batch of shape (B, S, T) in activation
 * slot `slot`: run(ctx) queues its ops, and is called at most once (not at
 * all on a replay). layout_gen: the model's Model.layout_gen. */
void step_graphs_run(StepGraphs *g, GraphPhase phase, int slot, int B, int S, int T, uint64_t layout_gen,
                     void (*run)(void *ctx), void *ctx);

GraphStats step_graphs_stats(const StepGraphs *g);

#endif
