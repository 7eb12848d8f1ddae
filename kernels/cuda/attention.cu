// attention.cu: masked softmax and scaled dot-product attention.
//
// The CPU's three textbook steps per (batch, head), kept as separate kernels
// so each is easy to check against it (no flash attention yet):
//   S = q k^T into P, P = masked softmax(S / sqrt(D)) in place, out = P v;
// and for the backward dv += P^T dout, dS = dout v^T into scratch, the
// softmax backward in place, dq += dS k, dk += dS^T q.
//
// Every product is one batched kernel, bh_gemm_kernel, over strided views:
// element (r, c) of a per-(b, h) matrix X sits at
//   X.ptr + b*X.bs + h*X.hs + r*X.rs + c*X.cs,
// which covers heads side by side in (B, T, H*D) rows (rs = H*D, offset h*D),
// the (B, H, Tq, Tk) probability blocks, and transposes (swap rs and cs).
// It computes 32x32 output tiles with a (32, 8) block, staging 32x32 tiles of
// both operands in shared memory, loaded along whichever index has unit
// stride so global reads coalesce. Sums are fp32 in a fixed order.
//
// Softmax rows are one warp each. A key j of row (b, h, i) is valid when
// j < k_len[b] and, if causal, j <= i (the CPU's valid_keys): masked scores
// are never read, masked probabilities are written as exact zeros, and a
// row without a valid key is all zeros.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define SM_THREADS 256  // 8 warps = 8 rows per block
#define SM_ROWS_PER_BLOCK (SM_THREADS / TP_WARP)
#define GT 32           // output tile edge of bh_gemm_kernel (= blockDim.x)
#define GR 8            // thread rows of bh_gemm_kernel (= blockDim.y)

// ---- kernels ---------------------------------------------------------------------

// Number of valid keys of query row i: keys [0, n) are valid.
__device__ __forceinline__ int valid_keys(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && n > i + 1) n = i + 1;
    return n < 0 ? 0 : n;
}

// P[row] = masked softmax(scale * S[row]); one warp per row of Tk. P may be S.
__global__ void softmax_fwd_kernel(float *P,              // (B, H, Tq, Tk)
                                   const float *S,        // (B, H, Tq, Tk)
                                   const int32_t *k_len,  // (B)
                                   int H, int Tq, int Tk, size_t n_rows, float scale,
                                   bool causal) {
    const int lane = threadIdx.x % TP_WARP;
    for (size_t r = blockIdx.x * (size_t)SM_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; r < n_rows;
         r += (size_t)gridDim.x * SM_ROWS_PER_BLOCK) {
        const int i = (int)(r % Tq);
        const int b = (int)(r / ((size_t)H * Tq));
        const int n_valid = valid_keys(k_len[b], i, Tk, causal);
        const float *s = S + r * Tk;
        float *p = P + r * Tk;
        if (n_valid > 0) {
            // z = scale * s rounded alone (no FMA with - max), as on the CPU
            float max = -INFINITY;
            for (int j = lane; j < n_valid; j += TP_WARP) max = fmaxf(max, __fmul_rn(scale, s[j]));
            max = tp_warp_max(max);
            float sum = 0.0f;
            for (int j = lane; j < n_valid; j += TP_WARP) {
                float e = expf(__fmul_rn(scale, s[j]) - max);
                p[j] = e;  // each lane rewrites only the elements it read
                sum += e;
            }
            sum = tp_warp_sum(sum);
            const float inv_sum = 1.0f / sum;
            for (int j = lane; j < n_valid; j += TP_WARP) p[j] *= inv_sum;
        }
        for (int j = n_valid + lane; j < Tk; j += TP_WARP) p[j] = 0.0f;
    }
}

// v = scale * P * (dP - sum_j dP * P); dS += v (ACCUM) or dS = v. One warp per
// row. dS may be dP: each lane reads its elements before writing them.
template <bool ACCUM>
__global__ void softmax_bwd_kernel(float *dS,        // (n_rows, Tk)
                                   const float *dP,  // (n_rows, Tk)
                                   const float *P,   // (n_rows, Tk)
                                   int Tk, size_t n_rows, float scale) {
    const int lane = threadIdx.x % TP_WARP;
    for (size_t r = blockIdx.x * (size_t)SM_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; r < n_rows;
         r += (size_t)gridDim.x * SM_ROWS_PER_BLOCK) {
        const float *dp = dP + r * Tk;
        const float *p = P + r * Tk;
        float *ds = dS + r * Tk;
        float dot = 0.0f;
        for (int j = lane; j < Tk; j += TP_WARP) dot += dp[j] * p[j];
        dot = tp_warp_sum(dot);
        for (int j = lane; j < Tk; j += TP_WARP) {
            float v = scale * p[j] * (dp[j] - dot);
            if (ACCUM)
                ds[j] += v;
            else
                ds[j] = v;
        }
    }
}

// A strided per-(b, h) matrix view (see the top of the file).
struct MatView {
    const float *ptr;
    long long bs, hs, rs, cs;
};
struct OutView {
    float *ptr;
    long long bs, hs, rs, cs;
};

// tile[a][b] = X(r0 + a, c0 + b), zero outside (n_r, n_c); tile is GT x (GT+1).
__device__ __forceinline__ void load_tile(float (*tile)[GT + 1], const float *X, long long rs,
                                          long long cs, int r0, int c0, int n_r, int n_c) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    if (cs == 1) {  // consecutive threads read consecutive columns
        for (int a = ty; a < GT; a += GR) {
            int r = r0 + a, c = c0 + tx;
            tile[a][tx] = (r < n_r && c < n_c) ? X[r * rs + c] : 0.0f;
        }
    } else {        // consecutive threads read consecutive rows (unit rs or neither)
        for (int b = ty; b < GT; b += GR) {
            int r = r0 + tx, c = c0 + b;
            tile[tx][b] = (r < n_r && c < n_c) ? X[r * rs + c * cs] : 0.0f;
        }
    }
}

// For each z = b*H + h < BH: C(r, c) (+)= sum_k A(r, k) B(k, c), C (M, N),
// A (M, K), B (K, N). grid (ceil(N/GT), ceil(M/GT), <= BH), block (GT, GR);
// each thread owns column tx of rows ty, ty + GR, ty + 2GR, ty + 3GR.
__global__ void bh_gemm_kernel(OutView Cv, MatView Av, MatView Bv, int M, int N, int K, int H,
                               int BH, bool accumulate) {
    __shared__ float As[GT][GT + 1];  // As[r][k]
    __shared__ float Bs[GT][GT + 1];  // Bs[k][c]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int r0 = blockIdx.y * GT, c0 = blockIdx.x * GT;
    for (int z = blockIdx.z; z < BH; z += gridDim.z) {
        const int b = z / H, h = z % H;
        const float *A = Av.ptr + b * Av.bs + h * Av.hs;
        const float *Bm = Bv.ptr + b * Bv.bs + h * Bv.hs;
        float *C = Cv.ptr + b * Cv.bs + h * Cv.hs;
        float acc[GT / GR];
#pragma unroll
        for (int u = 0; u < GT / GR; u++) acc[u] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += GT) {
            load_tile(As, A, Av.rs, Av.cs, r0, k0, M, K);
            load_tile(Bs, Bm, Bv.rs, Bv.cs, k0, c0, K, N);
            __syncthreads();
#pragma unroll 8
            for (int kk = 0; kk < GT; kk++) {
                const float bv = Bs[kk][tx];
#pragma unroll
                for (int u = 0; u < GT / GR; u++) acc[u] = fmaf(As[ty + u * GR][kk], bv, acc[u]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int u = 0; u < GT / GR; u++) {
            const int r = r0 + ty + u * GR, c = c0 + tx;
            if (r < M && c < N) {
                float *out = C + r * Cv.rs + c * Cv.cs;
                *out = accumulate ? *out + acc[u] : acc[u];
            }
        }
    }
}

// ---- launchers ---------------------------------------------------------------------

static unsigned softmax_blocks(size_t n_rows) { return tp_grid_1d(n_rows, SM_ROWS_PER_BLOCK); }

static void softmax_fwd_launch(float *P, const float *S, const int32_t *k_len, int B, int H,
                               int Tq, int Tk, float scale, bool causal, cudaStream_t stream) {
    const size_t n_rows = (size_t)B * H * Tq;
    softmax_fwd_kernel<<<softmax_blocks(n_rows), SM_THREADS, 0, stream>>>(P, S, k_len, H, Tq, Tk,
                                                                         n_rows, scale, causal);
    CUDA_CHECK(cudaGetLastError());
}

static void softmax_bwd_launch(float *dS, const float *dP, const float *P, size_t n_rows, int Tk,
                               float scale, bool accumulate, cudaStream_t stream) {
    if (accumulate)
        softmax_bwd_kernel<true>
            <<<softmax_blocks(n_rows), SM_THREADS, 0, stream>>>(dS, dP, P, Tk, n_rows, scale);
    else
        softmax_bwd_kernel<false>
            <<<softmax_blocks(n_rows), SM_THREADS, 0, stream>>>(dS, dP, P, Tk, n_rows, scale);
    CUDA_CHECK(cudaGetLastError());
}

static void bh_gemm_launch(OutView C, MatView A, MatView B, int M, int N, int K, int H, int BH,
                           bool accumulate, cudaStream_t stream) {
    dim3 grid((N + GT - 1) / GT, (M + GT - 1) / GT, BH < 65535 ? BH : 65535);
    dim3 block(GT, GR);
    bh_gemm_kernel<<<grid, block, 0, stream>>>(C, A, B, M, N, K, H, BH, accumulate);
    CUDA_CHECK(cudaGetLastError());
}

// Views of the per-(b, h) matrices. Token rows (B, T, H*D): head h of batch
// b is a (T, D) matrix with row stride H*D; its transpose swaps rs and cs.
static MatView tokens(const float *x, int T, int H, int D) {
    MatView m = {x, (long long)T * H * D, D, (long long)H * D, 1};
    return m;
}
static MatView tokens_t(const float *x, int T, int H, int D) {
    MatView m = {x, (long long)T * H * D, D, 1, (long long)H * D};
    return m;
}
static OutView tokens_out(float *x, int T, int H, int D) {
    OutView m = {x, (long long)T * H * D, D, (long long)H * D, 1};
    return m;
}
// (B, H, Tq, Tk) blocks: (Tq, Tk) matrices, or their (Tk, Tq) transposes.
static MatView probs(const float *p, int H, int Tq, int Tk) {
    MatView m = {p, (long long)H * Tq * Tk, (long long)Tq * Tk, Tk, 1};
    return m;
}
static MatView probs_t(const float *p, int H, int Tq, int Tk) {
    MatView m = {p, (long long)H * Tq * Tk, (long long)Tq * Tk, 1, Tk};
    return m;
}
static OutView probs_out(float *p, int H, int Tq, int Tk) {
    OutView m = {p, (long long)H * Tq * Tk, (long long)Tq * Tk, Tk, 1};
    return m;
}

static void attention_fwd_launch(float *out, float *P, const float *q, const float *k,
                                 const float *v, const int32_t *k_len, int B, int H, int Tq,
                                 int Tk, int D, bool causal, cudaStream_t stream) {
    const int BH = B * H;
    const float scale = 1.0f / sqrtf((float)D);
    // P = q k^T: (Tq, D) x (D, Tk)
    bh_gemm_launch(probs_out(P, H, Tq, Tk), tokens(q, Tq, H, D), tokens_t(k, Tk, H, D), Tq, Tk, D,
                   H, BH, false, stream);
    softmax_fwd_launch(P, P, k_len, B, H, Tq, Tk, scale, causal, stream);
    // out = P v: (Tq, Tk) x (Tk, D)
    bh_gemm_launch(tokens_out(out, Tq, H, D), probs(P, H, Tq, Tk), tokens(v, Tk, H, D), Tq, D, Tk,
                   H, BH, false, stream);
}

static void attention_bwd_launch(float *dq, float *dk, float *dv, const float *dout,
                                 const float *P, const float *q, const float *k, const float *v,
                                 float *scratch, int B, int H, int Tq, int Tk, int D,
                                 cudaStream_t stream) {
    const int BH = B * H;
    const float scale = 1.0f / sqrtf((float)D);
    // dv += P^T dout: (Tk, Tq) x (Tq, D)
    bh_gemm_launch(tokens_out(dv, Tk, H, D), probs_t(P, H, Tq, Tk), tokens(dout, Tq, H, D), Tk, D,
                   Tq, H, BH, true, stream);
    // dP = dout v^T into scratch: (Tq, D) x (D, Tk)
    bh_gemm_launch(probs_out(scratch, H, Tq, Tk), tokens(dout, Tq, H, D), tokens_t(v, Tk, H, D),
                   Tq, Tk, D, H, BH, false, stream);
    // dS = scale * P * (dP - rowsum(dP * P)), in place
    softmax_bwd_launch(scratch, scratch, P, (size_t)BH * Tq, Tk, scale, false, stream);
    // dq += dS k: (Tq, Tk) x (Tk, D)
    bh_gemm_launch(tokens_out(dq, Tq, H, D), probs(scratch, H, Tq, Tk), tokens(k, Tk, H, D), Tq,
                   D, Tk, H, BH, true, stream);
    // dk += dS^T q: (Tk, Tq) x (Tq, D)
    bh_gemm_launch(tokens_out(dk, Tk, H, D), probs_t(scratch, H, Tq, Tk), tokens(q, Tq, H, D), Tk,
                   D, Tq, H, BH, true, stream);
}

// ---- exported ops ---------------------------------------------------------------------

static void check_dims(const char *op, int B, int H, int Tq, int Tk) {
    TP_NEED_SIZE(op, B);
    TP_NEED_SIZE(op, H);
    TP_NEED_SIZE(op, Tq);
    TP_NEED_SIZE(op, Tk);
}

extern "C" void cuda_op_softmax_fwd(float *P, const float *S, const int32_t *k_len, int B, int H,
                                    int Tq, int Tk, float scale, bool causal,
                                    cudaStream_t stream) {
    check_dims("cuda_op_softmax_fwd", B, H, Tq, Tk);
    if (B == 0 || H == 0 || Tq == 0 || Tk == 0) return;
    TP_NEED_PTR("cuda_op_softmax_fwd", P);
    TP_NEED_PTR("cuda_op_softmax_fwd", S);
    TP_NEED_PTR("cuda_op_softmax_fwd", k_len);
    softmax_fwd_launch(P, S, k_len, B, H, Tq, Tk, scale, causal, stream);
}

extern "C" void cuda_op_softmax_bwd(float *dS, const float *dP, const float *P, int B, int H,
                                    int Tq, int Tk, float scale, cudaStream_t stream) {
    check_dims("cuda_op_softmax_bwd", B, H, Tq, Tk);
    if (B == 0 || H == 0 || Tq == 0 || Tk == 0) return;
    TP_NEED_PTR("cuda_op_softmax_bwd", dS);
    TP_NEED_PTR("cuda_op_softmax_bwd", dP);
    TP_NEED_PTR("cuda_op_softmax_bwd", P);
    softmax_bwd_launch(dS, dP, P, (size_t)B * H * Tq, Tk, scale, true, stream);
}

// The bh_gemm grid holds at most 65535 row tiles and int offsets inside a
// (b, h) matrix; both are far beyond attention sizes.
static void check_attention(const char *op, int B, int H, int Tq, int Tk, int D) {
    check_dims(op, B, H, Tq, Tk);
    TP_NEED_SIZE(op, D);
    TP_CHECK((long long)B * H <= INT32_MAX && (long long)H * D <= INT32_MAX,
             "%s: B*H or H*D overflows int (B %d, H %d, D %d)", op, B, H, D);
    TP_CHECK(Tq <= 65535 * GT && Tk <= 65535 * GT, "%s: Tq = %d or Tk = %d too long", op, Tq,
             Tk);
}

extern "C" void cuda_op_attention_fwd(float *out, float *P, const float *q, const float *k,
                                      const float *v, const int32_t *k_len, int B, int H, int Tq,
                                      int Tk, int D, bool causal, cudaStream_t stream) {
    const char *op = "cuda_op_attention_fwd";
    check_attention(op, B, H, Tq, Tk, D);
    if (B == 0 || H == 0 || Tq == 0 || D == 0) return;
    TP_NEED_PTR(op, out);
    if (Tk == 0) {  // nothing to attend to: every output row is zero
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)B * Tq * H * D * sizeof(float), stream));
        return;
    }
    TP_NEED_PTR(op, P);
    TP_NEED_PTR(op, q);
    TP_NEED_PTR(op, k);
    TP_NEED_PTR(op, v);
    TP_NEED_PTR(op, k_len);
    attention_fwd_launch(out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal, stream);
}

extern "C" void cuda_op_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                      const float *P, const float *q, const float *k,
                                      const float *v, float *scratch, int B, int H, int Tq,
                                      int Tk, int D, cudaStream_t stream) {
    const char *op = "cuda_op_attention_bwd";
    check_attention(op, B, H, Tq, Tk, D);
    if (B == 0 || H == 0 || Tq == 0 || Tk == 0 || D == 0) return;
    TP_NEED_PTR(op, dq);
    TP_NEED_PTR(op, dk);
    TP_NEED_PTR(op, dv);
    TP_NEED_PTR(op, dout);
    TP_NEED_PTR(op, P);
    TP_NEED_PTR(op, q);
    TP_NEED_PTR(op, k);
    TP_NEED_PTR(op, v);
    TP_NEED_PTR(op, scratch);
    attention_bwd_launch(dq, dk, dv, dout, P, q, k, v, scratch, B, H, Tq, Tk, D, stream);
}
