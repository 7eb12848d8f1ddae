// cuda_kernel_util.cuh: small device helpers shared by the kernel files:
// warp and block reductions, grid sizing, argument checks and carving of
// caller-provided scratch memory. Private to kernels/cuda (CUDA C++ only).
//
// Reductions here are deterministic: every sum is taken in a fixed tree
// (xor butterfly within a warp, then warp 0 over the per-warp values in warp
// order), and grid sizes depend only on the problem size, never on the
// device, so a result is a pure function of the input bits.
#ifndef TPTRAIN_CUDA_KERNEL_UTIL_CUH
#define TPTRAIN_CUDA_KERNEL_UTIL_CUH

#include <stddef.h>
#include <limits.h>
#include <stdint.h>

#include "bf16.h"  // tp_f32_to_bf16: the rounding, host and device
#include "backend.h"  // StepVars
#include "cuda_common.h"
#include "launch_policy.h"
#include "scratch_sizes.h"

#define TP_WARP 32
#define TP_FULL_MASK 0xffffffffu
// Upper bound on 1-D grid sizes; kernels loop grid-stride past it.
#define TP_MAX_GRID 65535u

// fp32 -> bf16 bits: common/bf16.h's rounding itself (nearest, ties to
// even; a NaN kept quiet with its sign), so every kernel that writes bf16
// gives the CPU reference's bits (__float2bfloat16_rn canonicalises NaN).
__device__ __forceinline__ uint16_t tp_bf16_bits(float x) { return tp_f32_to_bf16(x); }

// A dropout's stream id as the op draws it: with the backend's StepVars set
// (backend.h), their stream_base, read on the device when the kernel runs
// (a graph's replay reads the new one), plus the argument.
__device__ __forceinline__ uint64_t tp_step_stream(const StepVars *step, uint64_t stream_id) {
    return step ? step->stream_base + stream_id : stream_id;
}

// An input element as fp32: stored so, or bf16 bits widened (exact), for
// kernels templated on their input's storage.
__device__ __forceinline__ float ld_in(const float *x, long long i) { return x[i]; }
__device__ __forceinline__ float ld_in(const uint16_t *x, long long i) { return tp_bf16_to_f32(x[i]); }

// Argument checks of the exported ops (stay on in release builds).
#define TP_NEED_PTR(op, ptr) TP_CHECK((ptr) != NULL, "%s: %s is NULL", (op), #ptr)
#define TP_NEED_SIZE(op, x) TP_CHECK((x) >= 0, "%s: %s = %d is negative", (op), #x, (int)(x))

// Blocks needed to give each of n_items one thread (at least 1, at most
// TP_MAX_GRID): a function of the size only.
static inline unsigned tp_grid_1d(size_t n_items, unsigned threads) {
    size_t g = (n_items + threads - 1) / threads;
    if (g == 0) g = 1;
    if (g > TP_MAX_GRID) g = TP_MAX_GRID;
    return (unsigned)g;
}

// ---- caller-provided scratch -------------------------------------------------
// No op allocates: an op that needs temporary device memory states how much
// (cuda_<op>_scratch_bytes, a function of its arguments) and carves it from
// the scratch its caller passes (the backend's workspace arena). Regions
// start on TP_SCRATCH_ALIGN boundaries; the size functions add the padding.
#define TP_SCRATCH_ALIGN SCRATCH_ALIGN  // kernels/scratch_sizes.h: the planner's figure too

static inline size_t tp_scratch_round(size_t n_bytes) { return scratch_round(n_bytes); }

typedef struct {
    char *base;       // (cap) device scratch, TP_SCRATCH_ALIGN-aligned
    size_t used, cap;
    const char *op;   // named in the message when the scratch is too small
} TpCarver;

static inline TpCarver tp_carver(void *scratch, size_t cap, const char *op) {
    TP_CHECK(cap == 0 || ((uintptr_t)scratch % TP_SCRATCH_ALIGN == 0 && scratch != NULL),
             "%s: scratch %p is not %zu-byte aligned", op, scratch, TP_SCRATCH_ALIGN);
    TpCarver cv = {(char *)scratch, 0, cap, op};
    return cv;
}

// The next n_bytes of the scratch; dies if the caller passed less than the
// op's size function asked for.
static inline void *tp_carve(TpCarver *cv, size_t n_bytes) {
    const size_t at = cv->used;
    TP_CHECK(at + tp_scratch_round(n_bytes) <= cv->cap,
             "%s: scratch of %zu bytes is too small (%zu more at offset %zu)", cv->op, cv->cap,
             n_bytes, at);
    cv->used = at + tp_scratch_round(n_bytes);
    return cv->base + at;
}

// ---- warp reductions (every lane receives the same, bit-identical value) ----
__device__ __forceinline__ float tp_warp_sum(float v) {
    for (int o = TP_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(TP_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double tp_warp_sum(double v) {
    for (int o = TP_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(TP_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ int tp_warp_sum(int v) {
    for (int o = TP_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(TP_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float tp_warp_max(float v) {
    for (int o = TP_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TP_FULL_MASK, v, o));
    return v;
}

// ---- block reductions ----------------------------------------------------
// blockDim.x must be a multiple of 32 (1-D blocks); smem holds >= 32 values.
// Every thread must call them (they synchronise); all receive the result.
template <typename T>
__device__ __forceinline__ T tp_block_sum(T v, T *smem) {
    const int lane = threadIdx.x % TP_WARP, warp = threadIdx.x / TP_WARP;
    const int n_warps = blockDim.x / TP_WARP;
    v = tp_warp_sum(v);
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < n_warps ? smem[lane] : (T)0;
        w = tp_warp_sum(w);
        if (lane == 0) smem[0] = w;
    }
    __syncthreads();
    return smem[0];
}

__device__ __forceinline__ float tp_block_max(float v, float *smem) {
    const int lane = threadIdx.x % TP_WARP, warp = threadIdx.x / TP_WARP;
    const int n_warps = blockDim.x / TP_WARP;
    v = tp_warp_max(v);
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < n_warps ? smem[lane] : -INFINITY;
        w = tp_warp_max(w);
        if (lane == 0) smem[0] = w;
    }
    __syncthreads();
    return smem[0];
}

__device__ __forceinline__ int tp_block_min(int v, int *smem) {
    const int lane = threadIdx.x % TP_WARP, warp = threadIdx.x / TP_WARP;
    const int n_warps = blockDim.x / TP_WARP;
    for (int o = TP_WARP / 2; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(TP_FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int w = lane < n_warps ? smem[lane] : INT_MAX;
        for (int o = TP_WARP / 2; o > 0; o >>= 1) w = min(w, __shfl_xor_sync(TP_FULL_MASK, w, o));
        if (lane == 0) smem[0] = w;
    }
    __syncthreads();
    return smem[0];
}

// ---- dynamic shared memory above the default ------------------------------------------

// The current device's opt-in limit of dynamic shared memory per block,
// asked once per device ordinal (per file that calls it); -1 when unknown.
static inline int tp_smem_optin_limit(void) {
    static int optin[64];  // per device ordinal; 0 = not asked yet
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64) return -1;
    if (optin[dev] == 0) {
        int v = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        optin[dev] = v > 0 ? v : -1;
    }
    return optin[dev];
}

// Before a launch of `kernel` with `bytes` of dynamic shared memory: above
// the default the kernel opts in to the device's whole limit, the same value
// at every launch (launch_policy.h: one set to each launch's own size could
// go down under a captured graph's earlier, larger node). Neither call is a
// stream operation, so a capture allows them. A block over the limit is
// refused, naming `op`.
template <typename Kernel>
static void tp_smem_optin(Kernel kernel, size_t bytes, const char *op) {
    const int limit = tp_smem_optin_limit(), value = smem_optin_value(bytes, limit);
    TP_CHECK(value >= 0, "%s: %zu bytes of shared memory per block, the device allows %d", op, bytes, limit);
    if (value > 0) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, value));
}

#endif
