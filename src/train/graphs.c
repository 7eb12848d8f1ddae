/* graphs.c: the training step's graphs (see graphs.h). */
#include "train/graphs.h"

#include <stdio.h>
#include <stdlib.h>

#include "err.h"

#define GRAPH_SHAPES_MAX 1024  // shapes remembered (seen, with or without a graph)

typedef struct {
    int phase, slot, B, S, T;
    void *graph;          // NULL: seen, run as usual
    uint64_t n_frees;     // the backend's count when captured
    uint64_t layout_gen;  // the model's carving when captured
} GraphEntry;

struct StepGraphs {
    Backend *be;
    int max_graphs;
    GraphEntry *e;
    int n;
    GraphStats st;
};

StepGraphs *step_graphs_new(Backend *be, int max_graphs) {
    TP_CHECK(max_graphs >= 1, "step_graphs_new: room for %d graphs", max_graphs);
    StepGraphs *g = TP_CALLOC(1, sizeof *g);
    g->be = be;
    g->max_graphs = max_graphs;
    g->e = TP_CALLOC(GRAPH_SHAPES_MAX, sizeof *g->e);
    return g;
}

void step_graphs_free(StepGraphs *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) backend_graph_free(g->be, g->e[i].graph);
    free(g->e);
    free(g);
}

static GraphEntry *find(StepGraphs *g, int phase, int slot, int B, int S, int T) {
    for (int i = 0; i < g->n; i++) {
        GraphEntry *e = &g->e[i];
        if (e->phase == phase && e->slot == slot && e->B == B && e->S == S && e->T == T) return e;
    }
    return NULL;
}

static void drop(StepGraphs *g, GraphEntry *e) {
    backend_graph_free(g->be, e->graph);
    e->graph = NULL;
    g->st.kept--;
}

/* Captures run(ctx) and launches it; false (and graphs off) when refused. */
static bool capture(StepGraphs *g, GraphEntry *e, uint64_t layout_gen, void (*run)(void *), void *ctx) {
    char err[256] = "";
    backend_capture_begin(g->be);
    run(ctx);
    void *graph = backend_capture_end(g->be, err, sizeof err);
    if (!graph) {
        fprintf(stderr, "train_mt: --cuda-graphs: %s; the run goes on without graphs (same results)\n",
                err[0] ? err : "the backend made no graph");
        g->st.failed = true;
        return false;
    }
    e->graph = graph;
    e->n_frees = g->be->n_frees;
    e->layout_gen = layout_gen;
    g->st.captured++;
    g->st.kept++;
    backend_graph_launch(g->be, graph);
    return true;
}

void step_graphs_run(StepGraphs *g, GraphPhase phase, int slot, int B, int S, int T, uint64_t layout_gen,
                     void (*run)(void *ctx), void *ctx) {
    GraphEntry *e = g->st.failed ? NULL : find(g, (int)phase, slot, B, S, T);
    if (e && e->graph && (e->n_frees != g->be->n_frees || e->layout_gen != layout_gen)) {
        drop(g, e);  // it names buffers that moved: captured again below
        g->st.stale++;
    }
    if (e && e->graph) {
        backend_graph_launch(g->be, e->graph);
        g->st.replayed++;
        return;
    }
    if (e && g->st.kept < g->max_graphs && capture(g, e, layout_gen, run, ctx)) return;
    if (!e && !g->st.failed && g->n < GRAPH_SHAPES_MAX)
        g->e[g->n++] = (GraphEntry){.phase = (int)phase, .slot = slot, .B = B, .S = S, .T = T};
    run(ctx);
    g->st.eager++;
}

GraphStats step_graphs_stats(const StepGraphs *g) {
    GraphStats s = {0};
    if (g) s = g->st;
    return s;
}
