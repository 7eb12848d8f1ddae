// gemm_tune.cu: per-shape tuning of the weight-gradient GEMMs' cuBLASLt
// algorithm (gemm_plan.cu makes the plans; gemm.cu's linear backward asks
// for dW += dy^T x through gemm_lt_matmul_dw).
//
// Why these GEMMs. dW = dy^T x multiplies over the tokens: a long K (up to
// tens of thousands) against small M, N (the layer's widths), a shape where
// the heuristic's first answer, an estimate that runs nothing, can miss a
// better split-K or tile choice (not yet measured here: docs/gpu-benchmark.md
// has the command). So at the first call of each
// such shape the heuristic's first CUDA_GEMM_TUNE_CANDIDATES algorithms are
// run on the call's own operands, one warm-up and GEMM_TUNE_REPS timed runs
// each between two events on the context's stream (the heuristic's first
// timed again after the others, its better time counting), and one is kept
// in the plan (launch_policy.h's gemm_tune_pick). The other GEMMs keep the
// heuristic's first, and so does the fp32 dW GEMM whose BGRADB epilogue
// also writes the bias gradient: that db is a replicated parameter's
// gradient where the layer is row-parallel (every tensor-parallel rank
// computes it from the same dy, nothing reduces it), so it must come from
// the same algorithm on every rank, and a timing on each rank could differ.
// (In bf16, the speed path, db always comes from the separate kernel and
// the dW GEMM is tuned.)
//
// Nothing of the call is done twice. The timed runs read C (beta 1) but
// write their D at the end of the cuBLASLt workspace, and the algorithm is
// given only the workspace before it (a candidate needing more is not
// timed; where the output alone does not fit, nothing is). Only after the
// choice does the call run, once, into C with the chosen algorithm: beta 1
// accumulates once.
//
// When. Timing waits for the device, which a stream capture cannot hold:
// a shape first called inside a capture (cuda_capture_active, or the
// stream capturing) keeps the heuristic's first. The training step's graphs
// (train/graphs.c) run every batch shape once uncaptured before capturing
// it, so every shape a graph holds is tuned there. Cost: one heuristic query
// and up to 9 x 4 GEMMs of that shape, once per shape (stats.tune_ms).
//
// Fail safe. Any failure (a candidate refused, an event call failing, no
// room) keeps the heuristic's first algorithm: today's behaviour, never an
// error (the preference is made as every plan's is, and fails as it would).
// Off by default: TPTRAIN_GEMM_TUNE=1 or cuda_gemm_set_tuning(ctx, true)
// switches it on; a tuned and an untuned call are separate plans (key.tune).
//
// Determinism, honestly. Every candidate is a correct GEMM, but they sum in
// different orders (split-K above all), so the kept one decides the bits.
// Within a process a key is decided once: the choice is recorded
// (ctx->records, never evicted), a plan evicted and made again takes it, so
// the same call gives the same bits all run long, replays and captures
// included. Across processes it is a timing: two runs, a run and its
// resumption, or two ranks, may keep different algorithms where two
// candidates' times sit near GEMM_TUNE_MARGIN (the lower index wins unless
// another is more than 5% faster, so noise between near-equal candidates
// does not flip it; times near that margin still can). That is why it is
// off by default (a resume reproduces the straight run bit for bit only
// untuned), and the graphs and resume tests pin TPTRAIN_GEMM_TUNE=0 so that
// a tuned default later would not change what they compare. The choice is
// not saved with checkpoints: saving it would make tuning safe to default.
#include <string.h>

#include "clock.h"
#include "gemm_plan.h"
#include "launch_policy.h"

// The key's record, or the free slot it goes in; NULL when the table is full.
static TuneRecord *record_slot(CudaGemmCtx *ctx, const PlanKey *k) {
    const uint32_t h = gemm_key_hash(k);
    for (uint32_t i = 0; i < CUDA_GEMM_TUNE_RECORDS; i++) {
        TuneRecord *r = &ctx->records[(h + i) % CUDA_GEMM_TUNE_RECORDS];
        if (!r->used || gemm_key_eq(&r->key, k)) return r;
    }
    return NULL;
}

// Whether anything is capturing the context's stream (an unclear answer counts as yes).
static bool capturing(const CudaGemmCtx *ctx) {
    if (cuda_capture_active()) return true;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &st) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return st != cudaStreamCaptureStatusNone;
}

// The candidates: the plan's own algorithm first, then the heuristic's
// others that need at most algo_ws bytes of workspace. Their count.
static int candidates(CudaGemmCtx *ctx, const Plan *p, size_t algo_ws, cublasLtMatmulAlgo_t *out) {
    out[0] = p->algo;
    int n = 1;
    cublasLtMatmulPreference_t pref = gemm_plan_preference(ctx, &p->key);
    cublasLtMatmulHeuristicResult_t res[CUDA_GEMM_TUNE_CANDIDATES];
    memset(res, 0, sizeof res);
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(gemm_lt_handle(ctx), p->desc, p->lay_a, p->lay_b, p->lay_c,
                                                            p->lay_c, pref, CUDA_GEMM_TUNE_CANDIDATES, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) return n;
    for (int i = 0; i < found && i < CUDA_GEMM_TUNE_CANDIDATES && n < CUDA_GEMM_TUNE_CANDIDATES; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > algo_ws) continue;
        if (memcmp(&res[i].algo, &p->algo, sizeof p->algo) == 0) continue;  // the plan's own, already first
        out[n++] = res[i].algo;
    }
    return n;
}

// Milliseconds per run of algo into D (after a warm-up), or -1 when a run or an event call fails.
static float time_one(CudaGemmCtx *ctx, const Plan *p, const cublasLtMatmulAlgo_t *algo, float alpha, const void *A,
                      const void *B, float beta, const void *C, void *D, size_t algo_ws) {
    if (gemm_lt_run(ctx, p, algo, alpha, A, B, beta, C, D, algo_ws) != CUBLAS_STATUS_SUCCESS) return -1.0f;
    if (cudaEventRecord(ctx->tune_ev[0], ctx->stream) != cudaSuccess) return -1.0f;
    for (int r = 0; r < GEMM_TUNE_REPS; r++)
        if (gemm_lt_run(ctx, p, algo, alpha, A, B, beta, C, D, algo_ws) != CUBLAS_STATUS_SUCCESS) return -1.0f;
    float ms = -1.0f;
    if (cudaEventRecord(ctx->tune_ev[1], ctx->stream) != cudaSuccess ||
        cudaEventSynchronize(ctx->tune_ev[1]) != cudaSuccess ||
        cudaEventElapsedTime(&ms, ctx->tune_ev[0], ctx->tune_ev[1]) != cudaSuccess)
        return -1.0f;
    return ms / (float)GEMM_TUNE_REPS;
}

typedef enum { TUNE_TIMED, TUNE_SINGLE, TUNE_CAPTURED, TUNE_SKIPPED } TuneOutcome;

// Times p's candidates on the call's operands; p->algo becomes the kept one.
static TuneOutcome tune_time(CudaGemmCtx *ctx, Plan *p, float alpha, const void *A, const void *B, float beta,
                             const void *C) {
    const PlanKey *k = &p->key;
    const size_t out_bytes = (size_t)k->M * (size_t)k->N * (k->d_type == CUDA_R_32F ? sizeof(float) : sizeof(uint16_t));
    const size_t at = gemm_tune_out_offset(ctx->stats.workspace_bytes, out_bytes);
    if (at == GEMM_TUNE_NO_ROOM || p->ws_need > at) return TUNE_SKIPPED;
    cublasLtMatmulAlgo_t cand[CUDA_GEMM_TUNE_CANDIDATES];
    const int n = candidates(ctx, p, at, cand);
    if (n < 2) return TUNE_SINGLE;
    void *D = (char *)ctx->workspace + at;
    float ms[CUDA_GEMM_TUNE_CANDIDATES];
    for (int i = 0; i < n; i++) ms[i] = time_one(ctx, p, &cand[i], alpha, A, B, beta, C, D, at);
    // the first again, last: timed first it would pay alone for clocks still rising, and lose to noise
    const float again = time_one(ctx, p, &cand[0], alpha, A, B, beta, C, D, at);
    if (ms[0] >= 0.0f && again >= 0.0f && again < ms[0]) ms[0] = again;
    (void)cudaGetLastError();  // a failed event call is not sticky: the heuristic's first stays
    if (!(ms[0] >= 0.0f)) return TUNE_SKIPPED;
    const int best = gemm_tune_pick(ms, n);
    if (best != 0) {
        p->algo = cand[best];
        ctx->stats.n_tune_changed++;
    }
    return TUNE_TIMED;
}

void gemm_tune_plan(CudaGemmCtx *ctx, Plan *p, float alpha, const void *A, const void *B, float beta, const void *C) {
    TuneRecord *r = record_slot(ctx, &p->key);
    if (r && r->used) {  // decided before (the plan was evicted since): the same algorithm again
        p->algo = r->algo;
        ctx->stats.n_tune_recalled++;
        return;
    }
    const double t0 = tp_now_s();
    const TuneOutcome o = !r ? TUNE_SKIPPED : capturing(ctx) ? TUNE_CAPTURED : tune_time(ctx, p, alpha, A, B, beta, C);
    switch (o) {
    case TUNE_TIMED: ctx->stats.n_tuned++; break;
    case TUNE_SINGLE: ctx->stats.n_tune_single++; break;
    case TUNE_CAPTURED: ctx->stats.n_tune_captured++; break;
    case TUNE_SKIPPED: ctx->stats.n_tune_skipped++; break;
    }
    if (r) {  // every outcome is final for the key: a later call never tunes it again
        r->used = true;
        r->key = p->key;
        r->algo = p->algo;
    }
    ctx->stats.tune_ms += 1e3 * (tp_now_s() - t0);
}
