// bias.cu: the bias half of the linear layer (the GEMMs are in gemm.cu).
//
// bias_add is one IEEE add per element, bit-identical to the CPU. bias_bwd is
// a column sum over rows, done without atomics so the result never depends on
// scheduling, in colsum.cuh's order (the one layernorm.cu and residual_ln.cu
// sum in, so the fused residual backward's bias gradient is this op's bits):
// pass 1 cuts the rows into fixed chunks of COLSUM_CHUNK_ROWS; a (32 x 8)
// block sums 32 columns of one chunk in double (each thread its rows in
// order, then the 8 row-threads in order) into partials[chunk, c]; pass 2
// (colsum.cuh's) sums each column's partials in its fixed tree and adds the
// result, rounded once, to db (as the CPU, which sums in double). The
// partials live in the caller's scratch (cuda_bias_bwd_scratch_bytes).
// A bf16 linear backward needs dy's bf16 copy too: pass 1 can store it as
// it reads dy (cuda_op_bias_bwd_bf16_copy), one read of dy instead of two;
// behind a ReLU it can also apply the ReLU's gradient as it reads
// (cuda_op_bias_bwd_relu_bf16_copy: dy where the kept ReLU output is
// positive, else 0, act_bwd_x16's values), so the masked fp32 gradient is
// never written at all. In bf16 mode a linear layer's db is the sum of the
// bf16 dy its GEMMs read (backend.h's precision rule, what cuBLASLt's
// BGRADB epilogue sums): pass 1 then sums each value's bf16 rounding
// (ROUND; always so with the copy, which stores exactly the values summed),
// or reads dy as bf16 bits (cuda_op_bias_bwd_x16) where that is all there is.
#include <cuda_bf16.h>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "colsum.cuh"

#define BIAS_THREADS 256u
#define BIAS_COLS COLSUM_COLS     // columns per block of pass 1 (= blockDim.x)
#define BIAS_ROWT COLSUM_STREAMS  // row-threads per block of pass 1 (= blockDim.y): colsum.cuh's streams
#define BIAS_CHUNK_ROWS COLSUM_CHUNK_ROWS
#define BIAS_BATCH 8   // rows a thread of pass 1 loads before summing them

// ---- kernels ---------------------------------------------------------------------

__global__ void bias_add_kernel(float *y,        // (N, C)
                                const float *b,  // (C)
                                size_t n_elems, int C) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += b[i % (size_t)C];
}

// grid (ceil(C/32), colsum_grid_y(N)), block (32, 8): chunks blockIdx.y,
// blockIdx.y + gridDim.y, ... dy is fp32 or bf16 bits
// (In: float or uint16_t). ROUND: each element is summed as its bf16
// rounding (exact for bf16 bits). COPY (with ROUND): each value summed is
// also stored as bf16 into dy16 (the GEMMs' operand rounding), so a caller
// that needs both reads dy once. relu16 (or NULL): each element is first
// masked by the ReLU's gradient, relu16 > 0 ? dy : 0 (elementwise.cu's
// act_bwd on the widened bits, GRAD_WRITE).
// A thread's rows are n = row_begin + threadIdx.y + k * BIAS_ROWT, summed in
// k order; it loads BIAS_BATCH of them (dy, and relu16's values) before it
// sums and stores any. Loading one row at a time, each load waited for
// behind the previous row's bf16 store (the compiler cannot move a load
// above a store that may alias it), kept about one 4-byte load in flight a
// thread: a quarter of the memory's speed. The order of the sums, and so
// every bit, is the one-row-at-a-time loop's.
template <typename In, bool ROUND, bool COPY>
__global__ void bias_bwd_partial_kernel(double *partials,        // (n_chunks, C)
                                        __nv_bfloat16 *dy16,     // (N, C): COPY
                                        const In *dy,            // (N, C)
                                        const uint16_t *relu16,  // (N, C) or NULL
                                        int N, int C) {
    static_assert(ROUND || !COPY, "the copy stores the values summed: rounded");
    __shared__ double smem[BIAS_ROWT][BIAS_COLS];
    const int c = blockIdx.x * BIAS_COLS + threadIdx.x;
    for (int chunk = blockIdx.y; (long long)chunk * BIAS_CHUNK_ROWS < N; chunk += gridDim.y) {
        const int row_begin = chunk * BIAS_CHUNK_ROWS;
        const int row_end = min(N, row_begin + BIAS_CHUNK_ROWS);
        double acc = 0.0;
        if (c < C)
            for (int n0 = row_begin + threadIdx.y; n0 < row_end; n0 += BIAS_BATCH * BIAS_ROWT) {
                float v[BIAS_BATCH];
    #pragma unroll
                for (int u = 0; u < BIAS_BATCH; u++) {  // the loads
                    const int n = n0 + u * BIAS_ROWT;
                    const size_t i = (size_t)n * C + c;
                    v[u] = 0.0f;
                    if (n < row_end) {
                        v[u] = ld_in(dy, (long long)i);
                        if (relu16 && !(ld_in(relu16, (long long)i) > 0.0f)) v[u] = 0.0f;
                    }
                }
    #pragma unroll
                for (int u = 0; u < BIAS_BATCH; u++) {  // the sums (and copies), in row order
                    const int n = n0 + u * BIAS_ROWT;
                    if (n < row_end) {
                        const float x = ROUND ? tp_bf16_round(v[u]) : v[u];
                        acc += x;
                        if (COPY) dy16[(size_t)n * C + c] = __float2bfloat16_rn(x);  // exact: x is a bf16 value
                    }
                }
            }
        __syncthreads();  // the previous chunk's smem is read
        smem[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && c < C) {
            double sum = 0.0;
            for (int r = 0; r < BIAS_ROWT; r++) sum += smem[r][threadIdx.x];
            partials[(size_t)chunk * C + c] = sum;
        }
    }
}

// ---- launchers ---------------------------------------------------------------------

static void bias_add_launch(float *y, const float *b, int N, int C, cudaStream_t stream) {
    size_t n_elems = (size_t)N * C;
    bias_add_kernel<<<tp_grid_1d(n_elems, BIAS_THREADS), BIAS_THREADS, 0, stream>>>(y, b,
                                                                                   n_elems, C);
    CUDA_CHECK(cudaGetLastError());
}

static int bias_chunks(int N) { return scratch_bias_chunks(N); }

// The source pass 1 reads: fp32 values (summed as they are or rounded) or bf16 bits.
typedef struct {
    const float *f32;
    const uint16_t *bits;
    bool round;
} BiasSrc;

static void bias_bwd_launch(float *db, uint16_t *dy16, BiasSrc src, const uint16_t *relu16, int N, int C,
                            double *partials,  // (n_chunks, C)
                            cudaStream_t stream) {
    dim3 grid((C + BIAS_COLS - 1) / BIAS_COLS, colsum_grid_y(N)), block(BIAS_COLS, BIAS_ROWT);
    if (src.bits && dy16)  // bits are bf16 values: "rounding" them is exact, the copy stores them (masked)
        bias_bwd_partial_kernel<uint16_t, true, true><<<grid, block, 0, stream>>>(partials, (__nv_bfloat16 *)dy16,
                                                                                  src.bits, relu16, N, C);
    else if (src.bits)
        bias_bwd_partial_kernel<uint16_t, false, false><<<grid, block, 0, stream>>>(partials, NULL, src.bits, relu16,
                                                                                     N, C);
    else if (dy16)
        bias_bwd_partial_kernel<float, true, true><<<grid, block, 0, stream>>>(partials, (__nv_bfloat16 *)dy16,
                                                                               src.f32, relu16, N, C);
    else if (src.round)
        bias_bwd_partial_kernel<float, true, false><<<grid, block, 0, stream>>>(partials, NULL, src.f32, relu16, N, C);
    else
        bias_bwd_partial_kernel<float, false, false><<<grid, block, 0, stream>>>(partials, NULL, src.f32, relu16, N,
                                                                                 C);
    CUDA_CHECK(cudaGetLastError());
    ColsumPlanes pl = {{partials, NULL, NULL}, {db, NULL, NULL}};
    colsum_final_launch(pl, N, C, stream);
}

// ---- exported ops ---------------------------------------------------------------------

extern "C" void cuda_op_bias_add(float *y, const float *b, int N, int C, cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_bias_add", N);
    TP_NEED_SIZE("cuda_op_bias_add", C);
    if (N == 0 || C == 0) return;
    TP_NEED_PTR("cuda_op_bias_add", y);
    TP_NEED_PTR("cuda_op_bias_add", b);
    bias_add_launch(y, b, N, C, stream);
}

extern "C" size_t cuda_bias_bwd_scratch_bytes(int N, int C) {
    return scratch_bias_bwd(N, C);
}

static void bias_bwd_op(const char *op, float *db, uint16_t *dy16, BiasSrc src, const uint16_t *relu16, int N,
                        int C, void *scratch, cudaStream_t stream) {
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, C);
    if (N == 0 || C == 0) return;  // adds nothing
    TP_NEED_PTR(op, db);
    TP_CHECK(src.f32 || src.bits, "%s: dy is NULL", op);
    TpCarver cv = tp_carver(scratch, cuda_bias_bwd_scratch_bytes(N, C), op);
    double *partials = (double *)tp_carve(&cv, (size_t)bias_chunks(N) * C * sizeof(double));
    bias_bwd_launch(db, dy16, src, relu16, N, C, partials, stream);
}

static BiasSrc f32_src(const float *dy, bool round) {
    BiasSrc s = {dy, NULL, round};
    return s;
}

extern "C" void cuda_op_bias_bwd(float *db, const float *dy, int N, int C, void *scratch,
                                 cudaStream_t stream) {
    bias_bwd_op("cuda_op_bias_bwd", db, NULL, f32_src(dy, false), NULL, N, C, scratch, stream);
}

extern "C" void cuda_op_bias_bwd_rounded(float *db, const float *dy, int N, int C, void *scratch,
                                         cudaStream_t stream) {
    bias_bwd_op("cuda_op_bias_bwd_rounded", db, NULL, f32_src(dy, true), NULL, N, C, scratch, stream);
}

extern "C" void cuda_op_bias_bwd_x16(float *db, const uint16_t *dy16, const uint16_t *relu16, int N, int C,
                                     void *scratch, cudaStream_t stream) {
    BiasSrc src = {NULL, dy16, false};
    bias_bwd_op("cuda_op_bias_bwd_x16", db, NULL, src, relu16, N, C, scratch, stream);
}

extern "C" void cuda_op_bias_bwd_bf16_copy(float *db, uint16_t *dy16, const float *dy, int N, int C,
                                           void *scratch, cudaStream_t stream) {
    TP_NEED_PTR("cuda_op_bias_bwd_bf16_copy", dy16);
    bias_bwd_op("cuda_op_bias_bwd_bf16_copy", db, dy16, f32_src(dy, true), NULL, N, C, scratch, stream);
}

extern "C" void cuda_op_bias_bwd_relu_bf16_copy(float *db, uint16_t *dy16, const float *dy, const uint16_t *relu16,
                                                int N, int C, void *scratch, cudaStream_t stream) {
    TP_NEED_PTR("cuda_op_bias_bwd_relu_bf16_copy", dy16);
    TP_NEED_PTR("cuda_op_bias_bwd_relu_bf16_copy", relu16);
    bias_bwd_op("cuda_op_bias_bwd_relu_bf16_copy", db, dy16, f32_src(dy, true), relu16, N, C, scratch, stream);
}

extern "C" void cuda_op_bias_bwd_relu_x16_copy(float *db, uint16_t *copy16, const uint16_t *dy16,
                                               const uint16_t *relu16, int N, int C, void *scratch,
                                               cudaStream_t stream) {
    TP_NEED_PTR("cuda_op_bias_bwd_relu_x16_copy", copy16);
    TP_NEED_PTR("cuda_op_bias_bwd_relu_x16_copy", relu16);
    BiasSrc src = {NULL, dy16, false};
    bias_bwd_op("cuda_op_bias_bwd_relu_x16_copy", db, copy16, src, relu16, N, C, scratch, stream);
}
