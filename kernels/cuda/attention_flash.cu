// attention_flash.cu: attention without the probabilities (ops_list.h's
// attention_flash_fwd / attention_flash_bwd), on tensor cores: the ops'
// entry points, and the tiled kernels that serve any length. With
// TPTRAIN_FLASH_KERNEL=short (cuda_ops.h) the entry points first offer the
// call to the short-sequence kernels (attention_short.cu: a block per
// sentence and head, for sequences of at most 128), which take the shapes
// they serve; every other call runs the tiled kernels below.
//
// Tiles of 32 query rows x 32 keys, a block of 4 warps per (batch, head,
// tile). Every product is nvcuda::wmma 16x16x16 on bf16 operands staged in
// shared memory with fp32 accumulation; the transposes come from the
// operands' layouts (K read as col_major gives K^T, P and dS read as
// col_major give P^T and dS^T). The elementwise work (masks, exponentials,
// row sums) runs on the fp32 tiles the products store to shared memory,
// each warp owning 8 rows of the tile, so every row sum has one fixed
// order: lanes over 32 keys (a butterfly), then tiles in order.
//
// Forward, per query tile, in two passes over the key tiles: the first
// finds each row's maximum and sum (a running maximum; lse = m + log l),
// the second rebuilds the normalised p = exp(z - lse), rounds it to bf16
// and multiplies it with V, so the output's accumulators never need
// rescaling and stay in registers across key tiles. Only out (bf16) and
// lse leave the block.
//
// Backward, two kernels and no atomics (the results are a function of the
// shapes alone, run after run):
//   dq:    per query tile, pass 1 over the key tiles for delta = sum_j p dp
//          (written to scratch), pass 2 for dq += bf16(ds) K;
//   dk dv: per key tile, over the query tiles (their lse and delta read
//          back): dv += bf16(p)^T bf16(dout), dk += bf16(ds)^T q.
// Causal masks and k_len bound the tile loops: a tile with no valid key
// is skipped (a key tile past k_len still writes its zero dk, dv rows).
//
// Precision: the contract's roundings, bit for bit the CPU reference's
// (tp_bf16_bits, nearest-even): p and ds to bf16 before their products,
// dout to bf16 as it is staged, out (and in bf16 mode dq, dk, dv: the
// dq16, dk16, dv16 set) to bf16 as it is stored; z = scale * s
// rounded alone (__fmul_rn, no FMA). What differs from the reference is
// only the order of the fp32 sums (tensor cores, lane butterflies), the
// running maximum behind lse, and the device's expf / logf: a few ulp,
// which may flip a bf16 rounding of p, ds or out near a tie.
//
// Shared memory per block (bytes; padded rows, see Geo): forward 21,120 at
// D = 64 and 33,408 at D = 128; dq 30,464 and 46,848; dk dv 33,024 and
// 49,408 (the one above the default 48 KiB, opted in at launch).
#include <mma.h>
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "attention_flash.cuh"

using namespace nvcuda;

namespace {

constexpr int FT = 32;          // tile rows (queries) and columns (keys)
constexpr int FW = 4;           // warps per block
constexpr int FTHREADS = FW * TP_WARP;
constexpr int ROWS_PER_WARP = FT / FW;
constexpr int LDS = FT + 4;     // fp32 score tiles' leading dimension
constexpr int LDP = FT + 8;     // bf16 probability tiles' leading dimension

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

// A head's tile geometry: D its width, LD the bf16 row pitch in shared
// memory (padded by 8: rows stay 16-byte aligned, banks shift per row).
template <int D>
struct Geo {
    static constexpr int LD = D + 8;
    static constexpr int TILE = FT * LD;              // bf16 elements of a (32, D) tile
    static constexpr int LDO = D + 4;                 // fp32 staging of a (32, D) result
    static constexpr int NF = 2 * (D / 16);           // 16x16 fragments of a (32, D) result
    static constexpr int NF_WARP = (NF + FW - 1) / FW;
    // wmma: ldm a multiple of 8 bf16 / 4 floats, fragment starts 32-byte
    // aligned (a 16-row step, a 16-column step, a whole tile), and the
    // fp32 staging of a result fits in the two bf16 tiles it reuses.
    static_assert(D % 16 == 0 && D >= 16 && D <= 128, "head width");
    static_assert(LD % 8 == 0 && (16 * LD * 2) % 32 == 0 && (TILE * 2) % 32 == 0, "bf16 tile layout");
    static_assert(LDO % 4 == 0 && (16 * LDO * 4) % 32 == 0, "fp32 staging layout");
    static_assert(FT * LDO * 4 <= 2 * TILE * 2, "staging fits two tiles");
};
static_assert(LDS % 4 == 0 && (16 * LDS * 4) % 32 == 0 && (FT * LDS * 4) % 32 == 0, "fp32 score tile layout");
static_assert(LDP % 8 == 0 && (16 * LDP * 2) % 32 == 0 && (FT * LDP * 2) % 32 == 0, "bf16 probability tile layout");

__device__ __forceinline__ __nv_bfloat16 as_bf16(uint16_t bits) {
    __nv_bfloat16_raw r;
    r.x = bits;
    return __nv_bfloat16(r);
}

// rows [r0, r0 + 32) of a head's (T, D) slice, row t at src + t * HD, into
// a (32, LD) bf16 tile; rows at or past T are zeros. From bf16 bits as
// they are, or (dout) from fp32 rounded with the project's rounding.
template <int D>
__device__ void load_tile(__nv_bfloat16 *tile, const uint16_t *src, long long HD, int r0, int T) {
    constexpr int VEC = 8, PER_ROW = D / VEC;
    const bool aligned = ((uintptr_t)src & 15) == 0 && (HD % VEC) == 0;
    for (int e = threadIdx.x; e < FT * PER_ROW; e += FTHREADS) {
        const int r = e / PER_ROW, c = (e % PER_ROW) * VEC, t = r0 + r;
        __nv_bfloat16 *dst = tile + r * Geo<D>::LD + c;
        if (t >= T) {
            for (int v = 0; v < VEC; v++) dst[v] = as_bf16(0);
        } else if (aligned) {
            const uint4 w = *reinterpret_cast<const uint4 *>(src + t * HD + c);
            *reinterpret_cast<uint4 *>(dst) = w;
        } else {
            for (int v = 0; v < VEC; v++) dst[v] = as_bf16(src[t * HD + c + v]);
        }
    }
}
template <int D>
__device__ void load_tile_f32(__nv_bfloat16 *tile, const float *src, long long HD, int r0, int T) {
    for (int e = threadIdx.x; e < FT * D; e += FTHREADS) {
        const int r = e / D, c = e % D, t = r0 + r;
        tile[r * Geo<D>::LD + c] = as_bf16(t < T ? tp_bf16_bits(src[t * HD + c]) : 0);
    }
}

// S (32 x 32, fp32, ld LDS) = A (32 x D, row_major) B^T, B a (32 x D) row
// tile read as col_major: warp w computes fragment (w / 2, w % 2).
template <int D>
__device__ void mm_abt(float *S, const __nv_bfloat16 *A, const __nv_bfloat16 *B) {
    const int w = threadIdx.x / TP_WARP, fr = w / 2, fc = w % 2;
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < D; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, A + fr * 16 * Geo<D>::LD + k, Geo<D>::LD);
        wmma::load_matrix_sync(b, B + fc * 16 * Geo<D>::LD + k, Geo<D>::LD);
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(S + fr * 16 * LDS + fc * 16, acc, LDS, wmma::mem_row_major);
}

// acc[f] += P (32 x 32 bf16, ld LDP; transposed: P^T) X (32 x D bf16 row
// tile), for this warp's fragments f of the (32, D) result.
template <int D, bool TRANS>
__device__ void mm_px(Acc (&acc)[Geo<D>::NF_WARP], const __nv_bfloat16 *P, const __nv_bfloat16 *X) {
    typedef typename std::conditional<TRANS, wmma::col_major, wmma::row_major>::type LayoutP;
    const int w = threadIdx.x / TP_WARP;
#pragma unroll
    for (int u = 0; u < Geo<D>::NF_WARP; u++) {
        const int f = w + u * FW;
        if (f >= Geo<D>::NF) break;
        const int fr = f / (D / 16), fc = f % (D / 16);
        for (int k = 0; k < FT; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutP> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
            // P (r, k) at P[r * LDP + k]; P^T (r, k) = P (k, r) at P[k * LDP + r]
            wmma::load_matrix_sync(a, TRANS ? P + k * LDP + fr * 16 : P + fr * 16 * LDP + k, LDP);
            wmma::load_matrix_sync(b, X + k * Geo<D>::LD + fc * 16, Geo<D>::LD);
            wmma::mma_sync(acc[u], a, b, acc[u]);
        }
    }
}

template <int D>
__device__ void acc_zero(Acc (&acc)[Geo<D>::NF_WARP]) {
#pragma unroll
    for (int u = 0; u < Geo<D>::NF_WARP; u++) wmma::fill_fragment(acc[u], 0.0f);
}

// This warp's fragments stored into a (32, LDO) fp32 staging tile.
template <int D>
__device__ void acc_stage(float *O, Acc (&acc)[Geo<D>::NF_WARP]) {
    const int w = threadIdx.x / TP_WARP;
#pragma unroll
    for (int u = 0; u < Geo<D>::NF_WARP; u++) {
        const int f = w + u * FW;
        if (f >= Geo<D>::NF) break;
        const int fr = f / (D / 16), fc = f % (D / 16);
        wmma::store_matrix_sync(O + fr * 16 * Geo<D>::LDO + fc * 16, acc[u], Geo<D>::LDO, wmma::mem_row_major);
    }
}

// The staged (32, D) result's rows [r0, r0 + 32) below T into a head's
// slice (at element off) of an fp32 gradient: added, or written (old
// contents never read) as 0 + v, so that writing gives the bits of adding
// into zeros (a -0 result becomes +0 either way); or, dst16 given (bf16
// mode's q, k, v gradients, written), as the bf16 rounding of that 0 + v.
template <int D>
__device__ void stage_out(float *dst, uint16_t *dst16, long long off, long long HD, const float *O, int r0, int T,
                          bool add) {
    for (int e = threadIdx.x; e < FT * D; e += FTHREADS) {
        const int r = e / D, c = e % D, t = r0 + r;
        if (t >= T) continue;
        const float v = O[r * Geo<D>::LDO + c];
        const long long at = off + t * HD + c;
        if (dst16) {
            dst16[at] = tp_bf16_bits(0.0f + v);
            continue;
        }
        dst[at] = add ? dst[at] + v : 0.0f + v;
    }
}

// The probability of key j0 + lane for query row i from its score tile row.
__device__ __forceinline__ float flash_p(const float *s_row, int lane, int j0, int n_valid, float scale, float lse) {
    return j0 + lane < n_valid ? expf(__fmul_rn(scale, s_row[lane]) - lse) : 0.0f;
}

// The end of the keys a query tile starting at row i0 may see: keys past
// k_len, or (causal) past the tile's last row, are never valid.
__device__ __forceinline__ int flash_key_end(const FlashArgs &a, int klen, int i0) {
    int kend = klen < a.Tk ? klen : a.Tk;
    if (a.causal && kend > i0 + FT) kend = i0 + FT;
    return kend;
}

// ---- forward ----------------------------------------------------------------------------------

// Shared memory: Q, K, V bf16 tiles, the fp32 scores, the bf16
// probabilities, and the rows' lse; the output staged over K and V at the end.
template <int D>
constexpr size_t fwd_smem() {
    return 3 * Geo<D>::TILE * sizeof(__nv_bfloat16) + FT * LDS * sizeof(float) + FT * LDP * sizeof(__nv_bfloat16) +
           FT * sizeof(float);
}

// Pass 1 over the key tiles below kend: each of this warp's rows' running
// maximum m and sum l of exp(z - m) over its valid keys.
template <int D>
__device__ void fwd_stats(const FlashArgs &a, const __nv_bfloat16 *Qs, __nv_bfloat16 *Ks, float *Ss, const uint16_t *kb,
                          int i0, int kend, int klen, float (&m)[ROWS_PER_WARP], float (&l)[ROWS_PER_WARP]) {
    const long long HD = (long long)a.H * D;
    const int w = threadIdx.x / TP_WARP, lane = threadIdx.x % TP_WARP;
    for (int j0 = 0; j0 < kend; j0 += FT) {
        load_tile<D>(Ks, kb, HD, j0, a.Tk);
        __syncthreads();
        mm_abt<D>(Ss, Qs, Ks);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
            const int r = w * ROWS_PER_WARP + rr, n = flash_valid_keys(klen, i0 + r, a.Tk, a.causal);
            const bool ok = j0 + lane < n;
            const float z = ok ? __fmul_rn(a.scale, Ss[r * LDS + lane]) : -INFINITY;
            const float tmax = tp_warp_max(z);
            if (tmax == -INFINITY) continue;  // no valid key of this row in the tile (the same on every lane)
            const float m_new = fmaxf(m[rr], tmax);
            const float e = ok ? expf(z - m_new) : 0.0f;
            const float sum = tp_warp_sum(e);
            l[rr] = (m[rr] == -INFINITY ? 0.0f : l[rr] * expf(m[rr] - m_new)) + sum;
            m[rr] = m_new;
        }
        __syncthreads();  // Ks and Ss are rewritten by the next tile
    }
}

template <int D>
__global__ void __launch_bounds__(FTHREADS) flash_fwd_kernel(FlashArgs a, uint16_t *out16, float *lse_out) {
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *Ks = Qs + Geo<D>::TILE, *Vs = Ks + Geo<D>::TILE;
    float *Ss = (float *)(Vs + Geo<D>::TILE);
    __nv_bfloat16 *Ps = (__nv_bfloat16 *)(Ss + FT * LDS);
    float *lse_s = (float *)(Ps + FT * LDP);
    float *Os = (float *)Ks;  // the output's staging, once K and V are done with
    const long long HD = (long long)a.H * D;
    const int h = blockIdx.y, i0 = blockIdx.x * FT;
    const int w = threadIdx.x / TP_WARP, lane = threadIdx.x % TP_WARP;
    for (int b = blockIdx.z; b < a.B; b += gridDim.z) {
        const int klen = a.k_len[b], kend = flash_key_end(a, klen, i0);
        const uint16_t *qb = a.q + (long long)b * a.Tq * HD + (long long)h * D;
        const uint16_t *kb = a.k + (long long)b * a.Tk * HD + (long long)h * D;
        const uint16_t *vb = a.v + (long long)b * a.Tk * HD + (long long)h * D;
        load_tile<D>(Qs, qb, HD, i0, a.Tq);
        float m[ROWS_PER_WARP], l[ROWS_PER_WARP];
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; rr++) m[rr] = -INFINITY, l[rr] = 0.0f;
        fwd_stats<D>(a, Qs, Ks, Ss, kb, i0, kend, klen, m, l);
        if (lane == 0) {
#pragma unroll
            for (int rr = 0; rr < ROWS_PER_WARP; rr++)
                lse_s[w * ROWS_PER_WARP + rr] = m[rr] == -INFINITY ? -INFINITY : m[rr] + logf(l[rr]);
        }
        __syncthreads();
        Acc acc[Geo<D>::NF_WARP];
        acc_zero<D>(acc);
        for (int j0 = 0; j0 < kend; j0 += FT) {  // pass 2: p = exp(z - lse), out += bf16(p) V
            load_tile<D>(Ks, kb, HD, j0, a.Tk);
            load_tile<D>(Vs, vb, HD, j0, a.Tk);
            __syncthreads();
            mm_abt<D>(Ss, Qs, Ks);
            __syncthreads();
            for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
                const int r = w * ROWS_PER_WARP + rr, n = flash_valid_keys(klen, i0 + r, a.Tk, a.causal);
                const float p = flash_p(Ss + r * LDS, lane, j0, n, a.scale, lse_s[r]);
                Ps[r * LDP + lane] = as_bf16(tp_bf16_bits(p));
            }
            __syncthreads();
            mm_px<D, false>(acc, Ps, Vs);
            __syncthreads();  // Ks, Vs, Ss and Ps are rewritten by the next tile
        }
        acc_stage<D>(Os, acc);
        __syncthreads();
        for (int e = threadIdx.x; e < FT * D; e += FTHREADS) {
            const int r = e / D, c = e % D, t = i0 + r;
            if (t < a.Tq) out16[(long long)b * a.Tq * HD + t * HD + h * D + c] = tp_bf16_bits(Os[r * Geo<D>::LDO + c]);
        }
        for (int r = threadIdx.x; r < FT; r += FTHREADS)
            if (i0 + r < a.Tq) lse_out[((long long)b * a.H + h) * a.Tq + i0 + r] = lse_s[r];
        __syncthreads();  // the next batch's Q tile overwrites shared memory
    }
}

// ---- backward: dq and delta ---------------------------------------------------------------------

// Shared memory: Q, G (bf16 dout), K, V tiles, the fp32 scores and
// dp, the bf16 ds, the rows' lse and delta; dq staged over K and V.
template <int D>
constexpr size_t bwd_q_smem() {
    return 4 * Geo<D>::TILE * sizeof(__nv_bfloat16) + 2 * FT * LDS * sizeof(float) +
           FT * LDP * sizeof(__nv_bfloat16) + 2 * FT * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(FTHREADS) flash_bwd_q_kernel(FlashArgs a, const float *dout, const float *lse,
                                                               float *delta_out, float *dq, uint16_t *dq16,
                                                               bool add) {
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem, *Gs = Qs + Geo<D>::TILE, *Ks = Gs + Geo<D>::TILE,
                  *Vs = Ks + Geo<D>::TILE;
    float *Ss = (float *)(Vs + Geo<D>::TILE), *dPs = Ss + FT * LDS;
    __nv_bfloat16 *dSs = (__nv_bfloat16 *)(dPs + FT * LDS);
    float *lse_s = (float *)(dSs + FT * LDP), *delta_s = lse_s + FT;
    float *Os = (float *)Ks;
    const long long HD = (long long)a.H * D;
    const int h = blockIdx.y, i0 = blockIdx.x * FT;
    const int w = threadIdx.x / TP_WARP, lane = threadIdx.x % TP_WARP;
    for (int b = blockIdx.z; b < a.B; b += gridDim.z) {
        const int klen = a.k_len[b], kend = flash_key_end(a, klen, i0);
        const long long qoff = (long long)b * a.Tq * HD + (long long)h * D;
        const uint16_t *kb = a.k + (long long)b * a.Tk * HD + (long long)h * D;
        const uint16_t *vb = a.v + (long long)b * a.Tk * HD + (long long)h * D;
        load_tile<D>(Qs, a.q + qoff, HD, i0, a.Tq);
        load_tile_f32<D>(Gs, dout + qoff, HD, i0, a.Tq);
        for (int r = threadIdx.x; r < FT; r += FTHREADS)
            lse_s[r] = i0 + r < a.Tq ? lse[((long long)b * a.H + h) * a.Tq + i0 + r] : -INFINITY;
        float delta[ROWS_PER_WARP];
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; rr++) delta[rr] = 0.0f;
        Acc acc[Geo<D>::NF_WARP];
        acc_zero<D>(acc);
        for (int pass = 0; pass < 2; pass++) {  // 0: delta; 1: dq
            if (pass == 1 && lane == 0) {  // read after the tile loop's first barrier
#pragma unroll
                for (int rr = 0; rr < ROWS_PER_WARP; rr++) delta_s[w * ROWS_PER_WARP + rr] = delta[rr];
            }
            for (int j0 = 0; j0 < kend; j0 += FT) {
                load_tile<D>(Ks, kb, HD, j0, a.Tk);
                load_tile<D>(Vs, vb, HD, j0, a.Tk);
                __syncthreads();
                mm_abt<D>(Ss, Qs, Ks);
                mm_abt<D>(dPs, Gs, Vs);
                __syncthreads();
#pragma unroll
                for (int rr = 0; rr < ROWS_PER_WARP; rr++) {  // rows past Tq: no key (their lse is -inf)
                    const int r = w * ROWS_PER_WARP + rr;
                    const int n = i0 + r < a.Tq ? flash_valid_keys(klen, i0 + r, a.Tk, a.causal) : 0;
                    const float p = flash_p(Ss + r * LDS, lane, j0, n, a.scale, lse_s[r]);
                    const float dp = dPs[r * LDS + lane];
                    if (pass == 0) {
                        delta[rr] += tp_warp_sum(p * dp);
                    } else {
                        const float ds = j0 + lane < n ? __fmul_rn(a.scale, p) * (dp - delta_s[r]) : 0.0f;
                        dSs[r * LDP + lane] = as_bf16(tp_bf16_bits(ds));
                    }
                }
                __syncthreads();
                if (pass == 1) mm_px<D, false>(acc, dSs, Ks);
                __syncthreads();
            }
        }
#pragma unroll
        for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
            const int i = i0 + w * ROWS_PER_WARP + rr;
            if (lane == 0 && i < a.Tq) delta_out[((long long)b * a.H + h) * a.Tq + i] = delta[rr];
        }
        acc_stage<D>(Os, acc);
        __syncthreads();
        stage_out<D>(dq, dq16, qoff, HD, Os, i0, a.Tq, add);
        __syncthreads();
    }
}

// ---- backward: dk and dv ----------------------------------------------------------------------

// Shared memory: K, V (this block's keys), Q, G (a query tile's) bf16
// tiles, the fp32 scores and dp, the bf16 p and ds, a query tile's lse and
// delta; dv then dk staged over Q and G.
template <int D>
constexpr size_t bwd_kv_smem() {
    return 4 * Geo<D>::TILE * sizeof(__nv_bfloat16) + 2 * FT * LDS * sizeof(float) +
           2 * FT * LDP * sizeof(__nv_bfloat16) + 2 * FT * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(FTHREADS) flash_bwd_kv_kernel(FlashArgs a, const float *dout, const float *lse,
                                                                const float *delta, float *dk, float *dv,
                                                                uint16_t *dk16, uint16_t *dv16, bool add) {
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)smem, *Vs = Ks + Geo<D>::TILE, *Qs = Vs + Geo<D>::TILE,
                  *Gs = Qs + Geo<D>::TILE;
    float *Ss = (float *)(Gs + Geo<D>::TILE), *dPs = Ss + FT * LDS;
    __nv_bfloat16 *Ps = (__nv_bfloat16 *)(dPs + FT * LDS), *dSs = Ps + FT * LDP;
    float *lse_s = (float *)(dSs + FT * LDP), *delta_s = lse_s + FT;
    float *Os = (float *)Qs;
    const long long HD = (long long)a.H * D;
    const int h = blockIdx.y, j0 = blockIdx.x * FT;
    const int w = threadIdx.x / TP_WARP, lane = threadIdx.x % TP_WARP;
    for (int b = blockIdx.z; b < a.B; b += gridDim.z) {
        const int klen = a.k_len[b];
        const long long koff = (long long)b * a.Tk * HD + (long long)h * D;
        const bool any_key = j0 < klen;  // else every p of this tile is 0: dk, dv rows zero
        // causal: query rows before the tile's first key see none of its keys
        const int qbeg = a.causal ? (j0 / FT) * FT : 0;
        load_tile<D>(Ks, a.k + koff, HD, j0, a.Tk);
        load_tile<D>(Vs, a.v + koff, HD, j0, a.Tk);
        Acc dv_acc[Geo<D>::NF_WARP], dk_acc[Geo<D>::NF_WARP];
        acc_zero<D>(dv_acc);
        acc_zero<D>(dk_acc);
        for (int i0 = any_key ? qbeg : a.Tq; i0 < a.Tq; i0 += FT) {
            const long long qoff = (long long)b * a.Tq * HD + (long long)h * D;
            load_tile<D>(Qs, a.q + qoff, HD, i0, a.Tq);
            load_tile_f32<D>(Gs, dout + qoff, HD, i0, a.Tq);
            for (int r = threadIdx.x; r < FT; r += FTHREADS) {
                const bool in = i0 + r < a.Tq;
                const long long at = ((long long)b * a.H + h) * a.Tq + i0 + r;
                lse_s[r] = in ? lse[at] : -INFINITY;
                delta_s[r] = in ? delta[at] : 0.0f;
            }
            __syncthreads();
            mm_abt<D>(Ss, Qs, Ks);
            mm_abt<D>(dPs, Gs, Vs);
            __syncthreads();
            for (int rr = 0; rr < ROWS_PER_WARP; rr++) {
                const int r = w * ROWS_PER_WARP + rr;
                const int n = i0 + r < a.Tq ? flash_valid_keys(klen, i0 + r, a.Tk, a.causal) : 0;
                const float p = flash_p(Ss + r * LDS, lane, j0, n, a.scale, lse_s[r]);
                const float ds = j0 + lane < n ? __fmul_rn(a.scale, p) * (dPs[r * LDS + lane] - delta_s[r]) : 0.0f;
                Ps[r * LDP + lane] = as_bf16(tp_bf16_bits(p));
                dSs[r * LDP + lane] = as_bf16(tp_bf16_bits(ds));
            }
            __syncthreads();
            mm_px<D, true>(dv_acc, Ps, Gs);   // dv += P^T G
            mm_px<D, true>(dk_acc, dSs, Qs);  // dk += dS^T Q
            __syncthreads();
        }
        acc_stage<D>(Os, dv_acc);
        __syncthreads();
        stage_out<D>(dv, dv16, koff, HD, Os, j0, a.Tk, add);
        __syncthreads();
        acc_stage<D>(Os, dk_acc);
        __syncthreads();
        stage_out<D>(dk, dk16, koff, HD, Os, j0, a.Tk, add);
        __syncthreads();
    }
}

// x[i] = -infinity: the lse of rows without keys (Tk == 0)
__global__ void flash_fill_neg_inf(float *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = -INFINITY;
}

// ---- launchers --------------------------------------------------------------------------------

dim3 flash_grid(int T, int H, int B) {
    return dim3((unsigned)((T + FT - 1) / FT), (unsigned)H, (unsigned)(B < 65535 ? B : 65535));
}

template <int D>
void flash_fwd_launch(const FlashArgs &a, uint16_t *out16, float *lse, cudaStream_t stream) {
    const size_t smem = fwd_smem<D>();
    tp_smem_optin(flash_fwd_kernel<D>, smem, "op_attention_flash_fwd");
    flash_fwd_kernel<D><<<flash_grid(a.Tq, a.H, a.B), FTHREADS, smem, stream>>>(a, out16, lse);
    CUDA_CHECK(cudaGetLastError());
}

// g16: dq16, dk16, dv16 (each NULL, or all given: then dq, dk, dv are NULL).
template <int D>
void flash_bwd_launch(const FlashArgs &a, float *dq, float *dk, float *dv, uint16_t *const g16[3], bool add,
                      const float *dout, const float *lse, float *delta, cudaStream_t stream) {
    const size_t smem_q = bwd_q_smem<D>(), smem_kv = bwd_kv_smem<D>();
    tp_smem_optin(flash_bwd_q_kernel<D>, smem_q, "op_attention_flash_bwd");
    tp_smem_optin(flash_bwd_kv_kernel<D>, smem_kv, "op_attention_flash_bwd");
    flash_bwd_q_kernel<D><<<flash_grid(a.Tq, a.H, a.B), FTHREADS, smem_q, stream>>>(a, dout, lse, delta, dq, g16[0],
                                                                                     add);
    CUDA_CHECK(cudaGetLastError());
    flash_bwd_kv_kernel<D><<<flash_grid(a.Tk, a.H, a.B), FTHREADS, smem_kv, stream>>>(a, dout, lse, delta, dk, dv,
                                                                                       g16[1], g16[2], add);
    CUDA_CHECK(cudaGetLastError());
}

// The head width's instantiation (D / 16 = 1 .. 8).
#define FLASH_BY_D(D, CALL)                                 \
    switch (D) {                                            \
    case 16: CALL(16); break;                               \
    case 32: CALL(32); break;                               \
    case 48: CALL(48); break;                               \
    case 64: CALL(64); break;                               \
    case 80: CALL(80); break;                               \
    case 96: CALL(96); break;                               \
    case 112: CALL(112); break;                             \
    default: CALL(128); break;                              \
    }

// The implementation chosen (cuda_flash_set_kernel, else TPTRAIN_FLASH_KERNEL
// read at the first call) and what ran. Process-wide, as the fused switch
// of attention.cu.
int g_kernel = -1;  // -1: not chosen yet
CudaFlashCounts g_counts;

CudaFlashKernel flash_kernel(void) {
    if (g_kernel < 0) {
        const char *v = getenv(CUDA_FLASH_KERNEL_ENV);
        const bool is_short = v && strcmp(v, "short") == 0;
        TP_CHECK(v == NULL || v[0] == '\0' || is_short || strcmp(v, "tiled") == 0,
                 "%s=%s: expected tiled or short", CUDA_FLASH_KERNEL_ENV, v);
        g_kernel = is_short ? CUDA_FLASH_SHORT : CUDA_FLASH_TILED;
    }
    return (CudaFlashKernel)g_kernel;
}

void flash_check(const char *op, int B, int H, int Tq, int Tk, int D) {
    TP_NEED_SIZE(op, B);
    TP_NEED_SIZE(op, H);
    TP_NEED_SIZE(op, Tq);
    TP_NEED_SIZE(op, Tk);
    TP_NEED_SIZE(op, D);
    TP_CHECK(D % 16 == 0 && D <= 128, "%s: head width D = %d must be a multiple of 16, at most 128", op, D);
}

}  // namespace

void cuda_op_attention_flash_fwd(uint16_t *out16, float *lse, const uint16_t *q16, const uint16_t *k16,
                                 const uint16_t *v16, const int32_t *k_len, int B, int H, int Tq, int Tk, int D,
                                 bool causal, cudaStream_t stream) {
    const char *op = "op_attention_flash_fwd";
    flash_check(op, B, H, Tq, Tk, D);
    if (B == 0 || H == 0 || Tq == 0 || D == 0) return;
    TP_NEED_PTR(op, out16);
    TP_NEED_PTR(op, lse);
    if (Tk == 0) {  // nothing to attend to: out zeros, lse -inf
        CUDA_CHECK(cudaMemsetAsync(out16, 0, (size_t)B * Tq * H * D * sizeof(uint16_t), stream));
        const size_t n = (size_t)B * H * Tq;
        flash_fill_neg_inf<<<tp_grid_1d(n, 256), 256, 0, stream>>>(lse, n);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    TP_NEED_PTR(op, q16);
    TP_NEED_PTR(op, k16);
    TP_NEED_PTR(op, v16);
    TP_NEED_PTR(op, k_len);
    const FlashArgs a = {q16, k16, v16, k_len, B, H, Tq, Tk, causal, 1.0f / sqrtf((float)D)};
    if (flash_kernel() == CUDA_FLASH_SHORT && flash_short_fwd(a, D, out16, lse, stream)) {
        g_counts.short_fwd++;
        return;
    }
    g_counts.tiled_fwd++;
#define FLASH_FWD(DD) flash_fwd_launch<DD>(a, out16, lse, stream)
    FLASH_BY_D(D, FLASH_FWD)
#undef FLASH_FWD
}

void cuda_op_attention_flash_bwd(float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16, uint16_t *dv16,
                                 GradMode mode, const float *dout, const float *lse, const uint16_t *q16,
                                 const uint16_t *k16, const uint16_t *v16, const int32_t *k_len, float *scratch, int B,
                                 int H, int Tq, int Tk, int D, bool causal, cudaStream_t stream) {
    const char *op = "op_attention_flash_bwd";
    TP_CHECK(grad_mode_valid(mode), "%s: unknown gradient mode %d", op, (int)mode);
    flash_check(op, B, H, Tq, Tk, D);
    const bool h = attn_grads_bf16(op, mode, dq, dk, dv, dq16, dk16, dv16);  // the bf16 set (ops_list.h)
    if (B == 0 || H == 0 || D == 0) return;
    const bool write = mode == GRAD_WRITE;
    const size_t elem = h ? sizeof(uint16_t) : sizeof(float);
    void *const g[3] = {h ? (void *)dq16 : dq, h ? (void *)dk16 : dk, h ? (void *)dv16 : dv};
    const char *const gname[3] = {h ? "dq16" : "dq", h ? "dk16" : "dk", h ? "dv16" : "dv"};
    if (Tq == 0 || Tk == 0) {  // added: nothing; written: zeros
        if (write && Tk == 0 && Tq > 0) {
            TP_CHECK(g[0] != NULL, "%s: %s is NULL", op, gname[0]);
            CUDA_CHECK(cudaMemsetAsync(g[0], 0, (size_t)B * Tq * H * D * elem, stream));
        }
        if (Tk == 0 && Tq > 0 && scratch)  // delta of rows without keys: 0, as the reference's
            CUDA_CHECK(cudaMemsetAsync(scratch, 0, (size_t)B * H * Tq * sizeof(float), stream));
        for (int i = 1; i < 3 && write && Tq == 0 && Tk > 0; i++) {
            TP_CHECK(g[i] != NULL, "%s: %s is NULL", op, gname[i]);
            CUDA_CHECK(cudaMemsetAsync(g[i], 0, (size_t)B * Tk * H * D * elem, stream));
        }
        return;
    }
    const void *need[] = {g[0], g[1], g[2], dout, lse, q16, k16, v16, k_len, scratch};
    const char *names[] = {gname[0], gname[1], gname[2], "dout", "lse", "q16", "k16", "v16", "k_len", "scratch"};
    for (int i = 0; i < 10; i++) TP_CHECK(need[i] != NULL, "%s: %s is NULL", op, names[i]);
    const FlashArgs a = {q16, k16, v16, k_len, B, H, Tq, Tk, causal, 1.0f / sqrtf((float)D)};
    uint16_t *const g16[3] = {dq16, dk16, dv16};
    if (flash_kernel() == CUDA_FLASH_SHORT &&
        flash_short_bwd(a, D, dq, dk, dv, g16, !write, dout, lse, scratch, stream)) {
        g_counts.short_bwd++;
        return;
    }
    g_counts.tiled_bwd++;
#define FLASH_BWD(DD) flash_bwd_launch<DD>(a, dq, dk, dv, g16, !write, dout, lse, scratch, stream)
    FLASH_BY_D(D, FLASH_BWD)
#undef FLASH_BWD
}

void cuda_flash_set_kernel(CudaFlashKernel k) { g_kernel = (int)k; }

CudaFlashCounts cuda_flash_counts(void) { return g_counts; }
