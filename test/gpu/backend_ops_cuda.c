/* backend_ops_cuda.c: what test_backend_ops needs to see of a CUDA backend
 * beyond backend.h (harness.h declares these): the device's free memory,
 * the stream-ordered pool's reserved memory, and the GEMM context's
 * epilogue and tuning switches and counters. Built only with CUDA. */
#include <cuda_runtime_api.h>

#include "backend_ops/harness.h"
#include "cuda/backend_cuda.h"
#include "cuda/cuda_ops.h"
#include "err.h"

#define TEST_CUDA(call)                                                                                       \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        TP_CHECK(e_ == cudaSuccess, "%s failed: %s", #call, cudaGetErrorString(e_));                          \
    } while (0)

size_t gpu_free_bytes(void) {
    size_t free_bytes = 0, total_bytes = 0;
    TEST_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
}

size_t gpu_pool_reserved_bytes(const Backend *be) {
    cudaMemPool_t pool;
    TEST_CUDA(cudaDeviceGetDefaultMemPool(&pool, be->device));
    uint64_t reserved = 0;
    TEST_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    return (size_t)reserved;
}

void gpu_set_fused_attention(bool on) { cuda_attention_set_fused(on); }

void gpu_set_flash_short(bool on) { cuda_flash_set_kernel(on ? CUDA_FLASH_SHORT : CUDA_FLASH_TILED); }

int gpu_flash_short_max_t(void) { return CUDA_FLASH_SHORT_MAX_T; }

GpuFlashCounts gpu_flash_counts(void) {
    const CudaFlashCounts c = cuda_flash_counts();
    return (GpuFlashCounts){c.tiled_fwd, c.tiled_bwd, c.short_fwd, c.short_bwd};
}

void gpu_set_fused_epilogues(const Backend *be, bool on) { cuda_gemm_set_fused_epilogues(backend_cuda_gemm(be), on); }

GpuGemmCounts gpu_gemm_counts(const Backend *be) {
    CudaGemmStats s = cuda_gemm_stats(backend_cuda_gemm(be));
    GpuGemmCounts c = {s.n_bias_fused, s.n_bias_separate, s.n_bgrad_fused, s.n_bgrad_separate,
                       s.n_epilogue_refusals, s.n_plans, s.n_plan_evictions, s.n_out16_fused,
                       s.n_out16_separate, s.n_out16_unplanned, s.n_dx16_fused, s.n_dx16_separate,
                       s.n_relu_mask_fused, s.n_relu_mask_separate, s.n_drelu_fused, s.n_drelu_separate, s.n_tuned,
                       s.n_tune_changed, s.n_tune_single, s.n_tune_captured, s.n_tune_skipped, s.n_tune_recalled,
                       s.tune_ms};
    return c;
}

void gpu_set_gemm_tuning(const Backend *be, bool on) { cuda_gemm_set_tuning(backend_cuda_gemm(be), on); }
