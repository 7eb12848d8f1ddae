/* cuda_gemm.h: GEMM and linear layers on the GPU, through cuBLASLt.
 * PRIVATE to kernels/cuda (and the GPU tests): the model reaches these only
 * through the Backend table (backend_cuda.cu).
 *
 * The same operations and arguments as ops.h's op_gemm, op_linear_fwd and
 * op_linear_bwd (row-major, W[out, in], y = x W^T + b, backward ops
 * accumulate, NULL skips a gradient), on DEVICE pointers, plus a CudaGemmCtx
 * passed first: the cuBLASLt handle, the stream every call is queued on,
 * the precision, and a cache of matmul plans.
 *
 * Memory: the context allocates no device memory. The cuBLASLt workspace is
 * the caller's (given at creation), and each call that needs temporary
 * space (bf16 operand copies, the bias-gradient vector) takes `scratch` of
 * at least the matching cuda_*_scratch_bytes(...) bytes, 256-aligned (the
 * backend's workspace arena). Scratch is free again once the call returns
 * (the next call on the stream may reuse it).
 *
 * Precision: CUDA_GEMM_FP32 multiplies fp32 inputs with fp32 compute
 * (CUBLAS_COMPUTE_32F, no TF32): results match the CPU reference to fp32
 * rounding. CUDA_GEMM_BF16 multiplies bf16 operands on tensor cores with
 * fp32 accumulation and writes fp32 outputs; C and gradients stay fp32, and
 * a linear layer's bias enters as its bf16 rounding (backend.h's precision
 * rule): an fp32 vector of those values for an fp32 output, a bf16 one for
 * a bf16 output (cuBLASLt's bias has D's type). An operand, the bias too,
 * comes as a CudaGemmOperand: its fp32 values and, where
 * the caller keeps one (the backend's compute weights, re-cast once per
 * step), its bf16 copy, used as is; otherwise the fp32 values are rounded
 * to bf16 copies in scratch (round to nearest even) on every call. This is
 * exactly what the CPU backend emulates in bf16 mode.
 *
 * Epilogues: the linear forward adds its bias in the GEMM
 * (CUBLASLT_EPILOGUE_BIAS); the backward computes db in the dW GEMM
 * (CUBLASLT_EPILOGUE_BGRADB, which sums dy as the GEMM reads it: in bf16
 * its bf16 copy, the contract's db). The FFN's ReLU keeps a bit-mask
 * (cuda_op_linear_relu_fwd16: RELU_AUX_BIAS) from which the next layer's
 * dx GEMM takes the ReLU's gradient and the first layer's db
 * (cuda_op_linear_bwd16_drelu: DRELU_BGRAD, an fp32 bias gradient beside
 * a bf16 output). Where cuBLASLt has
 * no algorithm for an epilogue, or refuses it with any other status (that
 * one is logged once per context), or fusion is switched off, the separate
 * bias kernels of bias.cu run instead.
 *
 * Plans (descriptors, layouts and the heuristic's algorithm) are cached per
 * exact shape, operand types, epilogue and pointer alignment: the same call
 * always gets the same algorithm, so results are deterministic for a given
 * GPU, toolkit and shape, whatever calls came before (with tuning on, for
 * the tuned GEMMs: within the process; below). The cache holds
 * CUDA_GEMM_PLAN_SETS x CUDA_GEMM_PLAN_WAYS plans (set-associative, least
 * recently used evicted within a set), enough for the distinct token counts
 * of many steps; a miss costs one heuristic query.
 *
 * Tuning (gemm_tune.cu's first comment has the whole story): the weight
 * gradients' plain GEMMs (dW += dy^T x, the backward's largest; not the
 * fp32 one with the bias-gradient epilogue) time the
 * heuristic's first CUDA_GEMM_TUNE_CANDIDATES algorithms once per shape, at
 * the shape's first uncaptured call, and keep the fastest (the first unless
 * another is clearly faster). Off by default, as PyTorch's TunableOp is:
 * a timed choice is the same for the rest of the process, but two
 * processes may choose differently, so a rerun or a resume would no longer
 * reproduce a run bit for bit; TPTRAIN_GEMM_TUNE=1 (read when the context
 * is made) or cuda_gemm_set_tuning(ctx, true) turns it on.
 *
 * All calls are asynchronous on the context's stream. A context is not
 * thread-safe. Failures of CUDA or cuBLASLt calls and bad arguments end the
 * process with a message (err.h).
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

#include "backend.h"  // GradMode

typedef enum { CUDA_GEMM_FP32 = 0, CUDA_GEMM_BF16 = 1 } CudaGemmPrecision;

/* (The cuBLASLt workspace the backend gives the context is
 * backend_gemm_workspace_bytes(BACKEND_CUDA): one figure for it and the planner.) */

#define CUDA_GEMM_PLAN_SETS 256
#define CUDA_GEMM_PLAN_WAYS 4
#define CUDA_GEMM_TUNE_RECORDS 2048   // tuned shapes remembered per context (beyond: the heuristic's first)
#define CUDA_GEMM_TUNE_CANDIDATES 8   // the heuristic's first candidates timed per shape
#define CUDA_GEMM_TUNE_ENV "TPTRAIN_GEMM_TUNE"

/* What a context has done. */
typedef struct {
    size_t workspace_bytes;                // the caller's cuBLASLt workspace
    long n_matmuls;                        // cublasLtMatmul calls
    long n_plans;                          // heuristic queries (plan cache misses)
    long n_plan_evictions;                 // plans dropped to make room
    long n_bias_fused, n_bias_separate;    // linear forward bias: epilogue / separate kernel
    long n_bgrad_fused, n_bgrad_separate;  // linear backward db: epilogue / separate kernel
    long n_out16_fused, n_out16_separate;  // linear_fwd16: bf16 stored by the GEMM / fp32 then rounded
    long n_out16_unplanned;  // of the separate: no bf16-output plan, found before any operand copy
    long n_dx16_fused, n_dx16_separate;    // linear_bwd16's dx16: bf16 stored by the GEMM / fp32 row chunks rounded
    long n_relu_mask_fused, n_relu_mask_separate;  // linear_relu_fwd16's mask: RELU_AUX_BIAS / the rounding pass
    long n_drelu_fused, n_drelu_separate;  // linear_bwd16_drelu: DRELU_BGRAD / dx16 masked by relu16 in the bias pass
    long n_epilogue_refusals;              // fused epilogues refused with a status other than NOT_SUPPORTED
    /* tuning: each tuned key's first call counts once in tuned, single, captured or skipped */
    long n_tuned;          // shapes whose candidates were timed
    long n_tune_changed;   // of them, those where a candidate other than the heuristic's first won
    long n_tune_single;    // shapes with one usable candidate: nothing to time
    long n_tune_captured;  // shapes first called inside a stream capture: the heuristic's first, kept
    long n_tune_skipped;   // no room in the workspace, a failed timing, or the record table full
    long n_tune_recalled;  // plans made again (after eviction) that took their recorded choice
    double tune_ms;        // host time spent tuning (queries, timed runs, waits)
} CudaGemmStats;

/* One operand: fp32 values (always), and their bf16 bits where the caller
 * keeps a copy (NULL otherwise). */
typedef struct {
    const float *f32;
    const uint16_t *bf16;
} CudaGemmOperand;

typedef struct CudaGemmCtx CudaGemmCtx;

/* cuBLASLt is opened at run time (cublaslt_load.c), not linked: programs
 * that stay on the CPU never pay its start-up. cublaslt_load opens the
 * toolkit's soname once and resolves every function the context calls:
 * 0, or -1 with one sentence in err (the library, and why); _from takes
 * another soname (the tests' missing library). backend_cuda_create starts
 * it in the background (cublaslt_load_start below). */
int cublaslt_load(char *err, size_t err_len);
int cublaslt_load_from(const char *soname, char *err, size_t err_len);
bool cublaslt_is_loaded(void);
/* cublaslt_load on a thread of its own, started now and not waited for:
 * the library's 0.5 s of start-up overlaps the program's own (the corpus,
 * the model's initialisation). The first call that needs it waits for it
 * (the load holds the lock every forwarder takes); a failure is then that
 * call's one sentence. A second start, or a start after the load, does
 * nothing; without a thread the load happens at that first call. */
void cublaslt_load_start(void);

/* Creates the context on the current device (every call on the context
 * must run with that device current); its cuBLASLt handle is made at the
 * first GEMM, once the library is loaded. workspace: the caller's
 * device buffer of workspace_bytes for cuBLASLt (it must outlive every
 * queued call). stream is used by every call; the caller keeps ownership. */
CudaGemmCtx *cuda_gemm_ctx_create(cudaStream_t stream, CudaGemmPrecision precision, void *workspace,
                                  size_t workspace_bytes);
/* Waits for the stream, then frees what the context holds (not the workspace). */
void cuda_gemm_ctx_destroy(CudaGemmCtx *ctx);

/* true (the default): bias and bias-gradient epilogues where supported;
 * false: always the separate kernels (tests compare the two). */
void cuda_gemm_set_fused_epilogues(CudaGemmCtx *ctx, bool on);
CudaGemmStats cuda_gemm_stats(const CudaGemmCtx *ctx);
/* true (TPTRAIN_GEMM_TUNE=1; off by default): weight-gradient GEMMs
 * time their candidates at a shape's first call; false: the heuristic's
 * first. The two are separate plans: switching back finds each as it was. */
void cuda_gemm_set_tuning(CudaGemmCtx *ctx, bool on);

/* C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T; as op_gemm.
 * beta = 0 overwrites C (stale NaNs do not survive), beta = 1 accumulates. */
size_t cuda_gemm_scratch_bytes(const CudaGemmCtx *ctx, int M, int N, int K, bool a_has_bf16, bool b_has_bf16);
void cuda_op_gemm(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  CudaGemmOperand A,  // (M, K), or (K, M) when trans_a
                  CudaGemmOperand B,  // (K, N), or (N, K) when trans_b
                  float beta,
                  float *C,           // (M, N)
                  void *scratch,      // (scratch_bytes >= cuda_gemm_scratch_bytes(...))
                  size_t scratch_bytes);

/* y = x W^T + b; b may be NULL. x, like W, is an operand: its fp32 values,
 * or its bf16 bits alone (f32 NULL: the x16 ops' saved input), which bf16
 * multiplies as they are and fp32 widens into scratch (x_bf16_only). */
size_t cuda_linear_fwd_scratch_bytes(const CudaGemmCtx *ctx, int N, int in, int out, bool w_has_bf16,
                                     bool x_bf16_only, bool has_bias);
void cuda_op_linear_fwd(CudaGemmCtx *ctx,
                        float *y,           // (N, out)
                        CudaGemmOperand x,  // (N, in)
                        CudaGemmOperand W,  // (out, in)
                        CudaGemmOperand b,  // (out), or none (f32 NULL)
                        int N, int in, int out,
                        void *scratch,      // (scratch_bytes >= cuda_linear_fwd_scratch_bytes(...))
                        size_t scratch_bytes);

/* y16 = bf16(act(x W^T + b)), act ReLU when relu, else none (ops_list.h's
 * linear_fwd16): one cuBLASLt GEMM storing bf16 (epilogue BIAS, RELU or
 * RELU_BIAS, bf16 bias) in bf16 precision when cuBLASLt has an algorithm;
 * otherwise cuda_op_linear_fwd into tmp (N, out) and the rounding kernel,
 * or with tmp NULL the same in row chunks through fp32 room in scratch
 * (scratch_linear_fwd16). has_tmp: tmp will be given. */
size_t cuda_linear_fwd16_scratch_bytes(const CudaGemmCtx *ctx, int N, int in, int out, bool w_has_bf16,
                                       bool x_bf16_only, bool has_bias, bool has_tmp);
void cuda_op_linear_fwd16(CudaGemmCtx *ctx,
                          uint16_t *y16,      // (N, out) bf16 bits
                          float *tmp,         // (N, out) or NULL
                          CudaGemmOperand x,  // (N, in)
                          CudaGemmOperand W,  // (out, in)
                          CudaGemmOperand b,  // (out), or none (f32 NULL)
                          bool relu, int N, int in, int out,
                          void *scratch,      // (scratch_bytes >= cuda_linear_fwd16_scratch_bytes(...))
                          size_t scratch_bytes);

/* dx += dy W (GRAD_ADD) or dx = dy W (GRAD_WRITE: beta = 0, dx never read);
 * dW += dy^T x ; db += sum_rows(dy). dx, dW or db may be NULL. The scratch
 * is the same for either mode. */
size_t cuda_linear_bwd_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dW, bool want_db, int N,
                                     int in, int out, bool w_has_bf16, bool x_bf16_only);
void cuda_op_linear_bwd(CudaGemmCtx *ctx,
                        float *dx,          // (N, in) or NULL
                        GradMode dx_mode,
                        float *dW,          // (out, in) or NULL
                        float *db,          // (out) or NULL
                        const float *dy,    // (N, out)
                        CudaGemmOperand x,  // (N, in), as cuda_op_linear_fwd's
                        CudaGemmOperand W,  // (out, in)
                        int N, int in, int out,
                        void *scratch,      // (scratch_bytes >= cuda_linear_bwd_scratch_bytes(...))
                        size_t scratch_bytes);

/* cuda_op_linear_bwd on dy masked by a ReLU's gradient (ops_list.h's
 * linear_bwd_relu_x16: relu16 the kept ReLU output's bf16 bits, x as
 * bf16 bits). */
size_t cuda_linear_bwd_relu_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dW, bool want_db, int N,
                                          int in, int out, bool w_has_bf16);
void cuda_op_linear_bwd_relu(CudaGemmCtx *ctx,
                             float *dx,              // (N, in) or NULL
                             GradMode dx_mode,
                             float *dW,              // (out, in) or NULL
                             float *db,              // (out) or NULL
                             const float *dy,        // (N, out) before the ReLU's gradient
                             const uint16_t *relu16, // (N, out) bf16 bits
                             CudaGemmOperand x,      // (N, in) bf16 bits
                             CudaGemmOperand W,      // (out, in)
                             int N, int in, int out,
                             void *scratch,  // (scratch_bytes >= cuda_linear_bwd_relu_scratch_bytes(...))
                             size_t scratch_bytes);

/* ops_list.h's linear_bwd16: dy an operand (fp32, or bf16 bits alone), a
 * ReLU mask, dx in fp32 or written as bf16 (dx16). */
size_t cuda_linear_bwd16_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dx16, bool want_dW,
                                       bool want_db, int N, int in, int out, bool w_has_bf16, bool x_bf16_only,
                                       bool dy_bf16_only, bool relu);
void cuda_op_linear_bwd16(CudaGemmCtx *ctx, float *dx, uint16_t *dx16, GradMode dx_mode, float *dW, float *db,
                          CudaGemmOperand dy, const uint16_t *relu16, CudaGemmOperand x, CudaGemmOperand W, int N,
                          int in, int out, void *scratch, size_t scratch_bytes);

/* ops_list.h's linear_relu_fwd16: cuda_op_linear_fwd16 with relu, writing
 * the ReLU's bit-mask (the GEMM's RELU_AUX_BIAS epilogue, or the rounding
 * pass of the fallback). The scratch is cuda_linear_fwd16_scratch_bytes's. */
void cuda_op_linear_relu_fwd16(CudaGemmCtx *ctx, uint16_t *y16, float *tmp, uint8_t *mask, CudaGemmOperand x,
                               CudaGemmOperand W, CudaGemmOperand b, int N, int in, int out, void *scratch,
                               size_t scratch_bytes);
/* ops_list.h's linear_bwd16_drelu: x given as bf16 bits x16 (the ReLU's
 * output), dy an operand (fp32, or bf16 bits alone: dy_bf16_only). */
size_t cuda_linear_bwd16_drelu_scratch_bytes(const CudaGemmCtx *ctx, bool want_dW, bool want_db, int N, int in,
                                             int out, bool w_has_bf16, bool dy_bf16_only);
void cuda_op_linear_bwd16_drelu(CudaGemmCtx *ctx, uint16_t *dh16, float *dW, float *db, float *db_h,
                                CudaGemmOperand dy, const uint8_t *mask, const uint16_t *x16, CudaGemmOperand W, int N,
                                int in, int out, void *scratch, size_t scratch_bytes);

/* cuda_op_linear_bwd without db, dy as bf16 bits (ops_list.h's
 * linear_bwd_dy16): multiplied as they are in bf16, widened into scratch
 * in fp32. */
size_t cuda_linear_bwd_dy16_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dW, int N, int in,
                                          int out, bool w_has_bf16);
void cuda_op_linear_bwd_dy16(CudaGemmCtx *ctx,
                             float *dx,             // (N, in) or NULL
                             GradMode dx_mode,
                             float *dW,             // (out, in) or NULL
                             const uint16_t *dy16,  // (N, out) bf16 bits
                             CudaGemmOperand x,     // (N, in)
                             CudaGemmOperand W,     // (out, in)
                             int N, int in, int out,
                             void *scratch,  // (scratch_bytes >= cuda_linear_bwd_dy16_scratch_bytes(...))
                             size_t scratch_bytes);

/* fp32 -> bf16 (bf16 as its 16 raw bits; round to nearest even, NaN kept):
 * the compute weights' re-cast. */
void cuda_gemm_f32_to_bf16(cudaStream_t stream, uint16_t *dst, const float *src, size_t n_elems);

#ifdef __cplusplus
}
#endif
#endif
