// launch_policy.h: the CUDA backend's decisions that are plain logic, written
// once for the device code and the host so that test/test_launch_policy.c
// proves them on a machine without a GPU (the CUDA files apply them; they
// cannot run here). Private to kernels/cuda and that test; plain C.
//
// 1. What a failed cublasLtMatmul means (gemm_plan.cu). Inside a stream
//    capture a call can fail because of the capture itself; the failure is
//    then absorbed (the capture fails as a whole and the ops run again one
//    by one), and the plan keeps its support: marking it unsupported there
//    would switch a fused epilogue off for the rest of the run, and in fp32
//    change the bias gradient's bits, which graphs promise to keep. Outside
//    a capture an optional plan (fused epilogue, bf16 output) falls back to
//    the separate kernels for good; a plain fp32 GEMM that fails is fatal.
// 2. Which split-K reductions a plan may use (gemm_plan.cu). cuBLASLt's
//    INPLACE and OUTPUT_TYPE schemes sum partial products in the output's
//    type: for a bf16 output that is a bf16 sum, not the fp32 accumulation
//    every op promises. So a plan whose output is not fp32 allows only the
//    compute-type scheme (or none).
// 3. The dynamic shared memory a kernel is allowed (attention.cu,
//    attention_flash.cu). Above 48 KiB a kernel must opt in, and the setting
//    belongs to the function, not to a launch: set to each launch's own
//    size it could go down, and a captured graph's earlier node, replayed,
//    would then exceed its kernel's limit. So the opt-in is the device's
//    whole limit, the same value every time: it never goes down.
// 4. Which timed cuBLASLt candidate a tuned GEMM keeps, and where the timed
//    runs write (gemm_tune.cu). The heuristic's first (index 0) stays unless
//    another ran more than GEMM_TUNE_MARGIN faster than the one kept so far:
//    candidates within timing noise of each other never displace the lower
//    index, so the choice flips between processes only for a candidate near
//    the margin. The timed runs write their product at the workspace's end,
//    in the output's size rounded up to 256 bytes; the algorithm gets the
//    bytes before it, and a candidate needing more is not timed.
#ifndef TPTRAIN_LAUNCH_POLICY_H
#define TPTRAIN_LAUNCH_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    GEMM_FAIL_CAPTURED,  // inside a capture: absorbed, the plan untouched
    GEMM_FAIL_FALLBACK,  // an optional plan refused: marked unsupported, the separate kernels run
    GEMM_FAIL_FATAL,     // a plain fp32 GEMM failed: the process ends, naming it
} GemmFailAction;

static inline GemmFailAction gemm_fail_action(bool capturing, bool optional_plan) {
    if (capturing) return GEMM_FAIL_CAPTURED;
    return optional_plan ? GEMM_FAIL_FALLBACK : GEMM_FAIL_FATAL;
}

// cuBLASLt's cublasLtReductionScheme_t bits (gemm_plan.cu asserts they match).
enum {
    GEMM_REDUCE_INPLACE = 1,       // in the output buffer, in the output type
    GEMM_REDUCE_COMPUTE_TYPE = 2,  // in workspace, in the compute type (fp32)
    GEMM_REDUCE_OUTPUT_TYPE = 4,   // in workspace, in the output type
    GEMM_REDUCE_ALL = 7,
};

// The reduction schemes a plan may use: all with an fp32 output (each sums
// in fp32), the compute type's alone otherwise.
static inline uint32_t gemm_reduction_schemes(bool output_fp32) {
    return output_fp32 ? (uint32_t)GEMM_REDUCE_ALL : (uint32_t)GEMM_REDUCE_COMPUTE_TYPE;
}

// A block's default dynamic shared memory limit, above which it must opt in.
#define SMEM_DEFAULT_LIMIT (48 * 1024)

// The value to give cudaFuncAttributeMaxDynamicSharedMemorySize before a
// launch of `bytes` on a device whose opt-in limit is `device_optin`: 0 when
// no opt-in is needed (bytes within the default), -1 when the block cannot
// have that much at all, else the device's limit (constant, so it never
// goes down between launches of the same kernel).
static inline int smem_optin_value(size_t bytes, int device_optin) {
    if (bytes <= SMEM_DEFAULT_LIMIT) return 0;
    if (device_optin <= 0 || bytes > (size_t)device_optin) return -1;
    return device_optin;
}

#define GEMM_TUNE_MARGIN 0.05  // a candidate must be this much faster (a fraction of the kept one's time)
#define GEMM_TUNE_REPS 3        // timed runs per candidate, after one warm-up

// The candidate kept among n timed ones: ms[i] the time of candidate i,
// negative where it failed (never kept). Candidate 0, the heuristic's
// first, is the reference: where it has no time, it is kept.
static inline int gemm_tune_pick(const float *ms, int n) {
    int best = 0;
    if (n < 1 || !(ms[0] >= 0.0f)) return 0;
    for (int i = 1; i < n; i++)
        if (ms[i] >= 0.0f && ms[i] * (1.0f + (float)GEMM_TUNE_MARGIN) < ms[best]) best = i;
    return best;
}

#define GEMM_TUNE_NO_ROOM ((size_t)-1)

// Where in a workspace of ws_bytes (256-aligned) the timed runs write an
// output of out_bytes, which is also the workspace the algorithm may use:
// GEMM_TUNE_NO_ROOM when the output alone does not fit.
static inline size_t gemm_tune_out_offset(size_t ws_bytes, size_t out_bytes) {
    const size_t room = (out_bytes + 255) & ~(size_t)255;
    if (out_bytes == 0 || room < out_bytes || room > ws_bytes) return GEMM_TUNE_NO_ROOM;
    return (ws_bytes - room) & ~(size_t)255;
}

#endif
