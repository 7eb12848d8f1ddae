// convert.cu: fp32 <-> bf16 (raw bits) for the staging of bf16 collectives,
// and fp32 rounded to bf16 values in place.
// The rounding is common/bf16.h's integer arithmetic (nearest, ties to
// even; NaN kept quiet with its sign), so the GPU and the CPU reference
// give the same bits, NaN included (__float2bfloat16_rn canonicalises NaN).
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define CONVERT_THREADS 256u

// ---- kernels ---------------------------------------------------------------------

__global__ void to_bf16_kernel(uint16_t *dst,     // (n_elems)
                               const float *src,  // (n_elems)
                               size_t n_elems) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = tp_bf16_bits(src[i]);
}

__global__ void from_bf16_kernel(float *dst,           // (n_elems)
                                 const uint16_t *src,  // (n_elems)
                                 size_t n_elems) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

__global__ void round_bf16_kernel(float *x,  // (n_elems)
                                  size_t n_elems) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = tp_bf16_round(x[i]);
}

// ---- exported ops ------------------------------------------------------------------

// The checks of both ops, then one launch of kernel over n_elems.
template <typename Dst, typename Src>
static void convert_launch(const char *op, void (*kernel)(Dst *, const Src *, size_t), Dst *dst, const Src *src,
                           size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_CHECK(dst != NULL, "%s: dst is NULL", op);
    TP_CHECK(src != NULL, "%s: src is NULL", op);
    kernel<<<tp_grid_1d(n_elems, CONVERT_THREADS), CONVERT_THREADS, 0, stream>>>(dst, src, n_elems);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void cuda_op_to_bf16(uint16_t *dst, const float *src, size_t n_elems, cudaStream_t stream) {
    convert_launch("cuda_op_to_bf16", to_bf16_kernel, dst, src, n_elems, stream);
}

extern "C" void cuda_op_from_bf16(float *dst, const uint16_t *src, size_t n_elems, cudaStream_t stream) {
    convert_launch("cuda_op_from_bf16", from_bf16_kernel, dst, src, n_elems, stream);
}

extern "C" void cuda_op_round_bf16(float *x, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_CHECK(x != NULL, "cuda_op_round_bf16: x is NULL");
    round_bf16_kernel<<<tp_grid_1d(n_elems, CONVERT_THREADS), CONVERT_THREADS, 0, stream>>>(x, n_elems);
    CUDA_CHECK(cudaGetLastError());
}
