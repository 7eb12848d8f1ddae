// flash_core.h: what the two CUDA implementations of ops_list.h's
// attention_flash_fwd / _bwd share (their arguments, the contract's key
// mask), and the block and warp code of the short-sequence one
// (attention_short.cu, whose header says how it works), written once for
// the device and the host: test/test_attn_short.cc runs these very
// functions on the CPU, over an emulated warp whose mma.sync is built from
// the PTX ISA's fragment layouts, against the CPU reference.
//
// Under nvcc the primitives below are the device's. Elsewhere the includer
// defines them before including this header:
//   SC_FN                    the functions' qualifier (SC_HOST_FN: for the
//                            host too; empty there)
//   sc_tid()                 the thread's index in its block, 0 .. SC_THREADS - 1
//   sc_sync()                __syncthreads()
//   sc_xor(x, m)             __shfl_xor_sync over the whole warp
//   sc_mul(a, b)             a * b rounded alone (never fused into an FMA)
//   sc_mma(c, a, b0, b1)     c += A B, mma.sync m16n8k16 .bf16 with fp32 c
//   sc_ld32(p), sc_st32(p, v)      32 bits at a 4-byte aligned uint16_t *
//   sc_copy16(d, s), sc_zero16(d)  16 bytes at 16-byte aligned uint16_t *
#ifndef TPTRAIN_FLASH_CORE_H
#define TPTRAIN_FLASH_CORE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "bf16.h"  // tp_f32_to_bf16: the project's rounding, host and device

#define SC_WARP 32
#define SC_WARPS 4  // warps per block of the short kernels
#define SC_THREADS (SC_WARPS * SC_WARP)

#ifdef __CUDACC__
#define SC_FN __device__ __forceinline__
#define SC_HOST_FN __host__ __device__
#define SC_UNROLL _Pragma("unroll")
SC_FN int sc_tid() { return (int)threadIdx.x; }
SC_FN void sc_sync() { __syncthreads(); }
SC_FN float sc_xor(float x, int m) { return __shfl_xor_sync(0xffffffffu, x, m); }
SC_FN float sc_mul(float a, float b) { return __fmul_rn(a, b); }
SC_FN void sc_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
SC_FN uint32_t sc_ld32(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }
SC_FN void sc_st32(uint16_t *p, uint32_t v) { *reinterpret_cast<uint32_t *>(p) = v; }
SC_FN void sc_copy16(uint16_t *d, const uint16_t *s) { *reinterpret_cast<uint4 *>(d) = *reinterpret_cast<const uint4 *>(s); }
SC_FN void sc_zero16(uint16_t *d) { *reinterpret_cast<uint4 *>(d) = make_uint4(0, 0, 0, 0); }
#endif

#ifndef SC_HOST_FN
#define SC_HOST_FN
#define SC_UNROLL
#endif

struct FlashArgs {
    const uint16_t *q, *k, *v;  // bf16 bits, (B, T, H*D)
    const int32_t *k_len;       // (B)
    int B, H, Tq, Tk;
    bool causal;
    float scale;                // 1/sqrt(D)
};

// Keys query row i may see: the first min(k_len, Tk), and (causal) at most
// i + 1 of them (ops_list.h's attention_fwd masks).
SC_FN int flash_valid_keys(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && n > i + 1) n = i + 1;
    return n < 0 ? 0 : n;
}

SC_HOST_FN constexpr int round16(int x) { return (x + 15) / 16 * 16; }

// ---- fragments ------------------------------------------------------------------------------

// Two fp32 values as the bf16 pair of one register (lo in the low half).
SC_FN uint32_t pack_bf16(float lo, float hi) {
    return (uint32_t)tp_f32_to_bf16(lo) | ((uint32_t)tp_f32_to_bf16(hi) << 16);
}

// The A operand of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major
// bf16 array X (row pitch ld).
SC_FN void frag_a(uint32_t (&a)[4], const uint16_t *X, int ld, int r0, int k0) {
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
    const uint16_t *lo = X + (r0 + g) * ld + k0 + 2 * t, *hi = lo + 8 * ld;
    a[0] = sc_ld32(lo);
    a[1] = sc_ld32(hi);
    a[2] = sc_ld32(lo + 8);
    a[3] = sc_ld32(hi + 8);
}

// The B operand B(k, n) = X(n0 + n, k0 + k): X's rows are B's columns (K
// for q k^T, Q for k q^T, V for dout v^T): two 32-bit loads.
SC_FN void frag_b_rows(uint32_t &b0, uint32_t &b1, const uint16_t *X, int ld, int n0, int k0) {
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
    const uint16_t *p = X + (n0 + g) * ld + k0 + 2 * t;
    b0 = sc_ld32(p);
    b1 = sc_ld32(p + 8);
}

// The B operand B(k, n) = X(k0 + k, n0 + n): X's rows are B's rows (V for
// p v, K for ds k, dout and Q for the key-side products): the pair of a
// register lies in two rows, so four 16-bit loads (rows 2t apart by lane:
// distinct banks).
SC_FN void frag_b_cols(uint32_t &b0, uint32_t &b1, const uint16_t *X, int ld, int k0, int n0) {
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
    const uint16_t *p = X + (k0 + 2 * t) * ld + n0 + g;
    b0 = (uint32_t)p[0] | ((uint32_t)p[ld] << 16);
    b1 = (uint32_t)p[8 * ld] | ((uint32_t)p[9 * ld] << 16);
}

// The A operand of an m16n8k16 product from the accumulators of two
// adjacent 8-column tiles x[2c] and x[2c + 1] (C's layout is A's, half by
// half), rounded to bf16.
SC_FN void frag_a_from_acc(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

// A row's value over the four lanes that hold it (a fixed butterfly).
SC_FN float quad_sum(float x) {
    x += sc_xor(x, 1);
    return x + sc_xor(x, 2);
}
SC_FN float quad_max(float x) {
    x = fmaxf(x, sc_xor(x, 1));
    return fmaxf(x, sc_xor(x, 2));
}

// ---- staging ----------------------------------------------------------------------------------

// Rows [0, Tp) of a head's (T, D) slice (row t at src + t * HD) into a
// (Tp, D + 8) bf16 array; rows at or past T zeros (a padded key's K and V
// rows must be finite: its p is 0, and 0 * NaN is not).
template <int D>
SC_FN void stage_bf16(uint16_t *X, const uint16_t *src, long long HD, int T, int Tp) {
    constexpr int LD = D + 8, VEC = 8, PER_ROW = D / VEC;
    const bool aligned = ((uintptr_t)src & 15) == 0 && (HD % VEC) == 0;
    for (int e = sc_tid(); e < Tp * PER_ROW; e += SC_THREADS) {
        const int r = e / PER_ROW, c = (e % PER_ROW) * VEC;
        uint16_t *dst = X + r * LD + c;
        if (r >= T) {
            sc_zero16(dst);
        } else if (aligned) {
            sc_copy16(dst, src + r * HD + c);
        } else {
            for (int v = 0; v < VEC; v++) dst[v] = src[r * HD + c + v];
        }
    }
}

// The same from fp32 (dout), each value rounded to bf16 as it is staged.
template <int D>
SC_FN void stage_f32(uint16_t *X, const float *src, long long HD, int T, int Tp) {
    constexpr int LD = D + 8;
    for (int e = sc_tid(); e < Tp * D; e += SC_THREADS) {
        const int r = e / D, c = e % D;
        X[r * LD + c] = r < T ? tp_f32_to_bf16(src[r * HD + c]) : 0;
    }
}

// An fp32 gradient element: added, or written as 0 + v (the bits of adding
// into zeros, as the tiled kernels and the reference give them).
SC_FN void grad_store(float *p, float v, bool add) { *p = add ? *p + v : 0.0f + v; }

// Where a backward writes its gradients: fp32 (dq, dk, dv; added or
// written), or, in bf16 mode's written form, the bf16 rounding of the
// written value (dq16, dk16, dv16; then the fp32 set is NULL).
struct FlashGrads {
    float *dq, *dk, *dv;
    uint16_t *dq16, *dk16, *dv16;
};

// One gradient's rows r0 + g and r0 + g + 8 (those below T) of a (16, D)
// result held as D / 8 accumulator tiles, into a head's slice at element
// off (row t at off + t * HD) of dst, or of dst16 where that is given.
template <int D>
SC_FN void store_rows(float *dst, uint16_t *dst16, long long off, long long HD, const float (&acc)[D / 8][4], int r0,
                      int T, bool add) {
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
SC_UNROLL
    for (int h = 0; h < 2; h++) {
        const int r = r0 + g + 8 * h;
        if (r >= T) continue;
        const long long at = off + r * HD + 2 * t;
SC_UNROLL
        for (int dt = 0; dt < D / 8; dt++) {
            if (dst16) {
                sc_st32(dst16 + at + dt * 8, pack_bf16(0.0f + acc[dt][2 * h], 0.0f + acc[dt][2 * h + 1]));
            } else {
                grad_store(dst + at + dt * 8, acc[dt][2 * h], add);
                grad_store(dst + at + dt * 8 + 1, acc[dt][2 * h + 1], add);
            }
        }
    }
}

// A warp's query rows i0 + g and i0 + g + 8: the keys each may see (n; 0
// past Tq), and the 16-key chunks any row of the tile [i0, i0 + 16) sees.
SC_FN int tile_keys(const FlashArgs &a, int i0, int klen, int (&n)[2]) {
    const int g = (sc_tid() % SC_WARP) >> 2;
SC_UNROLL
    for (int h = 0; h < 2; h++) {
        const int r = i0 + g + 8 * h;
        n[h] = r < a.Tq ? flash_valid_keys(klen, r, a.Tk, a.causal) : 0;
    }
    int kend = klen < a.Tk ? klen : a.Tk;
    if (a.causal && kend > i0 + 16) kend = i0 + 16;
    return kend <= 0 ? 0 : (kend + 15) / 16;
}

// The backward's two score products of one warp's 16 rows r0.. (A rows of
// A1 and A2) against the columns of 8-column tiles nt with cbeg <= nt / 2 <
// cend (B1's and B2's rows): s = A1 B1^T, dp = A2 B2^T, from zero.
template <int D, int C>
SC_FN void score_pair(float (&s)[2 * C][4], float (&dp)[2 * C][4], const uint16_t *A1, const uint16_t *B1,
                      const uint16_t *A2, const uint16_t *B2, int r0, int cbeg, int cend) {
    constexpr int LD = D + 8;
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
SC_UNROLL
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a1[4], a2[4];
        frag_a(a1, A1, LD, r0, kk * 16);
        frag_a(a2, A2, LD, r0, kk * 16);
SC_UNROLL
        for (int nt = 0; nt < 2 * C; nt++) {
            if (nt / 2 < cbeg || nt / 2 >= cend) continue;
            uint32_t b0, b1;
            frag_b_rows(b0, b1, B1, LD, nt * 8, kk * 16);
            sc_mma(s[nt], a1, b0, b1);
            frag_b_rows(b0, b1, B2, LD, nt * 8, kk * 16);
            sc_mma(dp[nt], a2, b0, b1);
        }
    }
}

// ---- forward ----------------------------------------------------------------------------------

inline size_t fwd_smem(int D, int Tk) { return (size_t)2 * round16(Tk) * (D + 8) * sizeof(uint16_t); }

// One warp's 16 query rows [i0, i0 + 16): scores against every key chunk
// that a row of the tile may see, the exact softmax, out = bf16(p) V.
// C: the 16-key chunks the registers hold (Tk <= 16 C).
template <int D, int C>
SC_FN void fwd_rows(const FlashArgs &a, const uint16_t *Ks, const uint16_t *Vs, const uint16_t *qb,
                         uint16_t *ob, float *lse_b, int i0, int klen) {
    constexpr int LD = D + 8;
    const long long HD = (long long)a.H * D;
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
    const int rows[2] = {i0 + g, i0 + g + 8};
    int n[2];
    const int cend = tile_keys(a, i0, klen, n);

    float s[2 * C][4];
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
SC_UNROLL
    for (int kk = 0; kk < D / 16; kk++) {  // s = q k^T; q's fragments straight from global memory
        uint32_t qa[4];
        const uint16_t *lo = qb + (long long)rows[0] * HD + kk * 16 + 2 * t, *hi = lo + 8 * HD;
        qa[0] = rows[0] < a.Tq ? sc_ld32(lo) : 0u;
        qa[1] = rows[1] < a.Tq ? sc_ld32(hi) : 0u;
        qa[2] = rows[0] < a.Tq ? sc_ld32(lo + 8) : 0u;
        qa[3] = rows[1] < a.Tq ? sc_ld32(hi + 8) : 0u;
SC_UNROLL
        for (int nt = 0; nt < 2 * C; nt++) {
            if (nt / 2 >= cend) continue;
            uint32_t b0, b1;
            frag_b_rows(b0, b1, Ks, LD, nt * 8, kk * 16);
            sc_mma(s[nt], qa, b0, b1);
        }
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, lse[2];
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            s[nt][e] = j < n[h] ? sc_mul(a.scale, s[nt][e]) : -INFINITY;
            m[h] = fmaxf(m[h], s[nt][e]);
        }
SC_UNROLL
    for (int h = 0; h < 2; h++) m[h] = quad_max(m[h]);
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            if (j < n[h]) l[h] += expf(s[nt][e] - m[h]);
        }
SC_UNROLL
    for (int h = 0; h < 2; h++) {
        l[h] = quad_sum(l[h]);
        lse[h] = n[h] > 0 ? m[h] + logf(l[h]) : -INFINITY;
    }
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            s[nt][e] = j < n[h] ? expf(s[nt][e] - lse[h]) : 0.0f;  // p
        }

    float o[D / 8][4];
SC_UNROLL
    for (int dt = 0; dt < D / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
SC_UNROLL
    for (int c = 0; c < C; c++) {  // out = bf16(p) V
        if (c >= cend) continue;
        uint32_t pa[4];
        frag_a_from_acc(pa, s[2 * c], s[2 * c + 1]);
SC_UNROLL
        for (int dt = 0; dt < D / 8; dt++) {
            uint32_t b0, b1;
            frag_b_cols(b0, b1, Vs, LD, c * 16, dt * 8);
            sc_mma(o[dt], pa, b0, b1);
        }
    }
SC_UNROLL
    for (int h = 0; h < 2; h++) {
        const int r = rows[h];
        if (r >= a.Tq) continue;
        uint16_t *row = ob + (long long)r * HD + 2 * t;
SC_UNROLL
        for (int dt = 0; dt < D / 8; dt++)
            sc_st32(row + dt * 8, pack_bf16(o[dt][2 * h], o[dt][2 * h + 1]));
        if (t == 0) lse_b[r] = lse[h];
    }
}

// A block's work for one (batch, head): K and V staged, each warp its
// query tiles. smem: fwd_smem(D, Tk) bytes, 16-byte aligned.
template <int D, int C>
SC_FN void short_fwd_block(const FlashArgs &a, unsigned char *smem, int b, int h, uint16_t *out16, float *lse) {
    constexpr int LD = D + 8;
    const int Tkp = round16(a.Tk);
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + Tkp * LD;
    const long long HD = (long long)a.H * D;
    const int w = sc_tid() / SC_WARP;
    const long long qoff = (long long)b * a.Tq * HD + (long long)h * D;
    const long long koff = (long long)b * a.Tk * HD + (long long)h * D;
    stage_bf16<D>(Ks, a.k + koff, HD, a.Tk, Tkp);
    stage_bf16<D>(Vs, a.v + koff, HD, a.Tk, Tkp);
    sc_sync();
    const int klen = a.k_len[b];
    for (int i0 = w * 16; i0 < a.Tq; i0 += SC_WARPS * 16)
        fwd_rows<D, C>(a, Ks, Vs, a.q + qoff, out16 + qoff, lse + ((long long)b * a.H + h) * a.Tq, i0, klen);
    sc_sync();  // the next batch's K and V overwrite shared memory
}

// ---- backward ---------------------------------------------------------------------------------

inline size_t bwd_smem(int D, int Tq, int Tk) {
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
SC_FN void bwd_query_rows(const FlashArgs &a, const BwdSmem &sm, float *delta_b, const FlashGrads &gr, long long qoff,
                          int i0, int klen, bool add) {
    constexpr int LD = D + 8;
    const long long HD = (long long)a.H * D;
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
    const int rows[2] = {i0 + g, i0 + g + 8};
    int n[2];
    const int cend = tile_keys(a, i0, klen, n);

    float s[2 * C][4], dp[2 * C][4];
    score_pair<D, C>(s, dp, sm.Qs, sm.Ks, sm.Gs, sm.Vs, i0, 0, cend);  // q k^T, g v^T
    float lse[2], delta[2] = {0.0f, 0.0f};
SC_UNROLL
    for (int h = 0; h < 2; h++) lse[h] = sm.lse_s[rows[h]];
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            s[nt][e] = j < n[h] ? expf(sc_mul(a.scale, s[nt][e]) - lse[h]) : 0.0f;  // p
            delta[h] += s[nt][e] * dp[nt][e];
        }
SC_UNROLL
    for (int h = 0; h < 2; h++) {
        delta[h] = quad_sum(delta[h]);
        if (t == 0) {
            sm.delta_s[rows[h]] = delta[h];  // rows past Tq: 0, never read
            if (rows[h] < a.Tq) delta_b[rows[h]] = delta[h];
        }
    }
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int h = e / 2, j = nt * 8 + 2 * t + (e & 1);
            dp[nt][e] = j < n[h] ? sc_mul(a.scale, s[nt][e]) * (dp[nt][e] - delta[h]) : 0.0f;  // ds
        }
    float acc[D / 8][4];
SC_UNROLL
    for (int dt = 0; dt < D / 8; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
SC_UNROLL
    for (int c = 0; c < C; c++) {  // dq = bf16(ds) K
        if (c >= cend) continue;
        uint32_t da[4];
        frag_a_from_acc(da, dp[2 * c], dp[2 * c + 1]);
SC_UNROLL
        for (int dt = 0; dt < D / 8; dt++) {
            uint32_t b0, b1;
            frag_b_cols(b0, b1, sm.Ks, LD, c * 16, dt * 8);
            sc_mma(acc[dt], da, b0, b1);
        }
    }
    store_rows<D>(gr.dq, gr.dq16, qoff, HD, acc, i0, a.Tq, add);
}

// Phase 2, one warp's keys [j0, j0 + 16): s^T = k q^T and dp^T = v g^T over
// the query chunks that may see them, p^T and ds^T with phase 1's lse and
// delta, dv (+)= bf16(p^T) G and dk (+)= bf16(ds^T) Q. A padding key's p is
// 0 for every query: its dk and dv rows come out zeros.
template <int D, int C>
SC_FN void bwd_key_rows(const FlashArgs &a, const BwdSmem &sm, const FlashGrads &gr, long long koff, int j0, int klen,
                        bool add) {
    constexpr int LD = D + 8;
    const long long HD = (long long)a.H * D;
    const int lane = sc_tid() % SC_WARP, g = lane >> 2, t = lane & 3;
    const int keys[2] = {j0 + g, j0 + g + 8};
    // queries before j0 see none of these keys under the causal mask
    const int cbeg = a.causal ? j0 / 16 : 0, cend = j0 < klen ? (a.Tq + 15) / 16 : 0;

    float s[2 * C][4], dp[2 * C][4];
    score_pair<D, C>(s, dp, sm.Ks, sm.Qs, sm.Vs, sm.Gs, j0, cbeg, cend);  // k q^T, v g^T
SC_UNROLL
    for (int nt = 0; nt < 2 * C; nt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int j = keys[e / 2], i = nt * 8 + 2 * t + (e & 1);
            const bool ok = nt / 2 >= cbeg && nt / 2 < cend && i < a.Tq &&
                            j < flash_valid_keys(klen, i, a.Tk, a.causal);
            const float p = ok ? expf(sc_mul(a.scale, s[nt][e]) - sm.lse_s[i]) : 0.0f;
            dp[nt][e] = ok ? sc_mul(a.scale, p) * (dp[nt][e] - sm.delta_s[i]) : 0.0f;  // ds^T
            s[nt][e] = p;                                                             // p^T
        }
    float dv_acc[D / 8][4], dk_acc[D / 8][4];
SC_UNROLL
    for (int dt = 0; dt < D / 8; dt++)
SC_UNROLL
        for (int e = 0; e < 4; e++) dv_acc[dt][e] = dk_acc[dt][e] = 0.0f;
SC_UNROLL
    for (int c = 0; c < C; c++) {
        if (c < cbeg || c >= cend) continue;
        uint32_t pa[4], da[4];
        frag_a_from_acc(pa, s[2 * c], s[2 * c + 1]);
        frag_a_from_acc(da, dp[2 * c], dp[2 * c + 1]);
SC_UNROLL
        for (int dt = 0; dt < D / 8; dt++) {
            uint32_t b0, b1;
            frag_b_cols(b0, b1, sm.Gs, LD, c * 16, dt * 8);
            sc_mma(dv_acc[dt], pa, b0, b1);
            frag_b_cols(b0, b1, sm.Qs, LD, c * 16, dt * 8);
            sc_mma(dk_acc[dt], da, b0, b1);
        }
    }
    store_rows<D>(gr.dv, gr.dv16, koff, HD, dv_acc, j0, a.Tk, add);
    store_rows<D>(gr.dk, gr.dk16, koff, HD, dk_acc, j0, a.Tk, add);
}

// A block's work for one (batch, head): Q, bf16(dout), K, V and lse
// staged; phase 1 (queries) then phase 2 (keys). smem: bwd_smem(D, Tq, Tk)
// bytes, 16-byte aligned.
template <int D, int C>
SC_FN void short_bwd_block(const FlashArgs &a, unsigned char *smem, int b, int h, const float *dout, const float *lse,
                           float *delta, const FlashGrads &gr, bool add) {
    constexpr int LD = D + 8;
    const int Tqp = round16(a.Tq), Tkp = round16(a.Tk);
    uint16_t *Qs = (uint16_t *)smem, *Gs = Qs + Tqp * LD, *Ks = Gs + Tqp * LD, *Vs = Ks + Tkp * LD;
    float *lse_s = (float *)(Vs + Tkp * LD), *delta_s = lse_s + Tqp;
    const BwdSmem sm = {Qs, Gs, Ks, Vs, lse_s, delta_s};
    const long long HD = (long long)a.H * D;
    const int w = sc_tid() / SC_WARP;
    const long long qoff = (long long)b * a.Tq * HD + (long long)h * D;
    const long long koff = (long long)b * a.Tk * HD + (long long)h * D;
    const long long loff = ((long long)b * a.H + h) * a.Tq;
    stage_bf16<D>(Qs, a.q + qoff, HD, a.Tq, Tqp);
    stage_f32<D>(Gs, dout + qoff, HD, a.Tq, Tqp);
    stage_bf16<D>(Ks, a.k + koff, HD, a.Tk, Tkp);
    stage_bf16<D>(Vs, a.v + koff, HD, a.Tk, Tkp);
    for (int r = sc_tid(); r < Tqp; r += SC_THREADS) lse_s[r] = r < a.Tq ? lse[loff + r] : -INFINITY;
    sc_sync();
    const int klen = a.k_len[b];
    for (int i0 = w * 16; i0 < a.Tq; i0 += SC_WARPS * 16)
        bwd_query_rows<D, C>(a, sm, delta + loff, gr, qoff, i0, klen, add);
    sc_sync();  // every row's delta in delta_s
    for (int j0 = w * 16; j0 < a.Tk; j0 += SC_WARPS * 16)
        bwd_key_rows<D, C>(a, sm, gr, koff, j0, klen, add);
    sc_sync();  // the next batch's rows overwrite shared memory
}

#endif
