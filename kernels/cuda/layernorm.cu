// layernorm.cu: LayerNorm forward and backward.
//
// One warp per row (rows are d_model wide, a few hundred to a few thousand),
// its work in layernorm_row.cuh (shared with residual_ln.cu): lanes stride
// the row, row statistics are summed in double like the CPU (two-pass mean
// and biased variance; the two means of the backward) and reduced with the
// fixed warp butterfly. mean and rstd are rounded to float exactly as the
// CPU rounds them.
//
// dgamma and dbeta are column sums over all rows. They are reduced without
// atomics, so the result never depends on scheduling: pass 1 cuts the rows
// into fixed chunks of LN_CHUNK_ROWS and a (32 x 8) block sums 32 columns
// of one chunk in double (each thread its rows in order, then the 8
// row-threads in order) into per-chunk partials; pass 2 sums each column's
// partials over chunks in order and adds the result, rounded once. The
// partials live in the caller's scratch (cuda_layernorm_bwd_scratch_bytes).
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "layernorm_row.cuh"

#define LN_THREADS 256  // 8 warps = 8 rows per block
#define LN_ROWS_PER_BLOCK (LN_THREADS / TP_WARP)
#define LN_COLS 32      // columns per block of the column pass (= blockDim.x)
#define LN_ROWT 8       // row-threads per block of the column pass (= blockDim.y)
#define LN_CHUNK_ROWS SCRATCH_LN_CHUNK_ROWS  // kernels/scratch_sizes.h (the scratch size)

// ---- kernels ---------------------------------------------------------------------

// y, x (N, C); mean, rstd (N); gamma, beta (C)
__global__ void layernorm_fwd_kernel(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                                     const float *beta, int N, int C, float eps) {
    const int lane = threadIdx.x % TP_WARP;
    for (int n = blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; n < N;
         n += gridDim.x * LN_ROWS_PER_BLOCK) {
        float m, rs;
        tp_ln_row_fwd(y + (size_t)n * C, NULL, x + (size_t)n * C, gamma, beta, C, eps, lane, &m, &rs);
        if (lane == 0) {
            mean[n] = m;
            rstd[n] = rs;
        }
    }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
__global__ void layernorm_bwd_dx_kernel(float *dx,           // (N, C) accumulated
                                        const float *dy,     // (N, C)
                                        const float *x,      // (N, C)
                                        const float *mean,   // (N)
                                        const float *rstd,   // (N)
                                        const float *gamma,  // (C)
                                        int N, int C) {
    const int lane = threadIdx.x % TP_WARP;
    for (int n = blockIdx.x * LN_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; n < N;
         n += gridDim.x * LN_ROWS_PER_BLOCK) {
        const size_t at = (size_t)n * C;
        tp_ln_row_bwd_dx(dx + at, dy + at, x + at, gamma, mean[n], rstd[n], C, lane);
    }
}

// grid (ceil(C/32), n_chunks), block (32, 8): per-chunk column sums of
// dy * xhat (dgamma) and dy (dbeta).
__global__ void layernorm_bwd_partial_kernel(double *part_dgamma,  // (n_chunks, C)
                                             double *part_dbeta,   // (n_chunks, C)
                                             const float *dy,      // (N, C)
                                             const float *x,       // (N, C)
                                             const float *mean,    // (N)
                                             const float *rstd,    // (N)
                                             int N, int C) {
    __shared__ double s_dg[LN_ROWT][LN_COLS];
    __shared__ double s_db[LN_ROWT][LN_COLS];
    const int c = blockIdx.x * LN_COLS + threadIdx.x;
    const int row_begin = blockIdx.y * LN_CHUNK_ROWS;
    const int row_end = min(N, row_begin + LN_CHUNK_ROWS);
    double dg = 0.0, db = 0.0;
    if (c < C)
        for (int n = row_begin + threadIdx.y; n < row_end; n += LN_ROWT) {
            size_t i = (size_t)n * C + c;
            float xhat = (x[i] - mean[n]) * rstd[n];
            dg += (double)dy[i] * xhat;
            db += dy[i];
        }
    s_dg[threadIdx.y][threadIdx.x] = dg;
    s_db[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sg = 0.0, sb = 0.0;
        for (int r = 0; r < LN_ROWT; r++) {
            sg += s_dg[r][threadIdx.x];
            sb += s_db[r][threadIdx.x];
        }
        part_dgamma[(size_t)blockIdx.y * C + c] = sg;
        part_dbeta[(size_t)blockIdx.y * C + c] = sb;
    }
}

__global__ void layernorm_bwd_final_kernel(float *dgamma,               // (C) accumulated
                                           float *dbeta,                // (C) accumulated
                                           const double *part_dgamma,   // (n_chunks, C)
                                           const double *part_dbeta,    // (n_chunks, C)
                                           int n_chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double sg = 0.0, sb = 0.0;
    for (int k = 0; k < n_chunks; k++) {
        sg += part_dgamma[(size_t)k * C + c];
        sb += part_dbeta[(size_t)k * C + c];
    }
    dgamma[c] += (float)sg;
    dbeta[c] += (float)sb;
}

// ---- launchers ---------------------------------------------------------------------

static unsigned row_blocks(int N) {
    return tp_grid_1d((size_t)N, LN_ROWS_PER_BLOCK);
}

static void layernorm_fwd_launch(float *y, float *mean, float *rstd, const float *x,
                                 const float *gamma, const float *beta, int N, int C, float eps,
                                 cudaStream_t stream) {
    layernorm_fwd_kernel<<<row_blocks(N), LN_THREADS, 0, stream>>>(y, mean, rstd, x, gamma,
                                                                   beta, N, C, eps);
    CUDA_CHECK(cudaGetLastError());
}

static int ln_chunks(int N) { return scratch_ln_chunks(N); }

static void layernorm_bwd_launch(float *dx, float *dgamma, float *dbeta, const float *dy,
                                 const float *x, const float *mean, const float *rstd,
                                 const float *gamma, int N, int C,
                                 double *part_dgamma,  // (n_chunks, C)
                                 double *part_dbeta,   // (n_chunks, C)
                                 cudaStream_t stream) {
    layernorm_bwd_dx_kernel<<<row_blocks(N), LN_THREADS, 0, stream>>>(dx, dy, x, mean, rstd,
                                                                      gamma, N, C);
    CUDA_CHECK(cudaGetLastError());

    const int n_chunks = ln_chunks(N);
    dim3 grid((C + LN_COLS - 1) / LN_COLS, n_chunks), block(LN_COLS, LN_ROWT);
    layernorm_bwd_partial_kernel<<<grid, block, 0, stream>>>(part_dgamma, part_dbeta, dy, x, mean,
                                                             rstd, N, C);
    CUDA_CHECK(cudaGetLastError());
    layernorm_bwd_final_kernel<<<(C + LN_THREADS - 1) / LN_THREADS, LN_THREADS, 0, stream>>>(
        dgamma, dbeta, part_dgamma, part_dbeta, n_chunks, C);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

extern "C" void cuda_op_layernorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                      const float *gamma, const float *beta, int N, int C,
                                      float eps, cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_layernorm_fwd", N);
    TP_NEED_SIZE("cuda_op_layernorm_fwd", C);
    if (N == 0) return;
    TP_NEED_PTR("cuda_op_layernorm_fwd", mean);
    TP_NEED_PTR("cuda_op_layernorm_fwd", rstd);
    if (C > 0) {
        TP_NEED_PTR("cuda_op_layernorm_fwd", y);
        TP_NEED_PTR("cuda_op_layernorm_fwd", x);
        TP_NEED_PTR("cuda_op_layernorm_fwd", gamma);
        TP_NEED_PTR("cuda_op_layernorm_fwd", beta);
    }
    layernorm_fwd_launch(y, mean, rstd, x, gamma, beta, N, C, eps, stream);
}

extern "C" size_t cuda_layernorm_bwd_scratch_bytes(int N, int C) {
    return scratch_layernorm_bwd(N, C);
}

extern "C" void cuda_op_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy,
                                      const float *x, const float *mean, const float *rstd,
                                      const float *gamma, int N, int C, void *scratch,
                                      cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_layernorm_bwd", N);
    TP_NEED_SIZE("cuda_op_layernorm_bwd", C);
    if (N == 0 || C == 0) return;  // adds nothing
    TP_NEED_PTR("cuda_op_layernorm_bwd", dx);
    TP_NEED_PTR("cuda_op_layernorm_bwd", dgamma);
    TP_NEED_PTR("cuda_op_layernorm_bwd", dbeta);
    TP_NEED_PTR("cuda_op_layernorm_bwd", dy);
    TP_NEED_PTR("cuda_op_layernorm_bwd", x);
    TP_NEED_PTR("cuda_op_layernorm_bwd", mean);
    TP_NEED_PTR("cuda_op_layernorm_bwd", rstd);
    TP_NEED_PTR("cuda_op_layernorm_bwd", gamma);
    TP_CHECK(ln_chunks(N) <= 65535, "cuda_op_layernorm_bwd: N = %d rows too many", N);
    TpCarver cv = tp_carver(scratch, cuda_layernorm_bwd_scratch_bytes(N, C), "cuda_op_layernorm_bwd");
    const size_t part_bytes = (size_t)ln_chunks(N) * C * sizeof(double);
    double *part_dgamma = (double *)tp_carve(&cv, part_bytes);  // (n_chunks, C)
    double *part_dbeta = (double *)tp_carve(&cv, part_bytes);   // (n_chunks, C)
    layernorm_bwd_launch(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, N, C, part_dgamma,
                         part_dbeta, stream);
}
