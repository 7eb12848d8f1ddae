/* cuda_common.h: the CUDA / cuBLASLt members of the project's error-macro
 * family (err.h), and device set-up shared by every CUDA kernel file.
 * Only kernels/cuda includes this header; model code never sees CUDA. */
#ifndef TPTRAIN_CUDA_COMMON_H
#define TPTRAIN_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "err.h"
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* Inside a graph capture on this thread (the CUDA backend's capture_begin
 * to capture_end), a failed CUDA or cuBLASLt call does not end the
 * process: the first is kept (call, place, error), the capture then fails
 * at its end, naming it, and the caller runs the ops again without
 * capture (backend.h). Nothing has run on the device inside a capture, so
 * going on is safe; whatever the capture recorded is thrown away. True
 * when the error was kept so; false outside a capture (the caller dies). */
bool cuda_capture_absorbs(const char *call, const char *error, const char *file, int line);
/* Whether this thread is inside a stream capture (backend_cuda.cu's). */
bool cuda_capture_active(void);
#ifdef __cplusplus
}
#endif

#define CUDA_CHECK(call)                                                                      \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess && !cuda_capture_absorbs(#call, cudaGetErrorString(e_), __FILE__, __LINE__)) { \
            int dev_ = -1;                                                                    \
            cudaGetDevice(&dev_);                                                             \
            tp_die(__FILE__, __LINE__, "%s failed on device %d: %s", #call, dev_,             \
                   cudaGetErrorString(e_));                                                   \
        }                                                                                     \
    } while (0)

#define CUBLAS_CHECK(call)                                                                    \
    do {                                                                                      \
        cublasStatus_t s_ = (call);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS && !cuda_capture_absorbs(#call, "cuBLAS error", __FILE__, __LINE__)) { \
            int dev_ = -1;                                                                    \
            cudaGetDevice(&dev_);                                                             \
            tp_die(__FILE__, __LINE__, "%s failed on device %d: status %d", #call, dev_,      \
                   (int)s_);                                                                  \
        }                                                                                     \
    } while (0)

#ifdef __cplusplus
extern "C" {
#endif

/* What a rank learns about its GPU at start-up. */
typedef struct {
    int device;              // ordinal in use
    int n_devices;
    char name[256];
    int sm_major, sm_minor;
    int n_sms;
    size_t total_bytes;      // device memory
} CudaDeviceInfo;

/* Picks device (local_rank % device count), makes it current and fills info.
 * Returns 0, or -1 with a sentence in err when no usable device exists. */
int cuda_device_init(int local_rank, CudaDeviceInfo *info, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
