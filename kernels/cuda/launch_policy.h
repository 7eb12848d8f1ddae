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

#endif
