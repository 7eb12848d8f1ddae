// attention_short.cu: attention without the probabilities (ops_list.h's
// attention_flash_fwd / attention_flash_bwd) for the short sequences of
// translation: a sentence of 10 to 60 tokens, at most CUDA_FLASH_SHORT_MAX_T.
//
// Why a second implementation: the tiled kernels (attention_flash.cu) cut
// queries and keys into tiles of 32 and run each (batch, head, tile) as a
// block that stages every product through shared memory (wmma fragments
// stored as fp32 tiles, the softmax read back from there) in two passes over
// the keys. For a 20-token sentence most of each 32 x 32 tile is padding and
// the staging is most of the work. Here one block holds a (batch, head)
// pair's whole K and V in shared memory, each warp owns 16 query rows (or,
// in the backward's second phase, 16 keys), and everything between the
// products stays in registers:
//   - the products are mma.sync m16n8k16 (bf16 in, fp32 accumulate; sm_80
//     and newer, which the build targets): keys in steps of 8, so a 20-key
//     sentence costs 24 columns, not 32;
//   - a row's scores all sit in its warp's accumulators (at most
//     CUDA_FLASH_SHORT_MAX_T / 8 fragments of 4), so the softmax is exact, not
//     online: the true maximum, the sum, lse, then p = exp(z - lse) rounded
//     to bf16, which is the contract's p bit for bit up to the order of the
//     sum (the tiled kernels rescale a running sum);
//   - an accumulator fragment of two adjacent 8-key tiles is, element for
//     element, the A operand of the next product (p V, ds K, p^T dout,
//     ds^T q), so p and ds never leave the registers;
//   - the backward is one block per (batch, head), no atomics: phase 1 (a
//     warp per 16 queries) rebuilds p and dp, writes delta and dq; phase 2
//     (a warp per 16 keys) rebuilds p^T and dp^T from K Q^T and V dout^T
//     with phase 1's delta, and writes dk and dv. Every result is a
//     function of the shapes alone, run after run.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t;
// A (16 x 16, row major) in 4 registers of 2 bf16: rows g, g+8, g, g+8,
// columns 2t (+1), 2t, 2t + 8, 2t + 8; B (16 x 8) in 2: rows (k) 2t (+1)
// and 2t + 8 (+1), column g; C (16 x 8 fp32): rows g (c0, c1) and g + 8
// (c2, c3), columns 2t and 2t + 1. A register's lower 16 bits hold the
// element of the lower column (A) or row (B).
//
// Precision: the contract's roundings with tp_bf16_bits (nearest even):
// dout to bf16 as it is staged, p and ds before their products, out as it
// is stored; z = scale * s rounded alone (__fmul_rn); ds = (scale * p) *
// (dp - delta) as the reference writes it. What differs from the reference
// is the order of the fp32 sums (tensor cores, then the four lanes of a
// row in a fixed butterfly) and the device's expf / logf, as for the tiled
// kernels; the op test holds both to the same tolerances.
//
// Shared memory (bf16 rows padded to D + 8: 16-byte aligned rows, and the
// 32-bit fragment loads of 8 rows at 4 words each fall in 32 distinct
// banks): forward K and V, 2 Tk' (D + 8) * 2 bytes with Tk' = Tk rounded
// up to 16 (36,864 at Tk = 128, D = 64); backward Q, dout, K and V plus a
// row's lse and delta, 2 (Tq' + Tk') (D + 8) * 2 + 8 Tq' bytes (74,752 at
// 128 and 64; 140,288 at 128 and 128, which an H100 or H200 grants and a
// smaller device may not: then the tiled kernels run).
#include <cuda_bf16.h>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "attention_flash.cuh"

namespace {

constexpr int SW = 4;  // warps per block
constexpr int STHREADS = SW * TP_WARP;

__host__ __device__ constexpr int round16(int x) { return (x + 15) / 16 * 16; }

// ---- fragments ------------------------------------------------------------------------------

// c += a b, one m16n8k16 product on the tensor cores.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as the bf16 pair of one register (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    return (uint32_t)tp_bf16_bits(lo) | ((uint32_t)tp_bf16_bits(hi) << 16);
}

__device__ __forceinline__ uint32_t ld_pair(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// The A operand of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major
// bf16 array X (row pitch ld).
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const uint16_t *X, int ld, int r0, int k0) {
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
    const uint16_t *lo = X + (r0 + g) * ld + k0 + 2 * t, *hi = lo + 8 * ld;
    a[0] = ld_pair(lo);
    a[1] = ld_pair(hi);
    a[2] = ld_pair(lo + 8);
    a[3] = ld_pair(hi + 8);
}

// The B operand B(k, n) = X(n0 + n, k0 + k): X's rows are B's columns (K
// for q k^T, Q for k q^T, V for dout v^T): two 32-bit loads.
__device__ __forceinline__ void frag_b_rows(uint32_t &b0, uint32_t &b1, const uint16_t *X, int ld, int n0, int k0) {
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
    const uint16_t *p = X + (n0 + g) * ld + k0 + 2 * t;
    b0 = ld_pair(p);
    b1 = ld_pair(p + 8);
}

// The B operand B(k, n) = X(k0 + k, n0 + n): X's rows are B's rows (V for
// p v, K for ds k, dout and Q for the key-side products): the pair of a
// register lies in two rows, so four 16-bit loads (rows 2t apart by lane:
// distinct banks).
__device__ __forceinline__ void frag_b_cols(uint32_t &b0, uint32_t &b1, const uint16_t *X, int ld, int k0, int n0) {
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
    const uint16_t *p = X + (k0 + 2 * t) * ld + n0 + g;
    b0 = (uint32_t)p[0] | ((uint32_t)p[ld] << 16);
    b1 = (uint32_t)p[8 * ld] | ((uint32_t)p[9 * ld] << 16);
}

// The A operand of an m16n8k16 product from the accumulators of two
// adjacent 8-column tiles x[2c] and x[2c + 1] (C's layout is A's, half by
// half), rounded to bf16.
__device__ __forceinline__ void frag_a_from_acc(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

// A row's value over the four lanes that hold it (a fixed butterfly).
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(TP_FULL_MASK, x, 1);
    return x + __shfl_xor_sync(TP_FULL_MASK, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(TP_FULL_MASK, x, 1));
    return fmaxf(x, __shfl_xor_sync(TP_FULL_MASK, x, 2));
}

// ---- staging ----------------------------------------------------------------------------------

// Rows [0, Tp) of a head's (T, D) slice (row t at src + t * HD) into a
// (Tp, D + 8) bf16 array; rows at or past T zeros (a padded key's K and V
// rows must be finite: its p is 0, and 0 * NaN is not).
template <int D>
__device__ void stage_bf16(uint16_t *X, const uint16_t *src, long long HD, int T, int Tp) {
    constexpr int LD = D + 8, VEC = 8, PER_ROW = D / VEC;
    const bool aligned = ((uintptr_t)src & 15) == 0 && (HD % VEC) == 0;
    for (int e = threadIdx.x; e < Tp * PER_ROW; e += STHREADS) {
        const int r = e / PER_ROW, c = (e % PER_ROW) * VEC;
        uint16_t *dst = X + r * LD + c;
        if (r >= T) {
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        } else if (aligned) {
            *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src + r * HD + c);
        } else {
            for (int v = 0; v < VEC; v++) dst[v] = src[r * HD + c + v];
        }
    }
}

// The same from fp32 (dout), each value rounded to bf16 as it is staged.
template <int D>
__device__ void stage_f32(uint16_t *X, const float *src, long long HD, int T, int Tp) {
    constexpr int LD = D + 8;
    for (int e = threadIdx.x; e < Tp * D; e += STHREADS) {
        const int r = e / D, c = e % D;
        X[r * LD + c] = r < T ? tp_bf16_bits(src[r * HD + c]) : 0;
    }
}

// An fp32 gradient element: added, or written as 0 + v (the bits of adding
// into zeros, as the tiled kernels and the reference give them).
__device__ __forceinline__ void grad_store(float *p, float v, bool add) { *p = add ? *p + v : 0.0f + v; }

// Rows r0 + g and r0 + g + 8 (those below T) of a (16, D) result held as
// D / 8 accumulator tiles, into a head's slice (row t at dst + t * HD).
template <int D>
__device__ void store_rows_f32(float *dst, long long HD, const float (&acc)[D / 8][4], int r0, int T, bool add) {
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + g + 8 * h;
        if (r >= T) continue;
        float *row = dst + r * HD + 2 * t;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            grad_store(row + dt * 8, acc[dt][2 * h], add);
            grad_store(row + dt * 8 + 1, acc[dt][2 * h + 1], add);
        }
    }
}

// ---- forward ----------------------------------------------------------------------------------

size_t fwd_smem(int D, int Tk) { return (size_t)2 * round16(Tk) * (D + 8) * sizeof(uint16_t); }

// One warp's 16 query rows [i0, i0 + 16): scores against every key chunk
// that a row of the tile may see, the exact softmax, out = bf16(p) V.
// C: the 16-key chunks the registers hold (Tk <= 16 C).
template <int D, int C>
__device__ void fwd_rows(const FlashArgs &a, const uint16_t *Ks, const uint16_t *Vs, const uint16_t *qb,
                         uint16_t *ob, float *lse_b, int i0, int klen) {
    constexpr int LD = D + 8;
    const long long HD = (long long)a.H * D;
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
    const int rows[2] = {i0 + g, i0 + g + 8};
    int n[2];
#pragma unroll
    for (int h = 0; h < 2; h++) n[h] = rows[h] < a.Tq ? flash_valid_keys(klen, rows[h], a.Tk, a.causal) : 0;
    int kend = klen < a.Tk ? klen : a.Tk;
    if (a.causal && kend > i0 + 16) kend = i0 + 16;
    const int cend = kend <= 0 ? 0 : (kend + 15) / 16;  // chunks any row of the tile sees

    float s[2 * C][4];
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {  // s = q k^T; q's fragments straight from global memory
        uint32_t qa[4];
        const uint16_t *lo = qb + (long long)rows[0] * HD + kk * 16 + 2 * t, *hi = lo + 8 * HD;
        qa[0] = rows[0] < a.Tq ? ld_pair(lo) : 0u;
        qa[1] = rows[1] < a.Tq ? ld_pair(hi) : 0u;
        qa[2] = rows[0] < a.Tq ? ld_pair(lo + 8) : 0u;
        qa[3] = rows[1] < a.Tq ? ld_pair(hi + 8) : 0u;
#pragma unroll
        for (int nt = 0; nt < 2 * C; nt++) {
            if (nt / 2 >= cend) continue;
            uint32_t b0, b1;
            frag_b_rows(b0, b1, Ks, LD, nt * 8, kk * 16);
            mma_bf16(s[nt], qa, b0, b1);
        }
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, lse[2];
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            s[nt][e] = j < n[h] ? __fmul_rn(a.scale, s[nt][e]) : -INFINITY;
            m[h] = fmaxf(m[h], s[nt][e]);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) m[h] = quad_max(m[h]);
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            if (j < n[h]) l[h] += expf(s[nt][e] - m[h]);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] = quad_sum(l[h]);
        lse[h] = n[h] > 0 ? m[h] + logf(l[h]) : -INFINITY;
    }
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            s[nt][e] = j < n[h] ? expf(s[nt][e] - lse[h]) : 0.0f;  // p
        }

    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++) {  // out = bf16(p) V
        if (c >= cend) continue;
        uint32_t pa[4];
        frag_a_from_acc(pa, s[2 * c], s[2 * c + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            uint32_t b0, b1;
            frag_b_cols(b0, b1, Vs, LD, c * 16, dt * 8);
            mma_bf16(o[dt], pa, b0, b1);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = rows[h];
        if (r >= a.Tq) continue;
        uint16_t *row = ob + (long long)r * HD + 2 * t;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            *reinterpret_cast<uint32_t *>(row + dt * 8) = pack_bf16(o[dt][2 * h], o[dt][2 * h + 1]);
        if (t == 0) lse_b[r] = lse[h];
    }
}

// A block per (head, batch): K and V staged once, each warp its query tiles.
template <int D, int C>
__global__ void __launch_bounds__(STHREADS) short_fwd_kernel(FlashArgs a, uint16_t *out16, float *lse) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int LD = D + 8;
    const int Tkp = round16(a.Tk);
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + Tkp * LD;
    const long long HD = (long long)a.H * D;
    const int h = blockIdx.x, w = threadIdx.x / TP_WARP;
    for (int b = blockIdx.y; b < a.B; b += gridDim.y) {
        const long long qoff = (long long)b * a.Tq * HD + (long long)h * D;
        const long long koff = (long long)b * a.Tk * HD + (long long)h * D;
        stage_bf16<D>(Ks, a.k + koff, HD, a.Tk, Tkp);
        stage_bf16<D>(Vs, a.v + koff, HD, a.Tk, Tkp);
        __syncthreads();
        const int klen = a.k_len[b];
        for (int i0 = w * 16; i0 < a.Tq; i0 += SW * 16)
            fwd_rows<D, C>(a, Ks, Vs, a.q + qoff, out16 + qoff, lse + ((long long)b * a.H + h) * a.Tq, i0, klen);
        __syncthreads();  // the next batch's K and V overwrite shared memory
    }
}

// ---- backward ---------------------------------------------------------------------------------

size_t bwd_smem(int D, int Tq, int Tk) {
    return (size_t)2 * (round16(Tq) + round16(Tk)) * (D + 8) * sizeof(uint16_t) + 2 * (size_t)round16(Tq) * sizeof(float);
}

// Shared memory of the backward block: Q and G (bf16 dout) rows, K and V
// rows, each query row's lse and delta.
struct BwdSmem {
    const uint16_t *Qs, *Gs, *Ks, *Vs;
    const float *lse_s;
    float *delta_s;
};

// Phase 1, one warp's query rows [i0, i0 + 16): s = q k^T and dp = g v^T,
// p from lse, delta = sum_j p dp (to delta_s and delta_b), ds, dq (+)= bf16(ds) K.
template <int D, int C>
__device__ void bwd_query_rows(const FlashArgs &a, const BwdSmem &sm, float *delta_b, float *dqb, int i0, int klen,
                               bool add) {
    constexpr int LD = D + 8;
    const long long HD = (long long)a.H * D;
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
    const int rows[2] = {i0 + g, i0 + g + 8};
    int n[2];
#pragma unroll
    for (int h = 0; h < 2; h++) n[h] = rows[h] < a.Tq ? flash_valid_keys(klen, rows[h], a.Tk, a.causal) : 0;
    int kend = klen < a.Tk ? klen : a.Tk;
    if (a.causal && kend > i0 + 16) kend = i0 + 16;
    const int cend = kend <= 0 ? 0 : (kend + 15) / 16;

    float s[2 * C][4], dp[2 * C][4];
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t qa[4], ga[4];
        frag_a(qa, sm.Qs, LD, i0, kk * 16);
        frag_a(ga, sm.Gs, LD, i0, kk * 16);
#pragma unroll
        for (int nt = 0; nt < 2 * C; nt++) {
            if (nt / 2 >= cend) continue;
            uint32_t b0, b1;
            frag_b_rows(b0, b1, sm.Ks, LD, nt * 8, kk * 16);
            mma_bf16(s[nt], qa, b0, b1);
            frag_b_rows(b0, b1, sm.Vs, LD, nt * 8, kk * 16);
            mma_bf16(dp[nt], ga, b0, b1);
        }
    }
    float lse[2], delta[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++) lse[h] = sm.lse_s[rows[h]];
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            s[nt][e] = j < n[h] ? expf(__fmul_rn(a.scale, s[nt][e]) - lse[h]) : 0.0f;  // p
            delta[h] += s[nt][e] * dp[nt][e];
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        delta[h] = quad_sum(delta[h]);
        if (t == 0) {
            sm.delta_s[rows[h]] = delta[h];  // rows past Tq: 0, never read
            if (rows[h] < a.Tq) delta_b[rows[h]] = delta[h];
        }
    }
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            dp[nt][e] = j < n[h] ? __fmul_rn(a.scale, s[nt][e]) * (dp[nt][e] - delta[h]) : 0.0f;  // ds
        }
    float acc[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++) {  // dq = bf16(ds) K
        if (c >= cend) continue;
        uint32_t da[4];
        frag_a_from_acc(da, dp[2 * c], dp[2 * c + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            uint32_t b0, b1;
            frag_b_cols(b0, b1, sm.Ks, LD, c * 16, dt * 8);
            mma_bf16(acc[dt], da, b0, b1);
        }
    }
    store_rows_f32<D>(dqb, HD, acc, i0, a.Tq, add);
}

// Phase 2, one warp's keys [j0, j0 + 16): s^T = k q^T and dp^T = v g^T over
// the query chunks that may see them, p^T and ds^T with phase 1's lse and
// delta, dv (+)= bf16(p^T) G and dk (+)= bf16(ds^T) Q. A padding key's p is
// 0 for every query: its dk and dv rows come out zeros.
template <int D, int C>
__device__ void bwd_key_rows(const FlashArgs &a, const BwdSmem &sm, float *dkb, float *dvb, int j0, int klen,
                             bool add) {
    constexpr int LD = D + 8;
    const long long HD = (long long)a.H * D;
    const int lane = threadIdx.x % TP_WARP, g = lane >> 2, t = lane & 3;
    const int keys[2] = {j0 + g, j0 + g + 8};
    // queries before j0 see none of these keys under the causal mask
    const int cbeg = a.causal ? j0 / 16 : 0, cend = j0 < klen ? (a.Tq + 15) / 16 : 0;

    float s[2 * C][4], dp[2 * C][4];
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t ka[4], va[4];
        frag_a(ka, sm.Ks, LD, j0, kk * 16);
        frag_a(va, sm.Vs, LD, j0, kk * 16);
#pragma unroll
        for (int nt = 0; nt < 2 * C; nt++) {
            if (nt / 2 < cbeg || nt / 2 >= cend) continue;
            uint32_t b0, b1;
            frag_b_rows(b0, b1, sm.Qs, LD, nt * 8, kk * 16);
            mma_bf16(s[nt], ka, b0, b1);
            frag_b_rows(b0, b1, sm.Gs, LD, nt * 8, kk * 16);
            mma_bf16(dp[nt], va, b0, b1);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 2 * C; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = keys[e / 2], i = nt * 8 + 2 * t + (e & 1);
            const bool ok = nt / 2 >= cbeg && nt / 2 < cend && i < a.Tq &&
                            j < flash_valid_keys(klen, i, a.Tk, a.causal);
            const float p = ok ? expf(__fmul_rn(a.scale, s[nt][e]) - sm.lse_s[i]) : 0.0f;
            dp[nt][e] = ok ? __fmul_rn(a.scale, p) * (dp[nt][e] - sm.delta_s[i]) : 0.0f;  // ds^T
            s[nt][e] = p;                                                             // p^T
        }
    float dv_acc[D / 8][4], dk_acc[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dv_acc[dt][e] = dk_acc[dt][e] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (c < cbeg || c >= cend) continue;
        uint32_t pa[4], da[4];
        frag_a_from_acc(pa, s[2 * c], s[2 * c + 1]);
        frag_a_from_acc(da, dp[2 * c], dp[2 * c + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            uint32_t b0, b1;
            frag_b_cols(b0, b1, sm.Gs, LD, c * 16, dt * 8);
            mma_bf16(dv_acc[dt], pa, b0, b1);
            frag_b_cols(b0, b1, sm.Qs, LD, c * 16, dt * 8);
            mma_bf16(dk_acc[dt], da, b0, b1);
        }
    }
    store_rows_f32<D>(dvb, HD, dv_acc, j0, a.Tk, add);
    store_rows_f32<D>(dkb, HD, dk_acc, j0, a.Tk, add);
}

template <int D, int C>
__global__ void __launch_bounds__(STHREADS) short_bwd_kernel(FlashArgs a, const float *dout, const float *lse,
                                                             float *delta, float *dq, float *dk, float *dv, bool add) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int LD = D + 8;
    const int Tqp = round16(a.Tq), Tkp = round16(a.Tk);
    uint16_t *Qs = (uint16_t *)smem, *Gs = Qs + Tqp * LD, *Ks = Gs + Tqp * LD, *Vs = Ks + Tkp * LD;
    float *lse_s = (float *)(Vs + Tkp * LD), *delta_s = lse_s + Tqp;
    const BwdSmem sm = {Qs, Gs, Ks, Vs, lse_s, delta_s};
    const long long HD = (long long)a.H * D;
    const int h = blockIdx.x, w = threadIdx.x / TP_WARP;
    for (int b = blockIdx.y; b < a.B; b += gridDim.y) {
        const long long qoff = (long long)b * a.Tq * HD + (long long)h * D;
        const long long koff = (long long)b * a.Tk * HD + (long long)h * D;
        const long long loff = ((long long)b * a.H + h) * a.Tq;
        stage_bf16<D>(Qs, a.q + qoff, HD, a.Tq, Tqp);
        stage_f32<D>(Gs, dout + qoff, HD, a.Tq, Tqp);
        stage_bf16<D>(Ks, a.k + koff, HD, a.Tk, Tkp);
        stage_bf16<D>(Vs, a.v + koff, HD, a.Tk, Tkp);
        for (int r = threadIdx.x; r < Tqp; r += STHREADS) lse_s[r] = r < a.Tq ? lse[loff + r] : -INFINITY;
        __syncthreads();
        const int klen = a.k_len[b];
        for (int i0 = w * 16; i0 < a.Tq; i0 += SW * 16)
            bwd_query_rows<D, C>(a, sm, delta + loff, dq + qoff, i0, klen, add);
        __syncthreads();  // every row's delta in delta_s
        for (int j0 = w * 16; j0 < a.Tk; j0 += SW * 16)
            bwd_key_rows<D, C>(a, sm, dk + koff, dv + koff, j0, klen, add);
        __syncthreads();  // the next batch's rows overwrite shared memory
    }
}

// ---- launchers --------------------------------------------------------------------------------

dim3 short_grid(const FlashArgs &a) { return dim3((unsigned)a.H, (unsigned)(a.B < 65535 ? a.B : 65535)); }

// Whether this shape, these operands and this device suit the kernels.
bool short_fits(const FlashArgs &a, int D, size_t smem, const void *const *ptrs, int n_ptrs) {
    if (a.Tq > CUDA_FLASH_SHORT_MAX_T || a.Tk > CUDA_FLASH_SHORT_MAX_T || a.Tq <= 0 || a.Tk <= 0) return false;
    if (D != 16 && D != 32 && D != 64 && D != 128) return false;
    for (int i = 0; i < n_ptrs; i++)
        if (((uintptr_t)ptrs[i] & 3) != 0) return false;
    const int limit = tp_smem_optin_limit();
    return limit > 0 && smem <= (size_t)limit;
}

template <int D, int C>
void fwd_launch(const FlashArgs &a, uint16_t *out16, float *lse, size_t smem, cudaStream_t stream) {
    tp_smem_optin(short_fwd_kernel<D, C>, smem, "op_attention_flash_fwd");
    short_fwd_kernel<D, C><<<short_grid(a), STHREADS, smem, stream>>>(a, out16, lse);
    CUDA_CHECK(cudaGetLastError());
}

template <int D, int C>
void bwd_launch(const FlashArgs &a, float *dq, float *dk, float *dv, bool add, const float *dout, const float *lse,
                float *delta, size_t smem, cudaStream_t stream) {
    tp_smem_optin(short_bwd_kernel<D, C>, smem, "op_attention_flash_bwd");
    short_bwd_kernel<D, C><<<short_grid(a), STHREADS, smem, stream>>>(a, dout, lse, delta, dq, dk, dv, add);
    CUDA_CHECK(cudaGetLastError());
}

// The instantiation for a head width and a longest sequence: registers for
// 64 keys (C = 4) where that suffices, else CUDA_FLASH_SHORT_MAX_T (C = 8).
static_assert(CUDA_FLASH_SHORT_MAX_T == 128, "C = 8 chunks of 16 cover the longest sequence");
#define SHORT_BY_SHAPE(D, T, CALL)                              \
    do {                                                        \
        const bool c4 = (T) <= 64;                              \
        switch (D) {                                            \
        case 16: c4 ? CALL(16, 4) : CALL(16, 8); break;         \
        case 32: c4 ? CALL(32, 4) : CALL(32, 8); break;         \
        case 64: c4 ? CALL(64, 4) : CALL(64, 8); break;         \
        default: c4 ? CALL(128, 4) : CALL(128, 8); break;       \
        }                                                       \
    } while (0)

}  // namespace

bool flash_short_fwd(const FlashArgs &a, int D, uint16_t *out16, float *lse, cudaStream_t stream) {
    const size_t smem = fwd_smem(D, a.Tk);
    const void *ptrs[] = {a.q, out16};  // fragments read and stored 32 bits at a time
    if (!short_fits(a, D, smem, ptrs, 2)) return false;
#define SHORT_FWD(DD, CC) fwd_launch<DD, CC>(a, out16, lse, smem, stream)
    SHORT_BY_SHAPE(D, a.Tk, SHORT_FWD);
#undef SHORT_FWD
    return true;
}

bool flash_short_bwd(const FlashArgs &a, int D, float *dq, float *dk, float *dv, bool add, const float *dout,
                     const float *lse, float *delta, cudaStream_t stream) {
    const size_t smem = bwd_smem(D, a.Tq, a.Tk);
    if (!short_fits(a, D, smem, NULL, 0)) return false;
    const int T = a.Tq > a.Tk ? a.Tq : a.Tk;
#define SHORT_BWD(DD, CC) bwd_launch<DD, CC>(a, dq, dk, dv, add, dout, lse, delta, smem, stream)
    SHORT_BY_SHAPE(D, T, SHORT_BWD);
#undef SHORT_BWD
    return true;
}
