// colsum.cuh: the one summation order of the column sums over rows
// (bias.cu's bias gradient, layernorm.cu's and residual_ln.cu's dgamma,
// dbeta and bias gradient), and its second pass. Private to kernels/cuda.
//
// Why one order for three files: the fused residual + LayerNorm backward
// promises the bits of the unfused ops (layernorm_bwd, then bias_bwd), and a
// column sum's bits are its order. The order is a function of N alone:
//   - rows are cut into chunks of COLSUM_CHUNK_ROWS (kernels/scratch_sizes.h);
//   - in a chunk, stream r (0 <= r < COLSUM_STREAMS) sums rows
//     r, r + COLSUM_STREAMS, ... of the chunk in row order, in double, from 0;
//   - the chunk's partial is the streams' sums added in r order, from 0;
//   - pass 2 (colsum_final_kernel): row-thread t of COLSUM_FIN_ROWT sums the
//     partials of chunks t, t + COLSUM_FIN_ROWT, ... in order, the
//     row-threads' sums are added in t order, and the result is added to the
//     fp32 destination, rounded once.
// Any kernel may produce the partials, a column kernel (a thread per
// (column, stream), as bias.cu) or a row kernel (a warp per stream, its
// columns' sums in shared memory, as layernorm_row.cuh's), and get the same
// bits. Chunks of 64 rows give a row kernel eight rows per warp and N/64
// blocks (enough to fill a GPU at 4k tokens) while the partials stay 1/64
// of the rows they sum; pass 2's tree keeps its serial chains at
// n_chunks / 32 loads.
//
// The block code is written in row_prims.h's primitives, so
// test/test_ln_rows.cc runs it on the CPU; the kernels and their launches
// are nvcc's alone.
#ifndef TPTRAIN_COLSUM_CUH
#define TPTRAIN_COLSUM_CUH

#include "row_prims.h"
#include "scratch_sizes.h"

#define COLSUM_CHUNK_ROWS SCRATCH_LN_CHUNK_ROWS  // kernels/scratch_sizes.h (the scratch sizes)
static_assert(SCRATCH_LN_CHUNK_ROWS == SCRATCH_BIAS_CHUNK_ROWS, "one order for the LayerNorm and bias sums");
#define COLSUM_STREAMS 8  // row streams per chunk (a column kernel's row-threads, a row kernel's warps)
static_assert(COLSUM_CHUNK_ROWS % COLSUM_STREAMS == 0, "whole streams per chunk");
#define COLSUM_COLS 32     // columns per block of a column kernel and of pass 2 (= blockDim.x)
#define COLSUM_FIN_ROWT 32 // row-threads per block of pass 2 (= blockDim.y)
#define COLSUM_MAX_SUMS 3  // dgamma, dbeta, the bias

// Up to COLSUM_MAX_SUMS column sums of one op: partial planes (n_chunks, C)
// and their fp32 destinations, accumulated (a NULL destination is skipped).
typedef struct {
    const double *part[COLSUM_MAX_SUMS];  // (n_chunks, C) each
    float *dst[COLSUM_MAX_SUMS];          // (C) accumulated, or NULL
} ColsumPlanes;

// One block of pass 2: column bx * COLSUM_COLS + tx of sum `which`, row-thread ty;
// s: shared [COLSUM_FIN_ROWT][COLSUM_COLS].
RP_FN void colsum_final_block(const ColsumPlanes &pl, int n_chunks, int C, double (*s)[COLSUM_COLS], int bx,
                              int which, int tx, int ty) {
    const int c = bx * COLSUM_COLS + tx;
    float *dst = pl.dst[which];
    if (dst == NULL) return;  // the whole block: no barrier is left waiting
    const double *part = pl.part[which];
    double acc = 0.0;
    if (c < C) {
        int k = ty;
        for (; k + 3 * COLSUM_FIN_ROWT < n_chunks; k += 4 * COLSUM_FIN_ROWT) {  // four loads in flight, summed in order
            const double a = part[(size_t)k * C + c], b = part[(size_t)(k + COLSUM_FIN_ROWT) * C + c];
            const double e = part[(size_t)(k + 2 * COLSUM_FIN_ROWT) * C + c];
            const double f = part[(size_t)(k + 3 * COLSUM_FIN_ROWT) * C + c];
            acc += a;
            acc += b;
            acc += e;
            acc += f;
        }
        for (; k < n_chunks; k += COLSUM_FIN_ROWT) acc += part[(size_t)k * C + c];
    }
    s[ty][tx] = acc;
    rp_sync();
    if (ty == 0 && c < C) {
        double sum = 0.0;
        for (int t = 0; t < COLSUM_FIN_ROWT; t++) sum += s[t][tx];
        dst[c] += (float)sum;
    }
}

static inline int colsum_chunks(int N) { return scratch_ln_chunks(N); }  // = scratch_bias_chunks(N)

#ifdef __CUDACC__
// grid (ceil(C / COLSUM_COLS), COLSUM_MAX_SUMS), block (COLSUM_COLS, COLSUM_FIN_ROWT); static:
// a copy per file that includes this one.
static __global__ void colsum_final_kernel(ColsumPlanes pl, int n_chunks, int C) {
    __shared__ double s[COLSUM_FIN_ROWT][COLSUM_COLS];
    colsum_final_block(pl, n_chunks, C, s, blockIdx.x, blockIdx.y, threadIdx.x, threadIdx.y);
}

// Pass 2 over the planes given.
static inline void colsum_final_launch(const ColsumPlanes &pl, int N, int C, cudaStream_t stream) {
    dim3 grid((C + COLSUM_COLS - 1) / COLSUM_COLS, COLSUM_MAX_SUMS), block(COLSUM_COLS, COLSUM_FIN_ROWT);
    colsum_final_kernel<<<grid, block, 0, stream>>>(pl, colsum_chunks(N), C);
    CUDA_CHECK(cudaGetLastError());
}

// The chunks a column kernel's grid.y covers: chunk blockIdx.y, then every
// gridDim.y-th (grid.y stays within the hardware's 65535).
static inline unsigned colsum_grid_y(int N) {
    const int n = colsum_chunks(N);
    return n < 1 ? 1u : (n > 65535 ? 65535u : (unsigned)n);
}
#endif

#endif
