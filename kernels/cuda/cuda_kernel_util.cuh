// cuda_kernel_util.cuh: small device helpers shared by the kernel files:
// warp and block reductions, grid sizing, argument checks and stream-ordered
// scratch memory. Private to kernels/cuda (CUDA C++ only).
//
// Reductions here are deterministic: every sum is taken in a fixed tree
// (xor butterfly within a warp, then warp 0 over the per-warp values in warp
// order), and grid sizes depend only on the problem size, never on the
// device, so a result is a pure function of the input bits.
#ifndef TPTRAIN_CUDA_KERNEL_UTIL_CUH
#define TPTRAIN_CUDA_KERNEL_UTIL_CUH

#include <stddef.h>
#include <stdint.h>

#include "cuda_common.h"

#define TP_WARP 32
#define TP_FULL_MASK 0xffffffffu
// Upper bound on 1-D grid sizes; kernels loop grid-stride past it.
#define TP_MAX_GRID 65535u

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

// Stream-ordered temporary device memory (cudaMallocAsync pool): freed in
// stream order, so it is safe with any number of streams.
static inline void *tp_scratch_alloc(size_t n_bytes, cudaStream_t stream) {
    void *p = NULL;
    CUDA_CHECK(cudaMallocAsync(&p, n_bytes ? n_bytes : 1, stream));
    return p;
}
static inline void tp_scratch_free(void *p, cudaStream_t stream) {
    CUDA_CHECK(cudaFreeAsync(p, stream));
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

#endif
