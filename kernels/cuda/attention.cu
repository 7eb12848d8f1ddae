// attention.cu: masked softmax and scaled dot-product attention.
//
// The CPU's three textbook steps per (batch, head), kept as separate kernels
// so each is easy to check against it (no flash attention yet):
//   S = q k^T into P, P = masked softmax(S / sqrt(D)) in place, out = P v;
// and for the backward dv += P^T dout, dS = dout v^T into scratch, the
// softmax backward in place, dq += dS k, dk += dS^T q (GRAD_WRITE: dv, dq
// and dk stored, as C = acc, never read; every row is a product's row, so a
// padding key's dk and dv rows are written, zeros from its zero P column;
// or, bf16 mode's q, k, v gradients, stored as tp_bf16_bits(acc): the same
// products, only the store narrows).
//
// Every product is one batched kernel, bh_gemm_kernel, over strided views:
// element (r, c) of a per-(b, h) matrix X sits at
//   X.ptr + b*X.bs + h*X.hs + r*X.rs + c*X.cs,
// which covers heads side by side in (B, T, H*D) rows (rs = H*D, offset h*D),
// the (B, H, Tq, Tk) probability blocks, and transposes (swap rs and cs).
// It computes 32x32 output tiles with a (32, 8) block, staging 32x32 tiles of
// both operands in shared memory, loaded along whichever index has unit
// stride so global reads coalesce. Sums are fp32 in a fixed order.
// The _x16 ops read q, k and v as bf16 bits through the same kernels
// (templated on the element type), widened as they are loaded: the same
// fp32 arithmetic on the widened values, so the same bits.
//
// Softmax rows are one warp each. A key j of row (b, h, i) is valid when
// j < k_len[b] and, if causal, j <= i (the CPU's valid_keys): masked scores
// are never read, masked probabilities are written as exact zeros, and a
// row without a valid key is all zeros.
//
// Those are the general path. Translation batches are short (tens of tokens),
// and there the general path is all overhead: 32x32 tiles mostly padding,
// and every intermediate going through global memory between five or six
// launches. So when one (b, h) pair's operands fit in shared memory
// (attn_fused_*_smem_bytes within the device's per-block limit), one fused
// kernel per direction does the whole pair in a block: its q, k, v (and
// dout, P) rows are read once (P twice in the backward), the products and the softmax run out of
// shared memory, and only P and the results go back. Their products are
// register-tiled (attn_tile.h: 4 x 4 outputs a thread, each operand value
// loaded from shared memory once per tile), yet each element is
// computed by the same expression in the same order as on the general path
// (fmaf along the reduced index from 0, the warp-per-row softmax), so the
// two paths agree bit for bit: test_backend_ops checks that on a GPU
// (cuda_attention_set_fused). Shapes too big for shared memory (long
// decoding contexts, long sentences in backward) take the general path.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "attn_tile.h"

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

// One softmax row, by one warp (lane = its lane): p[j] = softmax(scale * s)
// over the n_valid first keys, exact zeros after them; all zeros when
// n_valid is 0. p may be s: each lane rewrites only the elements it read.
__device__ __forceinline__ void softmax_row_fwd(float *p, const float *s, int n_valid, int Tk, float scale,
                                                int lane) {
    if (n_valid > 0) {
        // z = scale * s rounded alone (no FMA with - max), as on the CPU
        float max = -INFINITY;
        for (int j = lane; j < n_valid; j += TP_WARP) max = fmaxf(max, __fmul_rn(scale, s[j]));
        max = tp_warp_max(max);
        float sum = 0.0f;
        for (int j = lane; j < n_valid; j += TP_WARP) {
            float e = expf(__fmul_rn(scale, s[j]) - max);
            p[j] = e;
            sum += e;
        }
        sum = tp_warp_sum(sum);
        const float inv_sum = 1.0f / sum;
        for (int j = lane; j < n_valid; j += TP_WARP) p[j] *= inv_sum;
    }
    for (int j = n_valid + lane; j < Tk; j += TP_WARP) p[j] = 0.0f;
}

// One softmax-backward row, by one warp: v = scale * p * (dp - sum_j dp * p);
// ds += v (ACCUM) or ds = v. ds may be dp: each lane reads its elements
// before writing them.
template <bool ACCUM>
__device__ __forceinline__ void softmax_row_bwd(float *ds, const float *dp, const float *p, int Tk, float scale,
                                                int lane) {
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
        softmax_row_fwd(P + r * Tk, S + r * Tk, valid_keys(k_len[b], i, Tk, causal), Tk, scale, lane);
    }
}

// dS (+)= scale * P * (dP - sum_j dP * P), one warp per row. dS may be dP.
template <bool ACCUM>
__global__ void softmax_bwd_kernel(float *dS,        // (n_rows, Tk)
                                   const float *dP,  // (n_rows, Tk)
                                   const float *P,   // (n_rows, Tk)
                                   int Tk, size_t n_rows, float scale) {
    const int lane = threadIdx.x % TP_WARP;
    for (size_t r = blockIdx.x * (size_t)SM_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; r < n_rows;
         r += (size_t)gridDim.x * SM_ROWS_PER_BLOCK)
        softmax_row_bwd<ACCUM>(dS + r * Tk, dP + r * Tk, P + r * Tk, Tk, scale, lane);
}

// (ld_in, cuda_kernel_util.cuh: the _x16 ops read q, k, v as bf16; every
// product and sum stays fp32.)

// A strided per-(b, h) matrix view (see the top of the file), of fp32 or
// bf16 elements.
template <typename T>
struct MatViewT {
    const T *ptr;
    long long bs, hs, rs, cs;
};
typedef MatViewT<float> MatView;
struct OutView {
    float *ptr;
    long long bs, hs, rs, cs;
    uint16_t *ptr16;  // instead of ptr: stored as bf16 bits (never accumulated)
};

// tile[a][b] = X(r0 + a, c0 + b), zero outside (n_r, n_c); tile is GT x (GT+1).
template <typename T>
__device__ __forceinline__ void load_tile(float (*tile)[GT + 1], const T *X, long long rs,
                                          long long cs, int r0, int c0, int n_r, int n_c) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    if (cs == 1) {  // consecutive threads read consecutive columns
        for (int a = ty; a < GT; a += GR) {
            int r = r0 + a, c = c0 + tx;
            tile[a][tx] = (r < n_r && c < n_c) ? ld_in(X, r * rs + c) : 0.0f;
        }
    } else {        // consecutive threads read consecutive rows (unit rs or neither)
        for (int b = ty; b < GT; b += GR) {
            int r = r0 + tx, c = c0 + b;
            tile[tx][b] = (r < n_r && c < n_c) ? ld_in(X, r * rs + c * cs) : 0.0f;
        }
    }
}

// For each z = b*H + h < BH: C(r, c) (+)= sum_k A(r, k) B(k, c), C (M, N),
// A (M, K), B (K, N). grid (ceil(N/GT), ceil(M/GT), <= BH), block (GT, GR);
// each thread owns column tx of rows ty, ty + GR, ty + 2GR, ty + 3GR.
template <typename TA, typename TB>
__global__ void bh_gemm_kernel(OutView Cv, MatViewT<TA> Av, MatViewT<TB> Bv, int M, int N, int K, int H,
                               int BH, bool accumulate) {
    __shared__ float As[GT][GT + 1];  // As[r][k]
    __shared__ float Bs[GT][GT + 1];  // Bs[k][c]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int r0 = blockIdx.y * GT, c0 = blockIdx.x * GT;
    for (int z = blockIdx.z; z < BH; z += gridDim.z) {
        const int b = z / H, h = z % H;
        const TA *A = Av.ptr + b * Av.bs + h * Av.hs;
        const TB *Bm = Bv.ptr + b * Bv.bs + h * Bv.hs;
        const long long c_at = b * Cv.bs + h * Cv.hs;
        float acc[GT / GR];
#pragma unroll
        for (int u = 0; u < GT / GR; u++) acc[u] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += GT) {
            load_tile<TA>(As, A, Av.rs, Av.cs, r0, k0, M, K);
            load_tile<TB>(Bs, Bm, Bv.rs, Bv.cs, k0, c0, K, N);
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
                const long long at = c_at + r * Cv.rs + c * Cv.cs;
                if (Cv.ptr16) {
                    Cv.ptr16[at] = tp_bf16_bits(acc[u]);
                    continue;
                }
                float *out = Cv.ptr + at;
                *out = accumulate ? *out + acc[u] : acc[u];
            }
        }
    }
}

// The backward's gradients dq, dk, dv (index 0, 1, 2): fp32 (f), or as
// their bf16 rounding (h, ops_list.h's dq16, dk16, dv16; GRAD_WRITE only),
// each store then tp_bf16_bits of the value the fp32 form stores.
struct AttnGradOut {
    float *f[3];
    uint16_t *h[3];
};

// Product p stores gradient i of g at element `at` on: fp32, or bf16 bits.
__device__ __forceinline__ void att_grad_into(AttProduct *p, const AttnGradOut &g, int i, size_t at) {
    if (g.h[i]) p->C16 = g.h[i] + at;
    else p->C = g.f[i] + at;
}

// ---- fused kernels: one (b, h) pair per block, out of shared memory -------------------
// The products are attn_tile.h's register-tiled loops (4 x 4 outputs per
// thread), the softmax rows the general path's, warp by warp.

#define FUSED_THREADS ATT_THREADS             // 8 warps: softmax rows go warp by warp
#define FUSED_WARPS (FUSED_THREADS / TP_WARP)
#define FUSED_MIN_BLOCKS 4                    // per SM: caps registers at 64 a thread

// Rows [0, n) of one head of a (B, T, H*D) tensor (row stride HD, from row
// pointer x) into dst (row stride ld), read along d so the block coalesces:
// four floats a load when D % 4 == 0 and x is 16-byte aligned (then so is
// every row, HD being a multiple of 4), one otherwise.
__device__ __forceinline__ void fused_load_rows(float *dst, int ld, const float *x, long long HD, int n, int D) {
    if ((D & 3) == 0 && ((uintptr_t)x & 15) == 0) {
        const int D4 = D / 4;
        for (int e = threadIdx.x; e < n * D4; e += blockDim.x) {
            const int r = e / D4, d = (e % D4) * 4;
            const float4 v4 = *(const float4 *)(x + r * HD + d);
            float *o = dst + r * ld + d;
            o[0] = v4.x;
            o[1] = v4.y;
            o[2] = v4.z;
            o[3] = v4.w;
        }
        return;
    }
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        dst[r * ld + d] = x[r * HD + d];
    }
}

// The same from bf16 bits, widened as they land: four a load (8 bytes)
// when D % 4 == 0 and x is 8-byte aligned, one otherwise.
__device__ __forceinline__ void fused_load_rows(float *dst, int ld, const uint16_t *x, long long HD, int n, int D) {
    if ((D & 3) == 0 && ((uintptr_t)x & 7) == 0) {
        const int D4 = D / 4;
        for (int e = threadIdx.x; e < n * D4; e += blockDim.x) {
            const int r = e / D4, d = (e % D4) * 4;
            const uint2 w = *(const uint2 *)(x + r * HD + d);
            float *o = dst + r * ld + d;
            o[0] = __uint_as_float(w.x << 16);
            o[1] = __uint_as_float(w.x & 0xffff0000u);
            o[2] = __uint_as_float(w.y << 16);
            o[3] = __uint_as_float(w.y & 0xffff0000u);
        }
        return;
    }
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        dst[r * ld + d] = ld_in(x, r * HD + d);
    }
}

// The forward of pair z = b*H + h per block (grid-stride over pairs); shared
// memory as att_fwd_smem lays it out: K, V, a query tile and its scores.
template <typename T>
__global__ void __launch_bounds__(FUSED_THREADS, FUSED_MIN_BLOCKS)
attn_fused_fwd_kernel(float *out, uint16_t *out16, float *P, const T *q, const T *k, const T *v,
                      const int32_t *k_len, int B, int H, int Tq, int Tk, int D, bool causal, float scale) {
    extern __shared__ float smem[];
    const AttFwdSmem s = att_fwd_smem(smem, Tk, D);
    const int tid = threadIdx.x, warp = tid / TP_WARP, lane = tid % TP_WARP;
    const long long HD = (long long)H * D;
    for (long long z = blockIdx.x; z < (long long)B * H; z += gridDim.x) {
        const int b = (int)(z / H), h = (int)(z % H);
        const size_t head = (size_t)h * D;
        __syncthreads();  // the last pair is done with shared memory
        fused_load_rows(s.K, s.ld_d, k + (size_t)b * Tk * HD + head, HD, Tk, D);
        const bool pv_wanted = out || out16;  // neither: P alone
        if (pv_wanted) fused_load_rows(s.V, D, v + (size_t)b * Tk * HD + head, HD, Tk, D);
        const int klen = k_len[b];
        for (int i0 = 0; i0 < Tq; i0 += ATT_QROWS) {
            const int nq = Tq - i0 < ATT_QROWS ? Tq - i0 : ATT_QROWS;
            __syncthreads();  // the last tile is done with Q and S
            fused_load_rows(s.Q, s.ld_d, q + ((size_t)b * Tq + i0) * HD + head, HD, nq, D);
            __syncthreads();
            const AttProduct scores = att_fwd_scores(&s, nq, Tk, D);  // S = q k^T
            att_run(&scores, tid);
            __syncthreads();
            for (int i = warp; i < nq; i += FUSED_WARPS) {  // P = softmax, in place, and saved
                float *srow = s.S + i * s.ld_s;
                softmax_row_fwd(srow, srow, valid_keys(klen, i0 + i, Tk, causal), Tk, scale, lane);
                __syncwarp();
                float *prow = P + ((size_t)z * Tq + i0 + i) * Tk;
                for (int j = lane; j < Tk; j += TP_WARP) prow[j] = srow[j];
            }
            __syncthreads();
            if (!pv_wanted) continue;
            const size_t at = ((size_t)b * Tq + i0) * HD + head;
            AttProduct pv = att_fwd_out(&s, out ? out + at : NULL, HD, nq, Tk, D);
            if (out16) pv.C16 = out16 + at;
            att_run(&pv, tid);  // out = P v
        }
    }
}

// The backward of pair z per block; shared memory as att_bwd_smem lays it
// out, X (Tq rows), W (Tk rows) and Y (Tq x Tk) each reused once: dout, v
// and P first (dv += P^T dout, then dP = dout v^T into Y), then the softmax
// backward turns Y into dS in place, reading P from global memory, while q
// and k replace dout and v (dq += dS k and dk += dS^T q). accumulate 0
// (GRAD_WRITE): dv, dq and dk stored instead of added to, or with g.h
// stored as bf16 bits (att_grad_into).
template <typename T>
__global__ void __launch_bounds__(FUSED_THREADS, FUSED_MIN_BLOCKS)
attn_fused_bwd_kernel(AttnGradOut g, const float *dout, const float *P, const T *q, const T *k, const T *v, int B,
                      int H, int Tq, int Tk, int D, float scale, int accumulate) {
    extern __shared__ float smem[];
    const AttBwdSmem s = att_bwd_smem(smem, Tq, Tk, D);
    const int tid = threadIdx.x, warp = tid / TP_WARP, lane = tid % TP_WARP;
    const long long HD = (long long)H * D;
    for (long long z = blockIdx.x; z < (long long)B * H; z += gridDim.x) {
        const int b = (int)(z / H), h = (int)(z % H);
        const size_t head = (size_t)h * D, qrow0 = (size_t)b * Tq * HD + head, krow0 = (size_t)b * Tk * HD + head;
        const float *pz = P + (size_t)z * Tq * Tk;
        __syncthreads();  // the last pair is done with shared memory
        fused_load_rows(s.X, s.ld_d, dout + qrow0, HD, Tq, D);
        fused_load_rows(s.W, s.ld_d, v + krow0, HD, Tk, D);
        for (int e = tid; e < Tq * Tk; e += FUSED_THREADS) s.Y[(e / Tk) * s.ld_s + e % Tk] = pz[e];
        __syncthreads();
        AttProduct pdv = att_bwd_dv(&s, NULL, HD, accumulate, Tq, Tk, D);
        att_grad_into(&pdv, g, 2, krow0);
        att_run(&pdv, tid);  // dv (+)= P^T dout
        __syncthreads();
        const AttProduct pdp = att_bwd_dp(&s, Tq, Tk, D);
        att_run(&pdp, tid);  // dP = dout v^T
        __syncthreads();
        for (int i = warp; i < Tq; i += FUSED_WARPS)  // dS = softmax backward, in place
            softmax_row_bwd<false>(s.Y + i * s.ld_s, s.Y + i * s.ld_s, pz + (size_t)i * Tk, Tk, scale, lane);
        fused_load_rows(s.X, s.ld_d, q + qrow0, HD, Tq, D);
        fused_load_rows(s.W, s.ld_d, k + krow0, HD, Tk, D);
        __syncthreads();
        AttProduct pdq = att_bwd_dq(&s, NULL, HD, accumulate, Tq, Tk, D);
        att_grad_into(&pdq, g, 0, qrow0);
        att_run(&pdq, tid);  // dq (+)= dS k
        AttProduct pdk = att_bwd_dk(&s, NULL, HD, accumulate, Tq, Tk, D);
        att_grad_into(&pdk, g, 1, krow0);
        att_run(&pdk, tid);  // dk (+)= dS^T q, on the threads dq leaves idle
    }
}

// ---- launchers ---------------------------------------------------------------------

// ---- the fused path's shared memory ------------------------------------------------

static size_t attn_fused_fwd_smem_bytes(int Tk, int D) { return sizeof(float) * att_fwd_smem_floats(Tk, D); }
static size_t attn_fused_bwd_smem_bytes(int Tq, int Tk, int D) {
    return sizeof(float) * att_bwd_smem_floats(Tq, Tk, D);
}

static bool g_fused_on = true;  // cuda_attention_set_fused: the tests' switch

extern "C" void cuda_attention_set_fused(bool on) { g_fused_on = on; }

// Whether a block may have smem_bytes of dynamic shared memory on this device.
static bool fused_fits(size_t smem_bytes) {
    return g_fused_on && smem_optin_value(smem_bytes, tp_smem_optin_limit()) >= 0;
}

template <typename Kernel, typename... Args>
static void fused_launch(Kernel kernel, size_t smem_bytes, int BH, cudaStream_t stream, Args... args) {
    tp_smem_optin(kernel, smem_bytes, "fused attention");  // above 48 KiB: the device's whole limit, every time
    const unsigned grid = BH < (1 << 20) ? (unsigned)BH : (1u << 20);
    kernel<<<grid, FUSED_THREADS, smem_bytes, stream>>>(args...);
    CUDA_CHECK(cudaGetLastError());
}


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

template <typename TA, typename TB>
static void bh_gemm_launch(OutView C, MatViewT<TA> A, MatViewT<TB> B, int M, int N, int K, int H, int BH,
                           bool accumulate, cudaStream_t stream) {
    dim3 grid((N + GT - 1) / GT, (M + GT - 1) / GT, BH < 65535 ? BH : 65535);
    dim3 block(GT, GR);
    bh_gemm_kernel<TA, TB><<<grid, block, 0, stream>>>(C, A, B, M, N, K, H, BH, accumulate);
    CUDA_CHECK(cudaGetLastError());
}

// Views of the per-(b, h) matrices. Token rows (B, T, H*D): head h of batch
// b is a (T, D) matrix with row stride H*D; its transpose swaps rs and cs.
template <typename T>
static MatViewT<T> tokens(const T *x, int Tn, int H, int D) {
    MatViewT<T> m = {x, (long long)Tn * H * D, D, (long long)H * D, 1};
    return m;
}
template <typename T>
static MatViewT<T> tokens_t(const T *x, int Tn, int H, int D) {
    MatViewT<T> m = {x, (long long)Tn * H * D, D, 1, (long long)H * D};
    return m;
}
static OutView tokens_out16(uint16_t *x, int T, int H, int D) {
    OutView m = {NULL, (long long)T * H * D, D, (long long)H * D, 1, x};
    return m;
}
static OutView tokens_out(float *x, int T, int H, int D) {
    OutView m = {x, (long long)T * H * D, D, (long long)H * D, 1, NULL};
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
    OutView m = {p, (long long)H * Tq * Tk, (long long)Tq * Tk, Tk, 1, NULL};
    return m;
}

// The dropout of attention_drop_* on the probabilities: the forward's room
// for the dropped P (the backward's is its scratch), the mask's window and
// key. NULL: none; a dropout always takes the general path (the fused
// kernels hold no mask), through dropout.cu's window op.
struct AttnDrop {
    float *Pd;  // (B, H, Tq, Tk)
    uint64_t first, ld;
    float p;
    uint64_t seed, stream_id;
    const StepVars *step;
};

static void drop_probs(const AttnDrop *d, float *Pd, const float *P, int B, int H, int Tq, int Tk,
                       cudaStream_t stream) {
    cuda_op_dropout_fwd_win(Pd, P, (size_t)B, (size_t)H * Tq * Tk, d->ld, d->first, d->p, d->seed, d->stream_id,
                            d->step, stream);
}

template <typename T>
static void attention_fwd_launch(float *out, uint16_t *out16, float *P, const T *q, const T *k,
                                 const T *v, const int32_t *k_len, int B, int H, int Tq,
                                 int Tk, int D, bool causal, const AttnDrop *drop, cudaStream_t stream) {
    const int BH = B * H;
    const float scale = 1.0f / sqrtf((float)D);
    if (!drop && fused_fits(attn_fused_fwd_smem_bytes(Tk, D))) {
        fused_launch(attn_fused_fwd_kernel<T>, attn_fused_fwd_smem_bytes(Tk, D), BH, stream, out, out16, P, q, k, v,
                     k_len, B, H, Tq, Tk, D, causal, scale);
        return;
    }
    // P = q k^T: (Tq, D) x (D, Tk)
    bh_gemm_launch(probs_out(P, H, Tq, Tk), tokens(q, Tq, H, D), tokens_t(k, Tk, H, D), Tq, Tk, D,
                   H, BH, false, stream);
    softmax_fwd_launch(P, P, k_len, B, H, Tq, Tk, scale, causal, stream);
    if (!out && !out16) return;  // P alone
    if (drop) drop_probs(drop, drop->Pd, P, B, H, Tq, Tk, stream);
    // out = P v (or the dropped P): (Tq, Tk) x (Tk, D)
    bh_gemm_launch(out ? tokens_out(out, Tq, H, D) : tokens_out16(out16, Tq, H, D),
                   probs(drop ? drop->Pd : P, H, Tq, Tk), tokens(v, Tk, H, D), Tq, D, Tk, H, BH, false, stream);
}

// Gradient i of g as a product's output view: fp32, or bf16 bits.
static OutView grad_out(const AttnGradOut &g, int i, int T, int H, int D) {
    return g.h[i] ? tokens_out16(g.h[i], T, H, D) : tokens_out(g.f[i], T, H, D);
}

template <typename T>
static void attention_bwd_launch(const AttnGradOut &g, const float *dout, const float *P, const T *q, const T *k,
                                 const T *v, float *scratch, int B, int H, int Tq, int Tk, int D, bool accumulate,
                                 const AttnDrop *drop, cudaStream_t stream) {
    const int BH = B * H;
    const float scale = 1.0f / sqrtf((float)D);
    if (!drop && fused_fits(attn_fused_bwd_smem_bytes(Tq, Tk, D))) {
        fused_launch(attn_fused_bwd_kernel<T>, attn_fused_bwd_smem_bytes(Tq, Tk, D), BH, stream, g, dout, P, q, k, v,
                     B, H, Tq, Tk, D, scale, (int)accumulate);
        return;
    }
    // dv (+)= P^T dout (the dropped P, rebuilt in scratch): (Tk, Tq) x (Tq, D)
    if (drop) drop_probs(drop, scratch, P, B, H, Tq, Tk, stream);
    bh_gemm_launch(grad_out(g, 2, Tk, H, D), probs_t(drop ? scratch : P, H, Tq, Tk), tokens(dout, Tq, H, D), Tk, D,
                   Tq, H, BH, accumulate, stream);
    // dP = dout v^T into scratch: (Tq, D) x (D, Tk), through the mask
    bh_gemm_launch(probs_out(scratch, H, Tq, Tk), tokens(dout, Tq, H, D), tokens_t(v, Tk, H, D),
                   Tq, Tk, D, H, BH, false, stream);
    if (drop)
        cuda_op_dropout_bwd_win(scratch, GRAD_WRITE, scratch, (size_t)B, (size_t)H * Tq * Tk, drop->ld, drop->first,
                                drop->p, drop->seed, drop->stream_id, drop->step, stream);
    // dS = scale * P * (dP - rowsum(dP * P)), in place
    softmax_bwd_launch(scratch, scratch, P, (size_t)BH * Tq, Tk, scale, false, stream);
    // dq (+)= dS k: (Tq, Tk) x (Tk, D)
    bh_gemm_launch(grad_out(g, 0, Tq, H, D), probs(scratch, H, Tq, Tk), tokens(k, Tk, H, D), Tq, D, Tk, H, BH,
                   accumulate, stream);
    // dk (+)= dS^T q: (Tk, Tq) x (Tq, D)
    bh_gemm_launch(grad_out(g, 1, Tk, H, D), probs_t(scratch, H, Tq, Tk), tokens(q, Tq, H, D), Tk, D, Tq, H, BH,
                   accumulate, stream);
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

template <typename T>
static void attention_fwd_op(const char *op, float *out, uint16_t *out16, float *P, const T *q, const T *k,
                             const T *v, const int32_t *k_len, int B, int H, int Tq, int Tk, int D, bool causal,
                             const AttnDrop *drop, cudaStream_t stream) {
    check_attention(op, B, H, Tq, Tk, D);
    TP_CHECK(!(out && out16), "%s: give at most one of out and out16", op);
    if (B == 0 || H == 0 || Tq == 0 || D == 0) return;
    if (Tk == 0) {  // nothing to attend to: every output row is zero (bf16 zeros are zero bits too)
        const size_t n = (size_t)B * Tq * H * D;
        if (out) CUDA_CHECK(cudaMemsetAsync(out, 0, n * sizeof(float), stream));
        if (out16) CUDA_CHECK(cudaMemsetAsync(out16, 0, n * sizeof(uint16_t), stream));
        return;
    }
    TP_NEED_PTR(op, P);
    TP_NEED_PTR(op, q);
    TP_NEED_PTR(op, k);
    TP_NEED_PTR(op, v);
    TP_NEED_PTR(op, k_len);
    if (drop && (out || out16)) TP_NEED_PTR(op, drop->Pd);
    attention_fwd_launch<T>(out, out16, P, q, k, v, k_len, B, H, Tq, Tk, D, causal, drop, stream);
}

extern "C" void cuda_op_attention_fwd(float *out, float *P, const float *q, const float *k,
                                      const float *v, const int32_t *k_len, int B, int H, int Tq,
                                      int Tk, int D, bool causal, cudaStream_t stream) {
    attention_fwd_op("cuda_op_attention_fwd", out, (uint16_t *)NULL, P, q, k, v, k_len, B, H, Tq, Tk, D, causal,
                     (const AttnDrop *)NULL, stream);
}

extern "C" void cuda_op_attention_fwd_x16(float *out, uint16_t *out16, float *P, const uint16_t *q16,
                                          const uint16_t *k16, const uint16_t *v16, const int32_t *k_len, int B,
                                          int H, int Tq, int Tk, int D, bool causal, cudaStream_t stream) {
    attention_fwd_op("cuda_op_attention_fwd_x16", out, out16, P, q16, k16, v16, k_len, B, H, Tq, Tk, D, causal,
                     (const AttnDrop *)NULL, stream);
}

// The pair of gradient sets (ops_list.h: fp32 dq, dk, dv or bf16 dq16,
// dk16, dv16, the bf16 one when any of its pointers is given), checked.
static AttnGradOut attn_grads(const char *op, GradMode mode, float *dq, float *dk, float *dv, uint16_t *dq16,
                              uint16_t *dk16, uint16_t *dv16) {
    attn_grads_bf16(op, mode, dq, dk, dv, dq16, dk16, dv16);
    AttnGradOut g = {{dq, dk, dv}, {dq16, dk16, dv16}};
    return g;
}
static const char *const k_grad_names[3][2] = {{"dq", "dq16"}, {"dk", "dk16"}, {"dv", "dv16"}};
static bool grads16(const AttnGradOut &g) { return g.h[0] || g.h[1] || g.h[2]; }

// Gradient i of g given (in the set chosen).
static void need_grad(const char *op, const AttnGradOut &g, int i) {
    const bool h = grads16(g);
    TP_CHECK(h ? g.h[i] != NULL : g.f[i] != NULL, "%s: %s is NULL", op, k_grad_names[i][h]);
}

// GRAD_WRITE with Tq or Tk 0: no product runs, and the gradients it would
// have written are zeros (the CPU's; bf16 zeros are zero bits too).
static void attention_bwd_empty(const char *op, const AttnGradOut &g, int B, int H, int Tq, int Tk, int D,
                                cudaStream_t stream) {
    const size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * H * D;
    const size_t elem = grads16(g) ? sizeof(uint16_t) : sizeof(float);
    for (int i = 0; i < 3; i++) {
        const size_t n = i == 0 ? (Tk == 0 ? nq : 0) : (Tq == 0 ? nk : 0);
        if (!n) continue;
        need_grad(op, g, i);
        void *p = g.h[i] ? (void *)g.h[i] : (void *)g.f[i];
        CUDA_CHECK(cudaMemsetAsync(p, 0, n * elem, stream));
    }
}

template <typename T>
static void attention_bwd_op(const char *op, const AttnGradOut &g, GradMode mode, const float *dout, const float *P,
                             const T *q, const T *k, const T *v, float *scratch, int B, int H, int Tq, int Tk, int D,
                             const AttnDrop *drop, cudaStream_t stream) {
    TP_CHECK(grad_mode_valid(mode), "%s: unknown gradient mode %d", op, (int)mode);
    check_attention(op, B, H, Tq, Tk, D);
    if (B == 0 || H == 0 || D == 0) return;
    if (Tq == 0 || Tk == 0) {  // added: nothing; written: zeros
        if (mode == GRAD_WRITE) attention_bwd_empty(op, g, B, H, Tq, Tk, D, stream);
        return;
    }
    for (int i = 0; i < 3; i++) need_grad(op, g, i);
    TP_NEED_PTR(op, dout);
    TP_NEED_PTR(op, P);
    TP_NEED_PTR(op, q);
    TP_NEED_PTR(op, k);
    TP_NEED_PTR(op, v);
    TP_NEED_PTR(op, scratch);
    attention_bwd_launch<T>(g, dout, P, q, k, v, scratch, B, H, Tq, Tk, D, mode == GRAD_ADD, drop, stream);
}

extern "C" void cuda_op_attention_bwd(float *dq, float *dk, float *dv, GradMode mode, const float *dout,
                                      const float *P, const float *q, const float *k,
                                      const float *v, float *scratch, int B, int H, int Tq,
                                      int Tk, int D, cudaStream_t stream) {
    static const char op[] = "cuda_op_attention_bwd";
    attention_bwd_op(op, attn_grads(op, mode, dq, dk, dv, NULL, NULL, NULL), mode, dout, P, q, k, v, scratch, B, H, Tq,
                     Tk, D, (const AttnDrop *)NULL, stream);
}

extern "C" void cuda_op_attention_bwd_x16(float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                          uint16_t *dv16, GradMode mode, const float *dout, const float *P,
                                          const uint16_t *q16, const uint16_t *k16, const uint16_t *v16,
                                          float *scratch, int B, int H, int Tq, int Tk, int D, cudaStream_t stream) {
    static const char op[] = "cuda_op_attention_bwd_x16";
    attention_bwd_op(op, attn_grads(op, mode, dq, dk, dv, dq16, dk16, dv16), mode, dout, P, q16, k16, v16, scratch, B,
                     H, Tq, Tk, D, (const AttnDrop *)NULL, stream);
}

// ---- attention with dropout on the probabilities ---------------------------------

// The dropout of a p > 0 (else NULL: the plain ops' path, bit for bit).
static const AttnDrop *attn_drop(AttnDrop *d, const char *op, float *Pd, uint64_t first, uint64_t ld, float p,
                                 uint64_t seed, uint64_t stream_id, const StepVars *step) {
    TP_CHECK(p >= 0.0f && p < 1.0f, "%s: p = %g outside [0, 1)", op, (double)p);
    *d = AttnDrop{Pd, first, ld, p, seed, stream_id, step};
    return p > 0.0f ? d : NULL;
}

static void need_one_set(const char *op, const float *q, const uint16_t *q16) {
    TP_CHECK((q != NULL) != (q16 != NULL), "%s: give q, k, v as fp32 or as bf16, exactly one of them", op);
}

extern "C" void cuda_op_attention_drop_fwd(float *out, uint16_t *out16, float *P, float *Pd, const float *q,
                                           const float *k, const float *v, const uint16_t *q16, const uint16_t *k16,
                                           const uint16_t *v16, const int32_t *k_len, int B, int H, int Tq, int Tk,
                                           int D, bool causal, uint64_t first, uint64_t ld, float p, uint64_t seed,
                                           uint64_t stream_id, const StepVars *step, cudaStream_t stream) {
    static const char op[] = "cuda_op_attention_drop_fwd";
    need_one_set(op, q, q16);
    AttnDrop d;
    const AttnDrop *drop = attn_drop(&d, op, Pd, first, ld, p, seed, stream_id, step);
    if (q16) attention_fwd_op(op, out, out16, P, q16, k16, v16, k_len, B, H, Tq, Tk, D, causal, drop, stream);
    else attention_fwd_op(op, out, out16, P, q, k, v, k_len, B, H, Tq, Tk, D, causal, drop, stream);
}

extern "C" void cuda_op_attention_drop_bwd(float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                           uint16_t *dv16, GradMode mode, const float *dout, const float *P,
                                           const float *q, const float *k, const float *v, const uint16_t *q16,
                                           const uint16_t *k16, const uint16_t *v16, float *scratch, int B, int H,
                                           int Tq, int Tk, int D, uint64_t first, uint64_t ld, float p, uint64_t seed,
                                           uint64_t stream_id, const StepVars *step, cudaStream_t stream) {
    static const char op[] = "cuda_op_attention_drop_bwd";
    need_one_set(op, q, q16);
    const AttnGradOut g = attn_grads(op, mode, dq, dk, dv, dq16, dk16, dv16);
    AttnDrop d;
    const AttnDrop *drop = attn_drop(&d, op, scratch, first, ld, p, seed, stream_id, step);
    if (q16) attention_bwd_op(op, g, mode, dout, P, q16, k16, v16, scratch, B, H, Tq, Tk, D, drop, stream);
    else attention_bwd_op(op, g, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D, drop, stream);
}
