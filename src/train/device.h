/* device.h: a rank's device, set up before its communicators.
 *
 * The backend comes first (LOCAL_RANK picks the GPU, modulo the visible
 * ones), so that runtime_init knows where the model's buffers live when it
 * chooses the data groups' communicator: NCCL on the backend's stream when
 * every rank of the node has its own GPU, else shared memory, which stages
 * device buffers through the backend's page-locked host buffers. This is
 * the one place where kernels/backend.h's staging hooks become tp/comm.h's,
 * so neither layer includes the other's header for it.
 */
#ifndef TPTRAIN_TRAIN_DEVICE_H
#define TPTRAIN_TRAIN_DEVICE_H

#include <stddef.h>

#include "kernels/backend.h"
#include "tp/runtime.h"

/* The backend --device asks for, on this rank's GPU (LOCAL_RANK, else RANK,
 * else 0, modulo the visible GPUs). NULL + one sentence in err: a bad
 * launcher variable, or cuda asked for and unavailable. */
Backend *rank_backend_create(DeviceChoice choice, Dtype dtype, char *err, size_t err_len);

/* Fills the device fields of *ro from be: device_is_gpu (be's buffers are
 * not host memory), n_visible_gpus (0 for a CPU backend: no GPU fact
 * matters then, and CUDA is left untouched), device, stream (be's, for
 * NCCL; NULL on the CPU) and device_copy: hooks (filled from backend_comm_copy) on a GPU,
 * NULL on a host-visible backend, whose buffers the shared-memory
 * collectives read and write as they are. hooks must stay valid until
 * runtime_init returns (the communicators copy them). */
void rank_device_options(Backend *be, RuntimeOptions *ro, CommDeviceCopy *hooks);

#endif
