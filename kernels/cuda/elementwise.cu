// elementwise.cu: activations and element-wise arithmetic.
//
// Memory-bound one-liners: one grid-stride loop each, one element per
// thread step, any alignment. add, accumulate, scale and ReLU are single
// IEEE operations and so bit-identical to the CPU. GELU is the exact erf
// form in fp32, written as x * Phi(x) with Phi(x) = erfc(-x/sqrt2)/2, which
// keeps full relative accuracy for negative x where 1 + erf(x) would
// cancel; the CPU evaluates it in double, so the two differ by a few ulp.
// (Sums into device scalars are in reduce.cu.)
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define EW_THREADS 256u

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

__device__ __forceinline__ float act_value(float xi, int act) {
    return act == ACT_RELU ? (xi > 0.0f ? xi : 0.0f) : xi * gelu_cdf(xi);
}

__global__ void act_fwd_kernel(float *y,        // (n_elems), may alias x
                               const float *x,  // (n_elems)
                               size_t n_elems, int act) {
    GRID_STRIDE(i, n_elems) y[i] = act_value(x[i], act);
}

// act_fwd_kernel's values rounded to bf16 as they are stored.
__global__ void act_fwd16_kernel(uint16_t *y16,   // (n_elems)
                                 const float *x,  // (n_elems)
                                 size_t n_elems, int act) {
    GRID_STRIDE(i, n_elems) y16[i] = tp_bf16_bits(act_value(x[i], act));
}

// The ReLU's bf16 output and its bit-mask (ops_list.h's linear_relu_fwd16)
// from the fp32 pre-activation: a thread per mask byte, the 8 elements of
// its row it covers (none past cols: the row's padding bits are 0).
__global__ void relu_fwd16_mask_kernel(uint16_t *y16,    // (N, cols) bf16 bits
                                       uint8_t *mask,    // (N, row_bytes)
                                       const float *h,   // (N, cols)
                                       int cols, size_t row_bytes, size_t n_bytes) {
    GRID_STRIDE(i, n_bytes) {
        const size_t n = i / row_bytes, j0 = (i % row_bytes) * 8;
        unsigned bits = 0;
        for (int k = 0; k < 8; k++) {
            const size_t j = j0 + (size_t)k;
            if (j >= (size_t)cols) break;
            const float v = h[n * (size_t)cols + j];
            y16[n * (size_t)cols + j] = tp_bf16_bits(act_value(v, ACT_RELU));
            if (v > 0.0f) bits |= 1u << k;
        }
        mask[i] = (uint8_t)bits;
    }
}

// x as stored: fp32, or bf16 bits widened (exact).
__device__ __forceinline__ float load_x(const float *x, size_t i) { return x[i]; }
__device__ __forceinline__ float load_x(const uint16_t *x, size_t i) { return __uint_as_float((uint32_t)x[i] << 16); }

// add: dx += the gradient, as the CPU (a ReLU's dx untouched where x <= 0);
// else dx = it, dx never read.
template <typename X>
__global__ void act_bwd_kernel(float *dx,        // (n_elems) accumulated, or written
                               const float *dy,  // (n_elems)
                               const X *x,       // (n_elems)
                               size_t n_elems, int act, bool add) {
    GRID_STRIDE(i, n_elems) {
        float xi = load_x(x, i);
        if (act == ACT_RELU) {
            if (add) {
                if (xi > 0.0f) dx[i] += dy[i];
            } else {
                dx[i] = xi > 0.0f ? dy[i] : 0.0f;
            }
        } else {
            // d/dx [x Phi(x)] = Phi(x) + x phi(x)
            float pdf = GELU_INV_SQRT_2PI * expf(-0.5f * xi * xi);
            float g = dy[i] * (gelu_cdf(xi) + xi * pdf);
            dx[i] = add ? dx[i] + g : g;
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

// ---- launchers ---------------------------------------------------------------------

static void act_fwd_launch(float *y, const float *x, size_t n_elems, Activation act,
                           cudaStream_t stream) {
    act_fwd_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(y, x, n_elems,
                                                                              (int)act);
    CUDA_CHECK(cudaGetLastError());
}

template <typename X>
static void act_bwd_launch(float *dx, const float *dy, const X *x, size_t n_elems,
                           Activation act, bool add, cudaStream_t stream) {
    act_bwd_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(
        dx, dy, x, n_elems, (int)act, add);
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

extern "C" void cuda_op_act_bwd_x16(float *dx, GradMode mode, const float *dy, const uint16_t *x16, size_t n_elems,
                                    Activation act, cudaStream_t stream) {
    check_act("cuda_op_act_bwd_x16", act);
    TP_CHECK(grad_mode_valid(mode), "cuda_op_act_bwd_x16: unknown gradient mode %d", (int)mode);
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_act_bwd_x16", dx);
    TP_NEED_PTR("cuda_op_act_bwd_x16", dy);
    TP_NEED_PTR("cuda_op_act_bwd_x16", x16);
    act_bwd_launch(dx, dy, x16, n_elems, act, mode == GRAD_ADD, stream);
}

extern "C" void cuda_op_act_fwd16(uint16_t *y16, const float *x, size_t n_elems, Activation act,
                                  cudaStream_t stream) {
    check_act("cuda_op_act_fwd16", act);
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_act_fwd16", y16);
    TP_NEED_PTR("cuda_op_act_fwd16", x);
    act_fwd16_kernel<<<tp_grid_1d(n_elems, EW_THREADS), EW_THREADS, 0, stream>>>(y16, x, n_elems, (int)act);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void cuda_op_relu_fwd16_mask(uint16_t *y16, uint8_t *mask, const float *h, int N, int cols,
                                        cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_relu_fwd16_mask", N);
    TP_NEED_SIZE("cuda_op_relu_fwd16_mask", cols);
    if (N == 0 || cols == 0) return;
    TP_NEED_PTR("cuda_op_relu_fwd16_mask", y16);
    TP_NEED_PTR("cuda_op_relu_fwd16_mask", mask);
    TP_NEED_PTR("cuda_op_relu_fwd16_mask", h);
    const size_t row_bytes = relu_mask_row_bytes(cols), n_bytes = (size_t)N * row_bytes;
    relu_fwd16_mask_kernel<<<tp_grid_1d(n_bytes, EW_THREADS), EW_THREADS, 0, stream>>>(y16, mask, h, cols, row_bytes,
                                                                                        n_bytes);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void cuda_op_act_bwd(float *dx, GradMode mode, const float *dy, const float *x, size_t n_elems,
                                Activation act, cudaStream_t stream) {
    check_act("cuda_op_act_bwd", act);
    TP_CHECK(grad_mode_valid(mode), "cuda_op_act_bwd: unknown gradient mode %d", (int)mode);
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_act_bwd", dx);
    TP_NEED_PTR("cuda_op_act_bwd", dy);
    TP_NEED_PTR("cuda_op_act_bwd", x);
    act_bwd_launch(dx, dy, x, n_elems, act, mode == GRAD_ADD, stream);
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
