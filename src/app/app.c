/* app.c: the helpers src/app/ shares (see app.h). */
#include "app/app.h"

#include <stdio.h>

#include "err.h"
#include "train/device.h"

void app_default_dtype(TrainArgs *a) {
    if (!a->dtype_given) a->dtype = device_is_gpu(a->device) ? DTYPE_BF16 : DTYPE_F32;
}

Backend *app_backend_open(TrainArgs *a) {
    char err[1024];
    app_default_dtype(a);
    Backend *be = rank_backend_create(a->device, a->dtype, err, sizeof err);
    if (!be) fprintf(stderr, "train_mt: %s\n", err);
    return be;
}

int app_runtime_open(Backend *be, RuntimeOptions *ro, Runtime *rt, const char *what) {
    char err[1024];
    CommDeviceCopy hooks;
    rank_device_options(be, ro, &hooks);
    const int rc = runtime_init(rt, ro, err, sizeof err);
    ro->device_copy = NULL;  // the communicators copied the hooks, which end here
    if (rc == 0) return 0;
    fprintf(stderr, "train_mt: %s%s\n", what, err);
    backend_destroy(be);
    return 2;
}
