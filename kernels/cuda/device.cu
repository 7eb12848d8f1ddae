// device.cu: GPU selection for a rank. LOCAL_RANK picks
// the device; several ranks may share one GPU (the staged shared-memory
// backend relies on it), so the choice wraps around the device count.
#include <string.h>
#include "cuda_common.h"

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
