// elementwise.cu: activations, element-wise arithmetic and the sum of squares.
//
// Memory-bound one-liners: one grid-stride loop each, one element per
// thread step, any alignment. add, accumulate, scale and ReLU are single
// IEEE operations and so bit-identical to the CPU. GELU is the exact erf
// form in fp32, written as x * Phi(x) with Phi(x) = erfc(-x/sqrt2)/2, which
// keeps full relative accuracy for negative x where 1 + erf(x) would
// cancel; the CPU evaluates it in double, so the two differ by a few ulp.
//
// sumsq is deterministic: pass 1 has a grid that depends only on n_elems;
// each thread sums its grid-stride elements in double, each block reduces
// in a fixed tree and writes one partial; pass 2 (one block) reduces the
// partials in the same fixed tree. Squares of floats are exact in double.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define EW_THREADS 256u
#define SUMSQ_THREADS 256u
#define SUMSQ_MAX_BLOCKS 1024u  // = threads of the final pass

static const float GELU_INV_SQRT2 = 0.70710678118654752440f;
static const float GELU_INV_SQRT_2PI = 0.39894228040143267794f;

// ---- kernels ---------------------------------------------------------------------

#define GRID_STRIDE(i, n)                                                              \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);            \
         i += (size_t)gridDim.x * blockDim.x)

// Phi(x), the standard normal CDF.
__device__ __forceinline__ float gelu_cdf(float x) {
    return 0.5f * erfcf(-x * GELU_INV_SQRT2);
}

__global__ void act_fwd_kernel(float *y,        // (n_elems), may alias x
                               const float *x,  // (n_elems)
                               size_t n_elems, int act) {
    GRID_STRIDE(i, n_elems) {
        float xi = x[i];
        y[i] = act == ACT_RELU ? (xi > 0.0f ? xi : 0.0f) : xi * gelu_cdf(xi);
    }
}

__global__ void act_bwd_kernel(float *dx,        // (n_elems) accumulated
                               const float *dy,  // (n_elems)
                               const float *x,   // (n_elems)
                               size_t n_elems, int act) {
    GRID_STRIDE(i, n_elems) {
        float xi = x[i];
        if (act == ACT_RELU) {
            if (xi > 0.0f) dx[i] += dy[i];
        } else {
            // d/dx [x Phi(x)] = Phi(x) + x phi(x)
            float pdf = GELU_INV_SQRT_2PI * expf(-0.5f * xi * xi);
            dx[i] += dy[i] * (gelu_cdf(xi) + xi * pdf);
        }
    }
}

__global__ void add_kernel(float *out,      // (n_elems), may alias a or b
                           const float *a,  // (n_elems)
                           const float *b,  // (n_elems)
                           size_t n_elems) {
    GRID_STRIDE(i, n_elems) out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float *y,        // (n_elems)
                                  const float *x,  // (n_elems)
                                  size_t n_elems) {
    GRID_STRIDE(i, n_elems) y[i] += x[i];
}

__global__ void scale_kernel(float *x,  // (n_elems)
                             float s, size_t n_elems) {
    GRID_STRIDE(i, n_elems) x[i] *= s;
}

// Pass 1: partials[blockIdx.x] = sum of x[i]^2 over this block's elements.
__global__ void sumsq_partial_kernel(double *partials,  // (gridDim.x)
                                     const float *x,    // (n_elems)
                                     size_t n_elems) {
    __shared__ double smem[TP_WARP];
    double acc = 0.0;
    GRID_STRIDE(i, n_elems) {
        double xi = x[i];
        acc += xi * xi;
    }
    acc = tp_block_sum(acc, smem);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2 (one block of SUMSQ_MAX_BLOCKS threads): out[0] = sum of partials.
__global__ void sumsq_final_kernel(double *out,             // (1)
                                   const double *partials,  // (n_partials)
                                   int n_partials) {
    __shared__ double smem[TP_WARP];
    double acc = (int)threadIdx.x < n_partials ? partials[threadIdx.x] : 0.0;
    acc = tp_block_sum(acc, smem);
    if (threadIdx.x == 0) out[0] = acc;
}

// ---- launchers ---------------------------------------------------------------------

static void act_fwd_launch(float *y, const float *x, size_t n_elems, Activation act,
                           cudaStream_t stream) {
    act_fwd_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(y, x, n_elems,
                                                                              (int)act);
    CUDA_CHECK(cudaGetLastError());
}

static void act_bwd_launch(float *dx, const float *dy, const float *x, size_t n_elems,
                           Activation act, cudaStream_t stream) {
    act_bwd_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(
        dx, dy, x, n_elems, (int)act);
    CUDA_CHECK(cudaGetLastError());
}

static void add_launch(float *out, const float *a, const float *b, size_t n_elems,
                       cudaStream_t stream) {
    add_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(out, a, b, n_elems);
    CUDA_CHECK(cudaGetLastError());
}

static void accumulate_launch(float *y, const float *x, size_t n_elems, cudaStream_t stream) {
    accumulate_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(y, x,
                                                                                 n_elems);
    CUDA_CHECK(cudaGetLastError());
}

static void scale_launch(float *x, float s, size_t n_elems, cudaStream_t stream) {
    scale_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(x, s, n_elems);
    CUDA_CHECK(cudaGetLastError());
}

static double sumsq_launch(const float *x, size_t n_elems, cudaStream_t stream) {
    unsigned n_blocks = tp_grid_1d(n_elems, SUMSQ_THREADS);
    if (n_blocks > SUMSQ_MAX_BLOCKS) n_blocks = SUMSQ_MAX_BLOCKS;
    double *buf = (double *)tp_scratch_alloc((n_blocks + 1) * sizeof(double), stream);
    double *partials = buf + 1;  // (n_blocks); buf[0] is the result
    sumsq_partial_kernel<<<n_blocks, SUMSQ_THREADS, 0, stream>>>(partials, x, n_elems);
    CUDA_CHECK(cudaGetLastError());
    sumsq_final_kernel<<<1, SUMSQ_MAX_BLOCKS, 0, stream>>>(buf, partials, (int)n_blocks);
    CUDA_CHECK(cudaGetLastError());
    double result = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&result, buf, sizeof result, cudaMemcpyDeviceToHost, stream));
    tp_scratch_free(buf, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return result;
}

// ---- exported ops ---------------------------------------------------------------------

static void check_act(const char *op, Activation act) {
    TP_CHECK(act == ACT_RELU || act == ACT_GELU, "%s: unknown activation %d", op, (int)act);
}

extern "C" void cuda_op_act_fwd(float *y, const float *x, size_t n_elems, Activation act,
                                cudaStream_t stream) {
    check_act("cuda_op_act_fwd", act);
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_act_fwd", y);
    TP_NEED_PTR("cuda_op_act_fwd", x);
    act_fwd_launch(y, x, n_elems, act, stream);
}

extern "C" void cuda_op_act_bwd(float *dx, const float *dy, const float *x, size_t n_elems,
                                Activation act, cudaStream_t stream) {
    check_act("cuda_op_act_bwd", act);
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_act_bwd", dx);
    TP_NEED_PTR("cuda_op_act_bwd", dy);
    TP_NEED_PTR("cuda_op_act_bwd", x);
    act_bwd_launch(dx, dy, x, n_elems, act, stream);
}

extern "C" void cuda_op_add(float *out, const float *a, const float *b, size_t n_elems,
                            cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_add", out);
    TP_NEED_PTR("cuda_op_add", a);
    TP_NEED_PTR("cuda_op_add", b);
    add_launch(out, a, b, n_elems, stream);
}

extern "C" void cuda_op_accumulate(float *y, const float *x, size_t n_elems,
                                   cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_accumulate", y);
    TP_NEED_PTR("cuda_op_accumulate", x);
    accumulate_launch(y, x, n_elems, stream);
}

extern "C" void cuda_op_scale(float *x, float s, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_scale", x);
    scale_launch(x, s, n_elems, stream);
}

extern "C" double cuda_op_sumsq(const float *x, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return 0.0;
    }
    TP_NEED_PTR("cuda_op_sumsq", x);
    return sumsq_launch(x, n_elems, stream);
}
