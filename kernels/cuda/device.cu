// device.cu: GPU selection for a rank. LOCAL_RANK picks
// the device; several ranks may share one GPU (the staged shared-memory
// backend relies on it), so the choice wraps around the device count.
// A GPU the build cannot serve is refused here in one line, before any
// kernel runs: older than sm_80 (the kernels need bf16 tensor cores), or
// one this build has no code for (CMAKE_CUDA_ARCHITECTURES; a compute_80
// PTX in the build serves every newer GPU through the driver's compiler).
#include <string.h>
#include "cuda_common.h"

#ifndef TPTRAIN_CUDA_ARCHS
#define TPTRAIN_CUDA_ARCHS "?"
#endif

namespace {
__global__ void image_probe() {}
}  // namespace

// 0, or -1 with the reason in err: the device's generation, then whether
// this binary holds code for it (asked through one kernel's attributes).
static int device_supported(int dev, const cudaDeviceProp &p, char *err, size_t err_len) {
    if (p.major < 8) {
        tp_error_set(err, err_len,
                     "GPU %d (%s) is sm_%d%d; tptrain needs sm_80 or newer (bf16 tensor cores: A100, L40S, "
                     "RTX 30 and 40 series, H100, H200)",
                     dev, p.name, p.major, p.minor);
        return -1;
    }
    cudaFuncAttributes fa;
    const cudaError_t e = cudaFuncGetAttributes(&fa, image_probe);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        tp_error_set(err, err_len,
                     "GPU %d (%s, sm_%d%d): this build has no code for it (built for CUDA architectures %s: %s); "
                     "rebuild with -DCMAKE_CUDA_ARCHITECTURES=native on this machine",
                     dev, p.name, p.major, p.minor, TPTRAIN_CUDA_ARCHS, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int cuda_device_init(int local_rank, CudaDeviceInfo *info, char *err, size_t err_len) {
    memset(info, 0, sizeof *info);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        tp_error_set(err, err_len, "no CUDA device available (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        return -1;
    }
    if (local_rank < 0) local_rank = 0;
    int dev = local_rank % n;
    CUDA_CHECK(cudaSetDevice(dev));
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    if (device_supported(dev, p, err, err_len)) return -1;
    info->device = dev;
    info->n_devices = n;
    static_assert(sizeof info->name <= sizeof p.name, "device name buffer");
    memcpy(info->name, p.name, sizeof info->name - 1);  // p.name is NUL-terminated
    info->name[sizeof info->name - 1] = '\0';
    info->sm_major = p.major;
    info->sm_minor = p.minor;
    info->n_sms = p.multiProcessorCount;
    info->total_bytes = p.totalGlobalMem;
    return 0;
}
