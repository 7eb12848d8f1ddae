// attn_tile.h: the register-tiled products of the fused attention kernels
// (attention.cu) and their shared-memory layouts, written once for the device
// and the host so that test/test_attn_tile.c can enumerate the index
// arithmetic and run the very same loops on the CPU. Private to kernels/cuda
// and that test; plain C when not compiled by nvcc.
//
// Every product is C(m, n) (+)= sum_k A(m, k) B(k, n), A (M, K) and B (K, N)
// in shared memory at element strides (rs along rows, cs along columns).
// Each thread owns tiles of ATT_TM x ATT_TN outputs: per k it loads ATT_TM
// values of A and ATT_TN of B once and does ATT_TM * ATT_TN fmaf, so shared
// loads per fmaf drop from 2 (one thread per output) to (TM + TN) / (TM TN).
//
// Tile e of an (M, N) output is (tm, tn) = (e / tiles_n, e % tiles_n); its
// element (r, c) is row tm + r * tiles_m, column tn + c * tiles_n. The rows
// and columns are interleaved rather than contiguous so that, for a fixed
// (r, c), the 32 threads of a warp read consecutive rows of A and columns of
// B: conflict-free banks when A's row stride and B's column stride are 1 or
// odd, which the layouts below keep (odd padded row strides). Elements past
// M or N (ragged edges) are computed from a clamped, in-range row or column
// and never written.
//
// Bits: every element's accumulator starts at 0.0f, takes
// acc = fmaf(A(m, k), B(k, n), acc) for k = 0, 1, ..., K - 1 and is stored
// (C = acc) or added (C = C + acc): the general path's expression, so the
// fused and general paths agree bit for bit.
#ifndef TPTRAIN_ATTN_TILE_H
#define TPTRAIN_ATTN_TILE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "bf16.h"  // tp_f32_to_bf16: the C16 stores

#ifdef __CUDACC__
#define ATT_HD __host__ __device__ __forceinline__
#else
#define ATT_HD static inline
#endif
#ifdef __CUDA_ARCH__  // the device pass: the tile loops fully unrolled into registers
#define ATT_UNROLL _Pragma("unroll")
#define ATT_UNROLL_K _Pragma("unroll 2")  // the k loop: 2 steps a pass fit 64 registers unspilled
#else
#define ATT_UNROLL
#define ATT_UNROLL_K
#endif

#define ATT_TM 4      // output rows per thread tile
#define ATT_TN 4      // output columns per thread tile
#define ATT_QROWS 32  // query rows per pass of the fused forward
#define ATT_THREADS 256  // threads of a fused block (8 warps)
#define ATT_WARP 32

// ---- the mapping from (thread tile e, r, c) to output elements ------------------

typedef struct {
    int M, N, tiles_m, tiles_n;
} AttTiles;

ATT_HD AttTiles att_tiles(int M, int N) {
    AttTiles g = {M, N, (M + ATT_TM - 1) / ATT_TM, (N + ATT_TN - 1) / ATT_TN};
    return g;
}
ATT_HD int att_tile_count(AttTiles g) { return g.tiles_m * g.tiles_n; }
ATT_HD int att_row(AttTiles g, int e, int r) { return e / g.tiles_n + r * g.tiles_m; }
ATT_HD int att_col(AttTiles g, int e, int c) { return e % g.tiles_n + c * g.tiles_n; }
// The row (column) read for tile row r: att_row, or the last row when past M.
ATT_HD int att_clamp(int x, int n) { return x < n ? x : n - 1; }

// Element (row, col) of a shared-memory operand at p[row * rs + col * cs].
typedef struct {
    const float *p;
    int rs, cs;
} AttMat;

ATT_HD AttMat att_mat(const float *p, int rs, int cs) {
    AttMat m = {p, rs, cs};
    return m;
}

// One product: C (row stride c_rs, unit column stride) = A B, or += when
// accumulate; or, C16 set instead of C, A B stored as bf16 bits (rounded
// as tp_f32_to_bf16 rounds; never accumulated); A is (M, K), B is (K, N),
// M and N >= 1. Tile e goes to thread
// (first + e) % ATT_THREADS, so a product can start where another one left
// threads idle (first is a multiple of the warp size: warps keep whole runs
// of consecutive tiles).
typedef struct {
    float *C;
    uint16_t *C16;
    long long c_rs;
    int accumulate;
    AttMat A, B;
    int M, N, K, first;
} AttProduct;

ATT_HD AttProduct att_product(float *C, long long c_rs, int accumulate, AttMat A, AttMat B, int M, int N, int K) {
    AttProduct p = {C, NULL, c_rs, accumulate, A, B, M, N, K, 0};
    return p;
}

// The first tile thread tid owns (later ones follow every ATT_THREADS).
ATT_HD int att_first_tile(const AttProduct *p, int tid) { return (tid + ATT_THREADS - p->first) % ATT_THREADS; }

// Thread tid's share of product p (every thread of the block calls it).
ATT_HD void att_run(const AttProduct *p, int tid) {
    const AttTiles g = att_tiles(p->M, p->N);
    const int n_tiles = att_tile_count(g), M = p->M, N = p->N;
    for (int e = att_first_tile(p, tid); e < n_tiles; e += ATT_THREADS) {
        const float *a_row[ATT_TM], *b_col[ATT_TN];
        float acc[ATT_TM][ATT_TN];
        ATT_UNROLL for (int r = 0; r < ATT_TM; r++) a_row[r] = p->A.p + att_clamp(att_row(g, e, r), M) * p->A.rs;
        ATT_UNROLL for (int c = 0; c < ATT_TN; c++) b_col[c] = p->B.p + att_clamp(att_col(g, e, c), N) * p->B.cs;
        ATT_UNROLL for (int r = 0; r < ATT_TM; r++) {
            ATT_UNROLL for (int c = 0; c < ATT_TN; c++) acc[r][c] = 0.0f;
        }
        ATT_UNROLL_K for (int k = 0; k < p->K; k++) {
            float a[ATT_TM], b[ATT_TN];
            const int ka = k * p->A.cs, kb = k * p->B.rs;
            ATT_UNROLL for (int r = 0; r < ATT_TM; r++) a[r] = a_row[r][ka];
            ATT_UNROLL for (int c = 0; c < ATT_TN; c++) b[c] = b_col[c][kb];
            ATT_UNROLL for (int r = 0; r < ATT_TM; r++) {
                ATT_UNROLL for (int c = 0; c < ATT_TN; c++) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
            }
        }
        ATT_UNROLL for (int r = 0; r < ATT_TM; r++) {
            const int m = att_row(g, e, r);
            if (m >= M) continue;
            ATT_UNROLL for (int c = 0; c < ATT_TN; c++) {
                const int n = att_col(g, e, c);
                if (n >= N) continue;
                if (p->C16) {
                    p->C16[m * p->c_rs + n] = tp_f32_to_bf16(acc[r][c]);
                    continue;
                }
                float *o = p->C + m * p->c_rs + n;
                *o = p->accumulate ? *o + acc[r][c] : acc[r][c];
            }
        }
    }
}

// ---- the fused kernels' shared memory ------------------------------------------------

// An odd row stride of at least n floats: rows read across a warp's threads
// then fall in distinct banks.
ATT_HD int att_ld(int n) { return n | 1; }

// Forward (floats): K (Tk, ld_d), V (Tk, D), a query tile (ATT_QROWS, ld_d)
// and its scores, then probabilities (ATT_QROWS, ld_s).
typedef struct {
    float *K, *V, *Q, *S;
    int ld_d, ld_s;
} AttFwdSmem;

ATT_HD size_t att_fwd_smem_floats(int Tk, int D) {
    return (size_t)Tk * att_ld(D) + (size_t)Tk * D + (size_t)ATT_QROWS * att_ld(D) + (size_t)ATT_QROWS * att_ld(Tk);
}
ATT_HD AttFwdSmem att_fwd_smem(float *smem, int Tk, int D) {
    AttFwdSmem s;
    s.ld_d = att_ld(D);
    s.ld_s = att_ld(Tk);
    s.K = smem;
    s.V = s.K + (size_t)Tk * s.ld_d;
    s.Q = s.V + (size_t)Tk * D;
    s.S = s.Q + (size_t)ATT_QROWS * s.ld_d;
    return s;
}

// S = q k^T for the tile's nq query rows: (nq, Tk) over d.
ATT_HD AttProduct att_fwd_scores(const AttFwdSmem *s, int nq, int Tk, int D) {
    return att_product(s->S, s->ld_s, 0, att_mat(s->Q, s->ld_d, 1), att_mat(s->K, 1, s->ld_d), nq, Tk, D);
}

// out = P v for the tile's nq rows: (nq, D) over keys, into rows of stride HD.
ATT_HD AttProduct att_fwd_out(const AttFwdSmem *s, float *out, long long HD, int nq, int Tk, int D) {
    return att_product(out, HD, 0, att_mat(s->S, s->ld_s, 1), att_mat(s->V, D, 1), nq, D, Tk);
}

// Backward (floats): X (Tq, ld_d) holds dout, later q; W (Tk, ld_d) holds v,
// later k; Y (Tq, ld_s) holds P, then dP, then dS (softmax backward in place).
typedef struct {
    float *X, *W, *Y;
    int ld_d, ld_s;
} AttBwdSmem;

ATT_HD size_t att_bwd_smem_floats(int Tq, int Tk, int D) {
    return (size_t)(Tq + Tk) * att_ld(D) + (size_t)Tq * att_ld(Tk);
}
ATT_HD AttBwdSmem att_bwd_smem(float *smem, int Tq, int Tk, int D) {
    AttBwdSmem s;
    s.ld_d = att_ld(D);
    s.ld_s = att_ld(Tk);
    s.X = smem;
    s.W = s.X + (size_t)Tq * s.ld_d;
    s.Y = s.W + (size_t)Tk * s.ld_d;
    return s;
}

// The input gradients (dv, dq, dk) are added to (accumulate 1: GRAD_ADD) or
// stored, their old contents never read (0: GRAD_WRITE).

// dv (+)= P^T dout: (Tk, D) over queries; Y holds P, X dout.
ATT_HD AttProduct att_bwd_dv(const AttBwdSmem *s, float *dv, long long HD, int accumulate, int Tq, int Tk, int D) {
    return att_product(dv, HD, accumulate, att_mat(s->Y, 1, s->ld_s), att_mat(s->X, s->ld_d, 1), Tk, D, Tq);
}

// dP = dout v^T into Y: (Tq, Tk) over d; X holds dout, W v.
ATT_HD AttProduct att_bwd_dp(const AttBwdSmem *s, int Tq, int Tk, int D) {
    return att_product(s->Y, s->ld_s, 0, att_mat(s->X, s->ld_d, 1), att_mat(s->W, 1, s->ld_d), Tq, Tk, D);
}

// dq (+)= dS k: (Tq, D) over keys; Y holds dS, W k.
ATT_HD AttProduct att_bwd_dq(const AttBwdSmem *s, float *dq, long long HD, int accumulate, int Tq, int Tk, int D) {
    return att_product(dq, HD, accumulate, att_mat(s->Y, s->ld_s, 1), att_mat(s->W, s->ld_d, 1), Tq, D, Tk);
}

// dk (+)= dS^T q: (Tk, D) over queries; Y holds dS, X q. Run beside dq (the
// same phase), its tiles start on the warp after dq's last tile.
ATT_HD AttProduct att_bwd_dk(const AttBwdSmem *s, float *dk, long long HD, int accumulate, int Tq, int Tk, int D) {
    AttProduct p = att_product(dk, HD, accumulate, att_mat(s->Y, 1, s->ld_s), att_mat(s->X, s->ld_d, 1), Tk, D, Tq);
    const int dq_tiles = att_tile_count(att_tiles(Tq, D));
    p.first = (dq_tiles + ATT_WARP - 1) / ATT_WARP * ATT_WARP % ATT_THREADS;
    return p;
}

#endif
