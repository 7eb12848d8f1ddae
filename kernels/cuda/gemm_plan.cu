// gemm_plan.cu: the GEMM context and its cache of cuBLASLt plans (the ops
// are in gemm.cu, whose header comment explains the row-major mapping the
// descriptors here encode).
//
// A plan is keyed by everything that shapes the heuristic's answer: exact
// sizes, transposes, operand type, epilogue and the alignment of every
// pointer. Exact sizes, not buckets: the same call must get the same
// algorithm whatever ran before, or the bits of a step would depend on the
// order batches arrived in (and bit-exact resume would break). So the cache
// is built to hold many shapes cheaply: CUDA_GEMM_PLAN_SETS sets of
// CUDA_GEMM_PLAN_WAYS plans; a key's hash picks the set, the set is searched
// in full, and on a miss the least recently used plan of the set is
// replaced. Varying token counts then cost one heuristic query per new
// shape, a lookup costs a hash and four key compares.
//
// Fused epilogues (bias, ReLU and bias, bias gradient, the ReLU bit-mask's
// RELU_AUX_BIAS and DRELU_BGRAD) and bf16 outputs are
// optional: when cuBLASLt has no algorithm for one or refuses to run it,
// the plan is marked unsupported and the caller runs the separate kernels
// (a caller that must prepare operands first asks gemm_lt_supported). A
// refusal with a status other than CUBLAS_STATUS_NOT_SUPPORTED is
// unexpected, so it is counted and logged once per context; plain GEMMs
// that fail end the process. A call that fails inside a stream capture is
// absorbed before any of that (launch_policy.h says why): the plan keeps its
// support. A plan whose output is bf16 allows only the split-K reduction in
// the compute type, so no partial sum is ever rounded to bf16.
//
// A weight-gradient GEMM's plan (key.tune) takes the heuristic's first
// algorithm like every other, then at its first matmul gemm_tune.cu times
// the other candidates on the call's operands and may replace it; the
// preference (gemm_plan_preference) is the same for both, the whole
// workspace included.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_plan.h"
#include "launch_policy.h"

static_assert((int)GEMM_REDUCE_INPLACE == (int)CUBLASLT_REDUCTION_SCHEME_INPLACE &&
                  (int)GEMM_REDUCE_COMPUTE_TYPE == (int)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE &&
                  (int)GEMM_REDUCE_OUTPUT_TYPE == (int)CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE &&
                  (int)GEMM_REDUCE_ALL == (int)CUBLASLT_REDUCTION_SCHEME_MASK,
              "launch_policy.h's reduction bits are cuBLASLt's");

bool gemm_key_eq(const PlanKey *a, const PlanKey *b) { return memcmp(a, b, sizeof *a) == 0; }

// FNV-1a over the key's bytes (keys are zero-filled before their fields are set).
uint32_t gemm_key_hash(const PlanKey *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static uint32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0) al >>= 1;
    return al;
}

static const char *epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_RELU: return "relu";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "relu-bias";
    case CUBLASLT_EPILOGUE_BGRADB: return "bias-gradient";
    case CUBLASLT_EPILOGUE_RELU_AUX: return "relu-mask";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: return "relu-mask-bias";
    case CUBLASLT_EPILOGUE_DRELU_BGRAD: return "relu-gradient-bias-gradient";
    default: return "plain";
    }
}

static void lt_die(const char *what, cublasStatus_t s, const PlanKey *k) __attribute__((noreturn));
static void lt_die(const char *what, cublasStatus_t s, const PlanKey *k) {
    int dev = -1;
    cudaGetDevice(&dev);
    tp_die(__FILE__, __LINE__,
           "%s failed on device %d: %s (%s) for gemm trans_a=%d trans_b=%d M=%d N=%d K=%d %s, %s epilogue", what,
           dev, cublasLtGetStatusName(s), cublasLtGetStatusString(s), k->trans_a, k->trans_b, k->M, k->N, k->K,
           k->ab_type == CUDA_R_16BF ? "bf16" : "fp32", epilogue_name(k->epilogue));
}

// An epilogue cuBLASLt will not do: counted, and logged once when the
// status is anything but the expected NOT_SUPPORTED.
static void epilogue_refused(CudaGemmCtx *ctx, const PlanKey *k, cublasStatus_t s) {
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) return;
    ctx->stats.n_epilogue_refusals++;
    if (ctx->warned_refusal) return;
    ctx->warned_refusal = true;
    fprintf(stderr,
            "warning: cuBLASLt refused the fused %s epilogue with %s for gemm M=%d N=%d K=%d %s, %s output; the "
            "separate kernels run instead (logged once)\n",
            epilogue_name(k->epilogue), cublasLtGetStatusName(s), k->M, k->N, k->K,
            k->ab_type == CUDA_R_16BF ? "bf16" : "fp32", k->d_type == CUDA_R_16BF ? "bf16" : "fp32");
}

// The context's cuBLASLt handle, made at the first GEMM (on the thread
// and device that run the backend's ops), when the library is loaded.
cublasLtHandle_t gemm_lt_handle(CudaGemmCtx *ctx) {
    if (!ctx->handle) CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
    return ctx->handle;
}

// A plan the caller can do without (it has separate kernels for it): a
// fused epilogue or a bf16 output. A plain fp32 GEMM that fails is fatal.
static bool optional(const PlanKey *k) {
    return k->epilogue != CUBLASLT_EPILOGUE_DEFAULT || k->d_type != CUDA_R_32F;
}

static void plan_release(Plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->lay_c);
    cublasLtMatrixLayoutDestroy(p->lay_b);
    cublasLtMatrixLayoutDestroy(p->lay_a);
    cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

// A bias gradient is fp32 (BGRADB's D is fp32; DRELU_BGRAD's D is bf16,
// its fp32 sums kept as they are, backend.h's db); a bias has D's type
// (cublasLt.h).
static cudaDataType_t bias_type_of(const PlanKey *k) {
    return k->epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD || k->epilogue == CUBLASLT_EPILOGUE_BGRADB ? CUDA_R_32F
                                                                                                      : k->d_type;
}

static void plan_descriptors(Plan *p, const PlanKey *k, const void *bias, const void *aux) {
    const cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // A_lt is our B
    const cublasOperation_t op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // B_lt is our A
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &k->epilogue,
                                                sizeof k->epilogue));
    if (aux) {  // the ReLU bit-mask: its pointer again at every matmul, as the bias's
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                    sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &k->aux_ld,
                                                    sizeof k->aux_ld));
    }
    if (bias) {
        const cudaDataType_t bias_type = bias_type_of(k);
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
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lay_c, k->d_type, N, M, (int64_t)N));
}

cublasLtMatmulPreference_t gemm_plan_preference(const CudaGemmCtx *ctx, const PlanKey *k) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = ctx->stats.workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const uint32_t schemes = gemm_reduction_schemes(k->d_type == CUDA_R_32F);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                      sizeof schemes));
    // A_lt is our B, B_lt our A; C and D are the same buffer.
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align_b,
                                                      sizeof k->align_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align_a,
                                                      sizeof k->align_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align_c,
                                                      sizeof k->align_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align_c,
                                                      sizeof k->align_c));
    return pref;
}

// Asks the heuristic for one algorithm for p's descriptors.
static void plan_choose(CudaGemmCtx *ctx, Plan *p) {
    const PlanKey *k = &p->key;
    cublasLtMatmulPreference_t pref = gemm_plan_preference(ctx, k);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int n_found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(gemm_lt_handle(ctx), p->desc, p->lay_a, p->lay_b, p->lay_c, p->lay_c,
                                                      pref, 1, &res, &n_found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && n_found > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        p->algo = res.algo;
        p->ws_need = res.workspaceSize;
        p->supported = 1;
        return;
    }
    if (s == CUBLAS_STATUS_SUCCESS) s = n_found > 0 ? res.state : CUBLAS_STATUS_NOT_SUPPORTED;
    if (!optional(k)) lt_die("cublasLtMatmulAlgoGetHeuristic", s, k);
    epilogue_refused(ctx, k, s);
}

// The cached plan of k, made (and the heuristic asked) on a miss.
static Plan *plan_lookup(CudaGemmCtx *ctx, const PlanKey *k, const void *bias, const void *aux) {
    Plan *set = ctx->plans[gemm_key_hash(k) % CUDA_GEMM_PLAN_SETS];
    ctx->clock++;
    Plan *victim = &set[0];
    for (int w = 0; w < CUDA_GEMM_PLAN_WAYS; w++) {
        Plan *p = &set[w];
        if (p->used && gemm_key_eq(&p->key, k)) {
            p->last_use = ctx->clock;
            return p;
        }
        if (!p->used) {
            if (victim->used) victim = p;
        } else if (victim->used && p->last_use < victim->last_use) {
            victim = p;
        }
    }
    if (victim->used) ctx->stats.n_plan_evictions++;
    plan_release(victim);
    victim->used = 1;
    victim->key = *k;
    victim->last_use = ctx->clock;
    ctx->stats.n_plans++;
    plan_descriptors(victim, k, bias, aux);
    plan_choose(ctx, victim);
    victim->tune_pending = k->tune && victim->supported;
    return victim;
}

bool gemm_lt_matmul(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void *A,
                    const void *B, cudaDataType_t ab_type, float beta, float *C, cublasLtEpilogue_t epilogue,
                    const void *bias) {
    return gemm_lt_matmul_d(ctx, trans_a, trans_b, M, N, K, alpha, A, B, ab_type, beta, C, CUDA_R_32F, epilogue,
                            bias);
}

// The plan of one call (looked up, or made and the heuristic asked).
static Plan *plan_of(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, const void *A, const void *B,
                     cudaDataType_t ab_type, void *C, cudaDataType_t d_type, cublasLtEpilogue_t epilogue,
                     const void *bias, const void *aux, int64_t aux_ld, bool tune) {
    PlanKey k;
    memset(&k, 0, sizeof k);  // padding too: keys are hashed and compared as bytes
    k.trans_a = trans_a;
    k.trans_b = trans_b;
    k.M = M;
    k.N = N;
    k.K = K;
    k.ab_type = ab_type;
    k.d_type = d_type;
    k.epilogue = epilogue;
    k.align_a = align_of(A);
    k.align_b = align_of(B);
    k.align_c = align_of(C);
    k.align_bias = bias ? align_of(bias) : 0;
    k.align_aux = aux ? align_of(aux) : 0;
    k.aux_ld = aux ? aux_ld : 0;
    k.tune = tune ? 1u : 0u;
    return plan_lookup(ctx, &k, bias, aux);
}

bool gemm_lt_supported(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, const void *A,
                       const void *B, cudaDataType_t ab_type, void *C, cudaDataType_t d_type,
                       cublasLtEpilogue_t epilogue, const void *bias) {
    return plan_of(ctx, trans_a, trans_b, M, N, K, A, B, ab_type, C, d_type, epilogue, bias, NULL, 0, false)
        ->supported;
}

bool gemm_lt_supported_aux(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, const void *A,
                           const void *B, cudaDataType_t ab_type, void *C, cudaDataType_t d_type,
                           cublasLtEpilogue_t epilogue, const void *bias, const void *aux, int64_t aux_ld) {
    return plan_of(ctx, trans_a, trans_b, M, N, K, A, B, ab_type, C, d_type, epilogue, bias, aux, aux_ld, false)
        ->supported;
}

cublasStatus_t gemm_lt_run(CudaGemmCtx *ctx, const Plan *p, const cublasLtMatmulAlgo_t *algo, float alpha,
                           const void *A, const void *B, float beta, const void *C, void *D, size_t ws_bytes) {
    return cublasLtMatmul(gemm_lt_handle(ctx), p->desc, &alpha, B, p->lay_a, A, p->lay_b, &beta, C, p->lay_c, D,
                          p->lay_c, algo, ctx->workspace, ws_bytes, ctx->stream);
}

// gemm_lt_matmul_d, the plan tuned (key.tune) or not.
static bool lt_matmul(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void *A,
                      const void *B, cudaDataType_t ab_type, float beta, void *C, cudaDataType_t d_type,
                      cublasLtEpilogue_t epilogue, const void *bias, const void *aux, int64_t aux_ld, bool tune) {
    Plan *p = plan_of(ctx, trans_a, trans_b, M, N, K, A, B, ab_type, C, d_type, epilogue, bias, aux, aux_ld, tune);
    if (!p->supported) return false;
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                    sizeof aux));
    if (p->tune_pending) {  // the shape's first call: its algorithm chosen once, before its result is computed
        p->tune_pending = false;
        gemm_tune_plan(ctx, p, alpha, A, B, beta, C);
    }
    cublasStatus_t s = gemm_lt_run(ctx, p, &p->algo, alpha, A, B, beta, C, C, ctx->stats.workspace_bytes);
    if (s == CUBLAS_STATUS_SUCCESS) {
        ctx->stats.n_matmuls++;
        return true;
    }
    switch (gemm_fail_action(cuda_capture_active(), optional(&p->key))) {
    case GEMM_FAIL_CAPTURED:  // it fails at the capture's end, and the ops run again without it
        cuda_capture_absorbs("cublasLtMatmul", cublasLtGetStatusString(s), __FILE__, __LINE__);
        return true;
    case GEMM_FAIL_FALLBACK:  // refused before anything was queued: later calls go straight to the separate kernel
        p->supported = 0;
        epilogue_refused(ctx, &p->key, s);
        return false;
    case GEMM_FAIL_FATAL: break;
    }
    lt_die("cublasLtMatmul", s, &p->key);
}

bool gemm_lt_matmul_d(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void *A,
                      const void *B, cudaDataType_t ab_type, float beta, void *C, cudaDataType_t d_type,
                      cublasLtEpilogue_t epilogue, const void *bias) {
    return lt_matmul(ctx, trans_a, trans_b, M, N, K, alpha, A, B, ab_type, beta, C, d_type, epilogue, bias, NULL, 0,
                     false);
}

bool gemm_lt_matmul_aux(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const void *A, const void *B, cudaDataType_t ab_type, float beta, void *C,
                        cudaDataType_t d_type, cublasLtEpilogue_t epilogue, const void *bias, const void *aux,
                        int64_t aux_ld) {
    return lt_matmul(ctx, trans_a, trans_b, M, N, K, alpha, A, B, ab_type, beta, C, d_type, epilogue, bias, aux,
                     aux_ld, false);
}

void gemm_lt_matmul_dw(CudaGemmCtx *ctx, int M, int N, int K, const void *A, const void *B, cudaDataType_t ab_type,
                       float *C) {
    // a plain fp32 GEMM: it runs or the process ends (lt_matmul), never falls back
    (void)lt_matmul(ctx, true, false, M, N, K, 1.0f, A, B, ab_type, 1.0f, C, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT,
                    NULL, NULL, 0, ctx->tune && ctx->tune_events_ok);
}

// ---- context -----------------------------------------------------------------------

// TPTRAIN_GEMM_TUNE: 1 tunes; unset, empty or 0 does not (the default: a rerun or a resume in another
// process then computes the same bits, as before tuning existed, until the choices travel with a
// checkpoint); anything else is refused, naming it.
static bool tune_env(void) {
    const char *v = getenv(CUDA_GEMM_TUNE_ENV);
    if (!v || !*v) return false;
    TP_CHECK(strcmp(v, "0") == 0 || strcmp(v, "1") == 0,
             "%s=%s: expected 0 (the heuristic's first cuBLASLt algorithm for every GEMM, the default) or 1 "
             "(time the weight-gradient GEMMs' candidates once per shape)", CUDA_GEMM_TUNE_ENV, v);
    return v[0] == '1';
}

extern "C" CudaGemmCtx *cuda_gemm_ctx_create(cudaStream_t stream, CudaGemmPrecision precision, void *workspace,
                                             size_t workspace_bytes) {
    TP_CHECK(precision == CUDA_GEMM_FP32 || precision == CUDA_GEMM_BF16, "cuda_gemm_ctx_create: precision %d",
             (int)precision);
    TP_CHECK(workspace_bytes == 0 || workspace, "cuda_gemm_ctx_create: no workspace for %zu bytes",
             workspace_bytes);
    CudaGemmCtx *ctx = (CudaGemmCtx *)TP_CALLOC(1, sizeof *ctx);
    CUDA_CHECK(cudaGetDevice(&ctx->device));
    ctx->stream = stream;
    ctx->precision = precision;
    ctx->fuse = true;
    ctx->workspace = workspace;
    ctx->stats.workspace_bytes = workspace_bytes;
    ctx->tune = tune_env();
    // events to time with; without them tuning stays off (the heuristic's first, as when switched off)
    ctx->tune_events_ok = cudaEventCreate(&ctx->tune_ev[0]) == cudaSuccess;
    if (ctx->tune_events_ok && cudaEventCreate(&ctx->tune_ev[1]) != cudaSuccess) {
        cudaEventDestroy(ctx->tune_ev[0]);
        ctx->tune_events_ok = false;
    }
    if (!ctx->tune_events_ok) (void)cudaGetLastError();
    return ctx;  // the handle at the first GEMM (gemm_lt_handle): the library may still be loading (cublaslt_load_start)
}

extern "C" void cuda_gemm_ctx_destroy(CudaGemmCtx *ctx) {
    if (!ctx) return;
    CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int s = 0; s < CUDA_GEMM_PLAN_SETS; s++)
        for (int w = 0; w < CUDA_GEMM_PLAN_WAYS; w++) plan_release(&ctx->plans[s][w]);
    if (ctx->handle) CUBLAS_CHECK(cublasLtDestroy(ctx->handle));
    if (ctx->tune_events_ok) {
        CUDA_CHECK(cudaEventDestroy(ctx->tune_ev[0]));
        CUDA_CHECK(cudaEventDestroy(ctx->tune_ev[1]));
    }
    free(ctx);
}

extern "C" void cuda_gemm_set_fused_epilogues(CudaGemmCtx *ctx, bool on) { ctx->fuse = on; }
extern "C" CudaGemmStats cuda_gemm_stats(const CudaGemmCtx *ctx) { return ctx->stats; }
extern "C" void cuda_gemm_set_tuning(CudaGemmCtx *ctx, bool on) { ctx->tune = on; }
