/* gemm_plan.h: the cuBLASLt half of the GEMM family, shared by gemm.cu (the
 * ops) and gemm_plan.cu (the context and its plan cache). Private to those
 * two files; everyone else uses cuda_gemm.h. */
#ifndef TPTRAIN_GEMM_PLAN_H
#define TPTRAIN_GEMM_PLAN_H

#include "cuda_common.h"
#include "cuda_gemm.h"

typedef struct {
    int trans_a, trans_b, M, N, K;
    cudaDataType_t ab_type;
    cudaDataType_t d_type;  // C = D: fp32, or bf16 (the linear layers' bf16 outputs)
    cublasLtEpilogue_t epilogue;
    uint32_t align_a, align_b, align_c, align_bias;  // bytes, powers of two up to 256
} PlanKey;

typedef struct {
    int used;
    int supported;                        // 0: no algorithm (epilogue plans fall back)
    uint64_t last_use;                    // the context's clock at the last hit
    PlanKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lay_a, lay_b;  // A_lt (our B), B_lt (our A)
    cublasLtMatrixLayout_t lay_c;         // C_lt = D_lt
    cublasLtMatmulAlgo_t algo;
} Plan;

struct CudaGemmCtx {
    int device;
    cudaStream_t stream;
    CudaGemmPrecision precision;
    bool fuse;
    bool warned_refusal;     // a refused epilogue has been logged
    cublasLtHandle_t handle;
    void *workspace;         // (stats.workspace_bytes) the caller's
    Plan plans[CUDA_GEMM_PLAN_SETS][CUDA_GEMM_PLAN_WAYS];
    uint64_t clock;          // counts plan lookups (least-recently-used order)
    CudaGemmStats stats;
};

/* One cuBLASLt matmul in gemm.cu's row-major mapping:
 * C = alpha op(A) op(B) + beta C, A and B of type ab_type, C fp32. With an
 * epilogue, bias is its vector; returns false (nothing queued) when cuBLASLt
 * cannot run that epilogue here, so the caller runs the separate kernel. */
bool gemm_lt_matmul(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                    const void *A, const void *B, cudaDataType_t ab_type, float beta, float *C,
                    cublasLtEpilogue_t epilogue, const void *bias);
/* The same with C of type d_type (CUDA_R_16BF: the fp32 result, bias and
 * ReLU applied, rounded as it is stored); the bias has C's type. */
bool gemm_lt_matmul_d(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      const void *A, const void *B, cudaDataType_t ab_type, float beta, void *C,
                      cudaDataType_t d_type, cublasLtEpilogue_t epilogue, const void *bias);

/* Whether gemm_lt_matmul_d with these arguments would find a plan (the
 * same lookup, so the answer is cached): asked before a caller spends work
 * preparing operands for a plan it can do without. A, B and C are the
 * pointers the call will get (their alignment is part of the plan). */
bool gemm_lt_supported(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, const void *A,
                       const void *B, cudaDataType_t ab_type, void *C, cudaDataType_t d_type,
                       cublasLtEpilogue_t epilogue, const void *bias);
#endif
