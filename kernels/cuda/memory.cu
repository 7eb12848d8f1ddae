// memory.cu: fills and copies of device buffers (floats and token ids).
//
// Both are left to the copy engines (cudaMemsetAsync, cudaMemcpyAsync) on the
// caller's stream: no kernel of ours can beat them. op_copy has memmove
// semantics on the CPU, which cudaMemcpy does not promise for overlapping
// ranges, so an overlapping copy goes through the caller's scratch (the
// backend's workspace): no op allocates.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

static bool ranges_overlap(const void *dst, const void *src, size_t n_bytes) {
    const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    return dst != src && d < s + n_bytes && s < d + n_bytes;
}

// ---- launchers ---------------------------------------------------------------

static void zero_launch(float *x,  // (n_elems)
                        size_t n_elems, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(x, 0, n_elems * sizeof(float), stream));
}

static void copy_launch(void *dst,        // (n_bytes)
                        const void *src,  // (n_bytes)
                        size_t n_bytes,
                        void *scratch,    // (n_bytes) when the ranges overlap
                        cudaStream_t stream) {
    if (!ranges_overlap(dst, src, n_bytes)) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, stream));
        return;
    }
    CUDA_CHECK(cudaMemcpyAsync(scratch, src, n_bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, scratch, n_bytes, cudaMemcpyDeviceToDevice, stream));
}

// ---- exported ops ---------------------------------------------------------------

extern "C" size_t cuda_copy_scratch_bytes(const void *dst, const void *src, size_t n_bytes) {
    return ranges_overlap(dst, src, n_bytes) ? n_bytes : 0;
}

extern "C" void cuda_op_copy_bytes(void *dst, const void *src, size_t n_bytes, void *scratch,
                                   cudaStream_t stream) {
    if (n_bytes == 0 || dst == src) return;
    TP_NEED_PTR("cuda_op_copy", dst);
    TP_NEED_PTR("cuda_op_copy", src);
    TP_CHECK(!ranges_overlap(dst, src, n_bytes) || scratch != NULL,
             "cuda_op_copy: overlapping ranges (%zu bytes) need scratch", n_bytes);
    copy_launch(dst, src, n_bytes, scratch, stream);
}

extern "C" void cuda_op_zero(float *x, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_zero", x);
    TP_CHECK(n_elems <= SIZE_MAX / sizeof(float), "cuda_op_zero: n_elems = %zu too large",
             n_elems);
    zero_launch(x, n_elems, stream);
}

extern "C" void cuda_op_copy(float *dst, const float *src, size_t n_elems, void *scratch,
                             cudaStream_t stream) {
    TP_CHECK(n_elems <= SIZE_MAX / sizeof(float), "cuda_op_copy: n_elems = %zu too large",
             n_elems);
    cuda_op_copy_bytes(dst, src, n_elems * sizeof(float), scratch, stream);
}

extern "C" void cuda_op_copy_ids(int32_t *dst, const int32_t *src, size_t n_elems,
                                 void *scratch, cudaStream_t stream) {
    TP_CHECK(n_elems <= SIZE_MAX / sizeof(int32_t), "cuda_op_copy_ids: n_elems = %zu too large",
             n_elems);
    cuda_op_copy_bytes(dst, src, n_elems * sizeof(int32_t), scratch, stream);
}
