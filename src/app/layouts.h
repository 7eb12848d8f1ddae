/* layouts.h: the layouts --plan and --layout auto weigh: the batch shapes
 * a layout's run would see, the candidates for a world size, and their
 * ranking (the planner, train/planner.h, predicts each one's memory and
 * step time).
 */
#ifndef TPTRAIN_APP_LAYOUTS_H
#define TPTRAIN_APP_LAYOUTS_H

#include <stdbool.h>
#include <stddef.h>

#include "app/args.h"
#include "app/source.h"
#include "train/planner.h"
#include "transformer/model.h"
#include "transformer/stage.h"

enum { PLAN_MAX_STEPS = 5000, PLAN_TOP = 10 };  // steps whose batch shapes are read (the largest recur every epoch)

/* The shapes a layout's run would see: every dp rank's micro-batches of the
 * first steps, the evaluation batches and the decode batch. */
typedef struct {
    PlanShape *train, *eval;
    int n_steps, n_eval;
    int decode_n, decode_S;
} PlanShapes;

void plan_shapes_free(PlanShapes *ps);

/* For dp ranks of M micro-batches of <= btok tokens (the copy task: the
 * --batch-size sentences of a step split into dp x M). 0, or -1 with err. */
int plan_shapes(const TrainArgs *a, Source *src, int dp, int M, int btok, PlanShapes *ps, char *err, size_t err_len);

/* One layout of the world's ranks, and its plan. */
typedef struct {
    int tp, dp, pp, micro, zero, batch_tokens;
    bool sp;
    ModelRecompute rc;
    const ModelStage *stages;  // [pp]
    int set;                   // its batch shapes: shape_sets[set]
    char why[256];             // why it was dropped; "" while it stands
    double peak, step, compute, comm, bubble;  // the largest rank's peak (library included) and the slowest step
    int worst;                 // the rank with that peak
} Layout;

typedef struct {
    int pp;
    ModelStage *st;
    char err[256];  // "": made
} StageSet;

typedef struct {
    int dp, micro, batch_tokens;
    PlanShapes ps;
    char err[256];  // "": read
} ShapeSet;

/* The layout in words, and the train_mt flags that run it. */
void layout_text(const Layout *l, const TrainArgs *a, char *buf, size_t len);
void layout_flags(const Layout *l, const TrainArgs *a, char *buf, size_t len);

/* The layouts --layout auto weighs for W ranks (*out: to free): every tp
 * that divides the heads and the ffn, pp up to the layers, dp the rest;
 * micro-batches 1 to 8 (the global batch kept: --batch-tokens x W tokens,
 * or --batch-size sentences on the copy task), ZeRO 0-2 where dp > 1,
 * sequence parallelism where tp > 1, and each recomputation. */
int layouts_enumerate(const TrainArgs *a, int W, Layout **out);

/* qsort order of Layout pointers: those that stand first, fastest first (as
 * fast: the leaner); then the dropped, leanest first. */
int by_step(const void *x, const void *y);

/* The choice among the layouts that stand (order: fastest predicted
 * first): of those within PLAN_TIE of the fastest, the one with the least
 * predicted communication and bubble (the least certain parts of a
 * prediction: on CPU ranks sharing cores they carry the scheduler's noise),
 * of equal ones (within 0.1% of a step) the faster. */
#define PLAN_TIE 0.05
int layout_pick(Layout **order, int n);

/* The ranking of --layout auto: the top layouts that fit, the choice, and
 * each reason for dropping the others once with how many it struck. */
void print_ranking(Layout **order, int n, const TrainArgs *a, int W, int top, int pick);

#endif
