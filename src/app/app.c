/* app.c: the helpers src/app/ shares (see app.h). */
#include "app/app.h"

#include "err.h"

void app_default_dtype(TrainArgs *a) {
    if (!a->dtype_given) a->dtype = device_is_gpu(a->device) ? DTYPE_BF16 : DTYPE_F32;
}

void comm_ok(int rc, const Comm *c) { TP_CHECK(rc == 0, "%s", comm_error(c)); }
