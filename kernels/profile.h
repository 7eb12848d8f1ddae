/* profile.h: time per class of operation over the training steps
 * (train_mt --profile).
 *
 * The hook is the backend's op table: backend_profile_enable swaps
 * be->ops for a copy whose op entries bracket the real ones with two time
 * marks (BackendOps.mark: a CUDA event recorded on the stream, or the wall
 * clock on the CPU), and tags the pair with the op's class. Nothing waits
 * per op: a step's marks are read once, at its end, when the step has
 * already waited for its scalars. Between the marks:
 *   - an op's own span goes to its class;
 *   - the time from one op's end to the next op's start is a host gap (on
 *     a GPU: the device idle, waiting for the host to queue work);
 *   - collectives are bracketed from outside (comm_set_timer, through
 *     backend_profile_region_begin/end) as communication; ops they run
 *     inside (staging copies) count with them, not apart.
 * Each pair is tagged with its op (ProfOp: an entry of ops_list.h, a copy,
 * the re-cast, or the collectives' region), and a class's time is the sum
 * of its ops' (the same marks), so the table by op breaks the class rows
 * down exactly.
 * The classes plus the host gaps are the span from the step's first mark to
 * its last; what the caller's wall-clock step time holds beyond that span
 * is the remainder, reported as its own row. Ops from other threads (a
 * gradient-reduction thread) are not marked: their time shows where the
 * step waits for them.
 */
#ifndef TPTRAIN_PROFILE_H
#define TPTRAIN_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include "backend.h"

typedef enum {
    PROF_GEMM = 0,
    PROF_ATTENTION,
    PROF_LAYERNORM,    // LayerNorm, and the fused residual add + dropout + LayerNorm (op_residual_ln_*)
    PROF_LOSS,
    PROF_ELEMENTWISE,  // element-wise, bias, activation, dropout, zeroing, copies on the device
    PROF_EMBEDDING,
    PROF_OPTIMIZER,    // AdamW, the gradient norm and clipping
    PROF_CONVERT,      // dtype conversion: fp32 <-> bf16, the compute weights' re-cast
    PROF_COMM,         // collectives and point-to-point messages
    PROF_COPY,         // host <-> device copies (batch upload, scalar reads)
    PROF_HOST_GAP,     // between ops: the device waiting for the host
    PROF_N_CLASSES
} ProfClass;

const char *prof_class_name(ProfClass c);  // "GEMM", "attention", ...
const char *prof_class_key(ProfClass c);   // "gemm", "attention", ... (JSON keys)

/* Every op the profile tells apart: the op table's entries in ops_list.h's
 * order, then the wrapped entries outside it, then the regions marked from
 * outside the table. */
typedef enum {
#define OP(name, cls, cpu, cuda, params, args) PROF_OP_##name,
#include "ops_list.h"
    PROF_OP_upload,
    PROF_OP_download,
    PROF_OP_upload_wait,
    PROF_OP_recast,
    PROF_OP_collectives,  // comm_set_timer's regions (class communication)
    PROF_N_OPS
} ProfOp;

const char *prof_op_name(ProfOp op);  // "linear_fwd", ..., "collectives"
ProfClass prof_op_class(ProfOp op);

/* The run's totals over the profiled steps, in seconds. */
typedef struct {
    double seconds[PROF_N_CLASSES];  // each class's ops summed (host gaps: their own)
    long n_ops[PROF_N_CLASSES];      // marked calls per class (host gaps: none)
    double op_seconds[PROF_N_OPS];   // per op, from the same marks
    long op_calls[PROF_N_OPS];
    double step_s;               // the callers' wall-clock step times, summed
    double span_s;               // first to last mark of each step, summed (= the classes' sum)
    int steps;                   // steps profiled
    int skipped;                 // steps not profiled: more marks than the set held (it grows for the next)
} ProfTotals;

/* Turns profiling on for be (idempotent); off until the first step_begin. */
void backend_profile_enable(Backend *be);
/* Restores the real op table and frees the state (backend_destroy calls it). */
void backend_profile_disable(Backend *be);
bool backend_profile_on(const Backend *be);
/* A training step: marks from begin to end count; end takes the step's
 * wall-clock seconds as the caller measured them. No-ops when off. */
void backend_profile_step_begin(Backend *be);
void backend_profile_step_end(Backend *be, double step_wall_s);
/* A region timed as one op, from outside the op table (collectives); ops
 * inside it count with it. No-ops when off or outside a step. */
void backend_profile_region_begin(Backend *be, ProfOp op);
void backend_profile_region_end(Backend *be);
/* The totals so far (zeros when off). */
ProfTotals backend_profile_totals(const Backend *be);

/* The table, per step in ms with shares of the measured step time; the
 * remainder row (step time less the classes) always shown. Then the table
 * by op: each op that ran, by time, ending with the "all ops" row. */
void prof_print_table(FILE *f, const ProfTotals *t, const char *device_name);
/* The same as one JSON object (per-step ms; "op_ms" and "op_calls" per op
 * that ran), into buf (truncated to fit); returns buf. */
char *prof_json(const ProfTotals *t, char *buf, size_t buf_len);

#endif
