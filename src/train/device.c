/* device.c: the rank's backend and the device facts runtime_init needs (see device.h). */
#include "train/device.h"

#include <string.h>

Backend *rank_backend_create(DeviceChoice choice, Dtype dtype, char *err, size_t err_len) {
    int local_rank;
    if (runtime_env_local_rank(&local_rank, err, err_len)) return NULL;
    return backend_create(choice, dtype, local_rank, err, err_len);
}

void rank_device_options(Backend *be, RuntimeOptions *ro, CommDeviceCopy *hooks) {
    int n_gpus = 0;
    ro->device_is_gpu = !be->host_visible;
    ro->device = be->device;
    ro->stream = backend_stream(be);
    ro->device_copy = NULL;
    if (ro->device_is_gpu) backend_cuda_available(&n_gpus);  // a GPU backend: CUDA is initialised already
    ro->n_visible_gpus = n_gpus;
    BackendCommCopy bc;
    if (backend_comm_copy(be, &bc)) {
        *hooks = (CommDeviceCopy){.ctx = bc.ctx, .to_host = bc.to_host, .to_device = bc.to_device,
                                  .host_alloc = bc.host_alloc, .host_free = bc.host_free};
        ro->device_copy = hooks;
    }
}
