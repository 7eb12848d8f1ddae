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
// The plans of that mapping, their cache and the context are in
// gemm_plan.cu. This file holds the conversions, the scratch layout of each
// call and the exported ops. Nothing here allocates: bf16 operand copies and
// the bias-gradient vector are carved from the scratch each call is given.
#include <stdint.h>
#include <string.h>
#include <cuda_bf16.h>

#include "cuda_kernel_util.cuh"
#include "cuda_ops.h"  // the separate bias kernels (bias.cu) and the conversions (convert.cu)
#include "gemm_plan.h"

#define BLOCK 256u

// ---- kernels -------------------------------------------------------------------

static __global__ void gemm_f32_to_bf16_kernel(__nv_bfloat16 *dst,  // (n_elems)
                                               const float *src,    // (n_elems)
                                               size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

// The same rounding, 8 elements a thread: two 16-byte loads, one 16-byte
// store (the operand copies are the GEMMs' main memory traffic besides the
// products). Both pointers 16-byte aligned; n_vec = n_elems / 8.
static __global__ void gemm_f32_to_bf16_x8_kernel(uint4 *dst,          // (n_vec)
                                                  const float4 *src,   // (2 n_vec)
                                                  size_t n_vec) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += (size_t)gridDim.x * blockDim.x) {
        const float4 a = src[2 * i], b = src[2 * i + 1];
        const __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y), p1 = __floats2bfloat162_rn(a.z, a.w);
        const __nv_bfloat162 p2 = __floats2bfloat162_rn(b.x, b.y), p3 = __floats2bfloat162_rn(b.z, b.w);
        uint4 o;
        o.x = *(const unsigned *)&p0;
        o.y = *(const unsigned *)&p1;
        o.z = *(const unsigned *)&p2;
        o.w = *(const unsigned *)&p3;
        dst[i] = o;
    }
}

static __global__ void gemm_accumulate_kernel(float *y,        // (n_elems)
                                              const float *x,  // (n_elems)
                                              size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

static __global__ void gemm_scale_kernel(float *x,  // (n_elems)
                                         float s, size_t n_elems) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_elems; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

// ---- launchers -------------------------------------------------------------------

static void launch_f32_to_bf16(cudaStream_t stream, void *dst, const float *src, size_t n_elems) {
    if (n_elems == 0) return;
    size_t done = 0;
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0 && n_elems >= 8) {
        const size_t n_vec = n_elems / 8;
        gemm_f32_to_bf16_x8_kernel<<<tp_grid_1d(n_vec, BLOCK), BLOCK, 0, stream>>>((uint4 *)dst, (const float4 *)src,
                                                                                  n_vec);
        CUDA_CHECK(cudaGetLastError());
        done = n_vec * 8;
    }
    if (done < n_elems) {  // unaligned operands, and the tail of aligned ones
        gemm_f32_to_bf16_kernel<<<tp_grid_1d(n_elems - done, BLOCK), BLOCK, 0, stream>>>(
            (__nv_bfloat16 *)dst + done, src + done, n_elems - done);
        CUDA_CHECK(cudaGetLastError());
    }
}

static void launch_accumulate(cudaStream_t stream, float *y, const float *x, size_t n_elems) {
    if (n_elems == 0) return;
    gemm_accumulate_kernel<<<tp_grid_1d(n_elems, BLOCK), BLOCK, 0, stream>>>(y, x, n_elems);
    CUDA_CHECK(cudaGetLastError());
}

// ---- operands and scratch -------------------------------------------------------------

static cudaDataType_t ab_type_of(const CudaGemmCtx *ctx) {
    return ctx->precision == CUDA_GEMM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The operand in the context's precision: the fp32 values, the caller's
// bf16 copy, or a bf16 copy made now in scratch.
// An operand given as bf16 bits alone (f32 NULL) is used as is in bf16 and
// widened (exactly) into scratch in fp32.
// operand_place says where the operand will be (carving its copy's room
// when it needs one) without writing it; operand_fill writes that copy.
static bool operand_copied(const CudaGemmCtx *ctx, CudaGemmOperand x) {
    return ctx->precision == CUDA_GEMM_FP32 ? x.f32 == NULL : x.bf16 == NULL;
}

static const void *operand_place(CudaGemmCtx *ctx, TpCarver *cv, CudaGemmOperand x, size_t n_elems) {
    if (!operand_copied(ctx, x)) return ctx->precision == CUDA_GEMM_FP32 ? (const void *)x.f32 : x.bf16;
    return tp_carve(cv, n_elems * (ctx->precision == CUDA_GEMM_FP32 ? sizeof(float) : sizeof(uint16_t)));
}

static void operand_fill(CudaGemmCtx *ctx, const void *place, CudaGemmOperand x, size_t n_elems) {
    if (!operand_copied(ctx, x)) return;
    if (ctx->precision == CUDA_GEMM_FP32) cuda_op_from_bf16((float *)place, x.bf16, n_elems, ctx->stream);
    else launch_f32_to_bf16(ctx->stream, (void *)place, x.f32, n_elems);
}

static const void *operand(CudaGemmCtx *ctx, TpCarver *cv, CudaGemmOperand x, size_t n_elems) {
    const void *place = operand_place(ctx, cv, x, n_elems);
    operand_fill(ctx, place, x, n_elems);
    return place;
}

// The bias as the GEMM adds it (backend.h's precision rule). fp32: b's own
// values. bf16: their rounding, a bf16 vector for a bf16 output (the
// caller's aligned twin as it is, where it gives one) or an fp32 vector
// for an fp32 output (the twin widened, or the values rounded), in the
// (out) floats of scratch the size functions hold for it
// (scratch_bias_rounded), carved whether the twin serves or not. NULL: no
// bias. bias_place says where, bias_fill writes it.
static const void *bias_place(CudaGemmCtx *ctx, TpCarver *cv, CudaGemmOperand b, int out, cudaDataType_t d_type) {
    if (!b.f32) return NULL;
    if (ctx->precision == CUDA_GEMM_FP32) return b.f32;
    void *room = tp_carve(cv, (size_t)out * sizeof(float));
    return d_type == CUDA_R_16BF && b.bf16 ? (const void *)b.bf16 : room;
}

static void bias_fill(CudaGemmCtx *ctx, const void *place, CudaGemmOperand b, int out, cudaDataType_t d_type) {
    if (!b.f32 || ctx->precision == CUDA_GEMM_FP32 || place == (const void *)b.bf16) return;
    if (d_type == CUDA_R_16BF) {
        launch_f32_to_bf16(ctx->stream, (void *)place, b.f32, (size_t)out);
    } else if (b.bf16) {
        cuda_op_from_bf16((float *)place, b.bf16, (size_t)out, ctx->stream);
    } else {  // the values, then convert.cu's rounding of them (the CPU's bits)
        CUDA_CHECK(cudaMemcpyAsync((void *)place, b.f32, (size_t)out * sizeof(float), cudaMemcpyDeviceToDevice,
                                   ctx->stream));
        cuda_op_round_bf16((float *)place, (size_t)out, ctx->stream);
    }
}

static TpCarver carver_of(void *scratch, size_t scratch_bytes, size_t need, const char *op) {
    TP_CHECK(scratch_bytes >= need, "%s: %zu bytes of scratch given, %zu needed", op, scratch_bytes, need);
    return tp_carver(scratch, scratch_bytes, op);
}

static CudaGemmOperand f32_operand(const float *x) {
    CudaGemmOperand o = {x, NULL};
    return o;
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
            gemm_scale_kernel<<<tp_grid_1d(n_elems, BLOCK), BLOCK, 0, ctx->stream>>>(C, beta, n_elems);
            CUDA_CHECK(cudaGetLastError());
        }
        return;
    }
    gemm_lt_matmul(ctx, trans_a, trans_b, M, N, K, alpha, A, B, ab_type_of(ctx), beta, C, CUBLASLT_EPILOGUE_DEFAULT,
                   NULL);
}

// ---- exported ops ------------------------------------------------------------------

extern "C" size_t cuda_gemm_scratch_bytes(const CudaGemmCtx *ctx, int M, int N, int K, bool a_has_bf16,
                                          bool b_has_bf16) {
    return scratch_gemm(ctx->precision == CUDA_GEMM_BF16, M, N, K, a_has_bf16, b_has_bf16);
}

extern "C" void cuda_op_gemm(CudaGemmCtx *ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                             CudaGemmOperand A,  // (M, K), or (K, M) when trans_a
                             CudaGemmOperand B,  // (K, N), or (N, K) when trans_b
                             float beta,
                             float *C,           // (M, N)
                             void *scratch, size_t scratch_bytes) {
    TP_CHECK(M >= 0 && N >= 0 && K >= 0, "cuda_op_gemm: negative size M=%d N=%d K=%d", M, N, K);
    if (M == 0 || N == 0) return;
    TP_CHECK(C && (K == 0 || (A.f32 && B.f32)), "cuda_op_gemm: NULL matrix (M=%d N=%d K=%d)", M, N, K);
    TpCarver cv = carver_of(scratch, scratch_bytes,
                            cuda_gemm_scratch_bytes(ctx, M, N, K, A.bf16 != NULL, B.bf16 != NULL), "cuda_op_gemm");
    const void *a = K ? operand(ctx, &cv, A, (size_t)M * K) : NULL;
    const void *b = K ? operand(ctx, &cv, B, (size_t)K * N) : NULL;
    gemm_prepared(ctx, trans_a, trans_b, M, N, K, alpha, a, b, beta, C);
}

static bool given(CudaGemmOperand x) { return x.f32 || x.bf16; }
static bool bf16_only(CudaGemmOperand x) { return !x.f32 && x.bf16; }

extern "C" size_t cuda_linear_fwd_scratch_bytes(const CudaGemmCtx *ctx, int N, int in, int out, bool w_has_bf16,
                                                bool x_bf16_only, bool has_bias) {
    return scratch_linear_fwd(ctx->precision == CUDA_GEMM_BF16, N, in, out, w_has_bf16, x_bf16_only, has_bias);
}

// y (N, out), x (N, in), W (out, in), bias (out) or none (f32 NULL)
extern "C" void cuda_op_linear_fwd(CudaGemmCtx *ctx, float *y, CudaGemmOperand x, CudaGemmOperand W,
                                   CudaGemmOperand bias, int N, int in, int out, void *scratch, size_t scratch_bytes) {
    TP_CHECK(N >= 0 && in >= 0 && out >= 0, "cuda_op_linear_fwd: negative size N=%d in=%d out=%d", N, in, out);
    if (N == 0 || out == 0) return;
    TP_CHECK(y && (in == 0 || (given(x) && W.f32)), "cuda_op_linear_fwd: NULL tensor (N=%d in=%d out=%d)", N, in,
             out);
    TpCarver cv = carver_of(scratch, scratch_bytes,
                            cuda_linear_fwd_scratch_bytes(ctx, N, in, out, W.bf16 != NULL, bf16_only(x),
                                                          bias.f32 != NULL),
                            "cuda_op_linear_fwd");
    const void *xa = in ? operand(ctx, &cv, x, (size_t)N * in) : NULL;
    const void *wa = in ? operand(ctx, &cv, W, (size_t)out * in) : NULL;
    const float *b = (const float *)bias_place(ctx, &cv, bias, out, CUDA_R_32F);
    bias_fill(ctx, b, bias, out, CUDA_R_32F);
    bool fused = false;
    if (b && ctx->fuse && in > 0)  // y = x W^T + b in one pass (bias along D_lt's rows = out)
        fused = gemm_lt_matmul(ctx, false, true, N, out, in, 1.0f, xa, wa, ab_type_of(ctx), 0.0f, y,
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

extern "C" size_t cuda_linear_fwd16_scratch_bytes(const CudaGemmCtx *ctx, int N, int in, int out, bool w_has_bf16,
                                                  bool x_bf16_only, bool has_bias, bool has_tmp) {
    return scratch_linear_fwd16(ctx->precision == CUDA_GEMM_BF16, N, in, out, w_has_bf16, x_bf16_only, has_bias,
                                has_tmp);
}

// Rows [first, ...) of an (N, in) operand.
static CudaGemmOperand rows_from(CudaGemmOperand x, size_t first, int in) {
    const size_t at = first * (size_t)in;
    CudaGemmOperand o = {x.f32 ? x.f32 + at : NULL, x.bf16 ? x.bf16 + at : NULL};
    return o;
}

// The fp32 product, then the rounding (with ReLU): into tmp whole, or with
// no tmp in row chunks through fp32 room carved from the scratch.
// With mask (relu), the rounding pass writes the ReLU's bit-mask too.
static void linear_fwd16_separate(CudaGemmCtx *ctx, uint16_t *y16, float *tmp, uint8_t *mask, CudaGemmOperand x,
                                  CudaGemmOperand W, CudaGemmOperand b, bool relu, int N, int in, int out,
                                  void *scratch, size_t scratch_bytes) {
    int R = N;
    if (!tmp) {
        R = scratch_out16_rows(N, out);
        const size_t room = scratch_round((size_t)R * out * sizeof(float));
        TP_CHECK(scratch_bytes >= room, "cuda_op_linear_fwd16: %zu bytes of scratch, %zu needed", scratch_bytes,
                 room);
        tmp = (float *)scratch;
        scratch = (char *)scratch + room;
        scratch_bytes -= room;
    }
    for (int r = 0; r < N; r += R) {
        const int rows = N - r < R ? N - r : R;
        const size_t n = (size_t)rows * out;
        cuda_op_linear_fwd(ctx, tmp, rows_from(x, (size_t)r, in), W, b, rows, in, out, scratch, scratch_bytes);
        uint16_t *dst = y16 + (size_t)r * out;
        if (mask) cuda_op_relu_fwd16_mask(dst, mask + (size_t)r * relu_mask_row_bytes(out), tmp, rows, out, ctx->stream);
        else if (relu) cuda_op_act_fwd16(dst, tmp, n, ACT_RELU, ctx->stream);
        else cuda_op_to_bf16(dst, tmp, n, ctx->stream);
    }
}

// Whether the one-GEMM bf16 store keeps the contract, y = bf16(x W^T + b)
// with the bias added to the fp32 sum. On an H200 (ab749a9) cuBLASLt's plan
// for an unaligned shape (in = 53, out = 29) gave bf16(bf16(x W^T) + b):
// about half a bf16 step off where the product and the bias nearly cancel,
// while every shape whose rows are whole 16-byte vectors (in and out
// multiples of 8 bf16 elements: every one of the model's) kept it. So only
// those take the fused store; the rest compute in fp32 and round once.
static bool out16_fusable(int in, int out) { return in % 8 == 0 && out % 8 == 0; }

// linear_fwd16 (and, mask given, linear_relu_fwd16: relu, RELU_AUX_BIAS
// writing the mask, aux leading dimension relu_mask_row_bytes(out) * 8 bits).
static void linear_fwd16_any(CudaGemmCtx *ctx, const char *op, uint16_t *y16, float *tmp, uint8_t *mask,
                             CudaGemmOperand x, CudaGemmOperand W, CudaGemmOperand bias, bool relu, int N, int in,
                             int out, void *scratch, size_t scratch_bytes) {
    TP_CHECK(N >= 0 && in >= 0 && out >= 0, "%s: negative size N=%d in=%d out=%d", op, N, in, out);
    if (N == 0 || out == 0) return;
    TP_CHECK(y16 && (in == 0 || (given(x) && W.f32)), "%s: NULL tensor (N=%d in=%d out=%d)", op, N, in, out);
    const bool has_bias = bias.f32 != NULL;
    const size_t need =
        cuda_linear_fwd16_scratch_bytes(ctx, N, in, out, W.bf16 != NULL, bf16_only(x), has_bias, tmp != NULL);
    TP_CHECK(scratch_bytes >= need, "%s: %zu bytes of scratch given, %zu needed", op, scratch_bytes, need);
    // the GEMM stores bf16, after bias and ReLU (and writes the mask)
    if (ctx->precision == CUDA_GEMM_BF16 && ctx->fuse && in > 0 && out16_fusable(in, out)) {
        TpCarver cv = carver_of(scratch, scratch_bytes,
                                cuda_linear_fwd_scratch_bytes(ctx, N, in, out, W.bf16 != NULL, bf16_only(x), has_bias),
                                op);
        const size_t nx = (size_t)N * in, nw = (size_t)out * in;
        const void *xa = operand_place(ctx, &cv, x, nx), *wa = operand_place(ctx, &cv, W, nw);
        const void *b = bias_place(ctx, &cv, bias, out, CUDA_R_16BF);  // bf16, as cuBLASLt wants it for bf16 D
        const cublasLtEpilogue_t relu_epi =
            mask ? (b ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX)
                 : (b ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU);
        const cublasLtEpilogue_t epi = relu ? relu_epi : (b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
        const int64_t aux_ld = mask ? (int64_t)relu_mask_row_bytes(out) * 8 : 0;
        // asked first: a plan cuBLASLt lacks costs no operand copies that the separate path makes again
        if (gemm_lt_supported_aux(ctx, false, true, N, out, in, xa, wa, ab_type_of(ctx), y16, CUDA_R_16BF, epi, b,
                                  mask, aux_ld)) {
            operand_fill(ctx, xa, x, nx);
            operand_fill(ctx, wa, W, nw);
            bias_fill(ctx, b, bias, out, CUDA_R_16BF);
            if (gemm_lt_matmul_aux(ctx, false, true, N, out, in, 1.0f, xa, wa, ab_type_of(ctx), 0.0f, y16,
                                   CUDA_R_16BF, epi, b, mask, aux_ld)) {
                ctx->stats.n_out16_fused++;
                if (mask) ctx->stats.n_relu_mask_fused++;
                return;
            }
        } else {
            ctx->stats.n_out16_unplanned++;
        }
    }
    linear_fwd16_separate(ctx, y16, tmp, mask, x, W, bias, relu, N, in, out, scratch, scratch_bytes);
    ctx->stats.n_out16_separate++;
    if (mask) ctx->stats.n_relu_mask_separate++;
}

extern "C" void cuda_op_linear_fwd16(CudaGemmCtx *ctx, uint16_t *y16, float *tmp, CudaGemmOperand x,
                                     CudaGemmOperand W, CudaGemmOperand bias, bool relu, int N, int in, int out,
                                     void *scratch, size_t scratch_bytes) {
    linear_fwd16_any(ctx, "cuda_op_linear_fwd16", y16, tmp, NULL, x, W, bias, relu, N, in, out, scratch,
                     scratch_bytes);
}

extern "C" void cuda_op_linear_relu_fwd16(CudaGemmCtx *ctx, uint16_t *y16, float *tmp, uint8_t *mask,
                                          CudaGemmOperand x, CudaGemmOperand W, CudaGemmOperand bias, int N, int in,
                                          int out, void *scratch, size_t scratch_bytes) {
    TP_CHECK(mask || N <= 0 || out <= 0, "cuda_op_linear_relu_fwd16: mask is NULL");
    linear_fwd16_any(ctx, "cuda_op_linear_relu_fwd16", y16, tmp, mask, x, W, bias, true, N, in, out, scratch,
                     scratch_bytes);
}

// The bias gradient comes from the dW GEMM's BGRADB epilogue, which sums
// dy as the GEMM reads it: the fp32 dy in fp32, its bf16 copy in bf16,
// each the contract's db (backend.h's precision rule). Behind a ReLU in
// bf16 the pass that masks dy into that copy sums it as it goes instead.
static bool fuse_bgrad(const CudaGemmCtx *ctx) { return ctx->fuse; }

extern "C" size_t cuda_linear_bwd_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dW, bool want_db,
                                                int N, int in, int out, bool w_has_bf16, bool x_bf16_only) {
    return scratch_linear_bwd(ctx->precision == CUDA_GEMM_BF16, fuse_bgrad(ctx), want_dx, want_dW, want_db, N, in, out,
                              w_has_bf16, x_bf16_only);
}

extern "C" size_t cuda_linear_bwd_dy16_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dW, int N,
                                                     int in, int out, bool w_has_bf16) {
    return scratch_linear_bwd_dy16(ctx->precision == CUDA_GEMM_BF16, want_dx, want_dW, N, in, out, w_has_bf16);
}

// The separate bias-gradient pass: the sum of dy as the GEMMs read it
// (bf16: each value's rounding, or the bits given).
static void bias_bwd_separate(CudaGemmCtx *ctx, float *db, CudaGemmOperand dy, int N, int out, void *bias_scratch) {
    if (!dy.f32) cuda_op_bias_bwd_x16(db, dy.bf16, NULL, N, out, bias_scratch, ctx->stream);
    else if (ctx->precision == CUDA_GEMM_BF16) cuda_op_bias_bwd_rounded(db, dy.f32, N, out, bias_scratch, ctx->stream);
    else cuda_op_bias_bwd(db, dy.f32, N, out, bias_scratch, ctx->stream);
    ctx->stats.n_bgrad_separate++;
}

// Through a ReLU kept with its bit-mask (linear_bwd16_drelu): the mask,
// the sum of the masked gradient (db_h, accumulated) and the ReLU's output
// (the fallback's mask); bgrad (in floats) and bias_scratch are carved.
typedef struct {
    const uint8_t *mask;     // (N, relu_mask_row_bytes(in))
    float *db_h;             // (in)
    const uint16_t *relu16;  // (N, in) bf16 bits
    float *bgrad;            // (in) the epilogue's output, added into db_h (it overwrites)
    void *bias_scratch;      // the fallback pass's partials
} DreluOut;

// dx16 = bf16(dy W) (GRAD_WRITE): in bf16 one GEMM storing bf16 where
// cuBLASLt plans it, else (and in fp32) the fp32 product in row chunks of
// scratch_out16_rows rows through `tmp`, each rounded (to_bf16's bits).
// With dr, masked and summed: DRELU_BGRAD on that one GEMM, else dx16 as
// above masked by relu16 > 0 in place in the pass that sums it.
static void dx16_gemm(CudaGemmCtx *ctx, uint16_t *dx16, const void *dya, const void *wa, float *tmp, int N, int in,
                      int out, const DreluOut *dr) {
    const bool bf16 = ctx->precision == CUDA_GEMM_BF16;
    if (dr && bf16 && ctx->fuse &&
        gemm_lt_matmul_aux(ctx, false, false, N, in, out, 1.0f, dya, wa, ab_type_of(ctx), 0.0f, dx16, CUDA_R_16BF,
                           CUBLASLT_EPILOGUE_DRELU_BGRAD, dr->bgrad, dr->mask, (int64_t)relu_mask_row_bytes(in) * 8)) {
        launch_accumulate(ctx->stream, dr->db_h, dr->bgrad, (size_t)in);
        ctx->stats.n_drelu_fused++;
        return;
    }
    if (dr) {
        dx16_gemm(ctx, dx16, dya, wa, tmp, N, in, out, NULL);
        cuda_op_bias_bwd_relu_x16_copy(dr->db_h, dx16, dx16, dr->relu16, N, in, dr->bias_scratch, ctx->stream);
        ctx->stats.n_drelu_separate++;
        return;
    }
    if (bf16 && ctx->fuse &&
        gemm_lt_matmul_d(ctx, false, false, N, in, out, 1.0f, dya, wa, ab_type_of(ctx), 0.0f, dx16, CUDA_R_16BF,
                         CUBLASLT_EPILOGUE_DEFAULT, NULL)) {
        ctx->stats.n_dx16_fused++;
        return;
    }
    const int R = scratch_out16_rows(N, in);
    const size_t elem = bf16 ? sizeof(uint16_t) : sizeof(float);  // dya's elements
    for (int r = 0; r < N; r += R) {
        const int rows = N - r < R ? N - r : R;
        gemm_prepared(ctx, false, false, rows, in, out, 1.0f, (const char *)dya + (size_t)r * out * elem, wa, 0.0f,
                      tmp);
        cuda_op_to_bf16(dx16 + (size_t)r * in, tmp, (size_t)rows * in, ctx->stream);
    }
    ctx->stats.n_dx16_separate++;
}

// dy as bf16 bits behind a ReLU: one pass masks them into a bf16 copy (the
// GEMMs' operand) and sums db (or, db NULL, a sum carved and dropped).
static CudaGemmOperand relu_bits_pass(CudaGemmCtx *ctx, TpCarver *cv, float **db, const uint16_t *dy16,
                                      const uint16_t *relu16, int N, int out) {
    uint16_t *masked = (uint16_t *)tp_carve(cv, (size_t)N * out * sizeof(uint16_t));
    float *sum = *db ? *db : (float *)tp_carve(cv, (size_t)out * sizeof(float));
    void *bias_scratch = tp_carve(cv, cuda_bias_bwd_scratch_bytes(N, out));
    cuda_op_bias_bwd_relu_x16_copy(sum, masked, dy16, relu16, N, out, bias_scratch, ctx->stream);
    if (*db) ctx->stats.n_bgrad_separate++;
    *db = NULL;  // done
    CudaGemmOperand o = {NULL, masked};
    return o;
}

// The two backward GEMMs and the bias gradient, dy an operand (fp32, or
// bf16 bits alone). relu16 (or NULL): dy is first masked by a ReLU's
// gradient (relu16 > 0 ? dy : 0), by the bias pass as it copies dy in
// bf16, else into fp32 scratch. dx16 (or NULL; dx then NULL, dx_mode
// GRAD_WRITE): dx stored as bf16 (dx16_gemm). db: the dW GEMM's BGRADB epilogue where
// cuBLASLt plans it (into scratch, then added: the epilogue overwrites),
// else a separate pass. The scratch was checked against `need` by the
// caller's size function.
static void linear_bwd_core(CudaGemmCtx *ctx, const char *op, float *dx, uint16_t *dx16, GradMode dx_mode,
                            float *dW, float *db, CudaGemmOperand dy, const uint16_t *relu16, CudaGemmOperand x,
                            CudaGemmOperand W, int N, int in, int out, void *scratch, size_t scratch_bytes,
                            size_t need, DreluOut *dr) {
    TP_CHECK(N >= 0 && in >= 0 && out >= 0, "%s: negative size N=%d in=%d out=%d", op, N, in, out);
    TP_CHECK(grad_mode_valid(dx_mode), "%s: unknown gradient mode %d", op, (int)dx_mode);
    if (N == 0) return;  // nothing to add to any gradient
    TP_CHECK(out == 0 || given(dy), "%s: dy is NULL", op);
    TP_CHECK(!(dx && dx16), "%s: give at most one of dx and dx16", op);
    TP_CHECK(!dx16 || dx_mode == GRAD_WRITE, "%s: dx16 is written (GRAD_WRITE), not accumulated", op);
    TP_CHECK(!(dx || dx16) || out == 0 || in == 0 || W.f32, "%s: dx wanted but W is NULL", op);
    TP_CHECK(!dW || out == 0 || in == 0 || given(x), "%s: dW wanted but x is NULL", op);
    const float dx_beta = dx_mode == GRAD_ADD ? 1.0f : 0.0f;
    if (out == 0) {  // dy W is an (N, in) zero matrix: a written dx becomes zeros, the rest is left as it is
        // (through a ReLU too: db_h gains zeros)
        if (dx) gemm_prepared(ctx, false, false, N, in, 0, 1.0f, NULL, NULL, dx_beta, dx);
        if (dx16 && in > 0) CUDA_CHECK(cudaMemsetAsync(dx16, 0, (size_t)N * in * sizeof(uint16_t), ctx->stream));
        return;
    }
    TpCarver cv = carver_of(scratch, scratch_bytes, need, op);
    const bool need_dy = (dx || dx16 || dW) && in > 0;
    const bool bf16 = ctx->precision == CUDA_GEMM_BF16;
    if (relu16 && !dy.f32) {  // bf16 bits behind a ReLU
        dy = relu_bits_pass(ctx, &cv, &db, dy.bf16, relu16, N, out);
        relu16 = NULL;
    }
    float *dx16_tmp = dx16 && in > 0 ? (float *)tp_carve(&cv, (size_t)scratch_out16_rows(N, in) * in * sizeof(float))
                                     : NULL;  // the fallback's fp32 row chunks
    if (dr && in > 0) {  // scratch_linear_bwd16_drelu's two
        dr->bgrad = (float *)tp_carve(&cv, (size_t)in * sizeof(float));
        dr->bias_scratch = tp_carve(&cv, cuda_bias_bwd_scratch_bytes(N, in));
    }
    const bool relu_in_pass = relu16 && bf16 && db && need_dy;  // the bias pass masks as it copies
    if (relu16 && !relu_in_pass) {  // the masked fp32 dy first (act_bwd_x16's values)
        TP_CHECK(dy.f32, "%s: a ReLU mask needs the fp32 dy", op);
        float *masked = (float *)tp_carve(&cv, (size_t)N * out * sizeof(float));
        cuda_op_act_bwd_x16(masked, GRAD_WRITE, dy.f32, relu16, (size_t)N * out, ACT_RELU, ctx->stream);
        dy = f32_operand(masked);
        relu16 = NULL;
    }
    const bool try_fused = db && dW && in > 0 && fuse_bgrad(ctx) && !relu_in_pass;
    float *bgrad = try_fused ? (float *)tp_carve(&cv, (size_t)out * sizeof(float)) : NULL;  // (out) epilogue output
    void *bias_scratch = db ? tp_carve(&cv, cuda_bias_bwd_scratch_bytes(N, out)) : NULL;
    const void *dya = NULL;
    bool db_done = false;
    if (need_dy && db && !try_fused && bf16 && !dy.bf16) {
        // the bias gradient's pass over dy also stores the GEMMs' bf16 copy of it (masked first behind a ReLU)
        uint16_t *copy = (uint16_t *)tp_carve(&cv, (size_t)N * out * sizeof(uint16_t));
        if (relu16) cuda_op_bias_bwd_relu_bf16_copy(db, copy, dy.f32, relu16, N, out, bias_scratch, ctx->stream);
        else cuda_op_bias_bwd_bf16_copy(db, copy, dy.f32, N, out, bias_scratch, ctx->stream);
        ctx->stats.n_bgrad_separate++;
        dya = copy;
        db_done = true;
    } else if (need_dy) {
        dya = operand(ctx, &cv, dy, (size_t)N * out);
    }
    if ((dx || dx16) && in > 0) {  // dx += dy W, or dx = dy W, or dx16 = bf16(dy W)
        const void *wa = operand(ctx, &cv, W, (size_t)out * in);
        if (dx16) dx16_gemm(ctx, dx16, dya, wa, dx16_tmp, N, in, out, dr);
        else gemm_prepared(ctx, false, false, N, in, out, 1.0f, dya, wa, dx_beta, dx);
    }
    bool fused = false;
    if (dW && in > 0) {  // dW += dy^T x, with db from the same pass (BGRADB sums dy, B_lt, over tokens)
        const void *xa = operand(ctx, &cv, x, (size_t)N * in);
        // straight into the fp32 gradient with beta 1; the plain one's algorithm timed once per shape (gemm_tune.cu)
        if (try_fused)
            fused = gemm_lt_matmul(ctx, true, false, out, in, N, 1.0f, dya, xa, ab_type_of(ctx), 1.0f, dW,
                                   CUBLASLT_EPILOGUE_BGRADB, bgrad);
        if (!fused) gemm_lt_matmul_dw(ctx, out, in, N, dya, xa, ab_type_of(ctx), dW);
    }
    if (db && !db_done) {
        if (fused) {
            launch_accumulate(ctx->stream, db, bgrad, (size_t)out);
            ctx->stats.n_bgrad_fused++;
        } else {
            bias_bwd_separate(ctx, db, dy, N, out, bias_scratch);
        }
    }
}

// dx (N, in), dW (out, in), db (out), each or NULL; dy (N, out), x (N, in), W (out, in).
// dx_mode GRAD_WRITE: the dx GEMM runs with beta = 0 (cuBLASLt does not read C).
extern "C" void cuda_op_linear_bwd(CudaGemmCtx *ctx, float *dx, GradMode dx_mode, float *dW, float *db,
                                   const float *dy, CudaGemmOperand x, CudaGemmOperand W, int N, int in, int out,
                                   void *scratch, size_t scratch_bytes) {
    const size_t need = N > 0 ? cuda_linear_bwd_scratch_bytes(ctx, dx != NULL, dW != NULL, db != NULL, N, in, out,
                                                              W.bf16 != NULL, bf16_only(x))
                              : 0;
    linear_bwd_core(ctx, "cuda_op_linear_bwd", dx, NULL, dx_mode, dW, db, f32_operand(dy), NULL, x, W, N, in, out,
                    scratch, scratch_bytes, need, NULL);
}

extern "C" size_t cuda_linear_bwd_relu_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dW, bool want_db,
                                                     int N, int in, int out, bool w_has_bf16) {
    return scratch_linear_bwd_relu(ctx->precision == CUDA_GEMM_BF16, fuse_bgrad(ctx), want_dx, want_dW, want_db, N,
                                   in, out, w_has_bf16);
}

extern "C" void cuda_op_linear_bwd_relu(CudaGemmCtx *ctx, float *dx, GradMode dx_mode, float *dW, float *db,
                                        const float *dy, const uint16_t *relu16, CudaGemmOperand x, CudaGemmOperand W,
                                        int N, int in, int out, void *scratch, size_t scratch_bytes) {
    TP_CHECK(relu16 || N <= 0 || out <= 0, "cuda_op_linear_bwd_relu: relu16 is NULL");
    const size_t need =
        N > 0 ? cuda_linear_bwd_relu_scratch_bytes(ctx, dx != NULL, dW != NULL, db != NULL, N, in, out, W.bf16 != NULL)
              : 0;
    linear_bwd_core(ctx, "cuda_op_linear_bwd_relu", dx, NULL, dx_mode, dW, db, f32_operand(dy), relu16, x, W, N, in,
                    out, scratch, scratch_bytes, need, NULL);
}

extern "C" void cuda_op_linear_bwd_dy16(CudaGemmCtx *ctx, float *dx, GradMode dx_mode, float *dW,
                                        const uint16_t *dy16, CudaGemmOperand x, CudaGemmOperand W, int N, int in,
                                        int out, void *scratch, size_t scratch_bytes) {
    const size_t need =
        N > 0 ? cuda_linear_bwd_dy16_scratch_bytes(ctx, dx != NULL, dW != NULL, N, in, out, W.bf16 != NULL) : 0;
    CudaGemmOperand dy = {NULL, dy16};
    linear_bwd_core(ctx, "cuda_op_linear_bwd_dy16", dx, NULL, dx_mode, dW, NULL, dy, NULL, x, W, N, in, out, scratch,
                    scratch_bytes, need, NULL);
}

extern "C" size_t cuda_linear_bwd16_scratch_bytes(const CudaGemmCtx *ctx, bool want_dx, bool want_dx16, bool want_dW,
                                                  bool want_db, int N, int in, int out, bool w_has_bf16,
                                                  bool x_bf16_only, bool dy_bf16_only, bool relu) {
    return scratch_linear_bwd16(ctx->precision == CUDA_GEMM_BF16, fuse_bgrad(ctx), want_dx, want_dx16, want_dW, want_db,
                                N, in, out, w_has_bf16, x_bf16_only, dy_bf16_only, relu);
}

extern "C" void cuda_op_linear_bwd16(CudaGemmCtx *ctx, float *dx, uint16_t *dx16, GradMode dx_mode, float *dW,
                                     float *db, CudaGemmOperand dy, const uint16_t *relu16, CudaGemmOperand x,
                                     CudaGemmOperand W, int N, int in, int out, void *scratch, size_t scratch_bytes) {
    const size_t need = N > 0 ? cuda_linear_bwd16_scratch_bytes(ctx, dx != NULL, dx16 != NULL, dW != NULL, db != NULL,
                                                                N, in, out, W.bf16 != NULL, bf16_only(x),
                                                                bf16_only(dy), relu16 != NULL)
                              : 0;
    linear_bwd_core(ctx, "cuda_op_linear_bwd16", dx, dx16, dx_mode, dW, db, dy, relu16, x, W, N, in, out, scratch,
                    scratch_bytes, need, NULL);
}

extern "C" void cuda_gemm_f32_to_bf16(cudaStream_t stream, uint16_t *dst, const float *src, size_t n_elems) {
    if (n_elems == 0) return;
    TP_CHECK(dst && src, "cuda_gemm_f32_to_bf16: NULL pointer");
    launch_f32_to_bf16(stream, dst, src, n_elems);
}

extern "C" size_t cuda_linear_bwd16_drelu_scratch_bytes(const CudaGemmCtx *ctx, bool want_dW, bool want_db, int N,
                                                        int in, int out, bool w_has_bf16, bool dy_bf16_only) {
    return scratch_linear_bwd16_drelu(ctx->precision == CUDA_GEMM_BF16, fuse_bgrad(ctx), want_dW, want_db, N, in, out,
                                      w_has_bf16, dy_bf16_only);
}

// ops_list.h's linear_bwd16_drelu: linear_bwd16's dx16 form whose dx16 GEMM
// takes the ReLU's gradient and db_h in its epilogue (dx16_gemm).
extern "C" void cuda_op_linear_bwd16_drelu(CudaGemmCtx *ctx, uint16_t *dh16, float *dW, float *db, float *db_h,
                                           CudaGemmOperand dy, const uint8_t *mask, const uint16_t *x16,
                                           CudaGemmOperand W, int N, int in, int out, void *scratch,
                                           size_t scratch_bytes) {
    const char *op = "cuda_op_linear_bwd16_drelu";
    TP_CHECK(N <= 0 || in <= 0 || (dh16 && db_h && mask && x16), "%s: NULL dh16, db_h, mask or x16", op);
    const size_t need = N > 0 ? cuda_linear_bwd16_drelu_scratch_bytes(ctx, dW != NULL, db != NULL, N, in, out,
                                                                      W.bf16 != NULL, bf16_only(dy))
                              : 0;
    DreluOut dr = {mask, db_h, x16, NULL, NULL};
    const CudaGemmOperand x = {NULL, x16};
    linear_bwd_core(ctx, op, NULL, dh16, GRAD_WRITE, dW, db, dy, NULL, x, W, N, in, out, scratch, scratch_bytes, need,
                    &dr);
}
