// reduce.cu: the device scalars of a step: sums into an accumulator (the
// loss sum, the squared norms), the global norm with its clip factor, and
// scaling by a factor that stays on the device. The host reads these once
// per step (backend_download), so none of them synchronises.
//
// The sums are deterministic, with no atomics: pass 1 runs a grid that
// depends only on n_elems (at most SUM_MAX_BLOCKS blocks); each thread sums
// its grid-stride elements in double, each block reduces in a fixed tree
// and writes one partial into the caller's scratch; pass 2, one block,
// reduces the partials in the same fixed tree and adds the total to acc[0]
// as the CPU does: acc = (float)((double)acc + sum). Squares of floats are
// exact in double, so sumsq differs from the CPU's loop only by the order of
// double additions (n * 2^-53 relative at most).
//
// clip_coef and scale_by are the CPU's expressions rounded the same way
// (sqrt and the division in IEEE arithmetic), so bit-identical.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define SUM_THREADS 256u
#define SUM_MAX_BLOCKS 1024u  // = threads of the final pass
#define SCALE_THREADS 256u

// ---- kernels ---------------------------------------------------------------------

// Pass 1: partials[blockIdx.x] = sum of x[i] (or x[i]^2) over this block's elements.
template <bool SQUARE>
__global__ void sum_partial_kernel(double *partials,  // (gridDim.x)
                                   const float *x,    // (n_elems)
                                   size_t n_elems) {
    __shared__ double smem[TP_WARP];
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x) {
        const double xi = x[i];
        acc += SQUARE ? xi * xi : xi;
    }
    acc = tp_block_sum(acc, smem);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2 (one block of SUM_MAX_BLOCKS threads): acc[0] += sum of the partials.
__global__ void sum_final_kernel(float *acc,               // (1)
                                 const double *partials,   // (n_partials)
                                 int n_partials) {
    __shared__ double smem[TP_WARP];
    double v = (int)threadIdx.x < n_partials ? partials[threadIdx.x] : 0.0;
    v = tp_block_sum(v, smem);
    if (threadIdx.x == 0) acc[0] = (float)((double)acc[0] + v);
}

// One thread: the CPU's cpu_clip_coef.
__global__ void clip_coef_kernel(float *norm_coef,    // (2)
                                 const float *sumsq,  // (n_parts)
                                 int n_parts, float max_norm) {
    double ss = 0.0;
    for (int i = 0; i < n_parts; i++) ss += sumsq[i];
    const float norm = (float)sqrt(ss);
    const float coef = max_norm > 0.0f ? __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f)) : 1.0f;
    norm_coef[0] = norm;
    norm_coef[1] = coef < 1.0f ? coef : 1.0f;
}

__global__ void scale_by_kernel(float *x,        // (n_elems)
                                const float *s,  // (1)
                                size_t n_elems) {
    const float f = s[0];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= f;
}

// ---- launchers ---------------------------------------------------------------------

static unsigned sum_blocks(size_t n_elems) {
    unsigned n_blocks = tp_grid_1d(n_elems, SUM_THREADS);
    return n_blocks > SUM_MAX_BLOCKS ? SUM_MAX_BLOCKS : n_blocks;
}

static void sum_launch(float *acc, const float *x, size_t n_elems, bool square,
                       double *partials,  // (sum_blocks(n_elems))
                       cudaStream_t stream) {
    const unsigned n_blocks = sum_blocks(n_elems);
    if (square)
        sum_partial_kernel<true><<<n_blocks, SUM_THREADS, 0, stream>>>(partials, x, n_elems);
    else
        sum_partial_kernel<false><<<n_blocks, SUM_THREADS, 0, stream>>>(partials, x, n_elems);
    CUDA_CHECK(cudaGetLastError());
    sum_final_kernel<<<1, SUM_MAX_BLOCKS, 0, stream>>>(acc, partials, (int)n_blocks);
    CUDA_CHECK(cudaGetLastError());
}

static void clip_coef_launch(float *norm_coef, const float *sumsq, int n_parts, float max_norm,
                             cudaStream_t stream) {
    clip_coef_kernel<<<1, 1, 0, stream>>>(norm_coef, sumsq, n_parts, max_norm);
    CUDA_CHECK(cudaGetLastError());
}

static void scale_by_launch(float *x, const float *s, size_t n_elems, cudaStream_t stream) {
    scale_by_kernel<<<tp_grid_1d(n_elems, SCALE_THREADS), SCALE_THREADS, 0, stream>>>(x, s,
                                                                                     n_elems);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

extern "C" size_t cuda_sum_scratch_bytes(size_t n_elems) {
    return n_elems ? tp_scratch_round(sum_blocks(n_elems) * sizeof(double)) : 0;
}

static void sum_op(const char *op, float *acc, const float *x, size_t n_elems, bool square,
                   void *scratch, cudaStream_t stream) {
    if (n_elems == 0) return;  // adds nothing
    TP_NEED_PTR(op, acc);
    TP_NEED_PTR(op, x);
    TpCarver cv = tp_carver(scratch, cuda_sum_scratch_bytes(n_elems), op);
    double *partials = (double *)tp_carve(&cv, sum_blocks(n_elems) * sizeof(double));
    sum_launch(acc, x, n_elems, square, partials, stream);
}

extern "C" void cuda_op_sum_acc(float *acc, const float *x, size_t n_elems, void *scratch,
                                cudaStream_t stream) {
    sum_op("cuda_op_sum_acc", acc, x, n_elems, false, scratch, stream);
}

extern "C" void cuda_op_sumsq_acc(float *acc, const float *x, size_t n_elems, void *scratch,
                                  cudaStream_t stream) {
    sum_op("cuda_op_sumsq_acc", acc, x, n_elems, true, scratch, stream);
}

extern "C" void cuda_op_clip_coef(float *norm_coef, const float *sumsq, int n_parts,
                                  float max_norm, cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_clip_coef", n_parts);
    TP_NEED_PTR("cuda_op_clip_coef", norm_coef);
    if (n_parts > 0) TP_NEED_PTR("cuda_op_clip_coef", sumsq);
    clip_coef_launch(norm_coef, sumsq, n_parts, max_norm, stream);
}

extern "C" void cuda_op_scale_by(float *x, const float *s, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_scale_by", x);
    TP_NEED_PTR("cuda_op_scale_by", s);
    scale_by_launch(x, s, n_elems, stream);
}
