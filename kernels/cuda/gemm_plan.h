/* gemm_plan.h: the cuBLASLt half of the GEMM family, shared by gemm.cu (the
 * ops), gemm_plan.cu (the context and its plan cache) and gemm_tune.cu (the
 * timed choice among the heuristic's candidates). Private to those files;
 * everyone else uses cuda_gemm.h. */
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
    uint32_t align_aux;  // the ReLU bit-mask's (RELU_AUX_BIAS, DRELU_BGRAD), 0 without one
    int64_t aux_ld;      // its leading dimension in bits (a multiple of 128), 0 without one
    uint32_t tune;  // 1: a weight-gradient GEMM whose algorithm is timed (gemm_tune.cu), 0: the heuristic's first
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
    size_t ws_need;                       // the workspace algo needs (the heuristic's answer)
    bool tune_pending;                    // key.tune and the choice not yet made (at the plan's first matmul)
} Plan;

/* A tuned key's choice, kept for the context's life (gemm_tune.cu): a plan
 * evicted and made again takes it instead of timing anew, so a shape keeps
 * one algorithm (and its bits) whatever ran in between. */
typedef struct {
    bool used;
    PlanKey key;
    cublasLtMatmulAlgo_t algo;
} TuneRecord;

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
    bool tune;               // time the weight-gradient GEMMs' candidates (TPTRAIN_GEMM_TUNE, cuda_gemm_set_tuning)
    bool tune_events_ok;     // tune_ev were made (else tuning is off: nothing to time with)
    cudaEvent_t tune_ev[2];  // a timing's start and end
    TuneRecord records[CUDA_GEMM_TUNE_RECORDS];  // open addressing by key_hash, never removed
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
/* The same with the ReLU bit-mask aux (aux_ld bits a row of our C, a
 * multiple of 128): written by RELU_AUX / RELU_AUX_BIAS, read by
 * DRELU_BGRAD, whose bias gradient (bias) is fp32 whatever C's type. */
bool gemm_lt_matmul_aux(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const void *A, const void *B, cudaDataType_t ab_type, float beta, void *C,
                        cudaDataType_t d_type, cublasLtEpilogue_t epilogue, const void *bias, const void *aux,
                        int64_t aux_ld);

/* The weight-gradient GEMM dW += dy^T x (C (M, N) fp32 += A^T B, A (K, M),
 * B (K, N)), no epilogue: gemm_lt_matmul with trans_a, alpha 1, beta 1,
 * its algorithm timed among the heuristic's candidates at the first call
 * of its shape where tuning is on (gemm_tune.cu). */
void gemm_lt_matmul_dw(CudaGemmCtx *ctx, int M, int N, int K, const void *A, const void *B, cudaDataType_t ab_type,
                       float *C);

/* Whether gemm_lt_matmul_d with these arguments would find a plan (the
 * same lookup, so the answer is cached): asked before a caller spends work
 * preparing operands for a plan it can do without. A, B and C are the
 * pointers the call will get (their alignment is part of the plan). */
bool gemm_lt_supported(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, const void *A,
                       const void *B, cudaDataType_t ab_type, void *C, cudaDataType_t d_type,
                       cublasLtEpilogue_t epilogue, const void *bias);
bool gemm_lt_supported_aux(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, const void *A,
                           const void *B, cudaDataType_t ab_type, void *C, cudaDataType_t d_type,
                           cublasLtEpilogue_t epilogue, const void *bias, const void *aux, int64_t aux_ld);
/* Shared by gemm_plan.cu and gemm_tune.cu. */
uint32_t gemm_key_hash(const PlanKey *k);
bool gemm_key_eq(const PlanKey *a, const PlanKey *b);
cublasLtHandle_t gemm_lt_handle(CudaGemmCtx *ctx);
/* The preference every plan's heuristic query uses: the whole workspace,
 * the allowed reduction schemes, the pointers' alignments. */
cublasLtMatmulPreference_t gemm_plan_preference(const CudaGemmCtx *ctx, const PlanKey *k);
/* One matmul of plan p with algorithm algo: D = alpha op(A) op(B) + beta C
 * (D may differ from C: gemm_tune.cu times into workspace), ws_bytes of the
 * workspace. The status, nothing checked. */
cublasStatus_t gemm_lt_run(CudaGemmCtx *ctx, const Plan *p, const cublasLtMatmulAlgo_t *algo, float alpha,
                           const void *A, const void *B, float beta, const void *C, void *D, size_t ws_bytes);
/* Makes p's choice (gemm_tune.cu): its record where the key has one, else
 * the candidates timed on these operands (nothing written to C or D), else
 * the heuristic's first kept. Never fails: any trouble keeps p->algo. */
void gemm_tune_plan(CudaGemmCtx *ctx, Plan *p, float alpha, const void *A, const void *B, float beta, const void *C);
#endif
