/* cuda_gemm.h: GEMM and linear layers on the GPU, through cuBLASLt.
 *
 * The same operations and arguments as ops.h's op_gemm, op_linear_fwd and
 * op_linear_bwd (row-major, W[out, in],
 * y = x W^T + b, backward ops accumulate, NULL skips a gradient), on DEVICE
 * pointers to fp32 tensors, plus a CudaGemmCtx passed first: the cuBLASLt
 * handle, its workspace (allocated once), the stream every call is queued
 * on, the precision, and a cache of matmul plans.
 *
 * Precision: CUDA_GEMM_FP32 multiplies fp32 inputs with fp32 compute
 * (CUBLAS_COMPUTE_32F, no TF32): results match the CPU reference to fp32
 * rounding. CUDA_GEMM_BF16 converts the inputs to bf16 copies in the
 * context's scratch (round to nearest even), multiplies on tensor cores with
 * fp32 accumulation (CUBLAS_COMPUTE_32F) and writes fp32 outputs; C, bias
 * and gradients stay fp32.
 *
 * Epilogues: the linear forward adds its bias in the GEMM
 * (CUBLASLT_EPILOGUE_BIAS) and the backward computes db in the dW GEMM
 * (CUBLASLT_EPILOGUE_BGRADB); where cuBLASLt has no algorithm for that
 * combination, or fusion is switched off, the separate bias kernels of
 * bias.cu (cuda_op_bias_add, cuda_op_bias_bwd in cuda_ops.h) run instead.
 * In bf16 mode the fused db is summed from the bf16 copy of dy, the
 * separate kernel from the fp32 dy (in double).
 *
 * All calls are asynchronous on the context's stream; results are
 * deterministic for a given GPU, toolkit and shape (the plan cache picks the
 * same algorithm every time; no atomics). A context is not thread-safe.
 * Failures of CUDA or cuBLASLt calls and bad arguments end the process with
 * a message (err.h).
 */
#ifndef TPTRAIN_CUDA_GEMM_H
#define TPTRAIN_CUDA_GEMM_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CUDA_GEMM_FP32 = 0, CUDA_GEMM_BF16 = 1 } CudaGemmPrecision;

#define CUDA_GEMM_DEFAULT_WORKSPACE_BYTES ((size_t)32 << 20)  // what cuBLAS asks for on Hopper

/* Device memory a context holds and what it has done: the memory report
 * adds workspace_bytes + handle_bytes + scratch_bytes to the allocator's peak. */
typedef struct {
    size_t workspace_bytes;  // cuBLASLt workspace, allocated at creation
    size_t handle_bytes;     // taken by cublasLtCreate (cudaMemGetInfo before/after; 0 when lazy)
    size_t scratch_bytes;    // bf16 operand copies + bias-gradient vector (grows to the largest call)
    long n_matmuls;          // cublasLtMatmul calls
    long n_plans;            // heuristic queries (plan cache misses)
    long n_bias_fused, n_bias_separate;    // linear forward bias: epilogue / separate kernel
    long n_bgrad_fused, n_bgrad_separate;  // linear backward db: epilogue / separate kernel
} CudaGemmStats;

typedef struct CudaGemmCtx CudaGemmCtx;

/* Creates the cuBLASLt handle on the current device (every call on the
 * context must run with that device current) and allocates
 * workspace_bytes (0 = CUDA_GEMM_DEFAULT_WORKSPACE_BYTES). stream is used by
 * every call (0 = the legacy default stream); the caller keeps ownership. */
CudaGemmCtx *cuda_gemm_ctx_create(cudaStream_t stream, CudaGemmPrecision precision, size_t workspace_bytes);
/* Waits for the stream, then frees everything the context holds. */
void cuda_gemm_ctx_destroy(CudaGemmCtx *ctx);

void cuda_gemm_set_precision(CudaGemmCtx *ctx, CudaGemmPrecision precision);
CudaGemmPrecision cuda_gemm_precision(const CudaGemmCtx *ctx);
/* true (the default): bias and bias-gradient epilogues where supported;
 * false: always the separate kernels (tests compare the two). */
void cuda_gemm_set_fused_epilogues(CudaGemmCtx *ctx, bool on);
cudaStream_t cuda_gemm_stream(const CudaGemmCtx *ctx);
CudaGemmStats cuda_gemm_stats(const CudaGemmCtx *ctx);

/* Scratch grows on demand, which waits for the stream once (the old buffer
 * may still be in use). Reserve the largest call's need at set-up to keep
 * steps free of that: cuda_gemm_scratch_bytes gives what a linear layer of
 * these sizes needs (forward or backward) at a precision. */
size_t cuda_gemm_scratch_bytes(CudaGemmPrecision precision, int N, int in, int out);
void cuda_gemm_reserve(CudaGemmCtx *ctx, size_t n_bytes);

/* C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T; as op_gemm.
 * beta = 0 overwrites C (stale NaNs do not survive), beta = 1 accumulates. */
void cuda_op_gemm(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const float *A,  // (M, K), or (K, M) when trans_a
                  const float *B,  // (K, N), or (N, K) when trans_b
                  float beta,
                  float *C);       // (M, N)

/* y = x W^T + b; b may be NULL. */
void cuda_op_linear_fwd(CudaGemmCtx *ctx,
                        float *y,        // (N, out)
                        const float *x,  // (N, in)
                        const float *W,  // (out, in)
                        const float *b,  // (out) or NULL
                        int N, int in, int out);

/* dx += dy W ; dW += dy^T x ; db += sum_rows(dy). dx, dW or db may be NULL. */
void cuda_op_linear_bwd(CudaGemmCtx *ctx,
                        float *dx,        // (N, in) or NULL
                        float *dW,        // (out, in) or NULL
                        float *db,        // (out) or NULL
                        const float *dy,  // (N, out)
                        const float *x,   // (N, in)
                        const float *W,   // (out, in)
                        int N, int in, int out);

/* fp32 <-> bf16 (bf16 as its 16 raw bits; round to nearest even, NaN kept). */
void cuda_gemm_f32_to_bf16(cudaStream_t stream, uint16_t *dst, const float *src, size_t n_elems);
void cuda_gemm_bf16_to_f32(cudaStream_t stream, float *dst, const uint16_t *src, size_t n_elems);

#ifdef __cplusplus
}
#endif
#endif
