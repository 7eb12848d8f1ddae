// residual_ln.cu: residual add + dropout + LayerNorm, fused each way.
//
// The boundary between two pre-LN sub-blocks is, unfused, four passes
// forward (bias add, dropout, residual add, LayerNorm) and six launches
// backward (LayerNorm backward's three, a zeroing, dropout backward, the
// bias gradient's two). Here the row work is one pass each way, a warp per
// row as in layernorm.cu: forward reads branch, res_in (and bias, gamma,
// beta), writes res_out, y, mean, rstd; backward reads dy, x, d_res, writes
// d_res and d_branch. The column sums of the backward (dgamma, dbeta and the
// bias gradient) follow in one column pass over fixed row chunks and one
// final pass, in double and fixed order like layernorm.cu's: no atomics, the
// same bits every run.
//
// The dropout mask is drawn exactly as dropout.cu draws it (element i of
// the window starting at `first` uses Philox counter (first + i) / 4, word
// (first + i) % 4), the residual arithmetic uses __fadd_rn / __fmul_rn (no
// FMA) as dropout.cu does, the LayerNorm rows are layernorm_row.cuh's (the
// code layernorm.cu runs) and the column sums follow layernorm.cu's and
// bias.cu's chunks and order. So both ops equal the unfused CUDA sequence bit
// for bit, and res_out and d_branch (given d_res) the CPU's too; y, mean,
// rstd, d_res and the column sums differ from the CPU only as layernorm.cu's
// do, in the order of their double sums (harness.h's SUM_RTOL). The
// residual pass and the dropout-gradient pass read and write float4 where
// rows are 4-wide and every pointer 16-byte aligned (one Philox call per
// float4); the LayerNorm passes stride the row by lane, as layernorm.cu.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "layernorm_row.cuh"
#include "philox.h"

#define RLN_THREADS 256  // 8 warps = 8 rows per block
#define RLN_ROWS_PER_BLOCK (RLN_THREADS / TP_WARP)
#define RLN_COLS 32      // columns per block of the column pass (= blockDim.x)
#define RLN_ROWT 8       // row-threads per block of the column pass (= blockDim.y)
#define RLN_CHUNK_ROWS SCRATCH_LN_CHUNK_ROWS  // kernels/scratch_sizes.h: layernorm.cu's chunks, and bias.cu's:
static_assert(SCRATCH_LN_CHUNK_ROWS == SCRATCH_BIAS_CHUNK_ROWS, "the fused sums follow layernorm.cu's and bias.cu's");

// The dropout of one run: the mask of philox.h, as dropout.cu draws it.
typedef struct {
    uint64_t first;           // the window's first element in the whole mask
    float p, scale;           // scale = 1/(1-p), the CPU's expression
    uint32_t key[2];          // seed lo, hi
    uint64_t stream;          // the stream id; with step, step->stream_base is added (rln_resolve)
    const StepVars *step;     // the backend's StepVars, or NULL
    bool on;                  // p > 0 (p == 0 copies, as op_dropout_fwd does)
} RlnDrop;

// ---- device helpers ------------------------------------------------------------

// The run's stream with the StepVars' base added, read once per thread
// at a kernel's start (the kernels' own copy of d).
__device__ __forceinline__ void rln_resolve(RlnDrop &d) {
    d.stream = tp_step_stream(d.step, d.stream);
    d.step = NULL;
}

__device__ __forceinline__ void rln_words(const RlnDrop &d, uint64_t block, uint32_t w[4]) {
    dropout_block_words(block, d.key, (uint32_t)d.stream, (uint32_t)(d.stream >> 32), w);
}

// Dropout of v with its mask word: v * scale or 0 (v itself when off).
__device__ __forceinline__ float rln_drop(const RlnDrop &d, float v, uint32_t word) {
    if (!d.on) return v;
    return dropout_keeps(word, d.p) ? __fmul_rn(v, d.scale) : 0.0f;
}

// The word of element i (an index into the window) for the scalar path.
__device__ __forceinline__ uint32_t rln_word_of(const RlnDrop &d, size_t i) {
    if (!d.on) return 0;
    uint32_t w[4];
    const uint64_t g = d.first + i;
    rln_words(d, g / 4, w);
    return w[g % 4];
}

// res_in + Dropout(branch + bias) for one element.
__device__ __forceinline__ float rln_resid(const RlnDrop &d, float r_in, float b, const float *bias, int c,
                                           uint32_t word) {
    const float v = bias ? __fadd_rn(b, bias[c]) : b;
    return __fadd_rn(r_in, rln_drop(d, v, word));
}

// ---- forward ---------------------------------------------------------------------

// The residual pass of a row: res_out written (this lane's elements).
template <bool VEC>
__device__ __forceinline__ void rln_fwd_residual(const RlnDrop &d, float *ro, const float *ri, const float *br,
                                                 const float *bias, size_t row_at, int C, int lane) {
    if (VEC) {
        for (int c = 4 * lane; c < C; c += 4 * TP_WARP) {
            const float4 b = *(const float4 *)(br + c), r = *(const float4 *)(ri + c);
            uint32_t w[4] = {0, 0, 0, 0};
            if (d.on) rln_words(d, (d.first + row_at + c) / 4, w);
            float4 o;
            o.x = rln_resid(d, r.x, b.x, bias, c, w[0]);
            o.y = rln_resid(d, r.y, b.y, bias, c + 1, w[1]);
            o.z = rln_resid(d, r.z, b.z, bias, c + 2, w[2]);
            o.w = rln_resid(d, r.w, b.w, bias, c + 3, w[3]);
            *(float4 *)(ro + c) = o;
        }
    } else {
        for (int c = lane; c < C; c += TP_WARP)
            ro[c] = rln_resid(d, ri[c], br[c], bias, c, rln_word_of(d, row_at + c));
    }
}

template <bool VEC>
__global__ void residual_ln_fwd_kernel(float *res_out, float *y, uint16_t *y16, float *mean, float *rstd,
                                       const float *res_in,
                                       const float *branch, const float *bias, const float *gamma, const float *beta,
                                       int N, int C, float eps, RlnDrop d) {  // shapes: ops_list.h
    rln_resolve(d);
    const int lane = threadIdx.x % TP_WARP;
    for (int n = blockIdx.x * RLN_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; n < N;
         n += gridDim.x * RLN_ROWS_PER_BLOCK) {
        const size_t at = (size_t)n * C;
        float *ro = res_out + at;
        rln_fwd_residual<VEC>(d, ro, res_in + at, branch + at, bias, at, C, lane);
        __syncwarp();  // the row's res_out, written in the residual pass's layout, is read by every lane
        float m, rs;
        tp_ln_row_fwd(y ? y + at : NULL, y ? NULL : y16 + at, ro, gamma, beta, C, eps, lane, &m, &rs);
        if (lane == 0) {
            mean[n] = m;
            rstd[n] = rs;
        }
    }
}

// ---- backward ----------------------------------------------------------------------

// d_branch's stores: fp32, or its bf16 rounding (d_branch16).
__device__ __forceinline__ void rln_store(float *o, int c, float v) { o[c] = v; }
__device__ __forceinline__ void rln_store(uint16_t *o, int c, float v) { o[c] = tp_bf16_bits(v); }
__device__ __forceinline__ void rln_store4(float *o, int c, float4 v) { *(float4 *)(o + c) = v; }
__device__ __forceinline__ void rln_store4(uint16_t *o, int c, float4 v) {
    ushort4 h;
    h.x = tp_bf16_bits(v.x);
    h.y = tp_bf16_bits(v.y);
    h.z = tp_bf16_bits(v.z);
    h.w = tp_bf16_bits(v.w);
    *(ushort4 *)(o + c) = h;
}

// d_branch = Dropout backward of d_res (written; 0 + value, as the unfused
// zeroing and accumulation give), this lane's elements of a row.
template <bool VEC, typename OutT>
__device__ __forceinline__ void rln_bwd_branch(const RlnDrop &d, OutT *db, const float *dr, size_t row_at, int C,
                                               int lane) {
    if (VEC) {
        for (int c = 4 * lane; c < C; c += 4 * TP_WARP) {
            const float4 r = *(const float4 *)(dr + c);
            uint32_t w[4] = {0, 0, 0, 0};
            if (d.on) rln_words(d, (d.first + row_at + c) / 4, w);
            float4 o;
            o.x = __fadd_rn(0.0f, rln_drop(d, r.x, w[0]));
            o.y = __fadd_rn(0.0f, rln_drop(d, r.y, w[1]));
            o.z = __fadd_rn(0.0f, rln_drop(d, r.z, w[2]));
            o.w = __fadd_rn(0.0f, rln_drop(d, r.w, w[3]));
            rln_store4(db, c, o);
        }
    } else {
        for (int c = lane; c < C; c += TP_WARP)
            rln_store(db, c, __fadd_rn(0.0f, rln_drop(d, dr[c], rln_word_of(d, row_at + c))));
    }
}

// d_res += LayerNorm backward of dy (layernorm_row.cuh), then d_branch from
// the new d_res.
template <bool VEC, typename OutT>
__global__ void residual_ln_bwd_rows_kernel(float *d_res,         // (N, C) accumulated
                                            OutT *d_branch,       // (N, C) written: fp32 or bf16 bits
                                            const float *dy,      // (N, C)
                                            const float *x,       // (N, C)
                                            const float *mean,    // (N)
                                            const float *rstd,    // (N)
                                            const float *gamma,   // (C)
                                            int N, int C, RlnDrop d) {
    rln_resolve(d);
    const int lane = threadIdx.x % TP_WARP;
    for (int n = blockIdx.x * RLN_ROWS_PER_BLOCK + threadIdx.x / TP_WARP; n < N;
         n += gridDim.x * RLN_ROWS_PER_BLOCK) {
        const size_t at = (size_t)n * C;
        tp_ln_row_bwd_dx(d_res + at, dy + at, x + at, gamma, mean[n], rstd[n], C, lane);
        __syncwarp();  // the row's d_res, written lane-strided, is read in the branch pass's layout
        rln_bwd_branch<VEC, OutT>(d, d_branch + at, d_res + at, at, C, lane);
    }
}

// grid (ceil(C/32), n_chunks), block (32, 8): per-chunk column sums of
// dy * xhat (dgamma), dy (dbeta) and, part_dbias given, d_branch (the bias;
// round_bias: its bf16 rounding, the dy a bf16 linear backward reads;
// d_branch16: those bf16 values, as stored).
__global__ void residual_ln_bwd_partial_kernel(double *part_dgamma,    // (n_chunks, C)
                                               double *part_dbeta,     // (n_chunks, C)
                                               double *part_dbias,     // (n_chunks, C) or NULL
                                               const float *dy,        // (N, C)
                                               const float *x,         // (N, C)
                                               const float *mean,      // (N)
                                               const float *rstd,      // (N)
                                               const float *d_branch,  // (N, C), or NULL
                                               const uint16_t *d_branch16,  // (N, C), or NULL
                                               bool round_bias, int N, int C) {
    __shared__ double s[3][RLN_ROWT][RLN_COLS];
    const int c = blockIdx.x * RLN_COLS + threadIdx.x;
    const int row_begin = blockIdx.y * RLN_CHUNK_ROWS;
    const int row_end = min(N, row_begin + RLN_CHUNK_ROWS);
    double dg = 0.0, db = 0.0, dbias = 0.0;
    if (c < C)
        for (int n = row_begin + threadIdx.y; n < row_end; n += RLN_ROWT) {
            const size_t i = (size_t)n * C + c;
            const float xhat = (x[i] - mean[n]) * rstd[n];
            dg += (double)dy[i] * xhat;
            db += dy[i];
            if (part_dbias)
                dbias += d_branch16 ? ld_in(d_branch16, (long long)i)
                                    : (round_bias ? tp_bf16_round(d_branch[i]) : d_branch[i]);
        }
    s[0][threadIdx.y][threadIdx.x] = dg;
    s[1][threadIdx.y][threadIdx.x] = db;
    s[2][threadIdx.y][threadIdx.x] = dbias;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sg = 0.0, sb = 0.0, sbias = 0.0;
        for (int r = 0; r < RLN_ROWT; r++) {
            sg += s[0][r][threadIdx.x];
            sb += s[1][r][threadIdx.x];
            sbias += s[2][r][threadIdx.x];
        }
        const size_t o = (size_t)blockIdx.y * C + c;
        part_dgamma[o] = sg;
        part_dbeta[o] = sb;
        if (part_dbias) part_dbias[o] = sbias;
    }
}

__global__ void residual_ln_bwd_final_kernel(float *dgamma,               // (C) accumulated
                                             float *dbeta,                // (C) accumulated
                                             float *d_bias,               // (C) accumulated, or NULL
                                             const double *part_dgamma,   // (n_chunks, C)
                                             const double *part_dbeta,    // (n_chunks, C)
                                             const double *part_dbias,    // (n_chunks, C) or NULL
                                             int n_chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double sg = 0.0, sb = 0.0, sbias = 0.0;
    for (int k = 0; k < n_chunks; k++) {
        const size_t o = (size_t)k * C + c;
        sg += part_dgamma[o];
        sb += part_dbeta[o];
        if (d_bias) sbias += part_dbias[o];
    }
    dgamma[c] += (float)sg;
    dbeta[c] += (float)sb;
    if (d_bias) d_bias[c] += (float)sbias;
}

// ---- launchers ---------------------------------------------------------------------

static RlnDrop rln_drop_of(uint64_t first, float p, uint64_t seed, uint64_t stream_id, const StepVars *step) {
    RlnDrop d;
    d.first = first;
    d.p = p;
    d.scale = dropout_scale(p);  // the CPU's expression (philox.h)
    d.key[0] = (uint32_t)seed;
    d.key[1] = (uint32_t)(seed >> 32);
    d.stream = stream_id;
    d.step = step;
    d.on = p > 0.0f;
    return d;
}

static bool aligned16(const void *p) { return p == NULL || (uintptr_t)p % 16 == 0; }

static unsigned rln_row_blocks(int N) { return tp_grid_1d((size_t)N, RLN_ROWS_PER_BLOCK); }

static int rln_chunks(int N) { return scratch_ln_chunks(N); }

static void residual_ln_fwd_launch(float *res_out, float *y, uint16_t *y16, float *mean, float *rstd,
                                   const float *res_in,
                                   const float *branch, const float *bias, const float *gamma, const float *beta,
                                   int N, int C, float eps, RlnDrop d, cudaStream_t stream) {
    const bool vec = C % 4 == 0 && aligned16(res_out) && aligned16(res_in) && aligned16(branch);  // the residual pass
    if (vec)
        residual_ln_fwd_kernel<true><<<rln_row_blocks(N), RLN_THREADS, 0, stream>>>(
            res_out, y, y16, mean, rstd, res_in, branch, bias, gamma, beta, N, C, eps, d);
    else
        residual_ln_fwd_kernel<false><<<rln_row_blocks(N), RLN_THREADS, 0, stream>>>(
            res_out, y, y16, mean, rstd, res_in, branch, bias, gamma, beta, N, C, eps, d);
    CUDA_CHECK(cudaGetLastError());
}

template <typename OutT>
static void rln_bwd_rows_launch(float *d_res, OutT *d_branch, const float *dy, const float *x, const float *mean,
                                const float *rstd, const float *gamma, int N, int C, RlnDrop d, bool vec,
                                cudaStream_t stream) {
    if (vec)
        residual_ln_bwd_rows_kernel<true, OutT><<<rln_row_blocks(N), RLN_THREADS, 0, stream>>>(
            d_res, d_branch, dy, x, mean, rstd, gamma, N, C, d);
    else
        residual_ln_bwd_rows_kernel<false, OutT><<<rln_row_blocks(N), RLN_THREADS, 0, stream>>>(
            d_res, d_branch, dy, x, mean, rstd, gamma, N, C, d);
    CUDA_CHECK(cudaGetLastError());
}

static void residual_ln_bwd_launch(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma, float *dbeta,
                                   float *d_bias,
                                   const float *dy, const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int N, int C, RlnDrop d, bool round_bias,
                                   double *part,  // (3, n_chunks, C)
                                   cudaStream_t stream) {
    // the dropout-gradient pass: four elements a load where C and both rows allow (bf16: 8-byte stores)
    const bool vec = C % 4 == 0 && aligned16(d_res) &&
                     (d_branch ? aligned16(d_branch) : ((uintptr_t)d_branch16 % 8 == 0));
    if (d_branch16) rln_bwd_rows_launch(d_res, d_branch16, dy, x, mean, rstd, gamma, N, C, d, vec, stream);
    else rln_bwd_rows_launch(d_res, d_branch, dy, x, mean, rstd, gamma, N, C, d, vec, stream);

    const int n_chunks = rln_chunks(N);
    const size_t plane = (size_t)n_chunks * C;
    double *part_dbias = d_bias ? part + 2 * plane : NULL;
    dim3 grid((C + RLN_COLS - 1) / RLN_COLS, n_chunks), block(RLN_COLS, RLN_ROWT);
    residual_ln_bwd_partial_kernel<<<grid, block, 0, stream>>>(part, part + plane, part_dbias, dy, x, mean, rstd,
                                                               d_branch, d_branch16, round_bias, N, C);
    CUDA_CHECK(cudaGetLastError());
    residual_ln_bwd_final_kernel<<<(C + RLN_THREADS - 1) / RLN_THREADS, RLN_THREADS, 0, stream>>>(
        dgamma, dbeta, d_bias, part, part + plane, part_dbias, n_chunks, C);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

static void rln_check_drop(const char *op, float p, uint64_t first) {
    TP_CHECK(p >= 0.0f && p <= 1.0f, "%s: p = %g outside [0, 1]", op, (double)p);
    TP_CHECK(first % 4 == 0, "%s: window start %llu is not a multiple of 4", op, (unsigned long long)first);
}

extern "C" void cuda_op_residual_ln_fwd(float *res_out, float *y, uint16_t *y16, float *mean, float *rstd,
                                        const float *res_in,
                                        const float *branch, const float *bias, const float *gamma,
                                        const float *beta, int N, int C, float eps, uint64_t first, float p,
                                        uint64_t seed, uint64_t stream_id, const StepVars *step,
                                        cudaStream_t stream) {
    const char *op = "cuda_op_residual_ln_fwd";
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, C);
    rln_check_drop(op, p, first);
    if (N == 0) return;
    TP_NEED_PTR(op, mean);
    TP_NEED_PTR(op, rstd);
    if (C > 0) {
        TP_NEED_PTR(op, res_out);
        TP_CHECK((y == NULL) != (y16 == NULL), "%s: give exactly one of y and y16", op);
        TP_NEED_PTR(op, res_in);
        TP_NEED_PTR(op, branch);
        TP_NEED_PTR(op, gamma);
        TP_NEED_PTR(op, beta);
        TP_CHECK(!y || (y != res_in && y != branch && y != res_out), "%s: y must not alias res_in, branch or res_out",
                 op);
    }
    residual_ln_fwd_launch(res_out, y, y16, mean, rstd, res_in, branch, bias, gamma, beta, N, C, eps,
                           rln_drop_of(first, p, seed, stream_id, step), stream);
}

extern "C" size_t cuda_residual_ln_bwd_scratch_bytes(int N, int C) { return scratch_residual_ln_bwd(N, C); }

static void residual_ln_bwd_op(const char *op, float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma,
                               float *dbeta,
                               float *d_bias, const float *dy, const float *x, const float *mean, const float *rstd,
                               const float *gamma, int N, int C, uint64_t first, float p, uint64_t seed,
                               uint64_t stream_id, const StepVars *step, bool round_bias, void *scratch,
                               cudaStream_t stream) {
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, C);
    rln_check_drop(op, p, first);
    if (N == 0 || C == 0) return;  // adds nothing, writes nothing
    TP_NEED_PTR(op, d_res);
    TP_CHECK((d_branch == NULL) != (d_branch16 == NULL), "%s: give exactly one of d_branch and d_branch16", op);
    TP_NEED_PTR(op, dgamma);
    TP_NEED_PTR(op, dbeta);
    TP_NEED_PTR(op, dy);
    TP_NEED_PTR(op, x);
    TP_NEED_PTR(op, mean);
    TP_NEED_PTR(op, rstd);
    TP_NEED_PTR(op, gamma);
    const void *br = d_branch ? (const void *)d_branch : (const void *)d_branch16;
    TP_CHECK(br != dy && br != d_res, "%s: d_branch must not alias dy or d_res", op);
    TP_CHECK(rln_chunks(N) <= 65535, "%s: N = %d rows too many", op, N);
    TpCarver cv = tp_carver(scratch, cuda_residual_ln_bwd_scratch_bytes(N, C), op);
    double *part = (double *)tp_carve(&cv, 3 * (size_t)rln_chunks(N) * C * sizeof(double));  // (3, n_chunks, C)
    residual_ln_bwd_launch(d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x, mean, rstd, gamma, N, C,
                           rln_drop_of(first, p, seed, stream_id, step), round_bias, part, stream);
}

extern "C" void cuda_op_residual_ln_bwd(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma,
                                        float *dbeta, float *d_bias, const float *dy, const float *x,
                                        const float *mean, const float *rstd, const float *gamma, int N, int C,
                                        uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                        const StepVars *step, void *scratch, cudaStream_t stream) {
    residual_ln_bwd_op("cuda_op_residual_ln_bwd", d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x, mean,
                       rstd, gamma, N, C, first, p, seed, stream_id, step, false, scratch, stream);
}

extern "C" void cuda_op_residual_ln_bwd_bias16(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma,
                                               float *dbeta, float *d_bias, const float *dy, const float *x,
                                               const float *mean, const float *rstd, const float *gamma, int N,
                                               int C, uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                               const StepVars *step, void *scratch, cudaStream_t stream) {
    residual_ln_bwd_op("cuda_op_residual_ln_bwd_bias16", d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x,
                       mean, rstd, gamma, N, C, first, p, seed, stream_id, step, true, scratch, stream);
}
