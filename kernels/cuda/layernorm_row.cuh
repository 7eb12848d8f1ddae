// layernorm_row.cuh: LayerNorm's rows, forward and backward, as kernels that
// layernorm.cu and residual_ln.cu both instantiate, so the fused residual
// op's LayerNorm is the plain op's bit for bit (the model may fuse a
// boundary in one recompute mode and not in another, and promises the same
// bits). Private to kernels/cuda.
//
// Shaped for memory speed (d_model 512: a row is 2 KiB, its statistics a
// few hundred flops): a warp per row, and the row read from global memory
// once. Lane l holds the row's columns c = 128 j + 4 l + e (e = 0..3; its
// element k = 4 j + e): with rows 4-wide and pointers 16-byte aligned
// (VEC) each group of four is one float4 load, else four scalar loads of
// the same elements. Rows up to LN_MAX_NJ * 128 wide stay in registers (NJ
// groups a lane, a template argument: 16 floats a lane at d_model 512); a
// wider row (NJ = 0) is read from global memory per pass in the same order.
// Every sum runs in that one order (a lane's elements in k order, then the
// fixed warp butterfly), so registers or not, vector loads or not, the
// bits are the same; the arithmetic is pinned with __f*_rn (no FMA
// contraction left to the compiler) for the same reason.
//
// Row statistics are summed in double like the CPU (two-pass mean and
// biased variance; the two means of the backward), from the registers: the
// second pass costs no memory traffic. Double, not float: the CPU rounds
// mean and rstd from double sums, and so the GPU's mean and rstd usually
// carry the CPU's very bits; the op test's band (harness.h's SUM_RTOL)
// covers the rest, the order of the sums. Per element that is two fp64
// conversions forward and four backward: about a third of what an H200's
// conversion units do at memory speed.
//
// The backward sums dgamma, dbeta (and a fused op's bias gradient) in
// colsum.cuh's order while it has the row: a block of COLSUM_STREAMS warps
// takes one chunk of COLSUM_CHUNK_ROWS rows, warp w its stream (rows w,
// w + 8, ... of the chunk), the stream's column sums in shared memory
// (each lane's own columns, [warp][sum][k][lane]: conflict-free, no
// barrier until the chunk's end), then the block adds the streams in order
// and writes the chunk's partials. Where that shared memory is more than
// the device allows (or NJ = 0), the row kernel runs without it and a
// column kernel makes the same partials from the stored tensors.
//
// The row and block code is written in row_prims.h's primitives (block
// and thread indices as arguments, shared memory as a pointer), so
// test/test_ln_rows.cc runs it on the CPU; the __global__ kernels that
// call it and their launches are nvcc's alone.
#ifndef TPTRAIN_LAYERNORM_ROW_CUH
#define TPTRAIN_LAYERNORM_ROW_CUH

#include <math.h>

#include <type_traits>

#include "colsum.cuh"

#define LN_GROUP (4 * RP_WARP)  // columns of one group j across the warp
#define LN_MAX_NJ 8             // groups a lane holds in registers: rows up to 1024 wide
#define LN_THREADS (COLSUM_STREAMS * RP_WARP)  // a warp per row; a backward block is one chunk's streams
#define LN_ROWS_PER_BLOCK (LN_THREADS / RP_WARP)

// ---- the element order -----------------------------------------------------------

RP_FN int ln_col(int k, int lane) { return LN_GROUP * (k >> 2) + 4 * lane + (k & 3); }

// Elements a lane visits (valid or not): 4 * groups.
template <int NJ>
RP_FN int ln_nk(int C) {
    return NJ > 0 ? 4 * NJ : 4 * ((C + LN_GROUP - 1) / LN_GROUP);
}

// A row's elements of this lane: registers (NJ > 0, zeros past C) or, for
// NJ = 0, read where they are.
template <int NJ>
struct LnRow {
    float v[4 * NJ];
    RP_FN float at(int k, int) const { return v[k]; }
};
template <>
struct LnRow<0> {
    const float *p;
    RP_FN float at(int k, int lane) const { return p[ln_col(k, lane)]; }
};

// The row r's elements into registers (NJ > 0), or the pointer kept (NJ = 0).
template <int NJ, bool VEC>
RP_FN void ln_load(LnRow<NJ> &row, const float *r, int C, int lane) {
RP_UNROLL
    for (int j = 0; j < NJ; j++) {
        const int c0 = LN_GROUP * j + 4 * lane;
        if (VEC) {  // C % 4 == 0: a group is whole or absent
            float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (c0 < C) rp_ld4(t, r + c0);
            row.v[4 * j] = t[0], row.v[4 * j + 1] = t[1], row.v[4 * j + 2] = t[2], row.v[4 * j + 3] = t[3];
        } else {
RP_UNROLL
            for (int e = 0; e < 4; e++) row.v[4 * j + e] = c0 + e < C ? r[c0 + e] : 0.0f;
        }
    }
}
template <>
RP_FN void ln_load<0, true>(LnRow<0> &row, const float *r, int, int) { row.p = r; }
template <>
RP_FN void ln_load<0, false>(LnRow<0> &row, const float *r, int, int) { row.p = r; }

// Four values of group j kept in a register row (NJ = 0: nothing kept).
template <int NJ>
RP_FN void ln_keep4(LnRow<NJ> &row, int j, const float (&o)[4]) {
RP_UNROLL
    for (int e = 0; e < 4; e++) row.v[4 * j + e] = o[e];
}
template <>
RP_FN void ln_keep4<0>(LnRow<0> &, int, const float (&)[4]) {}

// Stores of four consecutive elements (VEC) or one.
RP_FN void ln_st4(float *o, const float (&v)[4]) { rp_st4(o, v); }
RP_FN void ln_st4(uint16_t *o, const float (&v)[4]) {
    const uint16_t h[4] = {tp_f32_to_bf16(v[0]), tp_f32_to_bf16(v[1]), tp_f32_to_bf16(v[2]), tp_f32_to_bf16(v[3])};
    rp_st4h(o, h);
}
RP_FN void ln_st1(float *o, float v) { *o = v; }
RP_FN void ln_st1(uint16_t *o, float v) { *o = tp_f32_to_bf16(v); }

// ---- the arithmetic (each rounding pinned) ------------------------------------------

RP_FN float ln_xhat(float x, float m, float rs) { return rp_fmul(rp_fsub(x, m), rs); }

// (x - mean) * rstd * gamma + beta: the CPU's expression, its roundings.
RP_FN float ln_y(float x, float m, float rs, float g, float b) {
    return rp_fadd(rp_fmul(ln_xhat(x, m, rs), g), b);
}

// rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
RP_FN float ln_dx(float dy, float x, float gam, float m, float rs, float mean_g, float mean_gx) {
    const float g = rp_fmul(dy, gam), xhat = ln_xhat(x, m, rs);
    return rp_fmul(rs, rp_fsub(rp_fsub(g, mean_g), rp_fmul(xhat, mean_gx)));
}

// ---- row statistics ----------------------------------------------------------------

// mean and rstd of the row x (C > 0): two passes in double over the lane's
// elements, each reduced by the warp butterfly; rounded to float as the CPU.
template <int NJ>
RP_FN void ln_row_stats(const LnRow<NJ> &x, int C, float eps, int lane, float *m_out,
                                             float *rs_out) {
    const int nk = ln_nk<NJ>(C);
    double sum = 0.0;
RP_UNROLL
    for (int k = 0; k < nk; k++)
        if (ln_col(k, lane) < C) sum += (double)x.at(k, lane);
    sum = rp_warp_sum(sum);
    const double mu = sum / C;
    double sq = 0.0;
RP_UNROLL
    for (int k = 0; k < nk; k++)
        if (ln_col(k, lane) < C) {
            const double d = (double)x.at(k, lane) - mu;
            sq = rp_dfma(d, d, sq);
        }
    sq = rp_warp_sum(sq);
    *m_out = (float)mu;
    *rs_out = (float)(1.0 / sqrt(sq / C + (double)eps));
}

// mean(g) and mean(g * xhat) of the backward, g = dy * gamma (C > 0).
template <int NJ>
RP_FN void ln_bwd_means(const LnRow<NJ> &dy, const LnRow<NJ> &x, const LnRow<NJ> &gam, float m,
                                             float rs, int C, int lane, float *mean_g, float *mean_gx) {
    const int nk = ln_nk<NJ>(C);
    double sg = 0.0, sgx = 0.0;
RP_UNROLL
    for (int k = 0; k < nk; k++)
        if (ln_col(k, lane) < C) {
            const float g = rp_fmul(dy.at(k, lane), gam.at(k, lane)), xhat = ln_xhat(x.at(k, lane), m, rs);
            sg += (double)g;
            sgx += (double)g * (double)xhat;  // exact product: the same with or without FMA
        }
    sg = rp_warp_sum(sg);
    sgx = rp_warp_sum(sgx);
    *mean_g = (float)(sg / C);
    *mean_gx = (float)(sgx / C);
}

// ---- forward -----------------------------------------------------------------------

// The LayerNorm output of a row: y (fp32) or its bf16 rounding (OutT).
template <int NJ, bool VEC, typename OutT>
RP_FN void ln_row_out(OutT *yr, const LnRow<NJ> &x, const float *gamma, const float *beta,
                                           float m, float rs, int C, int lane) {
    const int nj = ln_nk<NJ>(C) / 4;
RP_UNROLL
    for (int j = 0; j < nj; j++) {
        const int c0 = LN_GROUP * j + 4 * lane;
        if (VEC) {
            if (c0 < C) {
                float g[4], b[4], o[4];
                rp_ld4(g, gamma + c0);
                rp_ld4(b, beta + c0);
RP_UNROLL
                for (int e = 0; e < 4; e++) o[e] = ln_y(x.at(4 * j + e, lane), m, rs, g[e], b[e]);
                ln_st4(yr + c0, o);
            }
        } else {
RP_UNROLL
            for (int e = 0; e < 4; e++)
                if (c0 + e < C) ln_st1(yr + c0 + e, ln_y(x.at(4 * j + e, lane), m, rs, gamma[c0 + e], beta[c0 + e]));
        }
    }
}

// The rows' source: Src::row(x, n, lane) fills (or points) x with row n's
// LayerNorm input: layernorm.cu's reads it, residual_ln.cu's makes it
// (writing res_out) and keeps it. Src::begin() runs once per thread (src:
// the thread's own copy, as a kernel argument is).
// Thread tid of block `block` of `grid` (LN_THREADS threads): a warp per
// row, rows block * LN_ROWS_PER_BLOCK + warp, then every grid-th block's.
template <int NJ, bool VEC, typename Src, typename OutT>
RP_FN void ln_fwd_block(Src src, OutT *y,                          // (N, C)
                        float *mean, float *rstd,                  // (N)
                        const float *gamma, const float *beta,     // (C)
                        int N, int C, float eps, int block, int grid, int tid) {
    src.begin();
    const int lane = tid % RP_WARP;
    for (int n = block * LN_ROWS_PER_BLOCK + tid / RP_WARP; n < N; n += grid * LN_ROWS_PER_BLOCK) {
        LnRow<NJ> x;
        src.template row<NJ, VEC>(x, n, C, lane);
        float m = 0.0f, rs;
        if (C > 0) {
            ln_row_stats<NJ>(x, C, eps, lane, &m, &rs);
            ln_row_out<NJ, VEC>(y + (size_t)n * C, x, gamma, beta, m, rs, C, lane);
        } else {
            rs = (float)(1.0 / sqrt((double)eps));  // the CPU's statistics of an empty row
        }
        if (lane == 0) {
            mean[n] = m;
            rstd[n] = rs;
        }
    }
}

// ---- backward ----------------------------------------------------------------------

// The backward's column sums in shared memory: [warp][sum][k][lane].
template <int NJ>
RP_FN double *ln_acc(double *acc, int n_sums, int warp, int s, int k, int lane) {
    return acc + (((size_t)(warp * n_sums + s) * (4 * NJ) + k) * RP_WARP + lane);
}

// The bytes of a block's column sums (0: none kept, NJ = 0).
static inline size_t ln_acc_bytes(int nj, int n_sums) {
    return (size_t)COLSUM_STREAMS * n_sums * 4 * nj * RP_WARP * sizeof(double);
}

// Inputs of the backward's rows.
typedef struct {
    float *dx;           // (N, C) accumulated: LayerNorm's dx, the fused op's d_res
    const float *dy;     // (N, C)
    const float *x;      // (N, C)
    const float *mean;   // (N)
    const float *rstd;   // (N)
    const float *gamma;  // (C)
} LnBwdRows;

// One row n of the backward: dx += LayerNorm's input gradient, then the
// tail (Tail::group4 on four consecutive columns of the new dx, VEC;
// Tail::one on one) with the third column sum's terms; with ACC the column
// sums of the warp's stream added to.
template <int NJ, bool VEC, bool ACC, typename Tail>
RP_FN void ln_bwd_row(const Tail &tail, const LnBwdRows &a, const LnRow<NJ> &gam, double *acc,
                                           int n_sums, int n, int C, int warp, int lane) {
    const size_t at = (size_t)n * C;
    const float m = a.mean[n], rs = a.rstd[n];
    LnRow<NJ> dy, x, dr;
    ln_load<NJ, VEC>(dy, a.dy + at, C, lane);
    ln_load<NJ, VEC>(x, a.x + at, C, lane);
    ln_load<NJ, VEC>(dr, a.dx + at, C, lane);
    float mean_g, mean_gx;
    ln_bwd_means<NJ>(dy, x, gam, m, rs, C, lane, &mean_g, &mean_gx);
    const int nj = ln_nk<NJ>(C) / 4;
RP_UNROLL
    for (int j = 0; j < nj; j++) {
        const int c0 = LN_GROUP * j + 4 * lane;
        if (c0 >= C) continue;
        float v[4], term[4] = {0.0f, 0.0f, 0.0f, 0.0f};
RP_UNROLL
        for (int e = 0; e < 4; e++) {
            const int k = 4 * j + e;
            v[e] = c0 + e < C ? rp_fadd(dr.at(k, lane),
                                          ln_dx(dy.at(k, lane), x.at(k, lane), gam.at(k, lane), m, rs, mean_g, mean_gx))
                              : 0.0f;
        }
        if (VEC) {
            ln_st4(a.dx + at + c0, v);
            tail.group4(at, c0, v, term);
        } else {
RP_UNROLL
            for (int e = 0; e < 4; e++)
                if (c0 + e < C) {
                    a.dx[at + c0 + e] = v[e];
                    term[e] = tail.one(at, c0 + e, v[e]);
                }
        }
        if (ACC) {
RP_UNROLL
            for (int e = 0; e < 4; e++) {
                const int k = 4 * j + e;
                if (c0 + e >= C) continue;
                const float dyv = dy.at(k, lane), xhat = ln_xhat(x.at(k, lane), m, rs);
                *ln_acc<NJ>(acc, n_sums, warp, 0, k, lane) += (double)dyv * (double)xhat;
                *ln_acc<NJ>(acc, n_sums, warp, 1, k, lane) += (double)dyv;
                if (n_sums > 2) *ln_acc<NJ>(acc, n_sums, warp, 2, k, lane) += (double)term[e];
            }
        }
    }
}

// The chunk's partials: the streams' sums of each column added in warp order.
template <int NJ>
RP_FN void ln_chunk_partials(const ColsumPlanes &pl, const double *acc, int n_sums, int chunk, int C, int tid) {
    for (int s = 0; s < n_sums; s++) {
        if (pl.dst[s] == NULL) continue;
        double *part = (double *)pl.part[s];
        for (int c = tid; c < C; c += LN_THREADS) {
            const int k = 4 * (c / LN_GROUP) + c % 4, l = (c % LN_GROUP) / 4;
            double p = 0.0;
            for (int w = 0; w < COLSUM_STREAMS; w++) p += acc[((size_t)(w * n_sums + s) * (4 * NJ) + k) * RP_WARP + l];
            part[(size_t)chunk * C + c] = p;
        }
    }
}

// Block `block` of `grid` (LN_THREADS threads, thread tid): chunks block,
// then every grid-th; warp w takes rows w, w + COLSUM_STREAMS, ... of the
// chunk. With ACC (NJ > 0; acc: shared memory of ln_acc_bytes(NJ, n_sums))
// the partials of pl (n_sums of them: dgamma, dbeta, the tail's) are
// written. tail: the thread's own copy.
template <int NJ, bool VEC, bool ACC, typename Tail>
RP_FN void ln_bwd_block(Tail tail, const LnBwdRows &a, const ColsumPlanes &pl, int n_sums, int n_chunks, int N, int C,
                        double *acc, int block, int grid, int tid) {
    static_assert(!ACC || NJ > 0, "column sums in shared memory need the row in registers");
    tail.begin();
    const int lane = tid % RP_WARP, warp = tid / RP_WARP;
    LnRow<NJ> gam;
    ln_load<NJ, VEC>(gam, a.gamma, C, lane);
    for (int chunk = block; chunk < n_chunks; chunk += grid) {
        if (ACC)
            for (int i = 0; i < n_sums * 4 * NJ; i++) acc[((size_t)warp * n_sums * 4 * NJ + i) * RP_WARP + lane] = 0.0;
        for (int r = warp; r < COLSUM_CHUNK_ROWS; r += COLSUM_STREAMS) {
            const int n = chunk * COLSUM_CHUNK_ROWS + r;
            if (n >= N) break;
            ln_bwd_row<NJ, VEC, ACC>(tail, a, gam, acc, n_sums, n, C, warp, lane);
        }
        if (ACC) {
            rp_sync();  // every stream summed
            ln_chunk_partials<NJ>(pl, acc, n_sums, chunk, C, tid);
            rp_sync();  // read before the next chunk zeroes it
        }
    }
}

// Block (bx, by) of a grid (ceil(C/32), gy), thread (tx, ty) of (32,
// COLSUM_STREAMS): the same partials from the stored tensors, for the rows
// run without ACC: dy * xhat (dgamma), dy (dbeta) and, with pl.dst[2], the
// tail's terms as Tail::term reads them back. s: shared
// [3][COLSUM_STREAMS][COLSUM_COLS].
template <typename Tail>
RP_FN void ln_bwd_partial_block(const Tail &tail, const LnBwdRows &a, const ColsumPlanes &pl, int N, int C,
                                double (*s)[COLSUM_STREAMS][COLSUM_COLS], int bx, int by, int gy, int tx, int ty) {
    const int c = bx * COLSUM_COLS + tx;
    const bool third = pl.dst[2] != NULL;
    for (int chunk = by; (long long)chunk * COLSUM_CHUNK_ROWS < N; chunk += gy) {
        const int row_end = N < (chunk + 1) * COLSUM_CHUNK_ROWS ? N : (chunk + 1) * COLSUM_CHUNK_ROWS;
        double dg = 0.0, db = 0.0, dt = 0.0;
        if (c < C)
            for (int n = chunk * COLSUM_CHUNK_ROWS + ty; n < row_end; n += COLSUM_STREAMS) {
                const size_t i = (size_t)n * C + c;
                const float dyv = a.dy[i], xhat = ln_xhat(a.x[i], a.mean[n], a.rstd[n]);
                dg += (double)dyv * (double)xhat;
                db += (double)dyv;
                if (third) dt += (double)tail.term(i);
            }
        rp_sync();  // the previous chunk's sums are read
        s[0][ty][tx] = dg;
        s[1][ty][tx] = db;
        s[2][ty][tx] = dt;
        rp_sync();
        if (ty == 0 && c < C)
            for (int q = 0; q < 3; q++) {
                if (pl.dst[q] == NULL) continue;
                double sum = 0.0;
                for (int r = 0; r < COLSUM_STREAMS; r++) sum += s[q][r][tx];
                ((double *)pl.part[q])[(size_t)chunk * C + c] = sum;
            }
    }
}

// The groups a lane holds for rows C wide: 1, 2, 4 or 8, or 0 (wider: rows
// read from global memory per pass).
static inline int ln_groups(int C) {
    const int need = (C + LN_GROUP - 1) / LN_GROUP;
    int nj = 1;
    while (nj < need) nj *= 2;
    return nj <= LN_MAX_NJ ? nj : 0;
}

static inline bool ln_aligned(const void *p, size_t to) { return p == NULL || (uintptr_t)p % to == 0; }

// Instantiates `launch` for the groups of C (a generic lambda taking an
// std::integral_constant<int, NJ>).
template <typename F>
static void ln_dispatch_nj(int nj, F launch) {
    switch (nj) {
        case 1: launch(std::integral_constant<int, 1>()); break;
        case 2: launch(std::integral_constant<int, 2>()); break;
        case 4: launch(std::integral_constant<int, 4>()); break;
        case 8: launch(std::integral_constant<int, 8>()); break;
        default: launch(std::integral_constant<int, 0>()); break;
    }
}

// ---- the plain op's pieces (layernorm.cu) -----------------------------------------

// The forward's source: the rows of x as they are.
struct LnSrcPlain {
    const float *x;  // (N, C)
    RP_FN void begin() {}
    template <int NJ, bool VEC>
    RP_FN void row(LnRow<NJ> &r, int n, int C, int lane) const {
        ln_load<NJ, VEC>(r, x + (size_t)n * C, C, lane);
    }
};

// The backward's tail: nothing after dx (two column sums).
struct LnTailNone {
    RP_FN void begin() {}
    RP_FN void group4(size_t, int, const float (&)[4], float (&)[4]) const {}
    RP_FN float one(size_t, int, float) const { return 0.0f; }
    RP_FN float term(size_t) const { return 0.0f; }
};

#ifdef __CUDACC__
// ---- the kernels and their launches --------------------------------------------------

static inline unsigned ln_row_blocks(int N) { return tp_grid_1d((size_t)N, LN_ROWS_PER_BLOCK); }

template <int NJ, bool VEC, typename Src, typename OutT>
__global__ void __launch_bounds__(LN_THREADS) ln_fwd_kernel(Src src, OutT *y, float *mean, float *rstd,
                                                            const float *gamma, const float *beta, int N, int C,
                                                            float eps) {
    ln_fwd_block<NJ, VEC>(src, y, mean, rstd, gamma, beta, N, C, eps, blockIdx.x, gridDim.x, threadIdx.x);
}

// Rows up to 512 wide: two blocks an SM (128 registers a thread; the
// shared memory allows it), so 16 warps keep the loads in flight.
template <int NJ, bool VEC, bool ACC, typename Tail>
__global__ void __launch_bounds__(LN_THREADS, NJ > 0 && NJ <= 4 ? 2 : 1)
    ln_bwd_kernel(Tail tail, LnBwdRows a, ColsumPlanes pl, int n_sums, int n_chunks, int N, int C) {
    extern __shared__ double acc[];
    ln_bwd_block<NJ, VEC, ACC>(tail, a, pl, n_sums, n_chunks, N, C, acc, blockIdx.x, gridDim.x, threadIdx.x);
}

template <typename Tail>
__global__ void ln_bwd_partial_kernel(Tail tail, LnBwdRows a, ColsumPlanes pl, int N, int C) {
    __shared__ double s[3][COLSUM_STREAMS][COLSUM_COLS];
    ln_bwd_partial_block(tail, a, pl, N, C, s, blockIdx.x, blockIdx.y, gridDim.y, threadIdx.x, threadIdx.y);
}

// The backward's launches: the row kernel with its column sums where the
// device gives it the shared memory, else without and the column kernel
// after; then colsum.cuh's pass 2. `vec`: VEC's conditions hold.
template <bool VEC, typename Tail>
static void ln_bwd_launch(const Tail &tail, const LnBwdRows &a, const ColsumPlanes &pl, int n_sums, int N, int C,
                          cudaStream_t stream) {
    const int nj = ln_groups(C);
    const size_t acc_bytes = ln_acc_bytes(nj, n_sums);
    const int limit = tp_smem_optin_limit();
    const bool acc = nj > 0 && limit >= 0 && acc_bytes <= (size_t)limit;
    const int n_chunks = colsum_chunks(N);
    const unsigned grid = (unsigned)(n_chunks < (int)TP_MAX_GRID ? n_chunks : (int)TP_MAX_GRID);
    ln_dispatch_nj(acc ? nj : 0, [&](auto njc) {
        constexpr int NJ = decltype(njc)::value;
        if (NJ > 0) {
            auto kernel = ln_bwd_kernel<NJ, VEC, (NJ > 0), Tail>;
            tp_smem_optin(kernel, acc_bytes, "layernorm backward");
            kernel<<<grid, LN_THREADS, acc_bytes, stream>>>(tail, a, pl, n_sums, n_chunks, N, C);
        } else {
            ln_bwd_kernel<0, VEC, false, Tail><<<grid, LN_THREADS, 0, stream>>>(tail, a, pl, n_sums, n_chunks, N, C);
        }
        CUDA_CHECK(cudaGetLastError());
    });
    if (!acc) {
        dim3 g2((C + COLSUM_COLS - 1) / COLSUM_COLS, colsum_grid_y(N)), b2(COLSUM_COLS, COLSUM_STREAMS);
        ln_bwd_partial_kernel<Tail><<<g2, b2, 0, stream>>>(tail, a, pl, N, C);
        CUDA_CHECK(cudaGetLastError());
    }
    colsum_final_launch(pl, N, C, stream);
}

// The forward's launch: registers for rows up to LN_MAX_NJ groups.
template <typename Src, typename OutT>
static void ln_fwd_launch(const Src &src, OutT *y, float *mean, float *rstd, const float *gamma, const float *beta,
                          int N, int C, float eps, bool vec, cudaStream_t stream) {
    ln_dispatch_nj(ln_groups(C), [&](auto njc) {
        constexpr int NJ = decltype(njc)::value;
        if (vec)
            ln_fwd_kernel<NJ, true, Src, OutT><<<ln_row_blocks(N), LN_THREADS, 0, stream>>>(src, y, mean, rstd, gamma,
                                                                                              beta, N, C, eps);
        else
            ln_fwd_kernel<NJ, false, Src, OutT><<<ln_row_blocks(N), LN_THREADS, 0, stream>>>(src, y, mean, rstd, gamma,
                                                                                               beta, N, C, eps);
        CUDA_CHECK(cudaGetLastError());
    });
}
#endif

#endif
