// gemm.cu: GEMM and linear layers on the GPU (cuBLASLt), mirroring
// kernels/cpu/gemm.c call for call.
//
// Row-major through a column-major library. A row-major (r, c) matrix with
// leading dimension c has exactly the bytes of its transpose, a column-major
// (c, r) matrix with the same leading dimension. So the row-major product
//     C = op(A) op(B)               C: (M, N) row-major
// is, read column-major,
//     C^T = op(B)^T op(A)^T         C^T: (N, M) column-major, ld N
// and cuBLASLt computes D = op_lt(A_lt) op_lt(B_lt) with
//     m = N, n = M, k = K
//     A_lt = our B: stored row-major (K, N) -> column-major (N, K), ld N, used as is  (TRANSA = N)
//                   or, trans_b, stored (N, K) -> column-major (K, N), ld K, transposed (TRANSA = T)
//     B_lt = our A: stored row-major (M, K) -> column-major (K, M), ld K, used as is  (TRANSB = N)
//                   or, trans_a, stored (K, M) -> column-major (M, K), ld M, transposed (TRANSB = T)
//     C_lt = D_lt = our C: column-major (N, M), ld N
// i.e. swap the operands and keep each one's transpose flag.
//
// Epilogues in that mapping. CUBLASLT_EPILOGUE_BIAS adds a vector of length
// m (rows of D_lt) to every column: m = N = our columns, so in
// y = x W^T (M = tokens, N = out) it adds b[out] to every token: the linear
// bias. For the bias gradient, db[o] = sum_t dy[t, o] must come from the dW
// GEMM, dW = dy^T x (M = out, N = in, K = tokens, our A = dy, trans_a): there
// dy is B_lt and op(B_lt) is the (k = tokens, n = out) matrix dy itself, so
// CUBLASLT_EPILOGUE_BGRADB (sum of op(B_lt) over k, length n) gives exactly
// db. (BGRADA would sum our B, x.) The epilogue writes its vector instead of
// adding to it, so it goes to scratch and one small kernel adds it into db.
//
// Plans (descriptors, layouts and the heuristic's algorithm) are cached per
// shape, operand types, epilogue and pointer alignment: the heuristic runs
// once per distinct call, and the same call always gets the same algorithm.
#include <stdint.h>
#include <string.h>
#include <cuda_bf16.h>

#include "cuda_common.h"
#include "cuda_gemm.h"
#include "cuda_ops.h"  // cuda_op_bias_add, cuda_op_bias_bwd: the separate bias kernels (bias.cu)

#define SCRATCH_ALIGN ((size_t)256)
#define MAX_PLANS 128
#define BLOCK 256
#define MAX_GRID 65536u

// ---- plan cache ----------------------------------------------------------------

typedef struct {
    int trans_a, trans_b, M, N, K;
    cudaDataType_t ab_type;
    cublasLtEpilogue_t epilogue;
    uint32_t align_a, align_b, align_c, align_bias;  // bytes, powers of two up to 256
} PlanKey;

typedef struct {
    int used;
    PlanKey key;
    int supported;                        // 0: no algorithm (epilogue plans fall back)
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
    cublasLtHandle_t handle;
    void *workspace;          // (workspace_bytes)
    char *scratch;            // (scratch_bytes) bf16 copies and the bias-gradient vector
    Plan plans[MAX_PLANS];
    int next_victim;          // round-robin eviction when the cache is full
    CudaGemmStats stats;
};

static bool key_eq(const PlanKey *a, const PlanKey *b) {
    return a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->M == b->M && a->N == b->N &&
           a->K == b->K && a->ab_type == b->ab_type && a->epilogue == b->epilogue && a->align_a == b->align_a &&
           a->align_b == b->align_b && a->align_c == b->align_c && a->align_bias == b->align_bias;
}

static uint32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

static void lt_die(const char *what, cublasStatus_t s, const PlanKey *k) __attribute__((noreturn));
static void lt_die(const char *what, cublasStatus_t s, const PlanKey *k) {
    int dev = -1;
    cudaGetDevice(&dev);
    tp_die(__FILE__, __LINE__,
           "%s failed on device %d: %s (%s) for gemm trans_a=%d trans_b=%d M=%d N=%d K=%d %s epilogue %d",
           what, dev, cublasLtGetStatusName(s), cublasLtGetStatusString(s), k->trans_a, k->trans_b, k->M, k->N,
           k->K, k->ab_type == CUDA_R_16BF ? "bf16" : "fp32", (int)k->epilogue);
}

static void plan_release(Plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->lay_c);
    cublasLtMatrixLayoutDestroy(p->lay_b);
    cublasLtMatrixLayoutDestroy(p->lay_a);
    cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

// Builds the descriptors of the mapping above and asks the heuristic for
// one algorithm. bias: the epilogue's vector (its alignment matters).
static Plan *plan_make(CudaGemmCtx *ctx, const PlanKey *k, const void *bias) {
    Plan *p = NULL;
    for (int i = 0; i < MAX_PLANS && !p; i++)
        if (!ctx->plans[i].used) p = &ctx->plans[i];
    if (!p) {
        p = &ctx->plans[ctx->next_victim];
        ctx->next_victim = (ctx->next_victim + 1) % MAX_PLANS;
        plan_release(p);
    }
    p->used = 1;
    p->key = *k;
    ctx->stats.n_plans++;

    const cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // A_lt is our B
    const cublasOperation_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // B_lt is our A
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &k->epilogue,
                                                sizeof k->epilogue));
    if (k->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        const cudaDataType_t bias_type = CUDA_R_32F;  // bias and bias gradient are fp32 like D
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof bias));
    }
    const uint64_t M = (uint64_t)k->M, N = (uint64_t)k->N, K = (uint64_t)k->K;
    if (k->trans_b)
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_a, k->ab_type, K, N, (int64_t)K));
    else
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_a, k->ab_type, N, K, (int64_t)N));
    if (k->trans_a)
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_b, k->ab_type, M, K, (int64_t)M));
    else
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_b, k->ab_type, K, M, (int64_t)K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_c, CUDA_R_32F, N, M, (int64_t)N));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ctx->stats.workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    // A_lt is our B, B_lt our A; C and D are the same buffer.
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align_b,
                                                      sizeof k->align_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align_a,
                                                      sizeof k->align_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align_c,
                                                      sizeof k->align_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align_c,
                                                      sizeof k->align_c));
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int n_found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx->handle, p->desc, p->lay_a, p->lay_b, p->lay_c, p->lay_c,
                                                      pref, 1, &res, &n_found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && n_found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = res.algo;
        p->supported = 1;
    } else if (k->epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
        lt_die("cublasLtMatmulAlgoGetHeuristic", s == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : s, k);
    }
    return p;
}

// One cuBLASLt matmul in the mapping above: C = alpha op(A) op(B) + beta C,
// A and B of type ab_type, C fp32. With an epilogue, bias is its vector;
// returns false (nothing queued) when cuBLASLt cannot do that epilogue here.
static bool lt_matmul(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      const void *A, const void *B, cudaDataType_t ab_type, float beta, float *C,
                      cublasLtEpilogue_t epilogue, const void *bias) {
    PlanKey k;
    memset(&k, 0, sizeof k);
    k.trans_a = trans_a;
    k.trans_b = trans_b;
    k.M = M;
    k.N = N;
    k.K = K;
    k.ab_type = ab_type;
    k.epilogue = epilogue;
    k.align_a = align_of(A);
    k.align_b = align_of(B);
    k.align_c = align_of(C);
    k.align_bias = epilogue == CUBLASLT_EPILOGUE_DEFAULT ? 0 : align_of(bias);
    Plan *p = NULL;
    for (int i = 0; i < MAX_PLANS && !p; i++)
        if (ctx->plans[i].used && key_eq(&ctx->plans[i].key, &k)) p = &ctx->plans[i];
    if (!p) p = plan_make(ctx, &k, bias);
    if (!p->supported) return false;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    cublasStatus_t s = cublasLtMatmul(ctx->handle, p->desc, &alpha, B, p->lay_a, A, p->lay_b, &beta, C, p->lay_c, C,
                                      p->lay_c, &p->algo, ctx->workspace, ctx->stats.workspace_bytes, ctx->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED && epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        p->supported = 0;  // remembered: later calls go straight to the separate kernel
        return false;
    }
    if (s != CUBLAS_STATUS_SUCCESS) lt_die("cublasLtMatmul", s, &k);
    ctx->stats.n_matmuls++;
    return true;
}

// ---- kernels -------------------------------------------------------------------

static unsigned grid_for(size_t n_elems) {
    size_t g = (n_elems + BLOCK - 1) / BLOCK;
    return g > MAX_GRID ? MAX_GRID : (unsigned)g;
}

static __global__ void gemm_f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

static __global__ void gemm_bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

static __global__ void gemm_accumulate_kernel(float *y, const float *x, size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

static __global__ void gemm_scale_kernel(float *x, float s, size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

// ---- launchers -------------------------------------------------------------------

static void launch_f32_to_bf16(cudaStream_t stream, void *dst, const float *src, size_t n_elems) {
    if (n_elems == 0) return;
    gemm_f32_to_bf16_kernel<<<grid_for(n_elems), BLOCK, 0, stream>>>((__nv_bfloat16 *)dst, src, n_elems);
    CUDA_CHECK(cudaGetLastError());
}

static void launch_accumulate(cudaStream_t stream, float *y, const float *x, size_t n_elems) {
    if (n_elems == 0) return;
    gemm_accumulate_kernel<<<grid_for(n_elems), BLOCK, 0, stream>>>(y, x, n_elems);
    CUDA_CHECK(cudaGetLastError());
}

// ---- scratch ------------------------------------------------------------------------

static size_t round_up(size_t n_bytes) { return (n_bytes + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN; }

static void scratch_ensure(CudaGemmCtx *ctx, size_t n_bytes) {
    if (n_bytes <= ctx->stats.scratch_bytes) return;
    if (ctx->scratch) {
        CUDA_CHECK(cudaStreamSynchronize(ctx->stream));  // queued work may still read the old buffer
        CUDA_CHECK(cudaFree(ctx->scratch));
        ctx->scratch = NULL;
        ctx->stats.scratch_bytes = 0;
    }
    const size_t grown = round_up(n_bytes + n_bytes / 8);  // some headroom against creeping growth
    CUDA_CHECK(cudaMalloc((void **)&ctx->scratch, grown));
    ctx->stats.scratch_bytes = grown;
}

// Bump allocation inside the scratch buffer for one call.
typedef struct {
    char *base;
    size_t used, cap;
} Carver;

static void *carve(Carver *cv, size_t n_bytes) {
    const size_t at = round_up(cv->used);
    TP_CHECK(at + n_bytes <= cv->cap, "gemm scratch: %zu bytes at %zu exceed the reserved %zu", n_bytes, at,
             cv->cap);
    cv->used = at + n_bytes;
    return cv->base + at;
}

static Carver carver_of(CudaGemmCtx *ctx) {
    Carver cv = {ctx->scratch, 0, ctx->stats.scratch_bytes};
    return cv;
}

// The bf16 copy of an fp32 tensor in scratch, or the tensor itself in fp32 mode.
static const void *operand(CudaGemmCtx *ctx, Carver *cv, const float *x, size_t n_elems) {
    if (ctx->precision == CUDA_GEMM_FP32) return x;
    void *copy = carve(cv, n_elems * sizeof(uint16_t));
    launch_f32_to_bf16(ctx->stream, copy, x, n_elems);
    return copy;
}

static cudaDataType_t ab_type_of(const CudaGemmCtx *ctx) {
    return ctx->precision == CUDA_GEMM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// GEMM on operands already in the context's precision; K = 0 leaves beta C.
static void gemm_prepared(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const void *A, const void *B, float beta, float *C) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        const size_t n_elems = (size_t)M * (size_t)N;
        if (beta == 0.0f) {
            CUDA_CHECK(cudaMemsetAsync(C, 0, n_elems * sizeof(float), ctx->stream));
        } else if (beta != 1.0f) {
            gemm_scale_kernel<<<grid_for(n_elems), BLOCK, 0, ctx->stream>>>(C, beta, n_elems);
            CUDA_CHECK(cudaGetLastError());
        }
        return;
    }
    lt_matmul(ctx, trans_a, trans_b, M, N, K, alpha, A, B, ab_type_of(ctx), beta, C, CUBLASLT_EPILOGUE_DEFAULT,
              NULL);
}

// ---- context -----------------------------------------------------------------------

extern "C" CudaGemmCtx *cuda_gemm_ctx_create(cudaStream_t stream, CudaGemmPrecision precision,
                                             size_t workspace_bytes) {
    TP_CHECK(precision == CUDA_GEMM_FP32 || precision == CUDA_GEMM_BF16, "cuda_gemm_ctx_create: precision %d",
             (int)precision);
    CudaGemmCtx *ctx = (CudaGemmCtx *)TP_CALLOC(1, sizeof *ctx);
    CUDA_CHECK(cudaGetDevice(&ctx->device));
    ctx->stream = stream;
    ctx->precision = precision;
    ctx->fuse = true;
    CUDA_CHECK(cudaFree(0));  // the CUDA context exists before measuring what the handle takes
    size_t free_before = 0, free_after = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    ctx->stats.handle_bytes = free_before > free_after ? free_before - free_after : 0;
    ctx->stats.workspace_bytes = workspace_bytes ? workspace_bytes : CUDA_GEMM_DEFAULT_WORKSPACE_BYTES;
    CUDA_CHECK(cudaMalloc(&ctx->workspace, ctx->stats.workspace_bytes));
    return ctx;
}

extern "C" void cuda_gemm_ctx_destroy(CudaGemmCtx *ctx) {
    if (!ctx) return;
    CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int i = 0; i < MAX_PLANS; i++) plan_release(&ctx->plans[i]);
    if (ctx->scratch) CUDA_CHECK(cudaFree(ctx->scratch));
    CUDA_CHECK(cudaFree(ctx->workspace));
    CUBLAS_CHECK(cublasLtDestroy(ctx->handle));
    free(ctx);
}

extern "C" void cuda_gemm_set_precision(CudaGemmCtx *ctx, CudaGemmPrecision precision) {
    TP_CHECK(precision == CUDA_GEMM_FP32 || precision == CUDA_GEMM_BF16, "cuda_gemm_set_precision: precision %d",
             (int)precision);
    ctx->precision = precision;
}

extern "C" CudaGemmPrecision cuda_gemm_precision(const CudaGemmCtx *ctx) { return ctx->precision; }
extern "C" void cuda_gemm_set_fused_epilogues(CudaGemmCtx *ctx, bool on) { ctx->fuse = on; }
extern "C" cudaStream_t cuda_gemm_stream(const CudaGemmCtx *ctx) { return ctx->stream; }
extern "C" CudaGemmStats cuda_gemm_stats(const CudaGemmCtx *ctx) { return ctx->stats; }

extern "C" size_t cuda_gemm_scratch_bytes(CudaGemmPrecision precision, int N, int in, int out) {
    const size_t n = N > 0 ? (size_t)N : 0, i = in > 0 ? (size_t)in : 0, o = out > 0 ? (size_t)out : 0;
    size_t bytes = round_up(o * sizeof(float)) + SCRATCH_ALIGN;  // bias-gradient vector
    if (precision == CUDA_GEMM_BF16)  // bf16 copies of x or dy, W, and x (backward)
        bytes += round_up(n * o * 2) + round_up(o * i * 2) + round_up(n * i * 2) + round_up(n * i * 2);
    return bytes;
}

extern "C" void cuda_gemm_reserve(CudaGemmCtx *ctx, size_t n_bytes) { scratch_ensure(ctx, n_bytes); }

// ---- exported ops ------------------------------------------------------------------

extern "C" void cuda_op_gemm(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                             const float *A,  // (M, K), or (K, M) when trans_a
                             const float *B,  // (K, N), or (N, K) when trans_b
                             float beta,
                             float *C) {      // (M, N)
    TP_CHECK(M >= 0 && N >= 0 && K >= 0, "cuda_op_gemm: negative size M=%d N=%d K=%d", M, N, K);
    if (M == 0 || N == 0) return;
    TP_CHECK(C && (K == 0 || (A && B)), "cuda_op_gemm: NULL matrix (M=%d N=%d K=%d)", M, N, K);
    const size_t a_elems = (size_t)M * (size_t)K, b_elems = (size_t)K * (size_t)N;
    if (ctx->precision == CUDA_GEMM_BF16) scratch_ensure(ctx, round_up(a_elems * 2) + round_up(b_elems * 2));
    Carver cv = carver_of(ctx);
    const void *a = operand(ctx, &cv, A, K ? a_elems : 0);
    const void *b = operand(ctx, &cv, B, K ? b_elems : 0);
    gemm_prepared(ctx, trans_a, trans_b, M, N, K, alpha, a, b, beta, C);
}

extern "C" void cuda_op_linear_fwd(CudaGemmCtx *ctx,
                                   float *y,        // (N, out)
                                   const float *x,  // (N, in)
                                   const float *W,  // (out, in)
                                   const float *b,  // (out) or NULL
                                   int N, int in, int out) {
    TP_CHECK(N >= 0 && in >= 0 && out >= 0, "cuda_op_linear_fwd: negative size N=%d in=%d out=%d", N, in, out);
    if (N == 0 || out == 0) return;
    TP_CHECK(y && (in == 0 || (x && W)), "cuda_op_linear_fwd: NULL tensor (N=%d in=%d out=%d)", N, in, out);
    scratch_ensure(ctx, cuda_gemm_scratch_bytes(ctx->precision, N, in, out));
    Carver cv = carver_of(ctx);
    const void *xa = operand(ctx, &cv, x, (size_t)N * (size_t)in);
    const void *wa = operand(ctx, &cv, W, (size_t)out * (size_t)in);
    bool fused = false;
    if (b && ctx->fuse && in > 0)  // y = x W^T + b in one pass (bias along D_lt's rows = out)
        fused = lt_matmul(ctx, false, true, N, out, in, 1.0f, xa, wa, ab_type_of(ctx), 0.0f, y,
                          CUBLASLT_EPILOGUE_BIAS, b);
    if (!fused) {
        gemm_prepared(ctx, false, true, N, out, in, 1.0f, xa, wa, 0.0f, y);  // y = x W^T
        if (b) cuda_op_bias_add(y, b, N, out, ctx->stream);
    }
    if (b) {
        if (fused) ctx->stats.n_bias_fused++;
        else ctx->stats.n_bias_separate++;
    }
}

extern "C" void cuda_op_linear_bwd(CudaGemmCtx *ctx,
                                   float *dx,        // (N, in) or NULL
                                   float *dW,        // (out, in) or NULL
                                   float *db,        // (out) or NULL
                                   const float *dy,  // (N, out)
                                   const float *x,   // (N, in)
                                   const float *W,   // (out, in)
                                   int N, int in, int out) {
    TP_CHECK(N >= 0 && in >= 0 && out >= 0, "cuda_op_linear_bwd: negative size N=%d in=%d out=%d", N, in, out);
    if (N == 0) return;  // nothing to add to any gradient
    TP_CHECK(out == 0 || dy, "cuda_op_linear_bwd: dy is NULL");
    TP_CHECK(!dx || out == 0 || in == 0 || W, "cuda_op_linear_bwd: dx wanted but W is NULL");
    TP_CHECK(!dW || out == 0 || in == 0 || x, "cuda_op_linear_bwd: dW wanted but x is NULL");
    if (out == 0) return;
    scratch_ensure(ctx, cuda_gemm_scratch_bytes(ctx->precision, N, in, out));
    Carver cv = carver_of(ctx);
    float *bgrad = (float *)carve(&cv, (size_t)out * sizeof(float));  // (out) the epilogue's output
    const bool need_dy = (dx || dW) && in > 0;
    const void *dya = need_dy ? operand(ctx, &cv, dy, (size_t)N * (size_t)out) : NULL;
    if (dx && in > 0) {  // dx += dy W
        const void *wa = operand(ctx, &cv, W, (size_t)out * (size_t)in);
        gemm_prepared(ctx, false, false, N, in, out, 1.0f, dya, wa, 1.0f, dx);
    }
    bool fused = false;
    if (dW && in > 0) {  // dW += dy^T x, with db from the same pass (BGRADB sums dy, B_lt, over tokens)
        const void *xa = operand(ctx, &cv, x, (size_t)N * (size_t)in);
        if (db && ctx->fuse)
            fused = lt_matmul(ctx, true, false, out, in, N, 1.0f, dya, xa, ab_type_of(ctx), 1.0f, dW,
                              CUBLASLT_EPILOGUE_BGRADB, bgrad);
        if (!fused) gemm_prepared(ctx, true, false, out, in, N, 1.0f, dya, xa, 1.0f, dW);
    }
    if (db) {
        if (fused) {
            launch_accumulate(ctx->stream, db, bgrad, (size_t)out);
            ctx->stats.n_bgrad_fused++;
        } else {
            cuda_op_bias_bwd(db, dy, N, out, ctx->stream);
            ctx->stats.n_bgrad_separate++;
        }
    }
}

extern "C" void cuda_gemm_f32_to_bf16(cudaStream_t stream, uint16_t *dst, const float *src, size_t n_elems) {
    if (n_elems == 0) return;
    TP_CHECK(dst && src, "cuda_gemm_f32_to_bf16: NULL pointer");
    launch_f32_to_bf16(stream, dst, src, n_elems);
}

extern "C" void cuda_gemm_bf16_to_f32(cudaStream_t stream, float *dst, const uint16_t *src, size_t n_elems) {
    if (n_elems == 0) return;
    TP_CHECK(dst && src, "cuda_gemm_bf16_to_f32: NULL pointer");
    gemm_bf16_to_f32_kernel<<<grid_for(n_elems), BLOCK, 0, stream>>>(dst, (const __nv_bfloat16 *)src, n_elems);
    CUDA_CHECK(cudaGetLastError());
}
