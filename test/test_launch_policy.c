/* test_launch_policy.c: the CUDA backend's plain-logic decisions
 * (kernels/cuda/launch_policy.h) proven where no GPU runs them:
 *  1. a cuBLASLt call that fails inside a stream capture leaves its plan's
 *     support alone, so the run after the failed capture (op by op) and
 *     every later capture still take the fused epilogue; outside a capture
 *     an optional plan falls back for good and a plain one is fatal. The
 *     sequence below applies the actions as gemm_plan.cu does;
 *  2. a plan with a bf16 output allows no split-K reduction in the output's
 *     type; an fp32 one allows them all;
 *  3. the shared-memory opt-in given before the fused attention's launches
 *     never goes down over launches of growing and shrinking sizes (the
 *     kernels' own layouts, attn_tile.h), covers each launch, and refuses a
 *     launch over the device's limit;
 *  4. a tuned GEMM keeps the heuristic's first candidate unless another is
 *     more than GEMM_TUNE_MARGIN faster (times within noise never move it,
 *     a failed candidate is never kept, without the first's time nothing
 *     moves), and the timed runs' output sits at the workspace's end,
 *     256-aligned, clear of the bytes the algorithm is given. */
#include <stdbool.h>
#include "check.h"
#include "attn_tile.h"
#include "launch_policy.h"

/* A plan's support as gemm_plan.cu keeps it, and what a call returns to its
 * caller: true = the GEMM is queued (or absorbed by the capture), false =
 * the caller runs the separate kernels. */
typedef struct {
    bool supported, died, absorbed;
} PlanSim;

static bool sim_call(PlanSim *p, bool capturing, bool optional_plan, bool fails) {
    if (!p->supported) return false;
    if (!fails) return true;
    switch (gemm_fail_action(capturing, optional_plan)) {
    case GEMM_FAIL_CAPTURED: p->absorbed = true; return true;
    case GEMM_FAIL_FALLBACK: p->supported = false; return false;
    case GEMM_FAIL_FATAL: p->died = true; return true;
    }
    return true;
}

static void failure_actions(void) {
    /* the capture invalidated by something else: the fused call fails inside it */
    PlanSim p = {true, false, false};
    CHECK(sim_call(&p, true, true, true), "a failure inside a capture is absorbed, not a fallback");
    CHECK(p.absorbed && p.supported, "the plan keeps its support after an absorbed failure");
    CHECK(sim_call(&p, false, true, false), "the op-by-op rerun after the failed capture takes the fused plan");
    CHECK(sim_call(&p, true, true, false) && p.supported, "a later capture records the fused plan");
    /* a real refusal outside a capture: the separate kernels from then on */
    PlanSim q = {true, false, false};
    CHECK(!sim_call(&q, false, true, true) && !q.supported, "a refused optional plan falls back");
    CHECK(!sim_call(&q, false, true, false), "and stays off");
    /* a plain fp32 GEMM: fatal outside a capture, absorbed inside */
    PlanSim r = {true, false, false};
    sim_call(&r, false, false, true);
    CHECK(r.died && r.supported, "a plain GEMM that fails ends the process");
    PlanSim c = {true, false, false};
    sim_call(&c, true, false, true);
    CHECK(c.absorbed && !c.died, "a plain GEMM failing inside a capture is absorbed");
    CHECK(gemm_fail_action(true, true) == GEMM_FAIL_CAPTURED && gemm_fail_action(true, false) == GEMM_FAIL_CAPTURED &&
              gemm_fail_action(false, true) == GEMM_FAIL_FALLBACK && gemm_fail_action(false, false) == GEMM_FAIL_FATAL,
          "the four cases");
}

static void reduction_schemes(void) {
    const uint32_t bf16 = gemm_reduction_schemes(false), fp32 = gemm_reduction_schemes(true);
    CHECK(!(bf16 & GEMM_REDUCE_INPLACE), "bf16 output: no in-place split-K (it sums in bf16): mask %#x", bf16);
    CHECK(!(bf16 & GEMM_REDUCE_OUTPUT_TYPE), "bf16 output: no output-type split-K: mask %#x", bf16);
    CHECK(bf16 == GEMM_REDUCE_COMPUTE_TYPE, "bf16 output: the compute type's reduction allowed: mask %#x", bf16);
    CHECK(fp32 == GEMM_REDUCE_ALL, "fp32 output: every reduction (all in fp32): mask %#x", fp32);
    CHECK(GEMM_REDUCE_ALL == (GEMM_REDUCE_INPLACE | GEMM_REDUCE_COMPUTE_TYPE | GEMM_REDUCE_OUTPUT_TYPE),
          "the mask is the three schemes");
}

static void smem_optin(void) {
    const int h100_optin = 227 * 1024;  // Hopper's opt-in limit per block (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    /* the fused backward's sizes over a run of batches whose lengths rise and fall */
    static const int lengths[] = {80, 120, 40, 96, 64, 112, 72, 100, 56};
    int last = 0, n_optin = 0;
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        const int T = lengths[i];
        const size_t bytes = sizeof(float) * att_bwd_smem_floats(T, T, 64);
        const int v = smem_optin_value(bytes, h100_optin);
        CHECK(v != -1, "T=%d: %zu bytes fit the opt-in", T, bytes);
        if (v == 0) {
            CHECK(bytes <= SMEM_DEFAULT_LIMIT, "no opt-in only within the default: %zu bytes", bytes);
            continue;
        }
        n_optin++;
        CHECK((size_t)v >= bytes, "T=%d: the opt-in %d covers the launch's %zu bytes", T, v, bytes);
        CHECK(v >= last, "T=%d: the opt-in went down from %d to %d", T, last, v);
        last = v;
    }
    CHECK(n_optin >= 4, "the run exercises the opt-in (%d launches above 48 KiB)", n_optin);
    CHECK(smem_optin_value(SMEM_DEFAULT_LIMIT, h100_optin) == 0, "48 KiB needs no opt-in");
    CHECK(smem_optin_value((size_t)h100_optin + 1, h100_optin) == -1, "over the device's limit: refused");
    CHECK(smem_optin_value(SMEM_DEFAULT_LIMIT + 1, -1) == -1, "a device without an opt-in limit refuses");
}

static void tune_pick(void) {
    const float near[] = {1.00f, 0.97f, 0.96f};  // within 5% of the first: noise, the first stays
    CHECK(gemm_tune_pick(near, 3) == 0, "candidates within the margin keep the first: %d", gemm_tune_pick(near, 3));
    const float faster[] = {1.00f, 0.90f, 0.80f};  // each clearly faster than the one kept before it
    CHECK(gemm_tune_pick(faster, 3) == 2, "the clearly fastest wins: %d", gemm_tune_pick(faster, 3));
    const float chain[] = {1.00f, 0.90f, 0.87f};  // 0.87 is within 5% of 0.90: the lower index stays
    CHECK(gemm_tune_pick(chain, 3) == 1, "near the kept one, the lower index stays: %d", gemm_tune_pick(chain, 3));
    const float failed[] = {1.00f, -1.0f, 0.99f};
    CHECK(gemm_tune_pick(failed, 3) == 0, "a failed candidate is never kept: %d", gemm_tune_pick(failed, 3));
    const float no_first[] = {-1.0f, 0.5f};
    CHECK(gemm_tune_pick(no_first, 2) == 0, "without the first's time the first stays: %d", gemm_tune_pick(no_first, 2));
    const float one[] = {2.0f};
    CHECK(gemm_tune_pick(one, 1) == 0 && gemm_tune_pick(one, 0) == 0, "one candidate or none: the first");
    const size_t ws = (size_t)32 << 20;
    const size_t out = (size_t)2048 * 512 * 4 + 12;  // not a multiple of 256
    const size_t at = gemm_tune_out_offset(ws, out);
    CHECK(at != GEMM_TUNE_NO_ROOM && at % 256 == 0, "the timed output is 256-aligned: %zu", at);
    CHECK(at + out <= ws && ws - at < out + 256, "it ends inside the workspace, tight: at %zu of %zu", at, ws);
    CHECK(gemm_tune_out_offset(ws, ws) == 0, "an output of the whole workspace leaves the algorithm none");
    CHECK(gemm_tune_out_offset(ws, ws + 1) == GEMM_TUNE_NO_ROOM, "a larger output: no room");
    CHECK(gemm_tune_out_offset(ws, 0) == GEMM_TUNE_NO_ROOM, "an empty output: nothing to time");
    CHECK(gemm_tune_out_offset(ws, (size_t)-1) == GEMM_TUNE_NO_ROOM, "a size that wraps when rounded: no room");
}

int main(void) {
    failure_actions();
    reduction_schemes();
    smem_optin();
    tune_pick();
    return check_report("test_launch_policy");
}
