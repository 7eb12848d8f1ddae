// backend_cuda.cu: the CUDA backend: kernels/backend.h's table filled with
// the kernels of kernels/cuda, every op queued on the backend's one
// non-blocking stream.
//
// Memory. dev_alloc is cudaMalloc (NULL when the device is full, so
// backend.c names the tag in its message); no op allocates: the ops that
// need temporary device memory ask backend_workspace for the size their
// scratch function gives, and the cuBLASLt workspace is a MEM_WORKSPACE
// allocation made here at creation. The stream-ordered pool
// (cudaMallocAsync) is not used at all. The CUDA context and cuBLASLt are
// measured, not allocated: the device memory in use once both exist, less
// what the allocator holds, is noted as library overhead (on a GPU that
// other processes share, their memory is counted too).
//
// Host and device. upload copies through pinned staging: two slots, each
// grown as needed up to STAGE_MAX_BYTES, used in turn, so the host waits
// only for the copy that last used a slot before refilling it (larger
// uploads go in chunks). download is an async copy and a stream sync;
// sync is a stream sync. upload_wait (the collectives' staging copies, from
// page-locked memory made by host_alloc = cudaMallocHost) is an async copy
// and a stream sync. Syncs read the CudaOpStatus the cross-entropy
// ops fill on the device (host memory mapped into the device: no copy) and
// die with its sentence if a target was outside the vocabulary: the ops
// never synchronise to check, so a bad target is reported at the next
// synchronisation point instead of at the op.
//
// Precision. In bf16 mode the GEMMs take weights inside a registered master
// range from their bf16 twin (backend_compute_twin, re-cast by recast once
// per step) and round every other operand to bf16 in scratch, accumulating
// in fp32; biases and bias gradients come from fp32 values. That is the
// CPU backend's emulation, point for point.
#include <stdio.h>
#include <string.h>

#include "backend_cuda.h"
#include "cuda_common.h"
#include "cuda_gemm.h"
#include "cuda_ops.h"

#define STAGE_MAX_BYTES ((size_t)32 << 20)  // per staging slot; larger uploads go in chunks

typedef struct {
    void *host;        // (cap) pinned
    size_t cap;
    cudaEvent_t done;  // recorded after the copy that last read this slot
    bool pending;
} Stage;

typedef struct {
    cudaStream_t stream;
    CudaGemmCtx *gemm;
    Stage stage[2];
    int next_stage;
    volatile CudaOpStatus *status;  // host view of the device-reported status
    CudaOpStatus *status_dev;       // the same memory, as the device sees it
} CudaImpl;

static CudaImpl *impl_of(const Backend *be) { return (CudaImpl *)be->impl; }
static cudaStream_t stream_of(const Backend *be) { return impl_of(be)->stream; }

extern "C" cudaStream_t backend_cuda_stream(const Backend *be) {
    TP_CHECK(be->kind == BACKEND_CUDA, "backend_cuda_stream: not a CUDA backend");
    return stream_of(be);
}

extern "C" CudaGemmCtx *backend_cuda_gemm(const Backend *be) {
    TP_CHECK(be->kind == BACKEND_CUDA, "backend_cuda_gemm: not a CUDA backend");
    return impl_of(be)->gemm;
}

// ---- memory, copies, synchronisation -------------------------------------------------

// Waits for the stream, then dies if an op reported bad input on the device.
static void cu_sync(Backend *be) {
    CudaImpl *c = impl_of(be);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    char msg[512];
    if (cuda_status_message(c->status, msg, sizeof msg)) tp_die(__FILE__, __LINE__, "%s", msg);
}

static void *cu_dev_alloc(Backend *be, size_t n_bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n_bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky: clear it, the caller reports
        return NULL;
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n_bytes, stream_of(be)));  // zero-filled, as backend_alloc promises
    CUDA_CHECK(cudaStreamSynchronize(stream_of(be)));           // before any other stream sees it
    return p;
}

static void cu_dev_free(Backend *be, void *p) {
    CUDA_CHECK(cudaStreamSynchronize(stream_of(be)));  // queued ops may still use it
    CUDA_CHECK(cudaFree(p));
}

// A staging slot free for n_bytes: waits for its last copy, grows it if needed.
static Stage *stage_take(CudaImpl *c, size_t n_bytes) {
    Stage *st = &c->stage[c->next_stage];
    c->next_stage ^= 1;
    if (st->pending) CUDA_CHECK(cudaEventSynchronize(st->done));
    st->pending = false;
    if (st->cap < n_bytes) {
        if (st->host) CUDA_CHECK(cudaFreeHost(st->host));
        size_t cap = st->cap * 2 > n_bytes ? st->cap * 2 : n_bytes;
        st->cap = cap < STAGE_MAX_BYTES ? cap : STAGE_MAX_BYTES;
        CUDA_CHECK(cudaMallocHost(&st->host, st->cap));
    }
    return st;
}

static void cu_upload(Backend *be, void *dst, const void *src, size_t n_bytes) {
    CudaImpl *c = impl_of(be);
    for (size_t off = 0; off < n_bytes;) {
        const size_t chunk = n_bytes - off < STAGE_MAX_BYTES ? n_bytes - off : STAGE_MAX_BYTES;
        Stage *st = stage_take(c, chunk);
        memcpy(st->host, (const char *)src + off, chunk);
        CUDA_CHECK(cudaMemcpyAsync((char *)dst + off, st->host, chunk, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaEventRecord(st->done, c->stream));
        st->pending = true;
        off += chunk;
    }
}

static void cu_download(Backend *be, void *dst, const void *src, size_t n_bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToHost, stream_of(be)));
    cu_sync(be);
}

// Straight from the caller's (page-locked) buffer, then a wait: the caller may
// refill it as soon as this returns (the collectives' staging buffer).
static void cu_upload_wait(Backend *be, void *dst, const void *src, size_t n_bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyHostToDevice, stream_of(be)));
    cu_sync(be);
}

static void *cu_host_alloc(Backend *be, size_t n_bytes) {
    (void)be;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, n_bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky: the caller reports
        return NULL;
    }
    CUDA_CHECK(e);
    return p;
}

static void cu_host_free(Backend *be, void *p) {
    CUDA_CHECK(cudaStreamSynchronize(stream_of(be)));  // a queued copy may still read it
    CUDA_CHECK(cudaFreeHost(p));
}

static void *cu_stream(Backend *be) { return (void *)stream_of(be); }

// The whole device, as the driver sees it: every process's memory, the
// contexts and the libraries included.
static bool cu_device_used(Backend *be, size_t *used_bytes) {
    (void)be;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    *used_bytes = total_bytes - free_bytes;
    return true;
}

static void cu_recast(Backend *be, void *compute, const float *master, size_t n_elems) {
    cuda_gemm_f32_to_bf16(stream_of(be), (uint16_t *)compute, master, n_elems);
}

static void cu_destroy(Backend *be) {
    CudaImpl *c = impl_of(be);
    cuda_gemm_ctx_destroy(c->gemm);  // waits for the stream
    for (int i = 0; i < 2; i++) {
        if (c->stage[i].host) CUDA_CHECK(cudaFreeHost(c->stage[i].host));
        CUDA_CHECK(cudaEventDestroy(c->stage[i].done));
    }
    CUDA_CHECK(cudaFreeHost((void *)c->status));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
    free(be);
}

// The table's op entries, cu_<name>, declared from ops_list.h: a definition
// below that differs from its entry does not compile.
#define OP(name, cls, cpu, cuda, params, args) static void cu_##name TP_OP_WITH_BE params;
#include "ops_list.h"

// ---- GEMM and linear layers ----------------------------------------------------------
// Shapes as ops.h: A (M, K) or (K, M), B (K, N) or (N, K), C (M, N); x (N, in),
// W (out, in), b (out), y and dy (N, out).

static void *scratch(Backend *be, size_t n_bytes) { return n_bytes ? backend_workspace(be, n_bytes) : NULL; }

// An operand: its bf16 twin where x lies in a registered master range (bf16
// mode). Parameters are carved from one buffer at any offset; a twin that is
// not TWIN_ALIGN-aligned is passed over (its master values are rounded into
// aligned scratch instead, the same bits), so cuBLASLt always sees the
// alignment its tensor-core kernels want.
#define TWIN_ALIGN 16
static CudaGemmOperand operand_of(const Backend *be, const float *x) {
    CudaGemmOperand o = {x, NULL};
    if (be->dtype != DTYPE_BF16 || !x) return o;
    const uint16_t *twin = (const uint16_t *)backend_compute_twin(be, x);
    if (twin && (uintptr_t)twin % TWIN_ALIGN == 0) o.bf16 = twin;
    return o;
}

static void cu_gemm(Backend *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, const float *B,
                    float beta, float *C) {
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand a = operand_of(be, A), b = operand_of(be, B);
    const size_t need = cuda_gemm_scratch_bytes(g, M, N, K, a.bf16 != NULL, b.bf16 != NULL);
    cuda_op_gemm(g, ta, tb, M, N, K, alpha, a, b, beta, C, scratch(be, need), need);
}

// The linear layers on x given as fp32 (linear_fwd / _bwd) or as bf16 bits
// alone (the _x16 forms): the same GEMMs.
static void linear_fwd_on(Backend *be, float *y, CudaGemmOperand x, const float *W, const float *b, int N, int in,
                          int out) {
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W), bias = operand_of(be, b);
    const size_t need = cuda_linear_fwd_scratch_bytes(g, N, in, out, w.bf16 != NULL, !x.f32 && x.bf16, b != NULL);
    cuda_op_linear_fwd(g, y, x, w, bias, N, in, out, scratch(be, need), need);
}

static void linear_bwd_on(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                          CudaGemmOperand x, const float *W, int N, int in, int out) {
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W);
    const size_t need = cuda_linear_bwd_scratch_bytes(g, dx != NULL, dW != NULL, db != NULL, N, in, out,
                                                      w.bf16 != NULL, !x.f32 && x.bf16);
    cuda_op_linear_bwd(g, dx, dx_mode, dW, db, dy, x, w, N, in, out, scratch(be, need), need);
}

static CudaGemmOperand x_f32(const float *x) {
    CudaGemmOperand o = {x, NULL};
    return o;
}
static CudaGemmOperand x_bf16(const uint16_t *x16) {
    CudaGemmOperand o = {NULL, x16};
    return o;
}

static void cu_linear_fwd(Backend *be, float *y, const float *x, const float *W, const float *b, int N, int in,
                          int out) {
    linear_fwd_on(be, y, x_f32(x), W, b, N, in, out);
}

static void cu_linear_bwd(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                          const float *x, const float *W, int N, int in, int out) {
    linear_bwd_on(be, dx, dx_mode, dW, db, dy, x_f32(x), W, N, in, out);
}

static void cu_linear_fwd16(Backend *be, uint16_t *y16, float *tmp, const float *x, const uint16_t *x16,
                            const float *W, const float *b, bool relu, int N, int in, int out) {
    TP_CHECK((x == NULL) != (x16 == NULL), "op_linear_fwd16: give exactly one of x and x16");
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W), bias = operand_of(be, b), xo = x ? x_f32(x) : x_bf16(x16);
    const size_t need = cuda_linear_fwd16_scratch_bytes(g, N, in, out, w.bf16 != NULL, !x, b != NULL, tmp != NULL);
    cuda_op_linear_fwd16(g, y16, tmp, xo, w, bias, relu, N, in, out, scratch(be, need), need);
}

static void cu_linear_relu_fwd16(Backend *be, uint16_t *y16, float *tmp, uint8_t *mask, const float *x,
                                 const uint16_t *x16, const float *W, const float *b, int N, int in, int out) {
    TP_CHECK((x == NULL) != (x16 == NULL), "op_linear_relu_fwd16: give exactly one of x and x16");
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W), bias = operand_of(be, b), xo = x ? x_f32(x) : x_bf16(x16);
    const size_t need = cuda_linear_fwd16_scratch_bytes(g, N, in, out, w.bf16 != NULL, !x, b != NULL, tmp != NULL);
    cuda_op_linear_relu_fwd16(g, y16, tmp, mask, xo, w, bias, N, in, out, scratch(be, need), need);
}

static void cu_linear_bwd16_drelu(Backend *be, uint16_t *dh16, float *dW, float *db, float *db_h, const float *dy,
                                  const uint16_t *dy16, const uint8_t *mask, const uint16_t *x16, const float *W,
                                  int N, int in, int out) {
    TP_CHECK((dy == NULL) != (dy16 == NULL), "op_linear_bwd16_drelu: give exactly one of dy and dy16");
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W), dyo = dy16 ? x_bf16(dy16) : x_f32(dy);
    const size_t need = cuda_linear_bwd16_drelu_scratch_bytes(g, dW != NULL, db != NULL, N, in, out, w.bf16 != NULL,
                                                              dy16 != NULL);
    cuda_op_linear_bwd16_drelu(g, dh16, dW, db, db_h, dyo, mask, x16, w, N, in, out, scratch(be, need), need);
}

static void cu_linear_bwd_dy16(Backend *be, float *dx, GradMode dx_mode, float *dW, const uint16_t *dy16,
                               const float *x, const float *W, int N, int in, int out) {
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W);
    const size_t need = cuda_linear_bwd_dy16_scratch_bytes(g, dx != NULL, dW != NULL, N, in, out, w.bf16 != NULL);
    cuda_op_linear_bwd_dy16(g, dx, dx_mode, dW, dy16, x_f32(x), w, N, in, out, scratch(be, need), need);
}

static void cu_linear_bwd16(Backend *be, float *dx, uint16_t *dx16, GradMode dx_mode, float *dW, float *db,
                            const float *dy, const uint16_t *dy16, const uint16_t *relu16, const float *x,
                            const uint16_t *x16, const float *W, int N, int in, int out) {
    TP_CHECK((dy == NULL) != (dy16 == NULL), "op_linear_bwd16: give exactly one of dy and dy16");
    TP_CHECK(!(x && x16), "op_linear_bwd16: give at most one of x and x16");
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W), xo = x16 ? x_bf16(x16) : x_f32(x);
    const CudaGemmOperand dyo = dy16 ? x_bf16(dy16) : x_f32(dy);
    const size_t need = cuda_linear_bwd16_scratch_bytes(g, dx != NULL, dx16 != NULL, dW != NULL, db != NULL, N, in,
                                                        out, w.bf16 != NULL, x16 != NULL, dy16 != NULL,
                                                        relu16 != NULL);
    cuda_op_linear_bwd16(g, dx, dx16, dx_mode, dW, db, dyo, relu16, xo, w, N, in, out, scratch(be, need), need);
}

static void cu_linear_fwd_x16(Backend *be, float *y, const uint16_t *x16, const float *W, const float *b, int N,
                              int in, int out) {
    linear_fwd_on(be, y, x_bf16(x16), W, b, N, in, out);
}

static void cu_linear_bwd_x16(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                              const uint16_t *x16, const float *W, int N, int in, int out) {
    linear_bwd_on(be, dx, dx_mode, dW, db, dy, x_bf16(x16), W, N, in, out);
}

static void cu_linear_bwd_relu_x16(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                                   const uint16_t *relu16, const uint16_t *x16, const float *W, int N, int in,
                                   int out) {
    CudaGemmCtx *g = impl_of(be)->gemm;
    const CudaGemmOperand w = operand_of(be, W);
    const size_t need =
        cuda_linear_bwd_relu_scratch_bytes(g, dx != NULL, dW != NULL, db != NULL, N, in, out, w.bf16 != NULL);
    cuda_op_linear_bwd_relu(g, dx, dx_mode, dW, db, dy, relu16, x_bf16(x16), w, N, in, out, scratch(be, need), need);
}

// ---- the rest: one kernel family each ---------------------------------------------------
// Arguments and their shapes are ops.h's; each entry adds the stream and, where
// the kernel family needs one, scratch of the size its function computes.

static void cu_zero(Backend *be, float *x, size_t n) { cuda_op_zero(x, n, stream_of(be)); }
static void cu_copy(Backend *be, float *d, const float *s, size_t n) {
    cuda_op_copy(d, s, n, scratch(be, cuda_copy_scratch_bytes(d, s, n * sizeof(float))), stream_of(be));
}
static void cu_copy_ids(Backend *be, int32_t *d, const int32_t *s, size_t n) {
    cuda_op_copy_ids(d, s, n, scratch(be, cuda_copy_scratch_bytes(d, s, n * sizeof(int32_t))), stream_of(be));
}
static void cu_bias_add(Backend *be, float *y, const float *b, int N, int C) {
    cuda_op_bias_add(y, b, N, C, stream_of(be));
}
static void cu_bias_bwd(Backend *be, float *db, const float *dy, int N, int C) {
    void *ws = scratch(be, cuda_bias_bwd_scratch_bytes(N, C));
    if (be->dtype == DTYPE_BF16) cuda_op_bias_bwd_rounded(db, dy, N, C, ws, stream_of(be));  // ops_list.h
    else cuda_op_bias_bwd(db, dy, N, C, ws, stream_of(be));
}
static void cu_embedding_fwd(Backend *be, float *out, const int32_t *ids, const float *table, float scale, int N,
                             int C, int vs, int Vl) {
    cuda_op_embedding_fwd(out, ids, table, scale, N, C, vs, Vl, stream_of(be));
}
static void cu_embedding_bwd(Backend *be, float *dt, const float *dout, const int32_t *ids, float scale, int N,
                             int C, int vs, int Vl) {
    void *s = scratch(be, N > 0 && C > 0 ? cuda_embedding_bwd_scratch_bytes(N, Vl) : 0);
    cuda_op_embedding_bwd(dt, dout, ids, scale, N, C, vs, Vl, s, stream_of(be));
}
static void cu_add_positions(Backend *be, float *x, int B, int T, int C) {
    cuda_op_add_positions(x, B, T, C, stream_of(be));
}
static void cu_layernorm_fwd(Backend *be, float *y, float *mean, float *rstd, const float *x, const float *g,
                             const float *b, int N, int C, float eps) {
    cuda_op_layernorm_fwd(y, mean, rstd, x, g, b, N, C, eps, stream_of(be));
}
static void cu_layernorm_bwd(Backend *be, float *dx, float *dg, float *db, const float *dy, const float *x,
                             const float *mean, const float *rstd, const float *g, int N, int C) {
    cuda_op_layernorm_bwd(dx, dg, db, dy, x, mean, rstd, g, N, C, scratch(be, cuda_layernorm_bwd_scratch_bytes(N, C)),
                          stream_of(be));
}
static void cu_act_fwd(Backend *be, float *y, const float *x, size_t n, Activation a) {
    cuda_op_act_fwd(y, x, n, a, stream_of(be));
}
static void cu_act_bwd_x16(Backend *be, float *dx, GradMode mode, const float *dy, const uint16_t *x, size_t n,
                           Activation a) {
    cuda_op_act_bwd_x16(dx, mode, dy, x, n, a, stream_of(be));
}
static void cu_act_fwd16(Backend *be, uint16_t *y, const float *x, size_t n, Activation a) {
    cuda_op_act_fwd16(y, x, n, a, stream_of(be));
}
static void cu_act_bwd(Backend *be, float *dx, GradMode mode, const float *dy, const float *x, size_t n, Activation a) {
    cuda_op_act_bwd(dx, mode, dy, x, n, a, stream_of(be));
}
static void cu_add(Backend *be, float *o, const float *a, const float *b, size_t n) {
    cuda_op_add(o, a, b, n, stream_of(be));
}
static void cu_accumulate(Backend *be, float *y, const float *x, size_t n) {
    cuda_op_accumulate(y, x, n, stream_of(be));
}
static void cu_scale(Backend *be, float *x, float s, size_t n) { cuda_op_scale(x, s, n, stream_of(be)); }
static void cu_sum_acc(Backend *be, float *acc, const float *x, size_t n) {
    cuda_op_sum_acc(acc, x, n, scratch(be, cuda_sum_scratch_bytes(n)), stream_of(be));
}
static void cu_sumsq_acc(Backend *be, float *acc, const float *x, size_t n) {
    cuda_op_sumsq_acc(acc, x, n, scratch(be, cuda_sum_scratch_bytes(n)), stream_of(be));
}
static void cu_clip_coef(Backend *be, float *nc, const float *ss, int k, float max_norm) {
    cuda_op_clip_coef(nc, ss, k, max_norm, stream_of(be));
}
static void cu_scale_by(Backend *be, float *x, const float *s, size_t n) { cuda_op_scale_by(x, s, n, stream_of(be)); }
static void cu_to_bf16(Backend *be, uint16_t *d, const float *s, size_t n) { cuda_op_to_bf16(d, s, n, stream_of(be)); }
static void cu_from_bf16(Backend *be, float *d, const uint16_t *s, size_t n) { cuda_op_from_bf16(d, s, n, stream_of(be)); }
static void cu_round_bf16(Backend *be, float *x, size_t n) { cuda_op_round_bf16(x, n, stream_of(be)); }
static void cu_softmax_fwd(Backend *be, float *P, const float *S, const int32_t *kl, int B, int H, int Tq, int Tk,
                           float scale, bool causal) {
    cuda_op_softmax_fwd(P, S, kl, B, H, Tq, Tk, scale, causal, stream_of(be));
}
static void cu_softmax_bwd(Backend *be, float *dS, const float *dP, const float *P, int B, int H, int Tq, int Tk,
                           float scale) {
    cuda_op_softmax_bwd(dS, dP, P, B, H, Tq, Tk, scale, stream_of(be));
}
static void cu_attention_fwd(Backend *be, float *out, float *P, const float *q, const float *k, const float *v,
                             const int32_t *kl, int B, int H, int Tq, int Tk, int D, bool causal) {
    cuda_op_attention_fwd(out, P, q, k, v, kl, B, H, Tq, Tk, D, causal, stream_of(be));
}
static void cu_attention_bwd(Backend *be, float *dq, float *dk, float *dv, GradMode mode, const float *dout,
                             const float *P, const float *q, const float *k, const float *v, float *scr, int B,
                             int H, int Tq, int Tk, int D) {
    cuda_op_attention_bwd(dq, dk, dv, mode, dout, P, q, k, v, scr, B, H, Tq, Tk, D, stream_of(be));
}
static void cu_attention_fwd_x16(Backend *be, float *out, uint16_t *out16, float *P, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, const int32_t *kl, int B, int H, int Tq, int Tk, int D,
                                 bool causal) {
    cuda_op_attention_fwd_x16(out, out16, P, q, k, v, kl, B, H, Tq, Tk, D, causal, stream_of(be));
}
static void cu_attention_bwd_x16(Backend *be, float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                 uint16_t *dv16, GradMode mode, const float *dout, const float *P, const uint16_t *q,
                                 const uint16_t *k, const uint16_t *v, float *scr, int B, int H, int Tq, int Tk,
                                 int D) {
    cuda_op_attention_bwd_x16(dq, dk, dv, dq16, dk16, dv16, mode, dout, P, q, k, v, scr, B, H, Tq, Tk, D,
                              stream_of(be));
}
static void cu_attention_flash_fwd(Backend *be, uint16_t *out16, float *lse, const uint16_t *q, const uint16_t *k,
                                   const uint16_t *v, const int32_t *kl, int B, int H, int Tq, int Tk, int D,
                                   bool causal) {
    cuda_op_attention_flash_fwd(out16, lse, q, k, v, kl, B, H, Tq, Tk, D, causal, stream_of(be));
}
static void cu_attention_flash_bwd(Backend *be, float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                   uint16_t *dv16, GradMode mode, const float *dout, const float *lse,
                                   const uint16_t *q, const uint16_t *k, const uint16_t *v, const int32_t *kl,
                                   float *scr, int B, int H, int Tq, int Tk, int D, bool causal) {
    cuda_op_attention_flash_bwd(dq, dk, dv, dq16, dk16, dv16, mode, dout, lse, q, k, v, kl, scr, B, H, Tq, Tk, D,
                                causal, stream_of(be));
}
static void cu_dropout_fwd_win(Backend *be, float *o, const float *x, size_t rows, size_t cols, uint64_t ld,
                               uint64_t first, float p, uint64_t seed, uint64_t st) {
    cuda_op_dropout_fwd_win(o, x, rows, cols, ld, first, p, seed, st, be->step_vars, stream_of(be));
}
static void cu_dropout_bwd_win(Backend *be, float *dx, GradMode mode, const float *dy, size_t rows, size_t cols,
                               uint64_t ld, uint64_t first, float p, uint64_t seed, uint64_t st) {
    cuda_op_dropout_bwd_win(dx, mode, dy, rows, cols, ld, first, p, seed, st, be->step_vars, stream_of(be));
}
static void cu_attention_drop_fwd(Backend *be, float *out, uint16_t *out16, float *P, float *Pd, const float *q,
                                  const float *k, const float *v, const uint16_t *q16, const uint16_t *k16,
                                  const uint16_t *v16, const int32_t *kl, int B, int H, int Tq, int Tk, int D,
                                  bool causal, uint64_t first, uint64_t ld, float p, uint64_t seed, uint64_t st) {
    cuda_op_attention_drop_fwd(out, out16, P, Pd, q, k, v, q16, k16, v16, kl, B, H, Tq, Tk, D, causal, first, ld, p,
                               seed, st, be->step_vars, stream_of(be));
}
static void cu_attention_drop_bwd(Backend *be, float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                  uint16_t *dv16, GradMode mode, const float *dout, const float *P, const float *q,
                                  const float *k, const float *v, const uint16_t *q16, const uint16_t *k16,
                                  const uint16_t *v16, float *scr, int B, int H, int Tq, int Tk, int D, uint64_t first,
                                  uint64_t ld, float p, uint64_t seed, uint64_t st) {
    cuda_op_attention_drop_bwd(dq, dk, dv, dq16, dk16, dv16, mode, dout, P, q, k, v, q16, k16, v16, scr, B, H, Tq, Tk,
                               D, first, ld, p, seed, st, be->step_vars, stream_of(be));
}
static void cu_dropout_fwd_at(Backend *be, float *o, const float *x, size_t n, uint64_t first, float p, uint64_t seed,
                           uint64_t st) {
    cuda_op_dropout_fwd_at(o, x, n, first, p, seed, st, be->step_vars, stream_of(be));
}
static void cu_dropout_bwd_at(Backend *be, float *dx, uint16_t *dx16, GradMode mode, const float *dy, size_t n,
                              uint64_t first, float p, uint64_t seed, uint64_t st) {
    cuda_op_dropout_bwd_at(dx, dx16, mode, dy, n, first, p, seed, st, be->step_vars, stream_of(be));
}
static void cu_residual_ln_fwd(Backend *be, float *ro, float *y, uint16_t *y16, float *mean, float *rstd,
                               const float *ri, const float *br, const float *bias, const float *g, const float *b,
                               int N, int C, float eps, uint64_t first, float p, uint64_t seed, uint64_t st) {
    cuda_op_residual_ln_fwd(ro, y, y16, mean, rstd, ri, br, bias, g, b, N, C, eps, first, p, seed, st, be->step_vars,
                            stream_of(be));
}
static void cu_residual_ln_bwd(Backend *be, float *dr, float *dbr, uint16_t *dbr16, float *dg, float *db, float *dbias,
                               const float *dy, const float *x, const float *mean, const float *rstd, const float *g,
                               int N, int C, uint64_t first, float p, uint64_t seed, uint64_t st) {
    void *ws = scratch(be, cuda_residual_ln_bwd_scratch_bytes(N, C));
    if (be->dtype == DTYPE_BF16)  // d_bias sums d_branch's bf16 rounding (ops_list.h)
        cuda_op_residual_ln_bwd_bias16(dr, dbr, dbr16, dg, db, dbias, dy, x, mean, rstd, g, N, C, first, p, seed, st,
                                       be->step_vars, ws, stream_of(be));
    else
        cuda_op_residual_ln_bwd(dr, dbr, dbr16, dg, db, dbias, dy, x, mean, rstd, g, N, C, first, p, seed, st,
                                be->step_vars, ws, stream_of(be));
}
static void cu_xent_fwd(Backend *be, float *losses, float *lse, const float *logits, const int32_t *t, int N, int V,
                        float eps, int32_t ig) {
    cuda_op_xent_fwd(losses, lse, logits, t, N, V, eps, ig, impl_of(be)->status_dev, stream_of(be));
}
static void cu_xent_bwd(Backend *be, float *dl, const float *logits, const float *lse, const int32_t *t, float dloss,
                        int N, int V, float eps, int32_t ig) {
    cuda_op_xent_bwd(dl, logits, lse, t, dloss, N, V, eps, ig, stream_of(be));
}
static void cu_xent_vp_max(Backend *be, float *rm, const float *logits, int N, int Vl, int Vv) {
    cuda_op_xent_vp_max(rm, logits, N, Vl, Vv, stream_of(be));
}
static void cu_xent_vp_sums(Backend *be, float *st, const float *logits, const float *rm, const int32_t *t, int N,
                            int Vl, int Vv, int vs, int32_t ig) {
    cuda_op_xent_vp_sums(st, logits, rm, t, N, Vl, Vv, vs, ig, stream_of(be));
}
static void cu_xent_vp_loss(Backend *be, float *losses, float *lse, const float *rm, const float *st,
                            const int32_t *t, int N, int V, float eps, int32_t ig) {
    cuda_op_xent_vp_loss(losses, lse, rm, st, t, N, V, eps, ig, impl_of(be)->status_dev, stream_of(be));
}
static void cu_xent_vp_grad_inplace(Backend *be, float *logits, const float *lse, const int32_t *t, float dloss,
                                    int N, int Vl, int Vv, int vs, int V, float eps, int32_t ig) {
    cuda_op_xent_vp_grad_inplace(logits, lse, t, dloss, N, Vl, Vv, vs, V, eps, ig, be->step_vars, stream_of(be));
}
static void cu_xent_vp_max16(Backend *be, float *rm, const uint16_t *logits, int N, int Vl, int Vv) {
    cuda_op_xent_vp_max16(rm, logits, N, Vl, Vv, stream_of(be));
}
static void cu_xent_vp_sums16(Backend *be, float *st, const uint16_t *logits, const float *rm, const int32_t *t,
                              int N, int Vl, int Vv, int vs, int32_t ig) {
    cuda_op_xent_vp_sums16(st, logits, rm, t, N, Vl, Vv, vs, ig, stream_of(be));
}
static void cu_xent_vp_grad_inplace16(Backend *be, uint16_t *logits, const float *lse, const int32_t *t, float dloss,
                                      int N, int Vl, int Vv, int vs, int V, float eps, int32_t ig) {
    cuda_op_xent_vp_grad_inplace16(logits, lse, t, dloss, N, Vl, Vv, vs, V, eps, ig, be->step_vars,
                                   stream_of(be));
}
static void cu_xent_vp_bwd(Backend *be, float *dl, const float *logits, const float *lse, const int32_t *t,
                           float dloss, int N, int Vl, int Vv, int vs, int V, float eps, int32_t ig) {
    cuda_op_xent_vp_bwd(dl, logits, lse, t, dloss, N, Vl, Vv, vs, V, eps, ig, stream_of(be));
}
static void cu_adamw(Backend *be, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                     float b2, float eps, float wd, int t) {
    cuda_op_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t, stream_of(be));
}

// ---- --profile's marks: timing events recorded on the stream, read once per step ----------

typedef struct {
    int n;
    cudaEvent_t ev[1];  // (n)
} CudaMarks;

static void *cu_marks_new(Backend *be, int n) {
    (void)be;
    if (n < 1) n = 1;
    CudaMarks *m = (CudaMarks *)TP_CALLOC(1, sizeof(CudaMarks) + (size_t)(n - 1) * sizeof(cudaEvent_t));
    m->n = n;
    for (int i = 0; i < n; i++) CUDA_CHECK(cudaEventCreate(&m->ev[i]));  // timing on: cudaEventDefault
    return m;
}
static void cu_mark(Backend *be, void *marks, int i) {
    CudaMarks *m = (CudaMarks *)marks;
    TP_CHECK(i >= 0 && i < m->n, "profile mark %d outside its set of %d", i, m->n);
    CUDA_CHECK(cudaEventRecord(m->ev[i], stream_of(be)));
}
static void cu_marks_read(Backend *be, void *marks, int n, double *seconds) {
    (void)be;
    CudaMarks *m = (CudaMarks *)marks;
    TP_CHECK(n >= 1 && n <= m->n, "profile: %d marks read of a set of %d", n, m->n);
    CUDA_CHECK(cudaEventSynchronize(m->ev[n - 1]));
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, m->ev[0], m->ev[i]));
        seconds[i] = 1e-3 * (double)ms;
    }
}
static void cu_marks_free(Backend *be, void *marks) {
    (void)be;
    CudaMarks *m = (CudaMarks *)marks;
    if (!m) return;
    for (int i = 0; i < m->n; i++) CUDA_CHECK(cudaEventDestroy(m->ev[i]));
    free(m);
}

static void cu_sumsq_segs(Backend *be, float *acc, const float *x, const OpSegTable *s) {
    cuda_op_sumsq_segs(acc, x, s, stream_of(be));
}
static void cu_adamw_segs(Backend *be, float *p, const float *g, float *m, float *v, const OpSegTable *s, float lr,
                          float b1, float b2, float eps, float wd, int t) {
    cuda_op_adamw_segs(p, g, m, v, s, lr, b1, b2, eps, wd, t, stream_of(be));
}

// ---- graphs: stream capture, instantiated once, launched per replay -----------------------
// ThreadLocal capture: a call this thread makes that a capture cannot hold
// fails (and backend.c stops the allocator's and the copies' calls before
// they reach CUDA); other threads (NCCL's, the data loader's) are not
// affected. A failed call inside the capture is kept, not fatal
// (cuda_capture_absorbs): the capture then fails as a whole, naming it.

static thread_local struct {
    bool on, failed;
    char what[384];
} g_capture;

extern "C" bool cuda_capture_active(void) { return g_capture.on; }

extern "C" bool cuda_capture_absorbs(const char *call, const char *error, const char *file, int line) {
    if (!g_capture.on) return false;
    if (!g_capture.failed)
        snprintf(g_capture.what, sizeof g_capture.what, "%s failed inside the capture (%s:%d): %s", call, file, line,
                 error);
    g_capture.failed = true;
    return true;
}

static void cu_capture_begin(Backend *be) {
    CUDA_CHECK(cudaStreamBeginCapture(stream_of(be), cudaStreamCaptureModeThreadLocal));
    g_capture.on = true;
    g_capture.failed = false;
    g_capture.what[0] = '\0';
}

static void *cu_capture_end(Backend *be, char *err, size_t err_len) {
    g_capture.on = false;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(stream_of(be), &graph);
    if (g_capture.failed) {  // the first failed call, whatever the end says
        if (e == cudaSuccess && graph) CUDA_CHECK(cudaGraphDestroy(graph));
        (void)cudaGetLastError();
        snprintf(err, err_len, "%s", g_capture.what);
        return NULL;
    }
    if (e != cudaSuccess || !graph) {
        snprintf(err, err_len, "stream capture failed: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return NULL;
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    CUDA_CHECK(cudaGraphDestroy(graph));
    if (e != cudaSuccess) {
        snprintf(err, err_len, "cudaGraphInstantiate failed: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return NULL;
    }
    return (void *)exec;
}

static void cu_graph_launch(Backend *be, void *graph) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, stream_of(be)));
}

static void cu_graph_free(Backend *be, void *graph) {
    CUDA_CHECK(cudaStreamSynchronize(stream_of(be)));  // a launch of it may still be queued
    CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

static BackendOps cuda_ops_table(void) {
    BackendOps o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.dev_alloc = cu_dev_alloc, o.dev_free = cu_dev_free, o.upload = cu_upload, o.download = cu_download;
    o.sync = cu_sync, o.recast = cu_recast, o.destroy = cu_destroy;
    o.host_alloc = cu_host_alloc, o.host_free = cu_host_free, o.upload_wait = cu_upload_wait;
    o.stream = cu_stream, o.device_used = cu_device_used;
#define OP(name, cls, cpu, cuda, params, args) o.name = cu_##name;
#include "ops_list.h"
    o.marks_new = cu_marks_new, o.mark = cu_mark, o.marks_read = cu_marks_read, o.marks_free = cu_marks_free;
    o.capture_begin = cu_capture_begin, o.capture_end = cu_capture_end, o.graph_launch = cu_graph_launch;
    o.graph_free = cu_graph_free;
    return o;
}
static const BackendOps CUDA_OPS = cuda_ops_table();

// ---- creation ----------------------------------------------------------------------------

extern "C" int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // no driver or no device: not an error here
        return 0;
    }
    return n;
}

static CudaImpl *impl_create(void) {
    CudaImpl *c = (CudaImpl *)TP_CALLOC(1, sizeof *c);
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventCreateWithFlags(&c->stage[i].done, cudaEventDisableTiming));
    void *status = NULL;
    CUDA_CHECK(cudaHostAlloc(&status, sizeof(CudaOpStatus), cudaHostAllocMapped));
    memset(status, 0, sizeof(CudaOpStatus));
    c->status = (volatile CudaOpStatus *)status;
    CUDA_CHECK(cudaHostGetDevicePointer((void **)&c->status_dev, status, 0));
    return c;
}

extern "C" Backend *backend_cuda_create(Dtype dtype, int local_rank, char *err, size_t err_len) {
    CudaDeviceInfo info;
    if (cuda_device_init(local_rank, &info, err, err_len)) return NULL;
    cublaslt_load_start();  // its start-up beside the program's; the first GEMM waits for it
    CUDA_CHECK(cudaFree(0));  // the context exists from here on
    Backend *be = (Backend *)TP_CALLOC(1, sizeof *be);
    be->ops = &CUDA_OPS;
    be->kind = BACKEND_CUDA;
    be->dtype = dtype;
    be->host_visible = false;
    be->device = info.device;
    snprintf(be->device_name, sizeof be->device_name, "%.96s (GPU %d, sm_%d%d)", info.name, info.device,
             info.sm_major, info.sm_minor);
    be->device_total_bytes = info.total_bytes;
    CudaImpl *c = impl_create();
    be->impl = c;
    const size_t lt_bytes = backend_gemm_workspace_bytes(BACKEND_CUDA);  // the planner's figure too
    void *lt_ws = backend_alloc(be, lt_bytes, MEM_WORKSPACE);
    c->gemm = cuda_gemm_ctx_create(c->stream, dtype == DTYPE_BF16 ? CUDA_GEMM_BF16 : CUDA_GEMM_FP32, lt_ws, lt_bytes);
    // What the device has lost beyond our allocations: the context, cuBLASLt, the stream.
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t in_use = total_bytes - free_bytes;
    backend_note_library(be, in_use > be->mem.total_cur ? in_use - be->mem.total_cur : 0);
    backend_device_used(be, NULL);  // the first sample of mem.device_used_peak
    return be;
}

// The seam's entry for this backend (backend.h; backend_list.c lists it).
extern "C" const BackendEntry backend_cuda_entry = {BACKEND_CUDA, backend_cuda_device_count, backend_cuda_create};
