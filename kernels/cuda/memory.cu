// memory.cu: fills and copies of device buffers.
//
// Both are left to the copy engines (cudaMemsetAsync, cudaMemcpyAsync) on the
// caller's stream: no kernel of ours can beat them. op_copy has memmove
// semantics on the CPU, which cudaMemcpy does not promise for overlapping
// ranges, so an overlapping copy goes through a stream-ordered temporary.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

// ---- launchers ---------------------------------------------------------------

static void zero_launch(float *x,  // (n_elems)
                        size_t n_elems, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(x, 0, n_elems * sizeof(float), stream));
}

static void copy_launch(float *dst,        // (n_elems)
                        const float *src,  // (n_elems)
                        size_t n_elems, cudaStream_t stream) {
    const size_t n_bytes = n_elems * sizeof(float);
    const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    const bool overlap = d < s + n_bytes && s < d + n_bytes;
    if (!overlap) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, stream));
        return;
    }
    void *tmp = tp_scratch_alloc(n_bytes, stream);
    CUDA_CHECK(cudaMemcpyAsync(tmp, src, n_bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(dst, tmp, n_bytes, cudaMemcpyDeviceToDevice, stream));
    tp_scratch_free(tmp, stream);
}

// ---- exported ops ---------------------------------------------------------------

extern "C" void cuda_op_zero(float *x, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_zero", x);
    TP_CHECK(n_elems <= SIZE_MAX / sizeof(float), "cuda_op_zero: n_elems = %zu too large",
             n_elems);
    zero_launch(x, n_elems, stream);
}

extern "C" void cuda_op_copy(float *dst, const float *src, size_t n_elems,
                             cudaStream_t stream) {
    if (n_elems == 0 || dst == src) return;
    TP_NEED_PTR("cuda_op_copy", dst);
    TP_NEED_PTR("cuda_op_copy", src);
    TP_CHECK(n_elems <= SIZE_MAX / sizeof(float), "cuda_op_copy: n_elems = %zu too large",
             n_elems);
    copy_launch(dst, src, n_elems, stream);
}
