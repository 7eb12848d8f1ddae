/* backend_cuda.h: what the GPU tests may see of a CUDA Backend beyond
 * backend.h: its stream and GEMM context (to compare fused and separate
 * epilogues and read the GEMM counters). PRIVATE to kernels/cuda and the
 * GPU tests; backend.c finds the backend through backend_cuda_entry
 * (backend.h), and the model never includes this. */
#ifndef TPTRAIN_BACKEND_CUDA_H
#define TPTRAIN_BACKEND_CUDA_H

#include <cuda_runtime_api.h>

#include "cuda_gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"

/* be must be a CUDA backend (be->kind == BACKEND_CUDA). */
cudaStream_t backend_cuda_stream(const Backend *be);
CudaGemmCtx *backend_cuda_gemm(const Backend *be);

#ifdef __cplusplus
}
#endif
#endif
