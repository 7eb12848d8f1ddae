/* app.h: the few helpers every part of train_mt's front end (src/app/)
 * shares: the default --dtype (it follows where the run will be:
 * device_is_gpu in args.h), and the check of a control collective.
 */
#ifndef TPTRAIN_APP_APP_H
#define TPTRAIN_APP_APP_H

#include <stdbool.h>

#include "app/args.h"
#include "kernels/backend.h"
#include "tp/comm.h"
#include "tp/runtime.h"

/* --dtype when not given: bf16 on a GPU, fp32 on a CPU. */
void app_default_dtype(TrainArgs *a);

/* This rank's backend for --device and --dtype (the default dtype set
 * first), or NULL after printing why. */
Backend *app_backend_open(TrainArgs *a);

/* The ranks meet (tp/runtime.h) with be's device hooks; 0, or 2 after
 * printing "train_mt: WHAT<why>" and destroying be. */
int app_runtime_open(Backend *be, RuntimeOptions *ro, Runtime *rt, const char *what);

#endif
